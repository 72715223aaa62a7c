"""How a notebook's claims are judged from its run: a verdict per model ("supports", "contradicts", "cannot
decide") with its n and a 95 % interval that resamples whole generations (generation_bootstrap). Each notebook's
own claims and thresholds are in its module (nb02_moving_sinks.do_sinks_move, nb07_what_sinks_carry.
does_a_sink_store_its_token, nb08_sinks_for_speed.does_a_fast_sampler_lean_on_sinks, …)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from sinklib.validation import BadValue


def decidable(low: float, high: float) -> bool:
    """Whether an interval [low, high] can decide a claim: not when it is undefined (no data) or of zero width (a
    degenerate sample: every generation, or every resample, gives one value, which says nothing of its spread). A
    reversed interval (low > high) is no interval: refused."""
    if np.isnan(low) or np.isnan(high):
        return False
    if low > high:
        raise BadValue(f"(low, high)={(float(low), float(high))!r} is not allowed: an interval must have low <= high")
    return low < high


def judged(low: float, high: float, threshold: float) -> str:
    """"supports" when a 95 % interval [low, high] lies at or above `threshold`, "contradicts" when it lies below,
    "cannot decide" when it holds the threshold, is undefined (no data) or has zero width (degenerate evidence:
    decidable)."""
    if not decidable(low, high):
        return "cannot decide"
    return "supports" if low >= threshold else "contradicts" if high < threshold else "cannot decide"


def _verdict(model: str, claim: str, n: int, estimate: float, interval: tuple[float, float], threshold: float) -> dict:
    return {"model": model, "claim": claim, "n": int(n), "estimate": estimate, "low": interval[0], "high": interval[1],
            "threshold": threshold, "verdict": judged(*interval, threshold)}


# A claim about a model holds across its generations, not across the steps, heads or positions inside one (those are
# far from independent): each verdict's interval resamples whole generations (a cluster bootstrap), and a model with
# fewer generations than MIN_GENERATIONS cannot decide
MIN_GENERATIONS = 3


BOOTSTRAP_DRAWS = 2000


def generation_bootstrap(sums, estimate: Callable[[np.ndarray], np.ndarray]) -> tuple[float, tuple[float, float]]:
    """A statistic over every generation, and its 95 % interval resampling whole generations.

    Args:
        sums: [generations, k] additive counts of each generation (e.g. its moves and its step pairs).
        estimate: totals [..., k] → the statistic [...], vectorised (e.g. moves / pairs).

    Returns:
        (the statistic on the summed counts, its percentile interval over BOOTSTRAP_DRAWS resamples of the
        generations, drawn from a fixed seed so the same data give the same interval); the interval is (nan, nan)
        with fewer than MIN_GENERATIONS generations, or where the statistic is undefined in most resamples.
    """
    sums = np.asarray(sums, dtype=float).reshape(len(sums), -1)
    if not np.isfinite(sums).all() or (sums < 0).any():
        wrong = sums[~(np.isfinite(sums) & (sums >= 0))][:3].tolist()
        raise BadValue(f"sums={wrong!r} is not allowed: sums must be additive counts, finite numbers >= 0 (these are "
                       "not)")
    nan = (float("nan"), float("nan"))
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(estimate(sums.sum(0))) if len(sums) else float("nan")
        if len(sums) < MIN_GENERATIONS:
            return point, nan
        picks = np.random.default_rng(0).integers(0, len(sums), (BOOTSTRAP_DRAWS, len(sums)))
        draws = estimate(sums[picks].sum(1))
    draws = draws[np.isfinite(draws)]
    if len(draws) < BOOTSTRAP_DRAWS // 2:
        return point, nan
    low, high = np.quantile(draws, [0.025, 0.975])
    return point, (float(low), float(high))


def _share(totals: np.ndarray) -> np.ndarray:
    """counts [..., 2] (hits, of) → hits / of."""
    return totals[..., 0] / totals[..., 1]


def _hits(share: float, of: int) -> tuple[int, int]:
    """(hits, of) from a share of `of` (0 hits of 0 where the share is undefined)."""
    return (int(round(share * of)), int(of)) if of else (0, 0)


# Notebook 08's claims judged from the run. A loss of accuracy smaller than this is one nobody would act on: an
# interval that excludes every larger loss says "no cost"
NEGLIGIBLE_LOSS = 0.05


def _cost_verdict(who: str, claim: str, n: int, estimate: float, low: float, high: float) -> dict:
    """"supports" a cost when the interval lies below 0, "contradicts" it when the interval excludes every loss of
    NEGLIGIBLE_LOSS or more, "cannot decide" otherwise."""
    verdict = "supports" if high < 0 else "contradicts" if low > -NEGLIGIBLE_LOSS else "cannot decide"
    if not decidable(low, high):  # no data, or a degenerate (zero-width) interval
        verdict = "cannot decide"
    return {"model": who, "claim": claim, "n": int(n), "estimate": estimate, "low": low, "high": high,
            "threshold": 0.0, "verdict": verdict}
