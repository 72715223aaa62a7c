"""The logit lens (sinklib.lens) against independent references on the tiny zoo: its last layer is the model's own
output distribution (Dream's shifted by one), an intermediate layer is norm + lm_head applied by hand,
first_correct_layer on a hand-built frame, the masked sink / other comparison against Eq. 3 worked out by hand,
and bad arguments named."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

import sinklib
from sinklib.lens import first_correct_layer, layer_logits, logit_lens, sink_vs_other_masked

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

PROMPT = "Q: tom has 4 marbles . tom gives away 4 marbles . how many marbles does tom have left ? A:"
# how far ahead each zoo model's output predicts, written down here, not asked of sinklib: Dream's output i is token
# i + 1 (its sampler shifts logits right by one), LLaDA's is token i
OFFSET = {"tiny-llada": 0, "tiny-dream": 1}


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def run(request):
    loaded = sinklib.load(request.param)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=6, gen_length=6), progress=False)
    return request.param, loaded, trace, logit_lens(loaded, trace)


def _own_probs(model, canvas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, softmax) [seq, vocab] of the model's own forward over one canvas."""
    with torch.no_grad():
        logits = model(input_ids=canvas[None]).logits[0].float()
    return logits, torch.softmax(logits, -1)


def _check_rows(rows: pd.DataFrame, logits: torch.Tensor, probs: torch.Tensor, final: torch.Tensor, offset: int) -> None:
    """Each row (one layer) against a reference distribution [seq, vocab] indexed by the read position."""
    for row in rows.itertuples():
        i = row.position
        assert row.predicts == i + offset
        target = int(final[row.predicts])
        assert row.final_id == target and row.top_id == int(probs[i].argmax())
        assert math.isclose(row.top_prob, float(probs[i].max()), rel_tol=1e-4, abs_tol=1e-6)
        assert math.isclose(row.final_prob, float(probs[i, target]), rel_tol=1e-4, abs_tol=1e-6)
        assert row.final_rank == int((logits[i] > logits[i, target]).sum())


def test_the_last_layer_is_the_models_own_output_distribution(run):
    name, loaded, trace, frame = run
    offset, n_layers, seq = OFFSET[name], loaded.model.config.num_hidden_layers, trace.tokens.shape[1]
    assert len(frame) == trace.n_steps * n_layers * (seq - offset)
    last = frame[frame["layer"] == n_layers - 1]
    for step in range(trace.n_steps):
        logits, probs = _own_probs(loaded.model, trace.tokens[step])
        rows = last[last["step"] == step]
        assert sorted(rows["predicts"]) == list(range(offset, seq))
        _check_rows(rows, logits, probs, trace.tokens[-1], offset)
        torch.testing.assert_close(layer_logits(loaded, trace.tokens[step])[-1], logits, rtol=1e-5, atol=1e-5)
    # the test has power: the model's last hidden state is already normed, and norming it again changes the output
    with torch.no_grad():
        out = loaded.model(input_ids=trace.tokens[0][None], output_hidden_states=True)
        twice = loaded.model.lm_head(loaded.model.model.norm(out.hidden_states[-1]))
    assert (twice - out.logits).abs().max() > 1e-2


def test_an_intermediate_layer_is_norm_and_lm_head_applied_by_hand(run):
    name, loaded, trace, frame = run
    model, step, layer = loaded.model, 2, 1
    with torch.no_grad():
        hidden = model(input_ids=trace.tokens[step][None], output_hidden_states=True).hidden_states
        logits = model.lm_head(model.model.norm(hidden[layer + 1]))[0].float()  # hidden[0] is the embedding
    rows = frame[(frame["step"] == step) & (frame["layer"] == layer)]
    _check_rows(rows, logits, torch.softmax(logits, -1), trace.tokens[-1], OFFSET[name])
    torch.testing.assert_close(layer_logits(loaded, trace.tokens[step])[layer], logits, rtol=1e-5, atol=1e-5)
    masked = rows[rows["state"] == "masked"]
    assert len(masked) and trace.is_masked[step][masked["predicts"].tolist()].all()


def test_the_top_k_columns_and_a_position_selection():
    loaded = sinklib.load("tiny-dream")
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=4), progress=False)
    seq = trace.tokens.shape[1]
    frame = logit_lens(loaded, trace, steps=[1], positions=[seq - 1], top=3)
    assert set(frame["predicts"]) == {seq - 1} and set(frame["position"]) == {seq - 2} and set(frame["step"]) == {1}
    for row in frame.itertuples():
        assert row.top_ids[0] == row.top_id and row.top_probs[0] == row.top_prob
        assert list(row.top_probs) == sorted(row.top_probs, reverse=True)


def _hand_frame() -> pd.DataFrame:
    final = 7
    patterns = {(0, 5): "FTTT", (0, 6): "TFTT", (0, 7): "TTTF", (0, 8): "TTTT", (1, 5): "FFFF", (1, 6): "FFFT"}
    rows = [{"step": step, "predicts": predicts, "layer": layer, "final_id": final,
             "top_id": final if mark == "T" else 99}
            for (step, predicts), marks in patterns.items() for layer, mark in enumerate(marks)]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # row order must not matter


def test_first_correct_layer_on_a_hand_built_frame():
    result = first_correct_layer(_hand_frame()).set_index(["step", "predicts"])["first_correct_layer"]
    expected = {(0, 5): 1.0, (0, 6): 2.0, (0, 7): np.nan, (0, 8): 0.0, (1, 5): np.nan, (1, 6): 3.0}
    assert len(result) == len(expected)
    for key, value in expected.items():
        assert (math.isnan(result[key]) and math.isnan(value)) or result[key] == value, key
    with pytest.raises(ValueError, match=r"lens_frame .*missing \['final_id'\].* not allowed"):
        first_correct_layer(_hand_frame().drop(columns="final_id"))


def _eq3_sinks(trace, eps: float) -> set[tuple[int, int]]:
    """(step, position) that are the top key of some (layer, head) and pass s_j > mean_{k≠j} s_k + eps, by hand."""
    found = set()
    scores = trace.scores
    for step in range(scores.shape[0]):
        for layer in range(scores.shape[1]):
            for head in range(scores.shape[2]):
                row = scores[step, layer, head].double()
                j = int(row.argmax())
                if row[j] > (row.sum() - row[j]) / (row.numel() - 1) + eps:
                    found.add((step, j))
    return found


def test_masked_sinks_against_other_masked_positions_by_hand(run):
    name, loaded, trace, frame = run
    eps = 3.0
    sinks = _eq3_sinks(trace, eps)
    firsts = first_correct_layer(frame)
    last = frame[frame["layer"] == frame["layer"].max()].set_index(["step", "predicts"])
    groups = {"sink": [], "other masked": []}
    for row in firsts.itertuples():
        if trace.is_masked[row.step, row.position] and trace.is_masked[row.step, row.predicts]:
            at_last = last.loc[(row.step, row.predicts)]
            groups["sink" if (row.step, row.position) in sinks else "other masked"].append(
                (row.first_correct_layer, float(at_last["top_id"] == at_last["final_id"]), at_last["final_prob"]))
    summary = sink_vs_other_masked(loaded, [trace], eps).set_index("group")
    assert summary["n"].sum() == sum(len(v) for v in groups.values()) > 0
    for group, values in groups.items():
        assert summary.loc[group, "n"] == len(values)
        if not values:
            continue
        firsts_ = [v[0] for v in values if not math.isnan(v[0])]
        assert summary.loc[group, "n_ever_correct"] == len(firsts_)
        for column, expected in (("mean_first_correct_layer", np.mean(firsts_) if firsts_ else np.nan),
                                 ("share_final_at_last", np.mean([v[1] for v in values])),
                                 ("mean_final_prob_last", np.mean([v[2] for v in values]))):
            assert np.isclose(summary.loc[group, column], expected, equal_nan=True), (group, column)
    again = sink_vs_other_masked(None, [trace], eps, frames=[frame])
    pd.testing.assert_frame_equal(again, summary.reset_index())


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": [99]}, r"steps=99 is not allowed: steps must be an integer >= 0 and <= 3"),
    ({"steps": [-1]}, r"steps=-1 is not allowed"),
    ({"steps": 2}, r"steps=2 is not allowed: steps must be None or a non-empty list of integers in 0\.\.3"),
    ({"steps": []}, r"steps=\[\] is not allowed"),
    ({"positions": [500]}, r"positions=500 is not allowed"),
    ({"top": 0}, r"top=0 is not allowed"),
])
def test_bad_arguments_are_named(kwargs, message):
    loaded = sinklib.load("tiny-llada")
    trace = sinklib.generate(loaded, "Q: 3 + 4 = A:", loaded.settings_for(steps=4, gen_length=4), progress=False)
    with pytest.raises(ValueError, match=message):
        logit_lens(loaded, trace, **kwargs)


def test_a_trace_of_another_family_is_refused():
    dream = sinklib.load("tiny-dream")
    llada = sinklib.load("tiny-llada")
    trace = sinklib.generate(llada, "Q: 3 + 4 = A:", llada.settings_for(steps=2, gen_length=2), progress=False)
    with pytest.raises(ValueError, match=r"trace=.*llada trace.* not allowed.*dream model"):
        logit_lens(dream, trace)
