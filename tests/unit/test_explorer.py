"""The explorer's callbacks, without a browser."""
import pytest
import torch

import sinklib
from sinklib import explorer
from sinklib.capturing.replay import replay_map
from tests.models import MASK_ID, diffusion_llama


@pytest.fixture(scope="module")
def setup():
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, [5, 9, 2, 33, 17, 8], loaded.settings_for(steps=4, gen_length=4), progress=False)
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
    kept = sinklib.generate(loaded, [5, 9, 2, 33, 17, 8], loaded.settings_for(steps=4, gen_length=4), maps=[(2, 0, 3)],
                            progress=False)
    torch.testing.assert_close(replay_map(loaded, kept, 2, 0, 3), kept.maps[(2, 0, 3)], atol=1e-6, rtol=0)


@pytest.mark.parametrize("step, layer, head, message", [(4, 0, 0, r"step=4 is not allowed: step must be in 0..3"),
                                                        (0, 2, 0, r"layer=2 is not allowed"), (0, 0, -1, r"head=-1")])
def test_out_of_range_controls_raise(setup, step, layer, head, message):
    loaded, trace = setup
    with pytest.raises(ValueError, match=message):
        explorer.render(loaded, trace, step, layer, head)


# -- the widget and the exported page, without a browser ------------------------------------------------------
import base64  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402
import traitlets  # noqa: E402

from sinklib.explorer import payload  # noqa: E402
from sinklib.explorer.page import to_html  # noqa: E402


def _floats(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def test_header_main_sinks_match_a_loop_over_every_head(setup):
    _, trace = setup
    header = payload.header(trace)
    steps, layers, heads, seq = trace.scores.shape
    main = _floats(header["main_score"]).reshape(steps, layers, heads)
    for s in range(steps):
        for layer in range(layers):
            for h in range(heads):
                row = [float(v) for v in trace.scores[s, layer, h]]
                best = max(range(seq), key=lambda p: (row[p], -p))
                assert header["main_position"][s][layer][h] == best and main[s, layer, h] == np.float32(row[best])
    assert header["canvas"] == trace.tokens.tolist() and header["decoded_at"] == trace.unmasked_at.tolist()
    assert (header["n_steps"], header["n_layers"], header["n_heads"], header["seq"]) == (steps, layers, heads, seq)


def test_autoregressive_nan_keys_are_never_the_main_sink():
    loaded = sinklib.load(diffusion_llama("arm"))
    trace = sinklib.generate(loaded, [5, 9, 2, 33], loaded.settings_for(gen_length=3), progress=False)
    assert trace.scores.isnan().any()
    _, positions = payload.main_sinks(trace.scores)
    assert not trace.scores.gather(-1, positions[..., None]).isnan().any()
    raw = np.frombuffer(payload.step_scores(trace, 0), dtype="<f4").reshape(trace.scores.shape[1:])
    np.testing.assert_array_equal(raw, trace.scores[0].numpy())  # NaN kept in the bytes


def test_widget_sends_one_step_and_the_replayed_map_of_the_selection(setup):
    loaded, trace = setup
    widget = explorer.Explorer(trace, loaded, eps=0.5)
    layer, head = payload.strongest_head_at_step(trace, 0)
    assert (widget.step, widget.layer, widget.head) == (0, layer, head)
    widget.step, widget.layer, widget.head = 2, 1, 3
    received = np.frombuffer(widget.scores, dtype="<f4").reshape(trace.scores.shape[1:])
    np.testing.assert_array_equal(received, trace.scores[2].numpy())
    assert widget.shown_step == 2 and widget.attention_of == [2, 1, 3, 10, 10]
    expected = replay_map(loaded, trace, 2, 1, 3).numpy()
    np.testing.assert_array_equal(np.frombuffer(widget.attention, dtype="<f4").reshape(10, 10), expected)


def test_widget_without_a_model_sends_no_map(setup):
    _, trace = setup
    widget = explorer.Explorer(trace)
    widget.step = 3
    assert widget.attention == b"" and widget.attention_of == [] and widget.shown_step == 3


@pytest.mark.parametrize("name, value, message", [("step", 4, r"step=4 is not allowed: step must be an int in 0\.\.3"),
                                                  ("layer", -1, r"layer=-1 is not allowed"),
                                                  ("head", 4, r"head=4 is not allowed: head must be an int in 0\.\.3"),
                                                  ("eps", -1.0, r"eps=-1.0 is not allowed")])
def test_widget_refuses_out_of_range_controls(setup, name, value, message):
    _, trace = setup
    widget = explorer.Explorer(trace)
    with pytest.raises(traitlets.TraitError, match=message):
        setattr(widget, name, value)


def test_widget_refuses_a_wrong_trace_or_model(setup):
    loaded, trace = setup
    with pytest.raises(TypeError, match=r"trace=dict is not allowed"):
        explorer.Explorer({})
    with pytest.raises(TypeError, match=r"loaded=str is not allowed"):
        explorer.Explorer(trace, "tiny-llada")
    with pytest.raises(traitlets.TraitError, match=r"step=9 is not allowed"):
        explorer.Explorer(trace, step=9)


def _embedded(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="sinklib-explorer-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_page_embeds_every_step_fetches_nothing_and_is_deterministic(setup, tmp_path):
    _, trace = setup
    first = explorer.to_html(trace, tmp_path / "a.html")
    second = explorer.to_html(trace, tmp_path / "b.html")
    assert first.read_bytes() == second.read_bytes()
    page = first.read_text()
    data = _embedded(page)
    np.testing.assert_array_equal(_floats(data["scores"]).reshape(trace.scores.shape), trace.scores.numpy())
    opened = (data["state"]["layer"], data["state"]["head"])
    assert data["state"]["eps"] == 3.0 and opened == payload.strongest_head_at_step(trace)
    assert not re.search(r"(src|href)=|https?://|fetch\(|import\(", page)  # self-contained
    assert "export default" not in page and "render({ model: staticModel(data)" in page


def test_page_escapes_token_text_that_would_end_the_script(setup, tmp_path):
    _, trace = setup
    trace.token_strings[5] = "</script><b>"
    try:
        page = explorer.to_html(trace, tmp_path / "p.html").read_text()
    finally:
        del trace.token_strings[5]
    assert "</script><b>" not in page and _embedded(page)["header"]["vocab"]["5"] == "</script><b>"


@pytest.mark.parametrize("kwargs, message", [(dict(path="page.txt"), r"path='.*page.txt' is not allowed: .* end in \.html"),
                                             (dict(path="p.html", eps=float("nan")), r"eps=nan is not allowed")])
def test_page_refuses_bad_arguments(setup, tmp_path, kwargs, message):
    _, trace = setup
    kwargs["path"] = tmp_path / kwargs["path"]
    with pytest.raises(ValueError, match=message):
        explorer.to_html(trace, **kwargs)
    assert not kwargs["path"].exists()


def test_page_names_keep_the_last_part_of_a_hub_id():
    assert explorer.page_name("GSAI-ML/LLaDA-8B-Instruct") == "explorer_LLaDA-8B-Instruct.html"
    assert explorer.page_name("tiny-dream") == "explorer_tiny-dream.html"


def test_page_of_a_large_trace_keeps_evenly_spaced_layers_within_its_budget(setup, tmp_path):
    _, trace = setup  # 2 layers × 4 heads × 10 keys × 4 steps: 160 floats a layer, 853 bytes as base64
    per_layer_mb = 4 * 4 * 10 * 4 * 4 / 3 / 2**20
    assert explorer.page_layers(trace, None, 1.5 * per_layer_mb) == [0]
    assert explorer.page_layers(trace, None, 2 * per_layer_mb) == [0, 1]
    data = _embedded(explorer.to_html(trace, tmp_path / "p.html", max_mb=1.5 * per_layer_mb).read_text())
    assert data["header"]["layer_ids"] == [0] and data["header"]["model_layers"] == 2
    np.testing.assert_array_equal(_floats(data["scores"]).reshape(4, 1, 4, 10), trace.scores[:, [0]].numpy())
    chosen = _embedded(explorer.to_html(trace, tmp_path / "q.html", layers=[1]).read_text())["header"]
    assert chosen["layer_ids"] == [1] and chosen["layer_names"] == trace.layer_names[1:]
    with pytest.raises(ValueError, match=r"max_mb=1e-06 is not allowed: one layer of this trace needs"):
        explorer.to_html(trace, tmp_path / "r.html", max_mb=1e-6)
    with pytest.raises(ValueError, match=r"layers=\[2\] is not allowed: layers must be distinct ints in 0\.\.1"):
        explorer.to_html(trace, tmp_path / "r.html", layers=[2])


def _one_trace(token_text: str = "x", scores=None) -> sinklib.Trace:
    scores = torch.rand(2, 1, 2, 4) if scores is None else scores
    return sinklib.Trace(scores=scores, tokens=torch.tensor([[1, 2, 3, 4]] * 3), is_masked=torch.zeros(2, 4, dtype=torch.bool),
                         prompt_len=1, layer_names=["l0"], token_strings={1: token_text, 2: "b", 3: "c", 4: "d"},
                         meta={"model": "tiny-llada"})


@pytest.mark.parametrize("text", ["<!--<script>", "</script><script>alert(1)</script>", "a & b > c"])
def test_a_page_keeps_any_token_text_inside_its_data(text, tmp_path):
    """Before: a token holding `<!--<script>` left the page blank (the data's <script> element never ended)."""
    page = to_html(_one_trace(text), tmp_path / "page.html").read_text()
    data = page.split('id="sinklib-explorer-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data and "&" not in data, "nothing in the data can end its element"
    assert json.loads(data)["header"]["vocab"]["1"] == text


def test_an_all_nan_trace_writes_valid_json(tmp_path):
    """Before: -Infinity in the JSON (JSON.parse refuses it: a blank page)."""
    page = to_html(_one_trace(scores=torch.full((2, 1, 2, 4), float("nan"))), tmp_path / "page.html").read_text()
    data = page.split('id="sinklib-explorer-data">', 1)[1].split("</script>", 1)[0]
    assert "Infinity" not in data and "NaN" not in data and json.loads(data)["header"]["score_max"] == 0.0


@pytest.mark.parametrize("max_mb, message", [(float("nan"), "max_mb=nan"), (float("inf"), "max_mb=inf"), ("25", "max_mb='25'"),
                                             (0, "max_mb=0")])
def test_bad_page_sizes_are_refused(max_mb, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message) + " is not allowed"):
        to_html(_one_trace(), tmp_path / "page.html", max_mb=max_mb)


def test_a_trace_without_steps_is_refused(tmp_path):
    empty = sinklib.Trace(scores=torch.zeros(0, 1, 1, 2), tokens=torch.zeros(1, 2, dtype=torch.long),
                          is_masked=torch.zeros(0, 2, dtype=torch.bool), prompt_len=1, layer_names=["l0"])
    with pytest.raises(ValueError, match="it has no step"):
        to_html(empty, tmp_path / "page.html")


def test_pages_that_would_share_a_name_are_refused(tmp_path):
    """Before: two folders with one last name wrote one page and returned two paths."""
    from sinklib.explorer import export_pages

    with pytest.raises(ValueError, match=r"would share the name 'explorer_model.html'"):
        export_pages(["/a/model", "/b/model"], tmp_path, "1+2=")
    assert list(tmp_path.iterdir()) == []


def test_the_explorer_refuses_a_model_that_did_not_make_the_trace():
    from sinklib.explorer import Explorer

    with pytest.raises(ValueError, match=r"loaded='tiny-dream' is not allowed: this trace was made by 'tiny-llada'"):
        Explorer(_one_trace(), sinklib.load("tiny-dream"))


def test_header_says_which_queries_a_cached_step_computed():
    """A cached sampler's trace carries Trace.recomputed into the explorer's data (its step label names the window);
    a plain trace's is null."""
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    cached = sinklib.generate(loaded, [5, 9, 2, 33], loaded.settings_for(steps=4, gen_length=8, block_length=4, cache="dual"),
                              progress=False)
    header = payload.header(cached)
    assert header["recomputed"][0] == [1] * 12 and header["recomputed"][1] == [0] * 4 + [1] * 4 + [0] * 4
    plain = sinklib.generate(loaded, [5, 9, 2, 33], loaded.settings_for(steps=4, gen_length=8, block_length=4), progress=False)
    assert payload.header(plain)["recomputed"] is None
