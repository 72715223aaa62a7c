"""The paper's checkpoints as a user downloads them — hub-style folders built from our stand-ins of the
LLaDA, Dream and MMaDA code (tests/remote_standins/) and a native Llama — load through sinklib.load on both
transformers majors and give exactly the model their own code builds. On transformers 5.x every named
compat fix is shown to be needed: with it switched off, the load fails the way the real code fails."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import sinklib
from sinklib import compat, mmada_repo
from tests import checkpoints

ROOT = Path(__file__).resolve().parents[2]
NEEDS_5 = pytest.mark.skipif(compat.transformers_major() < 5, reason="the failures exist on transformers 5.x only")
FIXES_ON_5 = {"llada": ["config_use_cache", "post_init", "tie_weights_signature"],
              "mmada": ["config_use_cache", "post_init", "tie_weights_signature"],
              "dream": ["default_rope", "generation_config_validate", "rotary_inv_freq"], "llama": []}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    repo = checkpoints.mmada_repository(root / "MMaDA")
    built = {family: checkpoints.build(family, root / family) for family in ("llada", "dream")}
    built["mmada"] = checkpoints.build("mmada", root / "mmada", repo / "models")
    built["llama"] = checkpoints.build_llama(root / "llama")
    return built, repo


@pytest.fixture
def mmada_env(folders, monkeypatch):
    monkeypatch.setenv(mmada_repo.ENV, str(folders[1]))


def _reference(folders, family):
    built, repo = folders
    return checkpoints.reference(built[family], family, repo / "models" if family == "mmada" else None)


@pytest.mark.parametrize("family", ["llada", "dream", "mmada"])
def test_load_gives_the_model_its_own_code_builds(folders, family, mmada_env):
    loaded = sinklib.load(folders[0][family], trust_remote_code=True)
    ids = checkpoints.token_ids(family)
    mask = {"llada": "<|mdm_mask|>", "mmada": "<|mdm_mask|>", "dream": "<|mask|>"}[family]
    assert (loaded.family.name, loaded.mask_id, loaded.model.dtype) == (family, ids[mask], torch.float32)
    assert loaded.calling == "remote"
    assert sorted(loaded.compat_fixes) == (sorted(FIXES_ON_5[family]) if compat.needs_fixes() else [])
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(0))
    reference = _reference(folders, family)
    with torch.no_grad():
        assert torch.equal(loaded.logits(tokens), reference(tokens).logits)
    # the whole traced generation through the chat template equals the same run on the reference module
    layout = dict(steps=4, gen_length=4, **({"block_length": 2} if family != "dream" else {}))
    prompt = "tom has 5 apples . how many apples does tom have now ?"
    trace = sinklib.generate(loaded, prompt, loaded.settings_for(**layout), progress=False)
    twin = sinklib.load(reference, family=family, tokenizer=loaded.tokenizer, mask_id=loaded.mask_id)
    expected = sinklib.generate(twin, prompt, twin.settings_for(**layout), progress=False)
    assert trace.tokens.tolist() == expected.tokens.tolist()
    torch.testing.assert_close(trace.scores, expected.scores, rtol=0, atol=1e-6)
    chat_start = {"dream": "<|im_start|>", "llada": "<|startoftext|>", "mmada": "<|startoftext|>"}[family]
    assert trace.tokens[0, 0].item() == ids[chat_start], trace.tokens[0].tolist()  # the chat template was applied


def test_native_llama_folder_is_the_autoregressive_family(folders):
    loaded = sinklib.load(folders[0]["llama"])
    ids = checkpoints.token_ids("llama")
    assert (loaded.family.name, loaded.calling, loaded.compat_fixes) == ("arm", "native", ())
    assert set(loaded.eos_ids) >= {ids["<|end_of_text|>"], ids["<|eot_id|>"]}
    trace = sinklib.generate(loaded, "tom has 5 apples", loaded.settings_for(gen_length=3), progress=False)
    assert trace.tokens[0, 0].item() == ids["<|begin_of_text|>"]


def test_dtype_none_is_float32_on_both_majors_and_auto_is_the_checkpoints_own(folders):
    # Dream's config.json declares bfloat16: transformers 5 would load that by default, 4.x float32
    assert sinklib.load(folders[0]["dream"], trust_remote_code=True).model.dtype == torch.float32
    assert sinklib.load(folders[0]["dream"], trust_remote_code=True, dtype="auto").model.dtype == torch.bfloat16


def test_remote_code_is_never_trusted_silently(folders, mmada_env):
    for family in ("llada", "dream", "mmada"):
        with pytest.raises(ValueError, match="pass trust_remote_code=True"):
            sinklib.load(folders[0][family])


@pytest.mark.process
def test_mmada_needs_only_the_repositorys_text_files(folders, mmada_env):
    # the repository's package __init__ imports the image tokenizer and its missing dependency, as MMaDA's does
    # (the stand-in's missing module is sinklib_tests_absent_image_dependency; the real repository's, einops or diffusers)
    out = subprocess.run([sys.executable, "-c", "import models"], cwd=folders[1], capture_output=True, text=True)
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, out.stderr[-2000:]
    assert type(sinklib.load(folders[0]["mmada"], trust_remote_code=True).model).__name__ == "MMadaModelLM"


def _fresh_mmada_import(monkeypatch):
    monkeypatch.setattr(mmada_repo, "_imported", None)
    for name in [n for n in sys.modules if n.startswith(mmada_repo.PACKAGE)]:
        monkeypatch.delitem(sys.modules, name)


def test_mmada_without_the_repository_says_what_to_do(folders, monkeypatch, tmp_path):
    _fresh_mmada_import(monkeypatch)
    monkeypatch.delenv(mmada_repo.ENV, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(folders[1])])
    with pytest.raises(ImportError, match=r"SINKLIB_MMADA_REPO.*git clone https://github.com/Gen-Verse/MMaDA"
                                          r"|git clone.*SINKLIB_MMADA_REPO"):
        sinklib.load(folders[0]["mmada"], trust_remote_code=True)
    monkeypatch.setenv(mmada_repo.ENV, str(tmp_path))
    with pytest.raises(ImportError, match=r"is not the MMaDA repository: .*modeling_mmada.py does not exist"):
        sinklib.load(folders[0]["mmada"], trust_remote_code=True)


def test_mmada_import_failure_shows_the_cause_and_what_to_install(folders, monkeypatch, tmp_path):
    _fresh_mmada_import(monkeypatch)
    broken = checkpoints.mmada_repository(tmp_path / "MMaDA")
    source = broken / "models" / "modeling_mmada.py"
    # appended, not prepended: the real file opens with `from __future__ import annotations`, which must stay first
    source.write_text(source.read_text() + "\nimport jaxtyping_absent_for_sinklib_tests\n")
    monkeypatch.setenv(mmada_repo.ENV, str(broken))
    with pytest.raises(ImportError, match="pip install jaxtyping_absent_for_sinklib_tests") as error:
        sinklib.load(folders[0]["mmada"], trust_remote_code=True)
    assert isinstance(error.value.__cause__, ModuleNotFoundError)
    assert "diffusers==0.32.2" in str(error.value)


# Each fix switched off in a fresh process (fixes patch classes for the process's lifetime); each folder is
# copied under a new name so that transformers imports its code afresh.
_WITHOUT = """
    import json, shutil, sys, torch, traceback
    import sinklib
    from sinklib import compat, mmada_repo
    from tests import checkpoints
    folder, family, repo, fixes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    reference = checkpoints.reference(folder, family, repo + "/models" if family == "mmada" else None)
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(0))
    saved = dict(compat.CLASS_FIXES), compat.restore_use_cache, compat.recompute_rotary_inv_freq, compat.apply_default_rope
    results = {}
    for fix in fixes:
        compat.CLASS_FIXES.clear(); compat.CLASS_FIXES.update(saved[0])
        compat.restore_use_cache, compat.recompute_rotary_inv_freq, compat.apply_default_rope = saved[1:]
        if fix in compat.CLASS_FIXES:
            del compat.CLASS_FIXES[fix]
        elif fix == "config_use_cache":
            compat.restore_use_cache = lambda config, raw: False
        elif fix == "rotary_inv_freq":
            compat.recompute_rotary_inv_freq = lambda model: []
        elif fix == "default_rope":
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            ROPE_INIT_FUNCTIONS.pop("default", None)
            compat.apply_default_rope = lambda: False
        copy = f"{folder}-without-{fix}"
        shutil.copytree(folder, copy)
        mmada_repo._imported = None
        for name in [n for n in sys.modules if n.startswith("sinklib_mmada_models")]:
            del sys.modules[name]
        try:
            model = sinklib.load(copy, trust_remote_code=True)
            with torch.no_grad():
                results[fix] = "same logits" if torch.equal(model.logits(tokens), reference(tokens).logits) else "other logits"
        except Exception as error:
            results[fix] = f"{type(error).__name__}: {error}"
    print("RESULTS" + json.dumps(results))
"""
FAILURE_WITHOUT = {
    "config_use_cache": "AttributeError: 'LLaDAConfig' object has no attribute 'use_cache'",
    "post_init": "object has no attribute 'all_tied_weights_keys'",
    "tie_weights_signature": "TypeError: ",
    "default_rope": "KeyError: 'default'",
    "generation_config_validate": "got an unexpected keyword argument 'user_set_attributes'",
    "rotary_inv_freq": "other logits",
}


@pytest.mark.process
@NEEDS_5
@pytest.mark.slow
@pytest.mark.parametrize("family", ["llada", "dream", "mmada"])
def test_each_compat_fix_is_needed_on_transformers_5(folders, family, mmada_env):
    built, repo = folders
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_WITHOUT), str(built[family]), family, str(repo),
                          json.dumps(FIXES_ON_5[family])], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert "RESULTS" in out.stdout, out.stderr[-3000:]
    results = json.loads(out.stdout.split("RESULTS", 1)[1])
    for fix in FIXES_ON_5[family]:
        expected = FAILURE_WITHOUT[fix].replace("'LLaDAConfig'", "'MMadaConfig'" if family == "mmada" else "'LLaDAConfig'")
        assert expected in results[fix], (fix, results[fix])
