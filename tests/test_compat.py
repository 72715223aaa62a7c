"""Remote-code checkpoints on transformers 5.x: a Dream-like stand-in (tests/remote_standins/dreamlike,
our own code) reproduces the two silent/loud failures, and sinklib.load fixes both."""
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

import sinklib
from sinklib import compat

STANDIN = Path(__file__).parent / "remote_standins" / "dreamlike"
NEEDS_5 = pytest.mark.skipif(compat.transformers_major() < 5, reason="the failures exist on transformers 5.x only")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved stand-in checkpoint, and the reference model it was saved from."""
    folder = tmp_path_factory.mktemp("dreamlike")
    for source in STANDIN.glob("*.py"):
        shutil.copy(source, folder)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "dreamlike", "architectures": ["DreamLikeModel"],
        "auto_map": {"AutoConfig": "configuration_dreamlike.DreamLikeConfig", "AutoModel": "modeling_dreamlike.DreamLikeModel"}}))
    compat.apply_default_rope()  # constructing the reference needs it on 5.x too
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    torch.manual_seed(0)
    reference = transformers.AutoModel.from_config(config, trust_remote_code=True).eval()
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, folder / "model.safetensors")
    return folder, reference


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


@NEEDS_5
def test_plain_transformers_5_fails_loudly_without_the_default_rope(checkpoint):
    folder, _ = checkpoint
    out = _run(f"""
        import transformers
        try:
            transformers.AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        except KeyError as error:
            print("KEYERROR", error)
    """)
    assert "KEYERROR 'default'" in out


@NEEDS_5
def test_plain_transformers_5_loads_garbage_rotary_frequencies_silently(checkpoint):
    folder, reference = checkpoint
    out = _run(f"""
        import json, transformers, torch
        from sinklib import compat
        compat.apply_default_rope()
        model = transformers.AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        print("INV" + json.dumps(model.model.rotary_emb.inv_freq.tolist()))
    """)
    loaded = json.loads(out.split("INV", 1)[1].splitlines()[0])
    assert loaded != reference.model.rotary_emb.inv_freq.tolist()


def test_sinklib_load_gives_the_reference_model(checkpoint):
    folder, reference = checkpoint
    loaded = sinklib.load(str(folder), trust_remote_code=True)
    assert loaded.family.name == "dream" and loaded.calling == "dream_remote" and loaded.mask_id == 63
    expected = ["default_rope", "rotary_inv_freq"] if compat.needs_fixes() else []
    assert set(loaded.extra["compat"]) <= set(expected) and ("rotary_inv_freq" in loaded.extra["compat"]) == compat.needs_fixes()
    assert torch.equal(loaded.model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    ids = torch.randint(0, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, reference(ids).logits)


def test_remote_dream_traces_through_its_own_calling_convention(checkpoint):
    folder, reference = checkpoint
    loaded = sinklib.load(str(folder), trust_remote_code=True)
    trace = sinklib.generate(loaded, [5, 9, 2, 33], steps=4, gen_length=4, alg="maskgit_plus", progress=False)
    assert trace.layer_names == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    batched = sinklib.generate(loaded, [[5, 9, 2, 33], [7, 1]], steps=4, gen_length=4, alg="maskgit_plus", progress=False)
    assert batched[0].tokens.tolist() == trace.tokens.tolist()
    torch.testing.assert_close(batched[0].scores, trace.scores, atol=1e-5, rtol=0)


def test_remote_code_is_never_trusted_silently(checkpoint):
    folder, _ = checkpoint
    with pytest.raises(ValueError, match="pass trust_remote_code=True"):
        sinklib.load(str(folder))
