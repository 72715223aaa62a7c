import json
import os

import pytest
import torch
import transformers

import sinklib
from sinklib.dynamics import sink_mask
from tests.models import MASK_ID, diffusion_llama, llama

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

PROMPT = [5, 9, 2, 33, 17, 8]


@pytest.fixture(scope="module")
def loaded():
    return sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)


@pytest.fixture(scope="module")
def trace(loaded):
    return sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4), maps=[(3, 1, 2)],
                            intervention=sinklib.MaskSinks(top_k=2, threshold=False), progress=False)


def test_each_step_scores_belong_to_the_canvas_before_that_step(loaded):
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4), progress=False)
    for step in (0, 5):
        with torch.no_grad(), sinklib.capture(loaded.model) as rec:
            loaded.model(input_ids=trace.tokens[step][None])
        torch.testing.assert_close(trace.scores[step], rec.scores[0, :, 0], atol=1e-6, rtol=0)


def test_canvas_bookkeeping(trace):
    assert trace.tokens.shape == (9, 14) and trace.is_masked.shape == (8, 14)
    assert trace.is_masked[0].tolist() == [False] * 6 + [True] * 8
    unmasked_at = trace.unmasked_at
    assert (unmasked_at[:6] == -1).all()
    for position in range(6, 14):
        step = int(unmasked_at[position])
        assert trace.is_masked[step, position] and (step == 7 or not trace.is_masked[step + 1, position])
        assert trace.tokens[step + 1, position] != MASK_ID
    assert (unmasked_at[6:10] < 4).all() and (unmasked_at[10:] >= 4).all(), "block 1 completes before block 2 starts"


def test_trace_records_settings_seed_versions_and_intervention(trace):
    meta = trace.meta
    assert meta["family"] == "llada" and meta["seed"] == 0 and meta["settings"]["block_length"] == 4
    assert "MaskSinks(top_k=2" in meta["intervention"] and meta["versions"]["transformers"] == transformers.__version__
    assert trace.masked_keys.shape == trace.scores.shape and not trace.masked_keys[0].any()
    assert (trace.masked_keys[1:].sum(-1) == 2).all()


def test_save_and_load_round_trip_is_loss_free(trace, tmp_path):
    trace.save(tmp_path / "t")
    again = sinklib.Trace.load(tmp_path / "t")
    assert torch.equal(again.scores, trace.scores) and torch.equal(again.tokens, trace.tokens)
    assert torch.equal(again.is_masked, trace.is_masked) and torch.equal(again.masked_keys, trace.masked_keys)
    assert again.maps.keys() == trace.maps.keys() and torch.equal(again.maps[(3, 1, 2)], trace.maps[(3, 1, 2)])
    assert again.meta == trace.meta and again.prompt_len == 6  # tuples stay tuples
    assert again.layer_names == trace.layer_names


def test_saved_files_are_deterministic(loaded, tmp_path):
    for name in ("a", "b"):
        sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=8, temperature=0.7), seed=5,
                         progress=False).save(tmp_path / name)
    for file in ("scores.parquet", "canvas.parquet", "maps.parquet", "meta.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_to_frame_is_tidy(trace):
    frame = trace.to_frame(steps=[0, 7], layers=[1], heads=[0, 3])
    assert list(frame.columns) == ["step", "layer", "head", "position", "score", "token_id", "token", "is_masked", "is_prompt"]
    assert len(frame) == 2 * 1 * 2 * 14
    row = frame[(frame["step"] == 7) & (frame["head"] == 3) & (frame["position"] == 10)].iloc[0]
    assert row.score == pytest.approx(float(trace.scores[7, 1, 3, 10])) and row.token_id == int(trace.tokens[7, 10])
    with pytest.raises(ValueError, match=r"steps=\[9\] is not allowed: steps must lie in 0..7"):
        trace.to_frame(steps=[9])


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=8, gen_length=10, block_length=4),
     r"gen_length=10 is not allowed: gen_length must be a multiple of block_length=4"),
    (dict(steps=6, gen_length=8, block_length=2),
     r"steps=6 is not allowed: steps must be a multiple of the number of blocks \(4"),
    (dict(steps=0, gen_length=8), r"steps=0 is not allowed"),
    (dict(steps=8, gen_length=8, temperature=-1.0), r"temperature=-1.0 is not allowed"),
    # past these the upstream formulas overflow float64 / float32 into inf and NaN: an empty generation, not samples
    (dict(steps=8, gen_length=8, temperature=1e308), r"temperature=1e\+308 is not allowed: temperature must be a finite "
                                                     r"number <= 100"),
    (dict(steps=8, gen_length=8, cfg_scale=1e308), r"cfg_scale=1e\+308 is not allowed: cfg_scale must be a finite "
                                                   r"number <= 10000"),
    (dict(steps=60, gen_length=60), r"gen_length=60 is not allowed: gen_length must be at most 58"),
    (dict(steps=8, gen_length=8, alg="entropy"), r"alg='entropy' is not allowed for the llada family"),
    (dict(steps=8, gen_length=8, remasking="lowest"), r"remasking='lowest' is not allowed"),
])
def test_bad_generation_arguments_fail_before_any_forward(loaded, kwargs, message):
    calls = []
    handle = loaded.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=message):
            sinklib.generate(loaded, PROMPT, loaded.settings_for(**kwargs), progress=False)
    finally:
        handle.remove()
    assert not calls


def test_unknown_dream_alg_and_empty_prompt():
    dream = sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID)
    with pytest.raises(ValueError, match=r"alg='maskgit' is not allowed.*did you mean 'maskgit_plus'"):
        sinklib.generate(dream, PROMPT, dream.settings_for(steps=4, gen_length=8, alg="maskgit"), progress=False)
    with pytest.raises(ValueError, match=r"prompt=\[\] is not allowed"):
        sinklib.generate(dream, [], dream.settings_for(steps=4, gen_length=8), progress=False)


def test_load_errors():
    with pytest.raises(ValueError, match=r"family='lada' is not allowed.*did you mean 'llada'"):
        sinklib.load(diffusion_llama(), family="lada")
    with pytest.raises(ValueError, match=r"cannot tell the family"):
        sinklib.load(llama(causal=False))
    with pytest.raises(ValueError, match=r"mask_id=126336 is not allowed: mask_id must be a token id < 64"):
        sinklib.load(diffusion_llama())  # no tokenizer: LLaDA's own mask id does not fit this vocabulary


def test_family_inferred_from_config():
    assert sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID).family.name == "dream"
    assert sinklib.load(llama(causal=True)).family.name == "arm"


def test_tokenizer_without_a_mask_token_is_refused_for_diffusion(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw)
    with pytest.raises(ValueError, match=r"has no mask token"):
        sinklib.load(diffusion_llama(), tokenizer=tokenizer, mask_id=None)


def test_offline_hub_id_gives_a_download_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(OSError, match=r"huggingface-cli download GSAI-ML/LLaDA-8B-Instruct"):
        sinklib.load("GSAI-ML/LLaDA-8B-Instruct", trust_remote_code=True)


def test_local_folder_loads_like_a_hub_id_and_remote_code_needs_consent(tmp_path):
    model = diffusion_llama("llada")
    model.save_pretrained(tmp_path / "m")
    loaded = sinklib.load(str(tmp_path / "m"), mask_id=MASK_ID)
    assert loaded.family.name == "llada" and loaded.model.config._attn_implementation == "sdpa"
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(json.dumps({"model_type": "llada",
                                                    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig"}}))
    with pytest.raises(ValueError, match=r"pass trust_remote_code=True to sinklib.load if you trust it"):
        sinklib.load(str(remote))


@pytest.mark.parametrize("padded", [False, True])
def test_declared_bidirectional_attention_is_honoured_on_every_transformers_version(padded):
    """transformers 4.x ignores config.is_causal=False; sinklib.load must still give bidirectional attention."""
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    changed = ids.clone()
    changed[0, -1] = 9
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]]) if padded else None
    with torch.no_grad():
        before, after = loaded.logits(ids, mask), loaded.logits(changed, mask)
    assert not torch.allclose(before[0, 3], after[0, 3])
    causal = sinklib.load(llama(causal=True))
    with torch.no_grad():
        assert torch.equal(causal.logits(ids, mask)[0, 3], causal.logits(changed, mask)[0, 3])


PROMPTS = [PROMPT, [7, 3, 11]]  # batched with left padding


@pytest.mark.parametrize("family", ["llada", "arm"])
@pytest.mark.parametrize("watched", [dict(), dict(intervention="sinks", maps=[(1, 0, 1)])])
def test_keep_scores_false_keeps_tokens_text_and_maps_and_stores_no_scores(family, watched):
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID) if family == "llada" else sinklib.load(llama())
    options = dict(steps=6, gen_length=6, block_length=3) if family == "llada" else dict(gen_length=6)
    def run(keep_scores):
        kwargs = dict(watched)
        if "intervention" in kwargs:
            kwargs["intervention"] = sinklib.MaskSinks(top_k=1, threshold=False)
        return sinklib.generate(loaded, PROMPTS, loaded.settings_for(**options), progress=False, keep_scores=keep_scores,
                                **kwargs)

    captured_during_forward = []
    handle = loaded.model.register_forward_pre_hook(
        lambda module, args: captured_during_forward.append(getattr(module, "_sinklib_capture_active", False)))
    try:
        bare = run(False)
    finally:
        handle.remove()
    full = run(True)
    # Without an intervention or maps nothing needs the attention: the model runs with no capture at all.
    assert set(captured_during_forward) == {bool(watched)}
    for b, f in zip(bare, full):
        assert b.scores is None and b.masked_keys is None
        assert torch.equal(b.tokens, f.tokens) and torch.equal(b.is_masked, f.is_masked) and b.text == f.text
        assert b.n_steps == f.scores.shape[0] and b.layer_names == f.layer_names
        assert b.maps.keys() == f.maps.keys() and all(torch.equal(b.maps[k], f.maps[k]) for k in f.maps)


def test_a_trace_without_scores_says_so_when_asked_for_them(loaded, tmp_path):
    bare = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=4), progress=False, keep_scores=False)
    message = r"this Trace has no attention scores: it was generated with keep_scores=False"
    for use in (bare.to_frame, lambda: bare.save(tmp_path / "t"), lambda: sink_mask(bare)):
        with pytest.raises(ValueError, match=message):
            use()


def test_capture_without_kept_steps_still_counts_steps_and_feeds_the_intervention(loaded):
    ids = torch.tensor([PROMPT + [MASK_ID] * 4])
    outputs = {}
    for keep in (True, False):
        with torch.no_grad(), sinklib.capture(loaded.model, intervention=sinklib.MaskSinks(top_k=1, threshold=False),
                                              keep_steps=keep) as rec:
            outputs[keep] = [loaded.model(input_ids=ids).logits for _ in range(3)]
        assert rec.n_steps == 3
    assert all(torch.equal(a, b) for a, b in zip(outputs[True], outputs[False]))
    assert not torch.equal(outputs[False][0], outputs[False][1]), "step 1 on must differ: its top sink is masked"
    with pytest.raises(ValueError, match=r"keep_steps=False: it kept no per-step scores"):
        _ = rec.scores


def test_every_changed_byte_of_a_saved_trace_is_caught(trace, tmp_path):
    """Before: 33 of 35 single-byte flips in scores.parquet loaded silently."""
    trace.save(tmp_path / "t")
    for name in ("scores.parquet", "canvas.parquet", "maps.parquet", "meta.json"):
        path = tmp_path / "t" / name
        original = path.read_bytes()
        for offset in range(0, len(original), max(1, len(original) // 12)):
            changed = bytearray(original)
            changed[offset] ^= 0x20
            path.write_bytes(bytes(changed))
            with pytest.raises(ValueError, match=r"path=.* (is a damaged|is not a readable|is not a verifiable)"):
                sinklib.Trace.load(tmp_path / "t")
        path.write_bytes(original)
    assert torch.equal(sinklib.Trace.load(tmp_path / "t").scores, trace.scores)


def test_an_edited_shape_is_refused_not_used_to_reshape(trace, tmp_path):
    folder = trace.save(tmp_path / "t")
    meta = json.loads((folder / "meta.json").read_text())
    steps, layers, heads, seq = meta["shape"]
    meta["shape"] = [steps, heads, layers, seq]  # same product: a plain reshape would accept it
    from sinklib.trace import _sha256_meta

    meta["sha256"]["meta.json"] = _sha256_meta(meta)  # even with its checksum recomputed
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"scores.parquet's layer column does not match the shape"):
        sinklib.Trace.load(folder)


FULL_DISK = """
import os, sys, torch, sinklib
folder = sys.argv[1]
small = sinklib.Trace(scores=torch.rand(2, 1, 1, 4), tokens=torch.zeros(3, 4, dtype=torch.long),
                      is_masked=torch.zeros(2, 4, dtype=torch.bool), prompt_len=1, layer_names=["l0"])
small.save(folder + "/trace")
with open(folder + "/ballast", "wb") as out:  # fill the disk but for a little room
    try:
        while True:
            out.write(b"x" * 65536)
    except OSError:
        pass
os.truncate(folder + "/ballast", os.path.getsize(folder + "/ballast") - 200_000)
big = sinklib.Trace(scores=torch.rand(40, 4, 4, 512), tokens=torch.zeros(41, 512, dtype=torch.long),
                    is_masked=torch.zeros(40, 512, dtype=torch.bool), prompt_len=1, layer_names=["l0", "l1", "l2", "l3"])
try:
    big.save(folder + "/trace")
    print("SAVED")
except OSError as error:
    print("REFUSED", error.errno)
again = sinklib.Trace.load(folder + "/trace")
print("OLD" if again.scores.shape == small.scores.shape and torch.equal(again.scores, small.scores) else "LOST")
print(sorted(os.listdir(folder + "/trace")))
"""


@pytest.mark.process
def test_saving_over_a_trace_on_a_full_disk_keeps_the_old_one(tmp_path):
    """Before: the new scores.parquet overwrote the old one, then the disk filled, and neither trace was left.
    On a 2 MB tmpfs of its own (a mount namespace: needs root and unshare; skipped elsewhere)."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a small tmpfs of the test's own needs root and unshare")
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    command = f"mount -t tmpfs -o size=2m tmpfs {mount} && {sys.executable} {script} {mount}"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=300)
    if "mount:" in done.stderr and done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[-200:]}")
    lines = done.stdout.split("\n")
    assert lines[0] == "REFUSED 28", done.stdout + done.stderr[-2000:]  # ENOSPC
    assert lines[1] == "OLD", "the old trace is still there and intact"
    assert lines[2] == "['canvas.parquet', 'maps.parquet', 'meta.json', 'scores.json', 'scores.parquet']", \
        "no partial file left"


def test_a_trace_is_never_saved_over_other_files(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    trace = sinklib.Trace(scores=torch.rand(1, 1, 1, 2), tokens=torch.zeros(2, 2, dtype=torch.long),
                          is_masked=torch.zeros(1, 2, dtype=torch.bool), prompt_len=1, layer_names=["l0"])
    with pytest.raises(ValueError, match=r"holds files that are not a Trace's \(\['mine.txt'\]\)"):
        trace.save(folder)
    assert (folder / "mine.txt").read_text() == "keep"


def test_an_explicit_none_override_keeps_the_models_value(loaded):
    """None means "not given": settings_for(temperature=None) keeps the model's own temperature, never a default's."""
    own = loaded.settings_for(gen_length=8, steps=8, block_length=4)
    assert loaded.settings_for(gen_length=8, steps=8, block_length=4, temperature=None, remasking=None) == own
