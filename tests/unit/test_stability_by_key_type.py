"""Do sinks move, split by key type (dynamics.stability_by_key_type, frontier.frontier_tracking and
frontier_summary): against answers worked out by hand and against a plain-loop reference written from the
definitions, not from the code."""
import math
import random

import pytest
import torch

from sinklib import dynamics, frontier
from sinklib.trace import Trace

NAN = float("nan")


# -- the reference: the definitions, one Python loop each ----------------------------------------------------------
def _type_of(trace: Trace, step: int, position: int) -> str:
    if position < trace.prompt_len:
        return "prompt"
    return "masked" if bool(trace.is_masked[step, position]) else "decoded"


def _rows(trace: Trace) -> list:
    """scores as nested lists [step][layer][head][key], None for keys not existing; autoregressive decoding rows
    (one query, summing to 1) times their number of keys."""
    rows = []
    for step, block in enumerate(trace.scores.tolist()):
        scaled = []
        for layer in block:
            heads = []
            for row in layer:
                keys = sum(not math.isnan(v) for v in row)
                factor = keys if trace.is_autoregressive and step >= 1 else 1
                heads.append([None if math.isnan(v) else v * factor for v in row])
            scaled.append(heads)
        rows.append(scaled)
    return rows


def _is_sink(row: list, j: int, eps: float) -> bool:
    others = [v for i, v in enumerate(row) if v is not None and i != j]
    return row[j] > sum(others) / len(others) + eps


def _pair_keys(trace, rows, t, layer, head, key_type):
    before, after = rows[t - 1][layer][head], rows[t][layer][head]
    if key_type == "all":
        return [j for j, v in enumerate(before) if v is not None], [j for j, v in enumerate(after) if v is not None]
    same = [j for j in range(len(before)) if before[j] is not None and after[j] is not None
            and _type_of(trace, t - 1, j) == key_type]
    return same, same


def reference(traces, k: int, eps: float) -> dict:
    """{(model, key_type): (moves, pairs_with_sinks, [jaccards], [k used])}."""
    found = {}
    for trace in traces:
        rows = _rows(trace)
        model = trace.meta.get("model", "")
        _, layers, heads, _ = trace.scores.shape
        for key_type in dynamics.KEY_TYPES:
            moves, pairs, jaccards, widths = found.setdefault((model, key_type), [0, 0, [], []])
            for t in range(2 if trace.is_autoregressive else 1, trace.n_steps):
                for layer in range(layers):
                    for head in range(heads):
                        before, after = rows[t - 1][layer][head], rows[t][layer][head]
                        keys_before, keys_after = _pair_keys(trace, rows, t, layer, head, key_type)
                        if not keys_before or not keys_after:
                            continue
                        top_before = max(keys_before, key=lambda j: before[j])
                        top_after = max(keys_after, key=lambda j: after[j])
                        if _is_sink(before, top_before, eps) and _is_sink(after, top_after, eps):
                            found[(model, key_type)][1] += 1
                            found[(model, key_type)][0] += top_before != top_after
                        width = min(k, len(keys_before))
                        a = set(sorted(keys_before, key=lambda j: -before[j])[:width])
                        b = set(sorted(keys_after, key=lambda j: -after[j])[:width])
                        jaccards.append(len(a & b) / len(a | b))
                        widths.append(width)
    return found


def assert_matches_reference(traces, k: int, eps: float) -> None:
    table = dynamics.stability_by_key_type(traces, k=k, eps=eps)
    expected = reference(traces, k, eps)
    assert len(table) == len(expected)
    for row in table.to_dict("records"):
        moves, pairs, jaccards, widths = expected[(row["model"], row["key_type"])]
        assert row["pairs_with_sinks"] == pairs and row["jaccard_pairs"] == len(jaccards), row
        assert _same(row["move_rate"], moves / pairs if pairs else NAN), row
        assert _same(row["jaccard_mean"], sum(jaccards) / len(jaccards) if jaccards else NAN), row
        assert (row["k_used_min"], row["k_used_max"]) == ((min(widths), max(widths)) if widths else (0, 0)), row


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


# -- hand-built traces --------------------------------------------------------------------------------------------
def diffusion_trace(scores: torch.Tensor, masked_from: list, prompt_len: int = 2, model: str = "toy") -> Trace:
    """masked_from[t]: positions >= it are still masked at step t (left to right unmasking); or a list of sets."""
    steps, _, _, seq = scores.shape
    is_masked = torch.zeros(steps, seq, dtype=torch.bool)
    for t, spec in enumerate(masked_from):
        for position in (range(spec, seq) if isinstance(spec, int) else spec):
            is_masked[t, position] = True
    tokens = torch.full((steps + 1, seq), 4)
    tokens[:-1][is_masked] = 9
    return Trace(scores=scores, tokens=tokens, is_masked=is_masked, prompt_len=prompt_len, layer_names=["l0"],
                 token_strings={4: "a", 9: "[MASK]"}, meta={"model": model, "kind": "diffusion"})


def base_scores(steps: int, heads: int, seq: int) -> torch.Tensor:
    """Distinct small scores (0.30 + 0.01 · position): no ties, and no sink at ε = 3."""
    return (0.30 + 0.01 * torch.arange(seq, dtype=torch.float32)).repeat(steps, 1, heads, 1)


def prompt_sink_stays_masked_sink_moves() -> Trace:
    """seq 8, prompt 2, one position unmasked per step left to right (masked: 2..7, 3..7, 4..7, 5..7).
    Head 0: the prompt key 0 is a sink at every step (10.0); the greatest masked-key sink goes 7 → 3 → 3 → 6, and key 3
    is decoded at step 2 (masked at step 1) while staying the greatest. Head 1: no sink."""
    scores = base_scores(4, 2, 8)
    scores[:, 0, 0, 0] = 10.0
    scores[0, 0, 0, 7] = 6.0
    scores[1, 0, 0, 3] = 6.0
    scores[2, 0, 0, 3], scores[2, 0, 0, 6] = 6.5, 6.0
    scores[3, 0, 0, 6] = 6.0
    return diffusion_trace(scores, [2, 3, 4, 5])


def test_the_prompt_sink_stays_while_the_masked_key_sink_moves():
    table = dynamics.stability_by_key_type([prompt_sink_stays_masked_sink_moves()], k=2).set_index("key_type")
    # head 0 only (head 1 has no sink). all: key 0 at every step, 3 pairs, no move; prompt: the same.
    assert table.loc["all", ["move_rate", "pairs_with_sinks"]].tolist() == [0.0, 3]
    assert table.loc["prompt", ["move_rate", "pairs_with_sinks"]].tolist() == [0.0, 3]
    # masked: (0,1) 7 → 3 moved; (1,2) among keys masked at step 1 (3..7): 3 → 3 although 3 is decoded at step 2;
    # (2,3) among 4..7: 6 → 6
    assert table.loc["masked", "move_rate"] == pytest.approx(1 / 3) and table.loc["masked", "pairs_with_sinks"] == 3
    # decoded: (0,1) has no decoded key; (1,2) key 2 is no sink; (2,3) key 3 is a sink at step 2, not at step 3
    assert table.loc["decoded", "pairs_with_sinks"] == 0 and math.isnan(table.loc["decoded", "move_rate"])
    # top-2 Jaccard, head 0 then head 1 (its base scores rank 7, 6 first everywhere): masked (0,1) {7,6}/{3,7} = 1/3,
    # (1,2) {3,7}/{3,6} = 1/3, (2,3) {6,7}/{6,7} = 1; head 1's masked: {7,6} throughout = 1, 1, 1
    assert table.loc["masked", "jaccard_mean"] == pytest.approx((1 / 3 + 1 / 3 + 1 + 3) / 6)
    assert table.loc["masked", "jaccard_pairs"] == 6
    # decoded: no key at (0,1); (1,2) one key (k used 1), (2,3) two keys {2,3} at both steps, both heads
    assert table.loc["decoded", ["jaccard_mean", "jaccard_pairs", "k_used_min", "k_used_max"]].tolist() == [1.0, 4, 1, 2]
    assert table.loc["prompt", ["jaccard_mean", "k", "k_used_max"]].tolist() == [1.0, 2, 2]
    # all, head 0: {0,7}/{0,3} = 1/3, {0,3}/{0,3} = 1, {0,3}/{0,6} = 1/3; head 1: 1, 1, 1
    assert table.loc["all", "jaccard_mean"] == pytest.approx((1 / 3 + 1 + 1 / 3 + 3) / 6)
    assert_matches_reference([prompt_sink_stays_masked_sink_moves()], k=2, eps=3.0)


def test_a_key_changing_type_belongs_to_its_type_at_the_earlier_step():
    """Key 3 is the greatest masked sink at step 0 and is decoded by step 1, where it stays the greatest: for the pair
    (0,1) it is a masked key, so the masked sink did not move, and the decoded type has no key at step 0."""
    scores = base_scores(2, 1, 6)
    scores[:, 0, 0, 3] = 8.0
    table = dynamics.stability_by_key_type([diffusion_trace(scores, [{2, 3, 4, 5}, {2, 4, 5}])], k=1).set_index("key_type")
    assert table.loc["masked", ["move_rate", "pairs_with_sinks", "jaccard_mean"]].tolist() == [0.0, 1, 1.0]
    assert table.loc["decoded", ["pairs_with_sinks", "jaccard_pairs"]].tolist() == [0, 0]
    # had the type been taken at the later step, the masked top key at step 1 would be 5 (not a sink): no pair


def test_a_head_without_a_sink_counts_no_pair_but_has_an_overlap():
    table = dynamics.stability_by_key_type([diffusion_trace(base_scores(3, 1, 6), [2, 3, 4])], k=2)
    assert table["pairs_with_sinks"].tolist() == [0, 0, 0, 0] and table["move_rate"].isna().all()
    assert table["move_rate_ci_low"].isna().all() and table["move_rate_ci_high"].isna().all()
    # masked keys at step 1 are 3..5, top-2 {5,4} at both steps; decoded at step 1 is key 2 alone
    assert table.set_index("key_type")["jaccard_mean"].tolist() == [1.0, 1.0, 1.0, 1.0]


def test_random_traces_match_the_reference_loop():
    for seed in range(4):
        rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        traces = []
        for model in ("m1", "m2", "m1"):
            steps, seq, prompt_len = 6, 10, 3
            scores = torch.rand((steps, 2, 3, seq), generator=generator) ** 4 * seq
            order = list(range(prompt_len, seq))
            rng.shuffle(order)  # a random unmasking order, 0–2 positions a step
            masked, sets = set(order), []
            for _ in range(steps):
                sets.append(set(masked))
                for _ in range(rng.randint(0, 2)):
                    if order:
                        masked.discard(order.pop())
            traces.append(diffusion_trace(scores, sets, prompt_len=prompt_len, model=model))
        assert_matches_reference(traces, k=3, eps=1.0)
        assert_matches_reference(traces, k=20, eps=0.5)  # k above every type's count: capped per pair


def autoregressive_trace() -> Trace:
    """Prompt of 3, then one key written per step (seq 7, 5 steps). Decoding rows sum to 1; key 0 dominates steps 1
    and 2, key 4 (decoded since step 2) step 3, key 4 step 4."""
    steps, seq, prompt_len = 5, 7, 3
    scores = torch.full((steps, 1, 1, seq), NAN)
    scores[0, 0, 0, :3] = torch.tensor([2.0, 0.6, 0.4])  # the prefill: column sums over 3 queries
    for t in range(1, steps):
        keys = prompt_len + t
        row = torch.linspace(0.05, 0.1, keys)
        row[0 if t < 3 else 4] = 3.0
        scores[t, 0, 0, :keys] = row / row.sum()
    tokens = torch.tensor([[1, 2, 3] + [0] * 4])
    tokens = tokens.repeat(steps + 1, 1)
    for t in range(steps + 1):
        tokens[t, prompt_len:prompt_len + t] = 5
    return Trace(scores=scores, tokens=tokens, is_masked=tokens[:-1] == 0, prompt_len=prompt_len, layer_names=["l0"],
                 meta={"model": "toy-arm", "kind": "autoregressive"})


def test_an_autoregressive_trace_has_no_masked_row_and_skips_the_prefill():
    trace = autoregressive_trace()
    table = dynamics.stability_by_key_type([trace], k=2).set_index("key_type")
    assert table.loc["masked", ["pairs_with_sinks", "jaccard_pairs", "k_used_max"]].tolist() == [0, 0, 0]
    assert table.loc["masked", ["move_rate", "jaccard_mean"]].isna().all()
    # pairs (1,2) (2,3) (3,4): key 0 → 0 → 4 → 4; the prefill pair (0,1) is skipped
    assert table.loc["all", ["move_rate", "pairs_with_sinks"]].tolist() == [pytest.approx(1 / 3), 3]
    # decoded keys at the earlier step: (1,2) {3}, (2,3) {3,4}: 4 is the top at step 3 but not a sink at step 2,
    # (3,4) {3,4,5}: key 4 → 4
    assert table.loc["decoded", ["move_rate", "pairs_with_sinks"]].tolist() == [0.0, 1]
    assert_matches_reference([trace], k=2, eps=3.0)
    overlap = dynamics.topk_overlap(trace, 2)  # prompt (3) >= k: the same cap as topk_overlap
    assert table.loc["all", "jaccard_mean"] == pytest.approx(overlap["jaccard"].mean())


def test_the_wilson_interval_is_scipys():
    stats = pytest.importorskip("scipy.stats")
    row = dynamics.stability_by_key_type([prompt_sink_stays_masked_sink_moves()], k=2).set_index("key_type").loc["masked"]
    interval = stats.binomtest(1, 3).proportion_ci(0.95, method="wilson")
    assert row["move_rate_ci_low"] == pytest.approx(interval.low) and row["move_rate_ci_high"] == pytest.approx(interval.high)


def test_bad_k_and_eps_are_refused_by_name():
    trace = prompt_sink_stays_masked_sink_moves()
    with pytest.raises(ValueError) as error:
        dynamics.stability_by_key_type([trace], k=0)
    assert str(error.value) == "k=0 is not allowed: k must be an integer >= 1"
    with pytest.raises(ValueError, match=r"^eps=-1\.0 is not allowed: eps must be a finite number >= 0$"):
        dynamics.stability_by_key_type([trace], eps=-1.0)


def test_no_traces_give_an_empty_table_with_the_columns():
    assert list(dynamics.stability_by_key_type([]).columns) == dynamics.STABILITY_COLUMNS
    assert frontier.frontier_summary([]).empty


def test_key_types_encode_prompt_decoded_and_masked():
    trace = diffusion_trace(base_scores(2, 1, 5), [{2, 4}, {4}])
    assert dynamics.key_types(trace).tolist() == [[1, 1, 3, 2, 3], [1, 1, 2, 2, 3]]
    assert [dynamics.KEY_TYPES[i] for i in dynamics.key_types(trace)[0]] == ["prompt", "prompt", "masked", "decoded",
                                                                              "masked"]


# -- frontier tracking --------------------------------------------------------------------------------------------
def riding_canvas(masked_sets: list, sink_at: list, seq: int = 10) -> Trace:
    """Head 0's greatest key is a sink at sink_at[t]; head 1 has none."""
    scores = base_scores(len(masked_sets), 2, seq)
    for t, position in enumerate(sink_at):
        scores[t, 0, 0, position] = 8.0
    return diffusion_trace(scores, masked_sets)


def test_a_sink_riding_the_rightmost_masked_token_leftward():
    """Unmasking from both ends (masked 2..9, 3..8, 4..7, 5..6): the sink sits on the rightmost masked token, which moves
    left, while the frontier (leftmost masked) moves right."""
    trace = riding_canvas([set(range(2, 10)), set(range(3, 9)), set(range(4, 8)), {5, 6}], [9, 8, 7, 6])
    rows = frontier.frontier_tracking(trace)
    assert rows[["step", "layer", "head", "position", "frontier", "rightmost_masked"]].values.tolist() == [
        [0, 0, 0, 9, 2, 9], [1, 0, 0, 8, 3, 8], [2, 0, 0, 7, 4, 7], [3, 0, 0, 6, 5, 6]]
    assert rows["on_rightmost_masked"].all() and rows["on_masked"].all() and not rows["on_frontier"].any()
    assert rows["distance_to_frontier"].tolist() == [7.0, 5.0, 3.0, 1.0]
    assert (rows["key_type"] == "masked").all()
    summary = frontier.frontier_summary([trace]).iloc[0]
    assert summary["sink_rows"] == 4 and summary["share_on_rightmost_masked"] == 1.0 and summary["share_on_masked"] == 1.0
    assert summary["share_on_prompt"] == 0.0 and summary["share_on_decoded"] == 0.0
    assert summary["spearman_rightmost_median"] == pytest.approx(1.0)
    # masks only shrink: a sink moving left on the rightmost masked token cannot rise with the leftmost masked one
    assert summary["spearman_frontier_median"] == pytest.approx(-1.0) and summary["heads_correlated"] == 1


def test_right_to_left_unmasking_leaves_the_frontier_still_and_its_correlation_undefined():
    trace = riding_canvas([set(range(2, 10 - t)) for t in range(4)], [9, 8, 7, 6])
    summary = frontier.frontier_summary([trace]).iloc[0]
    assert summary["share_on_rightmost_masked"] == 1.0 and summary["spearman_rightmost_median"] == pytest.approx(1.0)
    assert math.isnan(summary["spearman_frontier_median"]) and summary["heads_correlated"] == 0


def test_a_sink_on_the_frontier_tracks_it_and_other_sinks_are_split_by_type():
    """Left-to-right unmasking (masked 2..9, 3..9, 4..9, 5..9, 6..9, then nothing): the sink is on the frontier at steps
    0–2, then on the prompt key 0 at step 3, on the decoded key 3 at step 4 and on the decoded key 9 at step 5."""
    trace = riding_canvas([2, 3, 4, 5, 6, set()], [2, 3, 4, 0, 3, 9])
    rows = frontier.frontier_tracking(trace)
    assert rows["on_frontier"].tolist() == [True, True, True, False, False, False]
    assert not rows["on_rightmost_masked"].any() and rows["rightmost_masked"].tolist() == [9, 9, 9, 9, 9, -1]
    assert rows["key_type"].tolist() == ["masked", "masked", "masked", "prompt", "decoded", "decoded"]
    assert rows["distance_to_frontier"].tolist()[:5] == [0.0, 0.0, 0.0, -5.0, -3.0]
    assert math.isnan(rows["distance_to_frontier"].iloc[5]) and rows["frontier"].iloc[5] == -1  # nothing masked
    summary = frontier.frontier_summary([trace]).iloc[0]
    assert summary[["share_on_rightmost_masked", "share_on_masked", "share_on_prompt", "share_on_decoded"]].tolist() == [
        0.0, pytest.approx(3 / 6), pytest.approx(1 / 6), pytest.approx(2 / 6)]
    # over the steps with a mask: positions 2, 3, 4, 0, 3 against frontiers 2, 3, 4, 5, 6, ranked by hand
    assert summary["spearman_frontier_median"] == pytest.approx(_pearson([2, 3.5, 5, 1, 3.5], [1, 2, 3, 4, 5]))
    only_frontier = frontier.frontier_summary([riding_canvas([2, 3, 4], [2, 3, 4])]).iloc[0]
    assert only_frontier["spearman_frontier_median"] == pytest.approx(1.0)


def _pearson(x: list, y: list) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_frontier_tracking_refuses_an_autoregressive_trace_by_name():
    trace = autoregressive_trace()
    with pytest.raises(ValueError, match=r"^trace is not allowed: trace must be a diffusion trace, but model 'toy-arm'"):
        frontier.frontier_tracking(trace)
    with pytest.raises(ValueError, match=r"^traces\[1\] is not allowed: .* model 'toy-arm' is autoregressive"):
        frontier.frontier_summary([prompt_sink_stays_masked_sink_moves(), trace])


# -- a real generation --------------------------------------------------------------------------------------------
def test_the_all_row_of_a_tiny_dream_generation_is_stability_by_layers_pooled_data():
    import sinklib

    dream = sinklib.load("tiny-dream")
    trace = sinklib.generate(dream, "1+2=", dream.settings_for(steps=8, gen_length=8), progress=False)
    for k, eps in ((3, 3.0), (5, 1.0)):
        table = dynamics.stability_by_key_type([trace], k=k, eps=eps).set_index("key_type")
        moves = dynamics._moves(trace, 0, eps)
        overlap = dynamics.topk_overlap(trace, k)
        assert table.loc["all", "pairs_with_sinks"] == len(moves) > 0
        assert table.loc["all", "move_rate"] == pytest.approx(moves["moved"].mean())
        assert table.loc["all", "jaccard_pairs"] == len(overlap)
        assert table.loc["all", "jaccard_mean"] == pytest.approx(overlap["jaccard"].mean())
        by_layer = dynamics.stability_by_layer([trace], k=k, eps=eps)  # every layer has the same number of pairs
        assert table.loc["all", "jaccard_mean"] == pytest.approx(by_layer["jaccard_mean"].mean())
        assert_matches_reference([trace], k=k, eps=eps)
