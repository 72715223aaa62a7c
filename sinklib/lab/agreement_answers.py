"""Table 1's answers on another CPU: how many may change at near-ties (CROSS_KERNEL_ANSWERS, measured by
benchmarks/cpu_rounding_bound.py, bounded at ANSWER_CONFIDENCE), and the items tables compared by it."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sinklib.ties import NEAR_TIE, is_near_tie
from sinklib.lab.agreement_rows import (DIFFERS, MARGIN_TOLERANCE, NEAR, UNMASKED, WITHIN, Row, float_difference,
                                        matched, read_pair, schema_problems)


CROSS_KERNEL_ANSWERS: dict[str, dict[tuple[str, int], tuple[int, int]]] = {
    "tiny-llada": {(UNMASKED, 0): (0, 800), ("sinks", 1): (4, 600), ("sinks", 2): (1, 200), ("sinks", 5): (8, 600),
        ("sinks", 10): (8, 600), ("sinks", 20): (3, 200), ("random keys", 1): (2, 200), ("random keys", 2): (2, 200),
        ("random keys", 5): (4, 200), ("random keys", 10): (11, 200), ("random keys", 20): (24, 200),
        ("sink values (zero)", 1): (0, 200), ("sink values (zero)", 2): (1, 200),
        ("sink values (zero)", 5): (2, 200), ("sink values (zero)", 10): (2, 200),
        ("sink values (zero)", 20): (2, 200)},
    "tiny-dream": {(UNMASKED, 0): (0, 800), ("sinks", 1): (2, 600), ("sinks", 2): (0, 200), ("sinks", 5): (3, 600),
        ("sinks", 10): (2, 600), ("sinks", 20): (0, 200), ("random keys", 1): (0, 200), ("random keys", 2): (0, 200),
        ("random keys", 5): (0, 200), ("random keys", 10): (0, 200), ("random keys", 20): (0, 200),
        ("sink values (zero)", 1): (0, 200), ("sink values (zero)", 2): (0, 200),
        ("sink values (zero)", 5): (0, 200), ("sink values (zero)", 10): (0, 200),
        ("sink values (zero)", 20): (0, 200)},
    "tiny-arm": {(UNMASKED, 0): (0, 800), ("sinks", 1): (0, 600), ("sinks", 2): (0, 200), ("sinks", 5): (0, 600),
        ("sinks", 10): (0, 600), ("sinks", 20): (0, 200), ("random keys", 1): (0, 200), ("random keys", 2): (0, 200),
        ("random keys", 5): (0, 200), ("random keys", 10): (0, 200), ("random keys", 20): (0, 200),
        ("sink values (zero)", 1): (0, 200), ("sink values (zero)", 2): (0, 200),
        ("sink values (zero)", 5): (0, 200), ("sink values (zero)", 10): (0, 200),
        ("sink values (zero)", 20): (0, 200)},
    "smollm2-135m-autoregressive": {(UNMASKED, 0): (0, 100)},
    "smollm2-135m-instruct": {(UNMASKED, 0): (0, 100)},
    "smollm2-135m-diffusion": {(UNMASKED, 0): (0, 100)},
}


ANSWER_CONFIDENCE = 0.999


def compare_items(committed: Path, rerun: Path, explained: set[tuple]) -> Row:
    """Table 1's samples: the same samples in each run and the same answers, except an answer whose output parted
    from the committed one after a near-tie in both runs; the same output scored differently is never excused.
    Adds, per run (model, condition, k): ("answers", …, count) how many outputs parted so, ("flagged", …, count) how
    many samples decided a near-tie in both runs — the bounds compare_file gives that run's row."""
    name = committed.stem
    a, b, settled = read_pair(committed, rerun)
    if settled:
        return settled
    rows, keys = f"{len(a)} / {len(b)}", ["model", "condition", "k", "id"]
    schema = schema_problems(a, b, keys, required=("output", "correct", "margin"))
    if schema:
        return Row(name, rows, DIFFERS, detail="; ".join(schema))
    merged, unmatched = matched(a, b, keys)
    near = merged["margin"].map(is_near_tie) & merged["margin__rerun"].map(is_near_tie)
    parted = merged["output"] != merged["output__rerun"]
    problems = [f"{unmatched} samples on one side only"] if unmatched else []
    problems += _answer_problems(merged, parted, near)
    for kind, flags in (("answers", parted & near), ("flagged", near)):
        counts = merged[flags].groupby(["model", "condition", "k"]).size()
        explained.update((kind, m, c, int(k), int(n)) for (m, c, k), n in counts.items())
    note = (f"{int(parted.sum())} outputs changed, each after a near-tie (closest margins <= {NEAR_TIE:g} in both "
            "runs)" if parted.any() else "the same answers")
    return Row(name, rows, DIFFERS, detail="; ".join(problems)) if problems else \
        Row(name, rows, NEAR if parted.any() else WITHIN, detail=note)


def _answer_problems(merged: pd.DataFrame, parted: pd.Series, near: pd.Series) -> list[str]:
    """What no CPU explains in matched samples: an answer scored otherwise on the same output, an output changed
    without a near-tie, closest margins of answers decided alike moved beyond rounding, more answers changed at
    near-ties than another CPU changes."""
    problems = []
    rescored = ~parted & (merged["correct"] != merged["correct__rerun"])
    for flags, what, shown in ((rescored, "answers scored differently on the same output", "correct"),
                               (parted & ~near, "answers changed without a near-tie", "margin")):
        if flags.any():
            first = merged[flags].iloc[0]
            values = (f"correct {first['correct']} / {first['correct__rerun']}" if shown == "correct"
                      else f"margin {first['margin']:.2g} / {first['margin__rerun']:.2g}")
            problems.append(f"{int(flags.sum())} {what} (e.g. {first['model']} {first['condition']} k={first['k']} "
                            f"sample {first['id']}: {values})")
    same = ~parted & ~near
    margins = float_difference(merged.loc[same, "margin"], merged.loc[same, "margin__rerun"])
    if margins > MARGIN_TOLERANCE:
        problems.append(f"the closest margins of answers decided alike differ by up to {margins:.2g} of 1 + |margin| "
                        f"(rounding moves them at most {MARGIN_TOLERANCE:g})")
    return problems + _answers_beyond_bound(merged, parted & near)


def _answers_beyond_bound(merged: pd.DataFrame, changed: pd.Series) -> list[str]:
    """Per model whose `changed` answers (parted at near-ties) outnumber what another CPU changes under its runs'
    conditions (answers_allowed), the problem in words."""
    problems = []
    for model, count in merged[changed].groupby("model").size().items():
        ours = merged[merged["model"] == model]
        runs = {(str(condition), int(k)): int(n) for (condition, k), n in ours.groupby(["condition", "k"]).size().items()}
        allowed = answers_allowed(str(model), runs)
        if count > allowed:
            problems.append(f"{model} changed {count} of its {len(ours)} answers at near-ties, more than another CPU "
                            f"changes (at most {allowed}: {_answers_measured(str(model), runs)})")
    return problems


def upper_bound(successes: int, n: int, confidence: float = ANSWER_CONFIDENCE) -> float:
    """The exact one-sided upper bound of a share at `confidence`: the share p at which seeing `successes` or fewer
    of `n` has probability 1 − confidence (Clopper–Pearson; 1 − (1 − confidence)^(1/n) for 0 successes); 1.0 when
    n = 0 (nothing measured bounds nothing). Here, not in sinklib.stats: stats is part of the code the stored lens
    and carry measurements are keyed by (trace_store.stored_measurement), and a check's statistic is not."""
    from scipy.stats import binomtest  # noqa: PLC0415  (scipy: only a check needs it)

    if n == 0 or successes >= n:
        return 1.0
    return float(binomtest(successes, n, alternative="less").proportion_ci(confidence, method="exact").high)


def run_key(condition: str, k: int) -> tuple[str, int]:
    """The key a Table 1 run's cross-kernel measurement is kept under: (condition, k), or (UNMASKED, 0) at k = 0."""
    return (UNMASKED, 0) if int(k) == 0 else (str(condition), int(k))


def answers_allowed(model: str, runs: dict[tuple[str, int], int]) -> int:
    """How many of a model's answers in a table a rerun on another CPU may change at near-ties: over its runs
    ({(condition, k): samples}), the sum of samples × the 99.9 % upper bound of the share of final canvases that
    other kernels changed for this model under that run's condition and k (CROSS_KERNEL_ANSWERS), rounded down."""
    allowed = sum(n * upper_bound(*_answers_count(model, run_key(*key))) for key, n in runs.items())
    return math.floor(allowed + 1e-9)  # a sum of exact shares: never lose a whole answer to float rounding


def _answers_count(model: str, key: tuple[str, int]) -> tuple[int, int]:
    """(differed, compared) measured for `model` under `key`; the model's pooled measurements where that key was not
    measured; every model's where the model was not."""
    measured = CROSS_KERNEL_ANSWERS.get(model)
    if measured and key in measured:
        return measured[key]
    pool = measured.values() if measured else [c for runs in CROSS_KERNEL_ANSWERS.values() for c in runs.values()]
    return (sum(c for c, _ in pool), sum(n for _, n in pool))


def _answers_measured(model: str, runs: dict[tuple[str, int], int]) -> str:
    """What bounds the model's runs, in words: per run key, how many generations changed of how many compared."""
    parts = []
    for condition, k in sorted({run_key(*key) for key in runs}, key=lambda key: (key[0] != UNMASKED, key)):
        changed, compared = _answers_count(model, (condition, k))
        measured = (condition, k) in CROSS_KERNEL_ANSWERS.get(model, {})
        whose = "" if measured else (" (not measured: the model's conditions pooled)" if model in CROSS_KERNEL_ANSWERS
                                     else " (not measured: every measured model pooled)")
        parts.append(f"{condition if condition == UNMASKED else f'{condition} k={k}'} {changed} of {compared}{whose}")
    return f"generations of {model} changed between kernels: " + ", ".join(parts)
