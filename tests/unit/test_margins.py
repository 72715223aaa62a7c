"""Decision margins where confidences saturate: hand-worked cases of ties.confidence_margin, and the
agreement helpers that read margins."""
import math

import pytest
import torch

from sinklib.ties import NEAR_TIE, closest_margin, is_near_tie
from sinklib.ties import choice_margin, confidence_margin


def rows(*gaps: float, rivals: int = 1) -> torch.Tensor:
    """One logits row per gap: the top token at 0, `rivals` tokens each `gap` below it."""
    return torch.tensor([[0.0] + [-g] * rivals for g in gaps], dtype=torch.float32)


def test_two_probabilities_saturated_on_every_cpu_are_an_exact_tie():
    # rivals 40 and 30 logits below: float32 rounds both probabilities to exactly 1.0 whatever the kernel
    assert confidence_margin(rows(40.0), rows(30.0), torch.float32, "probability") == 0.0


def test_saturated_against_one_rounding_step_below_is_no_tie():
    # 1.0 against 1 − 2^-24: the rival holding 2^-24 · 1.2 alone keeps the second below 1 in every summation order
    gap = -math.log(2 ** -24 * 1.2)
    margin = confidence_margin(rows(40.0), rows(gap), torch.float32, "probability")
    assert margin > NEAR_TIE and not is_near_tie(margin)


def test_probabilities_a_softmax_rounding_apart_are_a_near_tie():
    # 90 rivals each 16 logits down (1 − p ≈ 1e-5): 0.1 % apart in log-odds is within one lane's rounding
    margin = confidence_margin(rows(16.001, rivals=90), rows(16.0, rivals=90), torch.float32, "probability")
    assert is_near_tie(margin)
    assert not is_near_tie(confidence_margin(rows(17.0, rivals=90), rows(16.0, rivals=90), torch.float32, "probability"))


def test_entropies_of_zero_are_an_exact_tie_and_a_measurable_gap_is_not():
    assert confidence_margin(rows(200.0), rows(180.0), torch.float32, "entropy") == 0.0
    assert confidence_margin(rows(20.0), rows(18.0), torch.float32, "entropy") > NEAR_TIE


def test_choice_margin_takes_every_entry_tied_at_the_boundary():
    """Three positions at p = 1.0: choosing the first over two saturated ones is exact; over one that only rounds
    to 1.0 on some CPUs (its rivals' mass at 2^-24, half float32's spacing above 1) it is not."""
    values = torch.tensor([[1.0, 1.0, 1.0]])
    chosen = torch.tensor([[True, False, False]])
    saturated = torch.cat([rows(40.0), rows(35.0), rows(30.0)])[None]
    assert choice_margin(values, chosen, saturated, "probability").item() == 0.0
    borderline = torch.cat([rows(40.0), rows(35.0), rows(-math.log(2 ** -24))])[None]
    assert is_near_tie(choice_margin(values, chosen, borderline, "probability").item())


def test_an_unknown_confidence_kind_is_refused_by_name():
    with pytest.raises(ValueError, match=r"kind='likelihood' is not allowed: choose one of \('probability'"):
        confidence_margin(rows(1.0), rows(2.0), torch.float32, "likelihood")


@pytest.mark.parametrize("margins, closest", [([0.3, 0.0, 2e-4], 2e-4), ([0.0, 0.0], math.inf), ([], None),
                                              ([math.nan], None), ([math.inf, 0.5], 0.5)])
def test_closest_margin_leaves_exact_ties_out(margins, closest):
    found = closest_margin(margins)
    assert (math.isnan(found) if closest is None else found == closest)


@pytest.mark.parametrize("poison", [float("nan"), float("-inf")])
def test_logits_with_no_decision_to_measure_are_never_called_a_near_tie(poison):
    """NaN logits, or a row whose logits are all −inf, decide nothing measurable: the margin is NaN (never a
    near-tie), where it used to say one."""
    good = rows(2.0)
    bad = torch.full_like(good, poison) if math.isinf(poison) else good.clone().fill_(poison)
    margin = confidence_margin(good, bad, torch.float32, "probability")
    assert math.isnan(margin) and not is_near_tie(margin)


def _selection_by_hand(scores: list[float], k: int, eps: float, threshold: bool) -> float:
    """selection_margin in float64 by its definition, over every key of one row."""
    n = len(scores)
    margins = [s - (sum(scores) - s) / (n - 1) for s in scores]
    order = sorted(range(n), key=lambda j: -scores[j])[:k + 1]
    gaps = [max(abs(margins[j] - eps) / (1 + abs(scores[j])), 1e-12) for j in order] if threshold else []
    if len(order) == k + 1 and (not threshold or margins[order[k]] > eps):
        high, low = scores[order[k - 1]], scores[order[k]]
        gaps.append((high - low) / (1 + abs(high)))
    return min((g for g in gaps if g > 0), default=math.inf)


@pytest.mark.parametrize("scores, k, threshold", [
    ([6.0, 1.0, 1.0, 0.0], 1, True),  # one clear sink
    ([6.0, 5.999, 0.001, 0.0], 1, True),  # two sinks a rank apart by 1.4e-4: a near-tie of the ranking
    ([4.0, 1.0, 1.0, 1.0], 1, True),  # 4 − 1 = 3 = eps exactly: no exact tie, the closest near-tie (1e-12)
    ([4.0001, 1.0, 1.0, 1.0], 2, True),  # the top key passes by 1e-4 / 5
    ([3.0, 2.0, 2.0, 1.0], 2, False),  # no threshold: keys 1 and 2 tied exactly (an exact tie), 1 vs 0 decides
])
def test_a_sink_choice_knows_how_close_it_came_to_other_keys(scores, k, threshold):
    """sinks.selection_margin against its definition worked by hand (float64 over every key of the float32 scores;
    the margins inside are float32 differences, so a gap of 1e-4 agrees to about 1 %)."""
    from sinklib.sinks import selection_margin

    scores = torch.tensor([scores])
    found = selection_margin(scores, k, 3.0, threshold=threshold)
    assert found.tolist() == [pytest.approx(_selection_by_hand(scores[0].tolist(), k, 3.0, threshold), rel=1e-2)]


def test_a_forwards_margin_is_the_closer_of_its_decision_and_the_key_choices_applied_in_it():
    """note_selection's margins (per row, a doubled batch folded) lower that forward's noted decision margin and
    are then forgotten; a sampled decision (NaN) stays NaN; outside recording_decisions nothing is kept."""
    from sinklib.ties import note_decisions, note_selection, recording_decisions

    note_selection(torch.tensor([1e-9, 1e-9]))  # outside: dropped
    with recording_decisions() as margins:
        note_selection(torch.tensor([0.5, 2e-4], dtype=torch.float64))
        note_selection(torch.tensor([0.1, math.inf, 0.3, math.inf], dtype=torch.float64))  # guided: [2 × batch]
        note_decisions(torch.tensor([0.2, 0.4], dtype=torch.float64))
        note_decisions(torch.tensor([0.2, 0.4], dtype=torch.float64))  # the next forward: no selection applied
        note_selection(torch.tensor([1e-5, 1e-5], dtype=torch.float64))
        note_decisions(torch.tensor([math.nan, 0.4], dtype=torch.float64))
    assert [m.tolist() for m in margins] == [[0.1, 2e-4], [0.2, 0.4], [pytest.approx(math.nan, nan_ok=True), 1e-5]]
