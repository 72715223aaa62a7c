"""A generation length given alone keeps a valid LLaDA block layout (experiments.sampling's rule), and the
lm-eval model honours a task's max_gen_toks unless model_args set gen_length."""
import logging

import pytest

import sinklib
from sinklib.experiments import sampling
from tests.standin import StandInLLaDA


@pytest.fixture(scope="module")
def llada():
    return sinklib.load(StandInLLaDA(), family="llada", mask_id=63)


@pytest.mark.parametrize("gen_length, block, steps", [(16, 16, 16), (128, 32, 128), (100, 25, 100), (96, 32, 96), (7, 7, 7)])
def test_gen_length_alone_gives_the_largest_block_dividing_it(llada, gen_length, block, steps):
    settings = sampling(llada, gen_length=gen_length)
    assert (settings["block_length"], settings["steps"]) == (block, steps)
    sinklib.families.llada.LLaDASettings(**settings).validate()  # a layout the sampler accepts


def test_explicit_values_win_and_steps_follow_the_blocks(llada):
    assert sampling(llada, steps=64, gen_length=64, block_length=8) == {"steps": 64, "gen_length": 64, "block_length": 8}
    assert sampling(llada, gen_length=64, block_length=8)["steps"] == 64
    with pytest.raises(ValueError, match="gen_length=30 is not allowed: gen_length must be a multiple of block_length=8"):
        sinklib.generate(llada, [1, 2, 3], **sampling(llada, gen_length=30, block_length=8), progress=False)


def test_lm_eval_model_honours_max_gen_toks_unless_gen_length_is_given(caplog):
    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    free = SinklibLM(pretrained="tiny-llada", device="cpu")
    assert free.settings_for(8) == {**free.settings, "gen_length": 8, "block_length": 8, "steps": 8}
    pinned = SinklibLM(pretrained="tiny-llada", device="cpu", gen_length=16)
    with caplog.at_level(logging.WARNING):
        assert pinned.settings_for(8) == pinned.settings
    assert "max_gen_toks=8; model_args gen_length=16 is used instead" in caplog.text
