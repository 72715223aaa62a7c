import math

import pytest
import torch

import sinklib
from sinklib.sinks import uniform_scores


def reference_sinks(row, eps, valid=None):
    """Eq. 3 by the definition, one row at a time, in plain Python."""
    n = len(row)
    valid = valid or [True] * n
    idx = [j for j in range(n) if valid[j]]
    out = []
    for j in range(n):
        others = [row[k] for k in idx if k != j]
        out.append(bool(valid[j] and others and row[j] > sum(others) / len(others) + eps))
    return out


def heavy_tailed(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(*shape, generator=g)
    spikes = torch.rand(*shape, generator=g) > 0.93
    return scores + spikes * torch.rand(*shape, generator=g) * 30


@pytest.mark.parametrize("eps", [0.0, 1.5, 3.0, 10.0])
def test_find_sinks_matches_definition_on_any_leading_shape(eps):
    scores = heavy_tailed(3, 2, 5, 40)
    got = sinklib.find_sinks(scores, eps)
    assert got.shape == scores.shape
    flat_scores, flat_got = scores.reshape(-1, 40), got.reshape(-1, 40)
    for row, mask in zip(flat_scores.tolist(), flat_got.tolist()):
        assert mask == reference_sinks(row, eps)


def test_mean_units_divide_by_the_number_of_queries():
    scores = heavy_tailed(4, 64)
    assert torch.equal(sinklib.find_sinks(scores, 0.05, units="mean"), sinklib.find_sinks(scores / 64, 0.05))
    assert torch.equal(sinklib.find_sinks(scores, 0.05, units="mean", n_queries=8), sinklib.find_sinks(scores / 8, 0.05))


def test_invalid_keys_are_never_sinks_and_leave_the_mean():
    scores = torch.tensor([[50.0, 1.0, 1.0, 9.0, 1.0]])
    valid = torch.tensor([[False, True, True, True, True]])
    got = sinklib.find_sinks(scores, 3.0, valid=valid)
    assert got.tolist() == [reference_sinks(scores[0].tolist(), 3.0, valid[0].tolist())] == [[False, False, False, True, False]]
    assert sinklib.find_sinks(scores, 3.0).tolist() == [[True, False, False, False, False]]


def test_top_sinks_orders_by_score_and_pads_with_minus_one():
    scores = torch.tensor([[1.0, 20.0, 1.0, 12.0, 1.0, 1.0, 1.0, 1.0], [1.0] * 8])
    assert sinklib.top_sinks(scores, 3).tolist() == [[1, 3, -1], [-1, -1, -1]]
    assert sinklib.top_sinks(scores, 3, threshold=False)[0].tolist() == [1, 3, 0]
    assert sinklib.top_sinks(scores, 0).shape == (2, 0)


def test_threshold_sweep_counts_and_is_monotone():
    scores = heavy_tailed(6, 64, seed=3)
    eps_values = [0, 1, 2, 3, 5, 8]
    table = sinklib.threshold_sweep(scores, eps_values)
    assert list(table.columns) == ["eps", "units", "selected", "tokens", "share"]
    for eps, selected in zip(eps_values, table["selected"]):
        assert selected == sum(sum(reference_sinks(row, eps)) for row in scores.tolist())
    assert table["share"].is_monotonic_decreasing and (table["tokens"] == 6 * 64).all()


def test_uniform_causal_baseline_makes_position_zero_a_sink_in_40_tokens():
    baseline = sinklib.causal_uniform_scores(40)
    harmonic = [sum(1 / i for i in range(j + 1, 41)) for j in range(40)]  # s_j = H_40 − H_j
    torch.testing.assert_close(baseline, torch.tensor(harmonic), atol=1e-5, rtol=0)
    assert sinklib.find_sinks(baseline, 3.0).nonzero().flatten().tolist() == [0]
    assert math.isclose(float(baseline.sum()), 40.0, rel_tol=1e-6)
    assert not sinklib.find_sinks(uniform_scores(torch.ones(40, 40, dtype=torch.bool)), 0.0).any()


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf"), "3"])
def test_bad_eps_is_rejected(eps):
    with pytest.raises(ValueError, match=r"eps=.* is not allowed: eps must be a finite number >= 0"):
        sinklib.find_sinks(torch.ones(4), eps)


@pytest.mark.parametrize("k", [-1, 9])
def test_bad_k_is_rejected(k):
    with pytest.raises(ValueError, match=rf"k={k} is not allowed: k must be an integer >= 0 and <= 8"):
        sinklib.top_sinks(torch.ones(2, 8), k)


def test_unknown_units_suggests_the_closest():
    with pytest.raises(ValueError, match=r"units='means' is not allowed.*did you mean 'mean'"):
        sinklib.find_sinks(torch.ones(4), units="means")
    with pytest.raises(ValueError, match=r"eps_values"):
        sinklib.threshold_sweep(torch.ones(4), [])


def test_nan_scores_are_invalid_keys_in_every_sink_function():
    """An autoregressive trace holds NaN for keys a step cannot see; before, find_sinks found no sink in such a row
    and top_sinks ranked NaN first (returning −1 as the top sink)."""
    scores = heavy_tailed(5, 30, seed=4)
    scores[:, 20:] = float("nan")
    unseen = ~torch.isnan(scores)
    expected = [reference_sinks(row[:20], 3.0) + [False] * 10 for row in scores.tolist()]
    assert sinklib.find_sinks(scores, 3.0).tolist() == expected
    assert torch.equal(sinklib.find_sinks(scores, 3.0), sinklib.find_sinks(torch.nan_to_num(scores), 3.0, valid=unseen))
    assert torch.equal(sinklib.top_sinks(scores, 3), sinklib.top_sinks(torch.nan_to_num(scores), 3, valid=unseen))
    assert torch.equal(sinklib.top_sinks(scores, 3, threshold=False),
                       torch.nan_to_num(scores, nan=-1.0).topk(3, dim=-1).indices)
    assert int(sinklib.find_sinks(scores, 3.0).sum()) == int(sinklib.threshold_sweep(scores, [3.0])["selected"][0]) > 0


def test_an_autoregressive_trace_gives_the_same_sinks_to_find_sinks_and_threshold_sweep():
    loaded = sinklib.load("tiny-arm")
    trace = sinklib.generate(loaded, "12+7=", loaded.settings_for(gen_length=8), progress=False)
    assert torch.isnan(trace.scores).any(), "the test needs unseen keys"
    for eps in (3.0, 0.2):
        found = int(sinklib.find_sinks(trace.scores, eps).sum())
        assert found == int(sinklib.threshold_sweep(trace.scores, [eps])["selected"][0])
    assert found > 0
    assert (sinklib.top_sinks(trace.scores, 1, eps=0.2)[..., 0] >= 0).any()


def test_numpy_arrays_and_lists_are_scores_too():
    scores = heavy_tailed(3, 12, seed=5)
    assert torch.equal(sinklib.find_sinks(scores.numpy(), 1.0), sinklib.find_sinks(scores, 1.0))
    assert torch.equal(sinklib.top_sinks(scores.tolist(), 2), sinklib.top_sinks(scores, 2))
    assert sinklib.threshold_sweep([scores[0].numpy(), scores[1].numpy()], [1.0]).equals(
        sinklib.threshold_sweep([scores[0], scores[1]], [1.0]))


def test_a_single_row_in_sum_units_has_mean_one_over_its_keys():
    row = torch.softmax(torch.randn(3, 4, 7), -1)  # [batch, heads, keys]: rows that sum to 1
    scaled = sinklib.sinks.single_row_scores(row, 7)
    torch.testing.assert_close(scaled.mean(-1), torch.ones(3, 4))
    assert bool(sinklib.find_sinks(scaled, 3.0).any()) == bool((scaled - (7 - scaled) / 6 > 3.0).any())


def test_a_sink_rule_is_eq_3_by_the_definition_and_refuses_bad_settings_when_made():
    scores = heavy_tailed(4, 40, seed=3)
    rule = sinklib.SinkRule(eps=1.5)
    for row, mask in zip(scores.tolist(), rule.find(scores).tolist()):
        assert mask == reference_sinks(row, 1.5)
    top = rule.top(scores, 3)
    for row, positions, mask in zip(scores.tolist(), top.tolist(), rule.find(scores).tolist()):
        sinks = sorted((j for j in range(40) if mask[j]), key=lambda j: (-row[j], j))[:3]
        assert positions == sinks + [-1] * (3 - len(sinks))
    assert rule.share(scores) == sum(map(sum, rule.find(scores).tolist())) / scores.numel()
    assert sinklib.SinkRule(3) == sinklib.SinkRule(3.0, "sum") and hash(sinklib.SinkRule(3)) == hash(sinklib.SinkRule(3.0))
    with pytest.raises(ValueError, match=r"eps=-1 is not allowed: eps must be a finite number >= 0"):
        sinklib.SinkRule(-1)
    with pytest.raises(ValueError, match=r"units='means' is not allowed.*did you mean 'mean'"):
        sinklib.SinkRule(units="means")
