"""The models the project ships (data/models/: the zoo and the twins' adapters) verify themselves at every load, as
the SmolLM2 cache does: a manifest of the files that make the model, written by their training. A damaged, edited,
cut, swapped or missing file is refused before anything is read, naming the folder, the file and the fix; a card or
README (documentation, rewritten after training) changes nothing the model computes and is not checked."""
import json
import shutil
from pathlib import Path

import pytest

import sinklib
from sinklib import loading, model_names, named
from sinklib.cache_manifest import MANIFEST, FolderCheckError, check_shipped
from sinklib.paths import ZOO_DIR

DIFFUSION, AUTOREGRESSIVE = "smollm2-135m-diffusion", "smollm2-135m-autoregressive"


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_json(path: Path, **changes) -> None:
    settings = json.loads(path.read_text())
    settings.update(changes)
    path.write_text(json.dumps(settings, indent=2, sort_keys=True))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


ADAPTER = "adapter_model.safetensors"
ADAPTER_DAMAGE = {  # what a user or a bad copy does to a twin's folder → the files the refusal names
    "bit-flipped weights": (lambda f: _flip_a_byte(f / ADAPTER), [ADAPTER]),
    "the other twin's weights": (lambda f: shutil.copy2(ZOO_DIR / AUTOREGRESSIVE / ADAPTER, f / ADAPTER), [ADAPTER]),
    "lora_alpha 32 -> 128": (lambda f: _edit_json(f / "adapter_config.json", lora_alpha=128), ["adapter_config.json"]),
    "target_modules cut to q_proj": (lambda f: _edit_json(f / "adapter_config.json", target_modules=["q_proj"]),
                                     ["adapter_config.json"]),
    "another rank": (lambda f: _edit_json(f / "adapter_config.json", r=8), ["adapter_config.json"]),
    "cut weights file": (lambda f: _cut(f / ADAPTER), [ADAPTER]),
    "cut config": (lambda f: _cut(f / "adapter_config.json"), ["adapter_config.json"]),
    "an extra weights file": (lambda f: shutil.copy2(f / ADAPTER, f / "adapter_model.bin"), ["adapter_model.bin"]),
    "no manifest": (lambda f: (f / MANIFEST).unlink(), [MANIFEST]),
    "a garbled manifest": (lambda f: (f / MANIFEST).write_text("{not json"), [MANIFEST]),
}


@pytest.fixture
def twin_folder(tmp_path, monkeypatch):
    """A copy of the diffusion twin's shipped folder, which sinklib.load reads in place of data/models/."""
    shutil.copytree(ZOO_DIR / DIFFUSION, tmp_path / DIFFUSION)
    monkeypatch.setattr(named, "ZOO_DIR", tmp_path)
    return tmp_path / DIFFUSION


@pytest.mark.parametrize("damage", ADAPTER_DAMAGE)
def test_a_damaged_adapter_is_refused_before_its_base_loads_naming_the_folder_the_file_and_the_fix(twin_folder, damage,
                                                                                                   monkeypatch):
    doctor, files = ADAPTER_DAMAGE[damage]
    doctor(twin_folder)
    monkeypatch.setattr(named, "resolve_named", lambda *a, **k: pytest.fail("the base was opened"))
    with pytest.raises(FolderCheckError) as caught:
        sinklib.load(DIFFUSION)
    assert caught.value.files == files and caught.value.folder == twin_folder
    message = str(caught.value)
    assert f"name_or_model={DIFFUSION!r}" in message and str(twin_folder) in message and files[0] in message
    assert "git checkout --" in message and f"python -m experiments.zoo adapt {DIFFUSION}" in message


def test_another_twins_whole_folder_is_refused_by_the_name_its_manifest_was_written_for(twin_folder):
    shutil.rmtree(twin_folder)
    shutil.copytree(ZOO_DIR / AUTOREGRESSIVE, twin_folder)
    with pytest.raises(FolderCheckError, match=f"written for {AUTOREGRESSIVE!r}, not {DIFFUSION!r}"):
        named.check_adapter(named.ADAPTED_MODELS[DIFFUSION])


def test_the_card_and_readme_are_documentation_not_checked(twin_folder):
    (twin_folder / "README.md").write_text("edited by hand\n")
    _edit_json(twin_folder / "card.json", note="edited")
    assert named.check_adapter(named.ADAPTED_MODELS[DIFFUSION]) == twin_folder


ZOO_DAMAGE = {
    "zeroed weights": (lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:4096] + bytes((f / "model.safetensors").stat().st_size - 4096)),
        ["model.safetensors"]),
    "a config with fewer layers": (lambda f: _edit_json(f / "config.json", num_hidden_layers=1), ["config.json"]),
    "an edited tokenizer config": (lambda f: _edit_json(f / "tokenizer_config.json", model_max_length=7),
                                   ["tokenizer_config.json"]),
    "a missing generation config": (lambda f: (f / "generation_config.json").unlink(), ["generation_config.json"]),
}


@pytest.mark.parametrize("damage", ZOO_DAMAGE)
def test_a_damaged_zoo_model_is_refused_naming_the_file(tmp_path, monkeypatch, damage):
    shutil.copytree(ZOO_DIR / "tiny-llada", tmp_path / "tiny-llada")
    monkeypatch.setattr(model_names, "ZOO_DIR", tmp_path)
    doctor, files = ZOO_DAMAGE[damage]
    doctor(tmp_path / "tiny-llada")
    with pytest.raises(FolderCheckError) as caught:
        sinklib.load("tiny-llada")
    assert caught.value.files == files
    assert str(tmp_path / "tiny-llada") in str(caught.value) and "python -m experiments.zoo train tiny-llada" in str(caught.value)


@pytest.mark.parametrize("name", sorted(p.name for p in ZOO_DIR.iterdir() if p.is_dir()))
def test_every_shipped_folder_carries_a_manifest_it_passes(name):
    check_shipped(ZOO_DIR / name, name, "unused")
    assert json.loads((ZOO_DIR / name / MANIFEST).read_text())["model"] == name


def test_a_twin_started_from_a_damaged_shipped_adapter_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A recipe with init_from (the diffusion twin starts from the autoregressive twin's adapter) reads the shipped
    adapter only as its training wrote it."""
    from experiments.zoo import adapt

    shutil.copytree(ZOO_DIR / AUTOREGRESSIVE, tmp_path / AUTOREGRESSIVE)
    _edit_json(tmp_path / AUTOREGRESSIVE / "adapter_config.json", lora_alpha=128)
    monkeypatch.setattr(named, "ZOO_DIR", tmp_path)
    with pytest.raises(FolderCheckError, match="adapter_config.json: ") as caught:
        adapt._load_shipped_adapter(None, AUTOREGRESSIVE)  # refused before the model is touched
    assert f"python -m experiments.zoo adapt {AUTOREGRESSIVE}" in str(caught.value)
    assert f"init_from={AUTOREGRESSIVE!r}" in str(caught.value)  # the parameter that named it


@pytest.fixture
def zoo_copy(tmp_path, monkeypatch):
    """A copy of tiny-llada's shipped folder in a data/models/ that sinklib.load reads instead of the real one."""
    shutil.copytree(ZOO_DIR / "tiny-llada", tmp_path / "tiny-llada")
    monkeypatch.setattr(model_names, "ZOO_DIR", tmp_path)
    return tmp_path / "tiny-llada"


@pytest.mark.parametrize("spelling", ["absolute", "relative", "trailing slash", "symlink"])
def test_a_shipped_folder_reached_by_its_path_is_checked_as_by_its_name(zoo_copy, spelling, monkeypatch, tmp_path):
    _edit_json(zoo_copy / "config.json", num_hidden_layers=1)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link").symlink_to(zoo_copy)
    monkeypatch.chdir(tmp_path / "elsewhere")
    path = {"absolute": str(zoo_copy), "relative": "../tiny-llada", "trailing slash": str(zoo_copy) + "/",
            "symlink": "link"}[spelling]
    with pytest.raises(FolderCheckError) as caught:
        sinklib.load(path)
    assert caught.value.files == ["config.json"] and "python -m experiments.zoo train tiny-llada" in str(caught.value)


@pytest.mark.parametrize("name", ["..", ".", ".hidden", ""])
def test_a_name_that_is_not_a_zoo_folder_is_never_taken_for_one(zoo_copy, name):
    (zoo_copy.parent / ".hidden").mkdir()
    assert loading.model_source("tiny-llada") == "zoo"
    assert loading.model_source(name) != "zoo"
    with pytest.raises((ValueError, OSError)) as caught:
        sinklib.load(name)
    assert "git checkout" not in str(caught.value)  # never advised to "restore" a folder that is not a model


def test_an_extra_file_and_a_folder_in_place_of_a_file_are_named_with_the_fix(zoo_copy):
    (zoo_copy / "notes: mine.txt").write_text("a file a user put there\n")
    (zoo_copy / "generation_config.json").unlink()
    (zoo_copy / "generation_config.json").mkdir()
    with pytest.raises(FolderCheckError) as caught:
        sinklib.load("tiny-llada")
    assert caught.value.files == ["notes: mine.txt", "generation_config.json"]
    message = str(caught.value)
    assert "notes: mine.txt: not written by its training" in message and "generation_config.json: not a file" in message
    assert "then remove the files it does not list (notes: mine.txt)" in message


def test_a_zoo_model_trained_from_a_damaged_donor_is_refused_before_it_is_read(zoo_copy, monkeypatch):
    """tiny-dream starts from tiny-arm's weights (ZooSpec.init_from): the donor is read only as its training wrote it."""
    from experiments.zoo import train

    shutil.copytree(ZOO_DIR / "tiny-arm", zoo_copy.parent / "tiny-arm")
    _flip_a_byte(zoo_copy.parent / "tiny-arm" / "model.safetensors")
    monkeypatch.setattr(train.transformers.LlamaForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the donor was read"))
    with pytest.raises(FolderCheckError, match="(?s)init_from=.tiny-arm.: .*model.safetensors: SHA-256") as caught:
        train.build_model(train.ZOO["tiny-dream"], train.build_tokenizer(), zoo_copy.parent)
    assert "python -m experiments.zoo train tiny-arm" in str(caught.value)
