"""Sink dynamics on hand-built traces with known answers."""
import pytest
import torch

from sinklib import dynamics
from sinklib.trace import Trace

MASK = 9


def build_trace(sink_positions, seq=8, prompt_len=3):
    """One layer, one head; at each step the key at sink_positions[t] (None = none) receives 6.0 and the
    others share the rest evenly (sum units, total = seq). Positions prompt_len.. are unmasked one per step."""
    steps = len(sink_positions)
    scores = torch.full((steps, 1, 1, seq), 1.0)
    for t, position in enumerate(sink_positions):
        if position is not None:
            scores[t, 0, 0] = (seq - 6.0) / (seq - 1)
            scores[t, 0, 0, position] = 6.0
    tokens = torch.tensor([[1, 2, 3] + [MASK] * (seq - prompt_len)]).repeat(steps + 1, 1)
    for t in range(steps):
        tokens[t + 1:, min(prompt_len + t, seq - 1)] = 4 + t % 3
    is_masked = tokens[:-1] == MASK
    return Trace(scores=scores, tokens=tokens, is_masked=is_masked, prompt_len=prompt_len, layer_names=["l0"],
                 token_strings={1: "[BOS]", 2: "Q:", 3: "x", 4: "a", 5: "b", 6: "c", MASK: "[MASK]"}, meta={"model": "toy"})


def test_greatest_sinks_and_frontier():
    trace = build_trace([0, 0, 5, None])
    top = dynamics.greatest_sinks(trace)
    assert top["position"].tolist()[:3] == [0, 0, 5] and top["is_sink"].tolist() == [True, True, True, False]
    assert top["frontier"].tolist() == [3, 4, 5, 6]
    assert top["token"].tolist()[:3] == ["[BOS]", "[BOS]", "[MASK]"]


def test_moving_events_need_a_sink_on_both_sides():
    events = dynamics.moving_sink_events(build_trace([0, 0, 5, None, 2, 6]))
    assert events[["step", "position_before", "position", "shift"]].values.tolist() == [[2, 0, 5, 5], [5, 2, 6, 4]]


def test_transient_sinks_live_one_step():
    found = dynamics.transient_sinks(build_trace([None, 4, None, 4, 4, None]))
    assert found[["step", "position"]].values.tolist() == [[1, 4]]


def test_a_transient_sink_carries_its_closest_threshold_test():
    """threshold_gap: the smallest |s_j − mean of the others − eps| / (1 + s_j) of the three steps that decide the
    event (steps 0, 1, 2 at position 4), against the same sums by hand in float64."""
    trace = build_trace([None, 4, None, 4, 4, None])
    others = (8 - 6.0) / 7
    by_hand = min(abs(6.0 - others - 3.0) / 7, abs(1.0 - 1.0 - 3.0) / 2)  # the sink step; a step of equal scores
    assert dynamics.transient_sinks(trace)["threshold_gap"].tolist() == [pytest.approx(by_hand, rel=1e-6)]
    trace.scores[2, 0, 0, 4] = 4.0 - 1e-5  # step 2's key misses the threshold by 1e-5: what another CPU may round over
    assert dynamics.transient_sinks(trace)["threshold_gap"].tolist() == [pytest.approx(1e-5 / 5, rel=1e-2)]


def test_undecided_rows_are_the_positions_a_test_within_the_band_could_make_one_step_sinks():
    """transient_sinks(undecided=True): beside the one-step sink (transient True), each position that taking one
    test within THRESHOLD_BAND the other way makes a one-step sink, transient False; by hand on a trace whose step
    3's key 6 misses the threshold by 1e-5 of 1 + its score (inside the band) or by 0.01 (outside)."""
    trace = build_trace([None, 4, None, None, None, 4, None])
    events = dynamics.transient_sinks(trace)
    assert events[["step", "position", "transient"]].values.tolist() == [[1, 4, True], [5, 4, True]]
    assert dynamics.transient_sinks(trace, undecided=True).equals(events)  # no test near its threshold: no other row
    far = build_trace([None, 4, None, None, None, 4, None])
    far.scores[3, 0, 0, 6] = 4.0 - 5e-2  # step 3's key 6 misses by 0.05 / 5: no CPU's rounding makes it a sink
    assert dynamics.transient_sinks(far, undecided=True).equals(events)
    trace.scores[3, 0, 0, 6] = 4.0 - 1e-5  # by 1e-5 / 5: a sink at step 3 only, another CPU may say
    undecided = dynamics.transient_sinks(trace, undecided=True)
    assert undecided[["step", "position", "transient"]].values.tolist() == [[1, 4, True], [3, 6, False], [5, 4, True]]
    assert undecided["threshold_gap"].iloc[1] == pytest.approx(1e-5 / 5, rel=1e-2)
    assert dynamics.transient_sinks(trace)[["step", "position"]].values.tolist() == [[1, 4], [5, 4]]


def test_dynamics_summary_lifetime_and_move_rate():
    summary = dynamics.dynamics_summary([build_trace([0, 0, 0, 5, 5, None, 2])])
    row = summary.iloc[0]
    assert row["mean_lifetime"] == (3 + 2 + 1) / 3  # runs: 0×3, 5×2, 2×1
    assert row["move_rate"] == 1 / 4  # pairs with sinks on both sides: (0,0) (0,0) (0,5) (5,5)
    assert row["share_heads_with_sink"] == 6 / 7


def test_sink_token_frequency_counts_every_detection():
    table = dynamics.sink_token_frequency([build_trace([0, 0, 5]), build_trace([0, None, None])])
    assert table.to_dict("records") == [{"token": "[BOS]", "count": 3, "share": 0.75},
                                        {"token": "[MASK]", "count": 1, "share": 0.25}]


def test_main_sink_by_layer_head_is_the_step_mean_of_the_maximum():
    frame = dynamics.main_sink_by_layer_head(build_trace([0, None]))
    assert frame["score"].tolist() == [pytest_approx(3.5)]


def pytest_approx(value):
    import pytest

    return pytest.approx(value)


def test_query_group_split_needs_the_map_and_reads_it():
    trace = build_trace([0, 0])
    attention = torch.zeros(8, 8)
    attention[trace.is_masked[1], 6] = 1.0
    attention[~trace.is_masked[1], 1] = 1.0
    trace.maps[(1, 0, 0)] = attention
    split = dynamics.query_group_split(trace, 1, 0, 0)
    assert split[["group", "top_key"]].values.tolist() == [["masked queries", 6], ["unmasked queries", 1]]
    try:
        dynamics.query_group_split(trace, 0, 0, 0)
    except ValueError as error:
        assert "generate with maps=[(0, 0, 0)]" in str(error)
    else:
        raise AssertionError("a missing map must raise")


def test_autoregressive_rows_are_scaled_to_key_units_before_eq3():
    steps, seq = 3, 6
    scores = torch.full((steps, 1, 1, seq), float("nan"))
    scores[0, 0, 0, :4] = torch.tensor([2.5, 0.5, 0.5, 0.5])  # prefill: column sums over 4 queries
    scores[1, 0, 0, :5] = torch.tensor([0.8, 0.05, 0.05, 0.05, 0.05])  # one row, sums to 1
    scores[2, 0, 0, :6] = torch.tensor([0.2, 0.16, 0.16, 0.16, 0.16, 0.16])
    tokens = torch.tensor([[1, 2, 3, 4, 0, 0], [1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    trace = Trace(scores=scores, tokens=tokens, is_masked=tokens[:-1] == 0, prompt_len=4, layer_names=["l0"],
                  meta={"family": "arm"})
    comparable = dynamics.comparable_scores(trace)
    assert comparable[1, 0, 0, 0].item() == pytest_approx(4.0) and comparable[0, 0, 0, 0].item() == 2.5
    assert dynamics.sink_mask(trace, 2.0)[:, 0, 0, 0].tolist() == [False, True, False]


# -- what the notebooks pick to draw (sinklib.lab), against brute force ---------------------------------
def _random_trace(seed: int, steps=4, layers=2, heads=3, seq=8) -> Trace:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand((steps, layers, heads, seq), generator=generator) ** 4 * seq
    tokens = torch.tensor([[1, 2, 3] + [MASK] * (seq - 3)]).repeat(steps + 1, 1)
    for t in range(steps):
        tokens[t + 1:, 3 + t] = 4
    return Trace(scores=scores, tokens=tokens, is_masked=tokens[:-1] == MASK, prompt_len=3, layer_names=["l0", "l1"],
                 token_strings={1: "[BOS]", 2: "Q:", 3: "x", 4: "a", MASK: "[MASK]"}, meta={"model": "toy"})


def test_strongest_head_is_the_greatest_mean_over_steps_of_the_top_key():
    for seed in range(5):
        trace = _random_trace(seed)
        best = max(((float(trace.scores[:, layer, h].amax(-1).mean()), layer, h) for layer in range(2) for h in range(3)))
        assert dynamics.strongest_head(trace) == (best[1], best[2])


def test_busiest_head_has_the_most_steps_with_a_sink():
    for seed in range(5):
        trace = _random_trace(seed)
        sinks = dynamics.sink_mask(trace, 1.0).any(-1)  # [steps, layers, heads]
        counts = {(layer, h): int(sinks[:, layer, h].sum()) for layer in range(2) for h in range(3)}
        most = max(counts.values())
        assert dynamics.busiest_head(dynamics.greatest_sinks(trace, 1.0)) == min(k for k, v in counts.items() if v == most)


def test_the_top_moving_event_is_the_strongest_over_every_prompt():
    weak, strong = build_trace([0, 0, 5, None]), build_trace([1, 1, 6, 6, 2])
    strong.scores[4, 0, 0, 2] = 7.0  # the second prompt's move at step 4 (6 → 2) lands on the strongest sink
    events = dynamics.moving_events([weak, strong])
    assert events["trace"].tolist() == [0, 1, 1]
    top = dynamics.top_moving_event(events)
    assert (int(top["trace"]), int(top["step"]), int(top["position"])) == (1, 4, 2)
    assert dynamics.top_moving_event(dynamics.moving_events([build_trace([0, 0, 0])])) is None


def test_a_registered_autoregressive_family_is_rescaled_by_its_kind_not_its_name():
    """An autoregressive family added with register_family (any name) gets its decoding rows scaled to key units,
    as "arm" does; a trace saved before kinds were recorded falls back to its family's kind."""
    from sinklib.dynamics import comparable_scores
    from sinklib.trace import Trace

    scores = torch.full((3, 1, 1, 4), float("nan"))
    scores[0, ..., :2] = torch.tensor([1.5, 0.5])
    scores[1, ..., :3] = torch.tensor([0.5, 0.25, 0.25])
    scores[2] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    tokens = torch.zeros(3, 4, dtype=torch.long)

    def trace(meta):
        return Trace(scores=scores, tokens=tokens, is_masked=torch.zeros(3, 4, dtype=torch.bool), prompt_len=1,
                     layer_names=["l0"],
                     meta=meta)

    scaled = comparable_scores(trace({"family": "my-causal-lm", "kind": "autoregressive"}))
    assert torch.equal(scaled[1, ..., :3], torch.tensor([[[1.5, 0.75, 0.75]]]))  # × 3 keys
    assert torch.equal(scaled[2], torch.ones(1, 1, 4))
    assert torch.equal(comparable_scores(trace({"family": "arm"}))[1, ..., :3], scaled[1, ..., :3])
    torch.testing.assert_close(comparable_scores(trace({"family": "llada", "kind": "diffusion"})), scores, rtol=0, atol=0,
                               equal_nan=True)
