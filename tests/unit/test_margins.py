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
