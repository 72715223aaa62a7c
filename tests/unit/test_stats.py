"""Intervals and paired tests (sinklib.stats) against independent references, and Table 1's paired views on a
hand-made table."""
import itertools
import math
import random

import pandas as pd
import pytest

from sinklib import stats
from sinklib.evaluation.table1 import MaskingTable, accuracy_rows
from sinklib.stats import difference_of_changes


def _wilson_by_hand(successes, n, z=1.959963984540054):
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("successes,n", [(0, 20), (7, 20), (20, 20), (134, 200), (1, 1)])
def test_wilson_interval_is_the_score_interval(successes, n):
    low, high = stats.wilson_interval(successes, n)
    expected = _wilson_by_hand(successes, n)
    assert low == pytest.approx(max(0.0, expected[0]), abs=1e-12)
    assert high == pytest.approx(min(1.0, expected[1]), abs=1e-12)
    assert low <= successes / n <= high


def test_mcnemar_exact_is_the_two_sided_binomial_on_discordant_pairs():
    for lost, gained in [(8, 2), (2, 8), (0, 5), (14, 14), (3, 0)]:
        n, smaller = lost + gained, min(lost, gained)
        tail = sum(math.comb(n, i) for i in range(smaller + 1)) / 2 ** n
        assert stats.mcnemar_exact(lost, gained) == pytest.approx(min(1.0, 2 * tail), rel=1e-9)
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_paired_difference_covers_the_true_difference_about_95_percent_of_the_time():
    # a joint distribution of (first right, second right) with a true difference of −0.15
    cells = {(True, True): 0.55, (True, False): 0.20, (False, True): 0.05, (False, False): 0.20}
    truth = cells[(False, True)] - cells[(True, False)]
    rng = random.Random(0)
    keys, weights = list(cells), list(cells.values())
    covered, runs = 0, 600
    for _ in range(runs):
        draws = rng.choices(keys, weights, k=120)
        result = stats.paired([a for a, _ in draws], [b for _, b in draws])
        covered += result.low <= truth <= result.high
    assert 0.92 <= covered / runs <= 0.98  # ±3 standard errors of a 95 % coverage at 600 runs


@pytest.mark.parametrize("cells,expected", [
    ((1, 1, 7, 12), (0.2857, 0.0256, 0.5069)),
    ((20, 5, 1, 174), (-0.0200, -0.0507, 0.0080)),
])
def test_paired_difference_matches_newcombes_method_10_as_published_implementations_give_it(cells, expected):
    """Reference values as biostatUZH's confIntPairedProportion and contingencytables'
    Newcombe_square_and_add_CI_paired_2x2 compute them (the correlation shrunk by n/2 when positive)."""
    assert stats.paired_difference(*cells) == pytest.approx(expected, abs=1e-4)


def test_paired_counts_and_direction():
    first = [True, True, True, False, False, True]
    second = [True, False, False, True, False, True]
    result = stats.paired(first, second)
    assert (result.both, result.lost, result.gained, result.neither) == (2, 2, 1, 1)
    assert result.delta == pytest.approx((1 - 2) / 6)
    assert result.low < result.delta < result.high
    with pytest.raises(ValueError, match="second has 2 problems, first 3"):
        stats.paired([True] * 3, [True] * 2)


def _items():
    rows = []
    outcomes = {("a", "sinks", 0): [1, 1, 1, 1, 0, 1], ("a", "sinks", 1): [1, 0, 0, 1, 0, 1],
                ("a", "random keys", 1): [1, 1, 1, 1, 0, 0],
                ("b", "sinks", 0): [1, 1, 0, 1, 1, 1], ("b", "sinks", 1): [0, 0, 0, 0, 0, 0],
                ("b", "random keys", 1): [1, 1, 0, 1, 1, 1]}
    for (model, condition, k), correct in outcomes.items():
        rows += [{"model": model, "condition": condition, "k": k, "id": f"p{i}", "correct": bool(c), "output": "",
                  "margin": 1.0} for i, c in enumerate(correct)]
    return pd.DataFrame(rows)


def test_table1_paired_views_count_each_problem_once():
    items = _items()
    table = MaskingTable(accuracy_rows(items), "arithmetic", items)
    paired = table.paired().set_index(["model", "condition", "k"])
    assert tuple(paired.loc[("a", "sinks", 1), ["n", "lost", "gained"]]) == (6, 2, 0)
    assert tuple(paired.loc[("a", "random keys", 1), ["lost", "gained"]]) == (1, 0)
    assert paired.loc[("b", "sinks", 1), "delta"] == pytest.approx(-5 / 6)
    against = table.sinks_against_random().set_index("model")
    assert tuple(against.loc["a", ["lost", "gained"]]) == (2, 1)  # right with random keys only: p1, p2; sinks only: p5
    matched = table.competence_matched()
    assert sorted(matched.items["id"].unique()) == ["p0", "p1", "p3", "p5"]  # both models right unmasked
    accuracy = matched.frame.set_index(["model", "condition", "k"])["accuracy"]
    assert accuracy[("a", "sinks", 0)] == 1.0 and accuracy[("b", "sinks", 0)] == 1.0
    assert accuracy[("a", "sinks", 1)] == pytest.approx(3 / 4)
    assert "[" in table.wide().loc["a", "top-1"]  # cells carry their interval


def _sign_flip_p(differences) -> float:
    """Every assignment of signs to the nonzero differences, enumerated independently of sinklib's matrix form."""
    moving = [d for d in differences if d]
    observed = abs(sum(differences))
    patterns = list(itertools.product([-1, 1], repeat=len(moving)))
    return sum(abs(sum(s * d for s, d in zip(signs, moving))) >= observed for signs in patterns) / len(patterns)


def test_difference_of_changes_is_the_difference_in_differences_with_an_exact_sign_flip_test():
    # the intervention costs 6 of 12 problems under the second setting and 1 under the first
    first_before = [True] * 12
    first_after = [True] * 11 + [False]
    second_before = [True] * 12
    second_after = [True] * 6 + [False] * 6
    result = difference_of_changes(first_before, first_after, second_before, second_after)
    differences = [(sa - sb) - (fa - fb) for fb, fa, sb, sa in zip(first_before, first_after, second_before, second_after)]
    assert result.n == 12 and result.delta == pytest.approx(sum(differences) / 12) == pytest.approx(-5 / 12)
    assert result.p == pytest.approx(_sign_flip_p(differences))  # 2 of the 32 patterns as extreme: 0.0625
    assert result.low <= result.delta <= result.high < 0


def test_difference_of_changes_finds_nothing_where_the_settings_agree_and_refuses_unequal_runs():
    runs = [[True, False, True, True], [True, False, False, True]]
    result = difference_of_changes(*runs, *runs)
    assert (result.delta, result.low, result.high, result.p) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"answered \[4, 4, 4, 3\] problems"):
        difference_of_changes(*runs, runs[0], runs[1][:3])


@pytest.mark.parametrize("call, message", [
    (lambda: stats.wilson_interval(-1, 5), "successes=-1 is not allowed: successes must be an integer >= 0"),
    (lambda: stats.wilson_interval(float("nan"), 5), "successes=nan is not allowed: successes must be an integer"),
    (lambda: stats.wilson_interval(6, 5), "successes=6 is not allowed: successes must be at most n=5"),
    (lambda: stats.paired_difference(2, -1, 0, 1), "lost=-1 is not allowed: lost must be an integer >= 0"),
    (lambda: stats.difference_of_changes([1, float("nan")], [1, 0], [1, 1], [0, 0]), "first_before=\\[nan\\] is not allowed"),
    (lambda: stats.difference_of_changes([1, None], [1, 0], [1, 1], [0, 0]), "first_before=\\[None\\] is not allowed"),
    (lambda: stats.difference_of_changes([1], [1], [1], [0], resamples=0), "resamples=0 is not allowed"),
])
def test_degenerate_or_impossible_evidence_is_refused_not_judged(call, message):
    """Issue 69: negative or NaN counts were accepted, and a NaN or None correctness gave p = 0.0."""
    with pytest.raises(ValueError, match=message):
        call()
