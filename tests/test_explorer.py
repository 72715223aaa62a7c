"""The explorer's callbacks, without a browser."""
import pytest
import torch

import sinklib
from sinklib import experiments, explorer
from tests.models import MASK_ID, diffusion_llama


@pytest.fixture(scope="module")
def setup():
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, [5, 9, 2, 33, 17, 8], steps=4, gen_length=4, progress=False)
    return loaded, trace


def test_render_shows_map_bars_and_canvas(setup):
    loaded, trace = setup
    view = explorer.render(loaded, trace, step=1, layer=1, head=2, eps=0.5)
    assert "step 1, layer 1, head 2" in view.scores.axes[0].get_title()
    assert view.canvas.split()[:6] == ["5", "9", "2", "33", "17", "8"] and view.canvas.count("▢") == 3
    expected = sinklib.find_sinks(trace.scores[1, 1, 2], 0.5).nonzero().flatten().tolist()
    assert view.sinks == expected
    image = view.attention.axes[0].images[0].get_array()
    assert image.shape == (10, 10)
    torch.testing.assert_close(torch.tensor(image.sum(0)), trace.scores[1, 1, 2], atol=1e-5, rtol=0)


def test_replayed_map_equals_a_map_kept_during_generation(setup):
    loaded, _ = setup
    kept = sinklib.generate(loaded, [5, 9, 2, 33, 17, 8], steps=4, gen_length=4, maps=[(2, 0, 3)], progress=False)
    torch.testing.assert_close(experiments.replay_map(loaded, kept, 2, 0, 3), kept.maps[(2, 0, 3)], atol=1e-6, rtol=0)


@pytest.mark.parametrize("step, layer, head, message", [(4, 0, 0, r"step=4 is not allowed: step must be in 0..3"),
                                                        (0, 2, 0, r"layer=2 is not allowed"), (0, 0, -1, r"head=-1")])
def test_out_of_range_controls_raise(setup, step, layer, head, message):
    loaded, trace = setup
    with pytest.raises(ValueError, match=message):
        explorer.render(loaded, trace, step, layer, head)
