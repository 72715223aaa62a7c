"""Intervals and paired tests for accuracies: what every number about a model carries (its n and a 95 % interval),
and what a comparison of two conditions on the same problems carries (a paired test).

- `wilson_interval`: the Wilson score interval of a share (scipy's binomtest), which keeps its coverage near 0 and 1
  where the normal ("± 1.96 stderr") interval collapses to a point.
- `mcnemar_exact`: McNemar's exact test of two conditions on the same problems: under "no difference" the
  problems that only one condition got right split 50/50 (a two-sided binomial test on the discordant pairs).
- `paired_difference`: the difference of two paired shares with Newcombe's (1998) hybrid score interval (his
  method 10): Wilson intervals of both shares, combined with the pairs' correlation.
- `difference_of_changes`: whether an intervention changes accuracy more under one setting than under another, all
  four runs on the same problems (a difference in differences): a paired bootstrap interval and an exact sign-flip
  test over the problems.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sinklib.validation import BadValue, Count, Index, bad_value, checked


def _binomtest():
    """scipy.stats.binomtest, imported on first use: scipy.stats takes about 2 s to import, and every process that
    imports sinklib (each notebook kernel, each command) would pay it, most of them computing no interval."""
    from scipy.stats import binomtest  # noqa: PLC0415  (2 s of import, for the processes that test)

    return binomtest

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


@checked
def wilson_interval(successes: Index, n: Index, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for `successes` of `n` (95 % by default); (nan, nan) when n = 0.
    Counts are whole numbers >= 0 (a negative or NaN count is refused), successes at most n."""
    if successes > n:
        raise bad_value("successes", successes, f"at most n={n}")
    if n == 0:
        return math.nan, math.nan
    if z == Z95:
        interval = _binomtest()(successes, n).proportion_ci(0.95, method="wilson")
        return float(interval.low), float(interval.high)
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: `lost` problems right under the first condition
    only, `gained` right under the second only. 1.0 when there are none."""
    if lost + gained == 0:
        return 1.0
    return float(_binomtest()(lost, lost + gained, 0.5).pvalue)


@dataclass(frozen=True)
class Paired:
    """Two conditions on the same n problems: both right, right under the first only (`lost` when the second is an
    intervention), under the second only (`gained`), neither; the difference second − first with its 95 %
    interval (Newcombe's method 10) and McNemar's exact p."""
    both: int
    lost: int
    gained: int
    neither: int
    delta: float
    low: float
    high: float
    p: float

    @property
    def n(self) -> int:
        """The problems both conditions answered."""
        return self.both + self.lost + self.gained + self.neither


def paired(first: Sequence[bool], second: Sequence[bool]) -> Paired:
    """The paired comparison of two conditions' correctness on the same problems, in the same order."""
    if len(first) != len(second):
        raise BadValue(f"second has {len(second)} problems, first {len(first)}: a paired comparison needs the same "
                       "problems in the same order")
    both = sum(a and b for a, b in zip(first, second))
    lost = sum(a and not b for a, b in zip(first, second))
    gained = sum(b and not a for a, b in zip(first, second))
    neither = len(first) - both - lost - gained
    delta, low, high = paired_difference(both, lost, gained, neither)
    return Paired(both, lost, gained, neither, delta, low, high, mcnemar_exact(lost, gained))


@checked
def paired_difference(both: Index, lost: Index, gained: Index, neither: Index) -> tuple[float, float, float]:
    """(difference, low, high): the second condition's share minus the first's, (gained − lost) / n, with Newcombe's
    hybrid score 95 % interval for paired shares (Statistics in Medicine 17:873, 1998, method 10)."""
    n = both + lost + gained + neither
    if n == 0:
        return math.nan, math.nan, math.nan
    first, second = (both + lost) / n, (both + gained) / n
    low1, high1 = wilson_interval(both + lost, n)
    low2, high2 = wilson_interval(both + gained, n)
    margins = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    # the pairs' correlation, shrunk towards 0 by n/2 when positive (Newcombe's rule, as Altman et al.'s "Statistics
    # with Confidence" and Fagerland et al. (2014) compute it): a positive correlation narrows the interval
    cross = both * neither - lost * gained
    cross = cross - n / 2 if cross > n / 2 else 0.0 if cross >= 0 else cross
    phi = 0.0 if margins == 0 else cross / math.sqrt(margins)
    delta = second - first
    # the difference's lower end pairs the second share's low end with the first's high end, and vice versa
    down = math.sqrt(max(0.0, (second - low2) ** 2 - 2 * phi * (second - low2) * (high1 - first) + (high1 - first) ** 2))
    up = math.sqrt(max(0.0, (high2 - second) ** 2 - 2 * phi * (high2 - second) * (first - low1) + (first - low1) ** 2))
    return delta, max(-1.0, delta - down), min(1.0, delta + up)


@dataclass(frozen=True)
class ChangeDifference:
    """How much more an intervention changes accuracy under a second setting than under a first, on the same n
    problems: delta = (after − before under the second) − (after − before under the first), its 95 % paired bootstrap
    interval (percentile, over problems) and a two-sided p from flipping the sign of each problem's difference (exact
    over the problems whose difference is not 0 when they are few, else Monte Carlo)."""
    n: int
    delta: float
    low: float
    high: float
    p: float


@checked
def difference_of_changes(first_before: Sequence[bool], first_after: Sequence[bool], second_before: Sequence[bool],
                          second_after: Sequence[bool], resamples: Count = 20_000, seed: Index = 0) -> ChangeDifference:
    """The difference in differences of four runs' correctness on the same problems, in the same order: e.g. the
    drop a sink masking causes under a cached sampler against the drop under the plain one. Under "the setting does
    not change the intervention's effect", each problem's difference d_i = (s_after − s_before) − (f_after −
    f_before) is as likely −d_i (the settings exchanged for that problem): the test flips signs; the interval
    resamples problems. `seed` fixes both (a result does not change from run to run)."""
    names = ("first_before", "first_after", "second_before", "second_after")
    for name, run in zip(names, (first_before, first_after, second_before, second_after)):
        wrong = [value for value in run if not (isinstance(value, (bool, np.bool_)) or value in (0, 1))]
        if wrong:  # a NaN or None correctness gave p = 0.0
            raise bad_value(name, wrong[:3], "correctness values: True / False (or 1 / 0), one per problem")
    runs = [np.asarray(run, dtype=float) for run in (first_before, first_after, second_before, second_after)]
    if len({len(run) for run in runs}) != 1:
        raise BadValue(f"the four runs answered {[len(run) for run in runs]} problems: a difference of paired changes "
                       "needs the same problems in the same order")
    differences = (runs[3] - runs[2]) - (runs[1] - runs[0])
    n = len(differences)
    if n == 0:
        return ChangeDifference(0, math.nan, math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, n, size=(resamples, n))].mean(1)
    low, high = np.quantile(means, [0.025, 0.975])
    observed = abs(differences.sum())
    moving = differences[differences != 0]
    if len(moving) <= 16:  # every sign pattern
        signs = np.array(np.meshgrid(*[[-1, 1]] * len(moving))).reshape(len(moving), -1).T if len(moving) else np.ones((1, 0))
        p = float(np.mean(np.abs(signs @ moving) >= observed - 1e-9))
    else:
        flipped = np.abs((rng.choice([-1.0, 1.0], size=(resamples, len(moving))) * moving).sum(1))
        p = float((1 + np.sum(flipped >= observed - 1e-9)) / (resamples + 1))
    return ChangeDifference(n, float(differences.mean()), float(low), float(high), p)
