"""Row-level comparisons for sinklib.lab.agreement: the verdict words and tolerances, one results table
against its rerun (identifying columns equal, floats within FLOAT_TOLERANCE, near-ties named), Table 1's run
tables and pooled tables. The module docstring of sinklib.lab.agreement says how each tolerance was measured."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sinklib.provenance import read_layout
from sinklib.summary import Layout
from sinklib.ties import both_near_tie


FLOAT_TOLERANCE = 1e-4


GENERATIONS = "generations"


# A decision's margin recorded by both runs where their canvases agree may differ by rounding only: measured at most
# 4.6e-4 of 1 + |margin| (tiny-llada with its top-1 sink masked, 689 steps of 50 generations, this CPU's kernels
# against torch's portable ones; tiny-dream 3.5e-6, tiny-arm 4.5e-7). Twenty times that bound catches a margin
# column scaled by hand wherever its margins are not tiny (× 2 from margins of 0.01, × 1000 from 1e-5); a scaling
# of margins already below a near-tie's 1e-3 is not seen here, and changes no excuse (both sides stay near-ties).
MARGIN_TOLERANCE = 1e-2


# Final canvases that differed between this CPU's kernels and another's, per model and per Table 1 run (condition, k):
# (differed, generations compared), summed over the kernel pairs compared — benchmarks/cpu_rounding_bound.py; its
# results in benchmarks/results/cpu_rounding_bound.md, which tests/unit/test_agreement.py holds these equal to (rows
# of another thread count, bit-identical here, are not another CPU's and are left out). A masked run picks its keys
# from the attention, one more place for a rounding to act, and the conditions change answers at different rates
# (tiny-llada: 0 of 800 unmasked, 8 of 600 with its top-5 sinks masked, 24 of 200 with 20 random keys masked), so
# each run is bounded by its own condition's measurement: a rerun may change at most the sum over a table's runs of
# n × upper_bound(differed, compared) (99.9 %) of a model's answers at near-ties — "every answer that passed a
# near-tie" would excuse a whole rewritten table. A run whose condition and k were not measured takes its model's
# measurements pooled; a model never measured, every model's. The bound is on a rate: a forger who rewrites about as
# many answers as another CPU changes cannot be told from one; only more measurement narrows it.
UNMASKED = "unmasked"  # the key of a k = 0 run, whatever its condition's name (Table 1 writes "sinks", 0)


# A figure drawn from data that agrees may differ in a few anti-aliased pixels; one drawn from data that parted at a
# near-tie (its notebook's tables say so) in a few more; a figure that is another plot differs in far more.
FIGURE_PIXELS_WITHIN, FIGURE_PIXELS_NEAR = 0.01, 0.10


TEXT_TABLES = ("*.md", "*.tex")  # figures/: text renderings of results tables (the table of the same name)


IDENTICAL, WITHIN, NEAR, DIFFERS = "identical", "within tolerance", "near-tie", "differs"


# A Table 1 row's audit (evaluation.checks.mass_dropped): one generation of the task's first sample under the row's
# policy. Where its closest margin (audit_margin) is a near-tie in both runs, another CPU's audit may take another
# path and mask other entries: measured at most 1.3 % apart (tiny-llada with its top-2 sinks' values ablated, 240 /
# 243 entries; its 45 audits of notebook 07's dose-response, this CPU's kernels against torch's portable ones), and
# AUDIT_SHIFT allows about eight times that; elsewhere the audit is a float computation like any other (counts
# equal, sums within FLOAT_TOLERANCE, the margin within MARGIN_TOLERANCE).
AUDIT_COLUMNS = ("masked_entries", "masked_score_before", "masked_score_after", "kept_share", "audit_margin")


AUDIT_SHIFT = 0.1


ITEMS = "_items"  # table1_masking_<task>_items: one row per evaluated sample, with its closest decision margin


_BASELINE = re.compile(r"^uniform causal attention \((.+)'s lengths\)$")  # fig10's reference rows, per model


@dataclass(frozen=True)
class Divergence:
    """Where one generation of a rerun first differs from the committed one."""
    model: str
    trace: int
    step: int
    margin_committed: float
    margin_rerun: float

    @property
    def near_tie(self) -> bool:
        """Both runs decided that step within NEAR_TIE (sinklib.ties.both_near_tie)."""
        return both_near_tie(self.margin_committed, self.margin_rerun)

    def describe(self) -> str:
        """One line for the report: the model, generation, step, both margins, and whether it is a near-tie."""
        kind = "near-tie" if self.near_tie else "NOT a near-tie"
        return (f"{self.model} #{self.trace} parts at step {self.step} (margin {self.margin_committed:.2g} / "
                f"{self.margin_rerun:.2g}: {kind})")


@dataclass
class Row:
    """One line of the report."""
    artifact: str
    rows: str
    status: str
    largest_difference: float = 0.0
    detail: str = ""


def divergences(committed: pd.DataFrame, rerun: pd.DataFrame) -> list[Divergence]:
    """The first differing step of every generation in two generations tables (a generation only one side has
    parts at step 0)."""
    found = []
    keys = sorted(set(map(tuple, committed[["model", "trace"]].drop_duplicates().values)) |
                  set(map(tuple, rerun[["model", "trace"]].drop_duplicates().values)))
    for model, trace in keys:
        a = _steps(committed, model, trace)
        b = _steps(rerun, model, trace)
        for step in sorted(set(a) | set(b)):
            if step not in a or step not in b or list(a[step][0]) != list(b[step][0]):
                found.append(Divergence(str(model), int(trace), int(step), _margin_at(a, step), _margin_at(b, step)))
                break
    return found


def _margin_at(steps: dict, step: int) -> float:
    """The decision margin a run recorded at `step` (NaN where that run has no such step)."""
    return float(steps[step][1]) if step in steps else float("nan")


def _steps(table: pd.DataFrame, model: str, trace: int) -> dict[int, tuple]:
    rows = table[(table["model"] == model) & (table["trace"] == trace)]
    return {int(s): (c, m) for s, c, m in zip(rows["step"], rows["canvas"], rows["margin"])}


def _read_bytes(path: Path) -> bytes:
    return Path(path).read_bytes()


def _compare_runs(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout, explained: set[tuple],
                  items: tuple[Path, Path]) -> Row:
    """Table 1's runs (one row per model, condition, k): each side's accuracy must be the mean of its own items'
    correctness; the accuracies may move by at most (the run's parted answers) / n, the other floats — summed over
    the run's generations — by at most 2 · (its samples decided at a near-tie) / n of the column's largest |value|
    for the model; everything else must be equal."""
    problems = [_accuracy_from_items(frame, path, side) for frame, path, side in
                ((a, items[0], "committed"), (b, items[1], "rerun"))]
    problems = [p for p in problems if p]
    merged = a.merge(b, on=list(layout.keys), how="outer", suffixes=("", "__rerun"), indicator=True)
    if (merged["_merge"] != "both").any():
        problems.append(f"{int((merged['_merge'] != 'both').sum())} runs on one side only")
    merged = merged[merged["_merge"] == "both"]
    run_keys = list(zip(merged["model"], merged["condition"], merged["k"].astype(int)))
    counts = {kind: {entry[1:4]: entry[4] for entry in explained if entry[0] == kind} for kind in ("answers", "flagged")}
    size = merged["n"].to_numpy(dtype=np.float64).clip(min=1)
    parted = np.array([counts["answers"].get(key, 0) for key in run_keys]) / size
    flagged = np.array([counts["flagged"].get(key, 0) for key in run_keys]) / size
    largest = 0.0
    audit_near = (np.array([both_near_tie(float(m), float(n)) for m, n in
                            zip(merged["audit_margin"], merged["audit_margin__rerun"])], dtype=bool)
                  if "audit_margin" in merged else np.zeros(len(merged), dtype=bool))
    for column in (c for c in a.columns if c not in layout.keys):
        problem, gap = (_compare_audit(column, merged, audit_near) if column in AUDIT_COLUMNS
                        else _compare_run_column(column, merged, parted, flagged))
        problems += [problem] if problem else []
        largest = max(largest, gap)
    if problems:
        return Row(name, rows, DIFFERS, largest, "; ".join(problems))
    note = f"{int((parted > 0).sum())} runs with answers parted at a near-tie" if (parted > 0).any() else ""
    return Row(name, rows, NEAR if note else IDENTICAL if a.equals(b) else WITHIN, largest, note)


def _compare_run_column(column: str, merged: pd.DataFrame, parted: np.ndarray, flagged: np.ndarray) -> tuple[str, float]:
    """(a problem or '', the largest relative gap) for one result column of Table 1's matched runs: the accuracies
    within the run's parted share, other floats within 2 × its flagged share of the model's scale, the rest equal."""
    x, y = merged[column], merged[f"{column}__rerun"]
    if not (pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y)):
        changed = int((x.astype(object).values != y.astype(object).values).sum())
        return (f"{column} differs in {changed} runs" if changed else ""), 0.0
    x, y = x.to_numpy(dtype=np.float64), y.to_numpy(dtype=np.float64)
    scale = pd.Series(np.abs(x)).groupby(merged["model"].to_numpy()).transform("max").to_numpy()
    moved = parted if column in ("accuracy", "accuracy_flexible", "stderr") else 2 * flagged * np.nan_to_num(scale)
    gap = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))
    gap = np.where(np.isnan(gap), np.inf, gap)
    largest = float((gap / (1 + np.abs(np.nan_to_num(x)))).max(initial=0.0))
    beyond = gap > FLOAT_TOLERANCE * (1 + np.abs(np.nan_to_num(x))) + moved
    if not beyond.any():
        return "", largest
    worst = merged.iloc[int(np.argmax(beyond))]
    return (f"{column} differs beyond its bound in {int(beyond.sum())} runs (e.g. {worst['model']} "
            f"{worst['condition']} k={worst['k']}: {worst[column]!r} / {worst[f'{column}__rerun']!r})"), largest


def _compare_audit(column: str, merged: pd.DataFrame, near: np.ndarray) -> tuple[str, float]:
    """(a problem or '', the largest relative gap) for one audit column of Table 1's matched runs: within rounding
    (the margin within MARGIN_TOLERANCE, the rest within FLOAT_TOLERANCE: counts equal) where the audited generation
    decided no near-tie in both runs, within AUDIT_SHIFT of the larger side where it did."""
    x = merged[column].to_numpy(dtype=np.float64, na_value=np.nan)
    y = merged[f"{column}__rerun"].to_numpy(dtype=np.float64, na_value=np.nan)
    rounding = MARGIN_TOLERANCE if column == "audit_margin" else FLOAT_TOLERANCE
    allowed = rounding * (1 + np.abs(np.nan_to_num(x))) + np.where(
        near, np.inf if column == "audit_margin" else AUDIT_SHIFT * np.fmax(np.abs(x), np.abs(y)), 0.0)
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))
    gap = np.where(np.isnan(gap), np.inf, gap)
    relative = float((gap / (1 + np.abs(np.nan_to_num(x)))).max(initial=0.0))
    beyond = gap > allowed
    if not beyond.any():
        return "", relative
    worst = merged.iloc[int(np.argmax(beyond))]
    why = (f"beyond {AUDIT_SHIFT:.0%} although its audit decided a near-tie" if near[int(np.argmax(beyond))]
           else "beyond rounding, its audit deciding no near-tie in both runs")
    return (f"{column} differs {why} in {int(beyond.sum())} runs (e.g. {worst['model']} {worst['condition']} "
            f"k={worst['k']}: {worst[column]!r} / {worst[f'{column}__rerun']!r})"), relative


def _accuracy_from_items(table: pd.DataFrame, items: Path, side: str) -> str:
    """'' if each run's accuracy is the mean of its items' correctness (or there are no items), else what is not."""
    if not items.exists():
        return ""
    means = pd.read_parquet(items).groupby(["model", "condition", "k"])["correct"].mean()
    own = table.set_index(["model", "condition", "k"])["accuracy"]
    joined = own.to_frame().join(means.rename("from_items"), how="left")
    wrong = joined[~np.isclose(joined["accuracy"], joined["from_items"], rtol=0, atol=1e-9)]
    if wrong.empty:
        return ""
    (model, condition, k), row = next(iter(wrong.iterrows()))
    return (f"the {side} accuracy of {len(wrong)} runs is not the share of its items answered correctly (e.g. "
            f"{model} {condition} k={k}: {row['accuracy']!r}, its items {row['from_items']!r})")


def compare_file(committed: Path, rerun: Path, explained: set[tuple] = frozenset()) -> Row:
    """Compare one results file; rows downstream of the `explained` near-ties may differ within their bounds
    (("trace", model, trace): a generation that parted at a near-tie; ("answers" / "flagged", model, condition, k,
    count): an evaluation run's samples whose outputs parted / that decided a near-tie, from compare_items)."""
    name = committed.stem
    layout = _layout(committed, rerun)
    a, b, settled = _read_pair(committed, rerun)
    if settled and not (layout is not None and layout.scope == "run" and settled.status == IDENTICAL):
        # identical runs still match their items
        return settled
    rows = f"{len(a)} / {len(b)}"
    if layout is None:
        return Row(name, rows, DIFFERS, detail="no layout for this file: only an identical frame agrees")
    if layout.index:
        a, b = a.reset_index(), b.reset_index()
    schema = _schema_problems(a, b, list(layout.keys))
    if schema:
        return Row(name, rows, DIFFERS, detail="; ".join(schema))
    if layout.scope == "model":
        return _compare_pooled(name, rows, a, b, layout, _parted_shares(explained))
    if layout.scope == "run":
        return _compare_runs(name, rows, a, b, layout, explained,
                             (committed.with_name(f"{name}{ITEMS}.parquet"), rerun.with_name(f"{name}{ITEMS}.parquet")))
    a, b = _downstream(a, layout, explained), _downstream(b, layout, explained)
    skipped = int(a["_explained"].sum())  # committed rows set aside (the rerun's may number more or fewer)
    a, b = a[~a["_explained"]], b[~b["_explained"]]
    return _compare_rows(name, rows, a.drop(columns="_explained"), b.drop(columns="_explained"), layout, skipped)


def _layout(committed: Path, rerun: Path) -> Layout | None:
    """The layout the table carries (summary.Layout, written with it): the rerun's, which the code under test
    wrote, else the committed file's; None when neither carries one."""
    for path in (rerun, committed):
        found = read_layout(path) if path.exists() else None
        if found is not None:
            return Layout(tuple(found["keys"]), found["scope"], found["index"], found.get("threshold"))
    return None


def _read_pair(committed: Path, rerun: Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None, Row | None]:
    """(committed frame, rerun frame, None), or the row that settles the comparison already: a file missing on
    one side, or two identical frames."""
    missing = _missing(committed, rerun)
    if missing:
        return None, None, missing
    frames = []
    for path, side in ((committed, "committed"), (rerun, "rerun")):
        try:
            frames.append(pd.read_parquet(path))
        except Exception as error:  # noqa: BLE001  (pyarrow raises many kinds; a damaged file is a finding)
            return None, None, Row(committed.stem, "-", DIFFERS,
                                   detail=f"the {side} file is not a readable table: {' '.join(str(error).split())[:200]}")
    a, b = frames
    return a, b, Row(committed.stem, f"{len(a)} / {len(b)}", IDENTICAL) if a.equals(b) else None


def _schema_problems(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> list[str]:
    """What makes two tables incomparable row by row: other columns (renamed, dropped or added), identifying columns
    missing, or rows whose identifying columns repeat."""
    problems = []
    if list(a.columns) != list(b.columns):
        only_a, only_b = [c for c in a.columns if c not in b.columns], [c for c in b.columns if c not in a.columns]
        problems.append(f"the columns differ (only committed: {only_a}, only rerun: {only_b})" if only_a or only_b
                        else f"the columns are in another order ({list(a.columns)} / {list(b.columns)})")
    for frame, side in ((a, "committed"), (b, "rerun")):
        absent = [key for key in keys if key not in frame.columns]
        if absent:
            problems.append(f"the {side} table lacks its identifying columns {absent}")
        elif frame.duplicated(keys).any():
            problems.append(f"the {side} table repeats {int(frame.duplicated(keys).sum())} rows' identity ({keys})")
    return problems


def _matched(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """The rows of a and b with the same keys side by side (b's columns suffixed __rerun), and how many rows only
    one side has."""
    merged = a.merge(b, on=keys, how="outer", suffixes=("", "__rerun"), indicator=True)
    unmatched = int((merged["_merge"] != "both").sum())
    return merged[merged["_merge"] == "both"], unmatched


def _missing(committed: Path, rerun: Path) -> Row | None:
    if committed.exists() and rerun.exists():
        return None
    side = "the committed results" if not committed.exists() else "the rerun"
    return Row(committed.stem, "-", DIFFERS, detail=f"missing from {side}")


def _downstream(frame: pd.DataFrame, layout: Layout, explained: set[tuple]) -> pd.DataFrame:
    """frame with an _explained column: whether the row comes from a generation that parted at a near-tie."""
    owners = frame["model"].astype(str).map(lambda m: _BASELINE.sub(r"\1", m))
    if layout.scope == "trace":
        flag = [("trace", m, int(t)) in explained for m, t in zip(owners, frame["trace"])]
    elif layout.scope == "first":
        flag = [("trace", m, 0) in explained for m in owners]
    else:
        flag = [False] * len(frame)
    return frame.assign(_explained=np.asarray(flag, dtype=bool))


def _compare_rows(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout, skipped: int) -> Row:
    merged, unmatched = _matched(a, b, list(layout.keys))
    problems, largest = [], 0.0
    at_threshold = _rows_at_threshold(a, b, layout)
    if unmatched - at_threshold:
        problems.append(f"{unmatched - at_threshold} rows on one side only")
    threshold_note = (f"{at_threshold} rows on one side only, each decided by a threshold test within rounding"
                      if at_threshold else "")
    for column in (c for c in a.columns if c not in layout.keys):
        left, right = merged[column], merged[f"{column}__rerun"]
        if pd.api.types.is_float_dtype(left) and pd.api.types.is_float_dtype(right):
            difference = _float_difference(left, right)
            largest = max(largest, difference)
            if difference > FLOAT_TOLERANCE:
                problems.append(f"{column} differs by {difference:.2g} of 1 + |value|")
        else:
            changed = int((left.astype(object).values != right.astype(object).values).sum())
            if changed:
                problems.append(f"{column} differs in {changed} rows")
    note = "; ".join(part for part in (f"{skipped} rows after a near-tie set aside" if skipped else "", threshold_note)
                     if part)
    if problems:
        return Row(name, rows, DIFFERS, largest, "; ".join(problems + ([note] if note else [])))
    return Row(name, rows, NEAR if note else WITHIN, largest, note)


def _rows_at_threshold(a: pd.DataFrame, b: pd.DataFrame, layout: Layout) -> int:
    """How many rows only one side has are there by a threshold test within rounding (layout.threshold's column at
    most FLOAT_TOLERANCE on the side that has the row): another CPU's scores may decide such a test otherwise."""
    if layout.threshold is None or layout.threshold not in a.columns:
        return 0
    merged = a.merge(b, on=list(layout.keys), how="outer", suffixes=("", "__rerun"), indicator=True)
    gap = merged[layout.threshold].where(merged["_merge"] == "left_only", merged[f"{layout.threshold}__rerun"])
    one_sided = merged["_merge"] != "both"
    return int((one_sided & (gap.astype(np.float64) <= FLOAT_TOLERANCE)).sum())


def _parted_shares(explained: set[tuple]) -> dict[str, float]:
    """model → the share of its generations that parted from the committed ones at a near-tie."""
    totals = {entry[1]: entry[2] for entry in explained if entry[0] == "generations"}
    parted: dict[str, int] = {}
    for entry in explained:
        if entry[0] == "trace":
            parted[entry[1]] = parted.get(entry[1], 0) + 1
    return {model: count / max(1, totals.get(model, count)) for model, count in parted.items()}


def _compare_pooled(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout,
                    shares: dict[str, float]) -> Row:
    """A table pooled over each model's generations: where a share s of a model's generations parted at a near-tie,
    each of its values may move by at most 2 · s · (the largest |value| of that column for the model) beyond float
    tolerance, and a row only one side has counts as zeros on the other; every other model must agree within
    tolerance. So one parted generation of six excuses a sixth of the scale, never a tripled or deleted row."""
    merged = a.merge(b, on=list(layout.keys), how="outer", suffixes=("", "__rerun"), indicator=True)
    owners = merged["model"].astype(str).map(lambda m: _BASELINE.sub(r"\1", m))
    share = owners.map(lambda m: shares.get(m, 0.0)).to_numpy(dtype=np.float64)
    one_sided = (merged["_merge"] != "both").to_numpy()
    problems, largest = [], 0.0
    if (one_sided & (share == 0)).any():
        problems.append(f"{int((one_sided & (share == 0)).sum())} rows on one side only")
    for column in (c for c in a.columns if c not in layout.keys):
        x = merged[column].to_numpy(dtype=np.float64, na_value=np.nan)
        y = merged[f"{column}__rerun"].to_numpy(dtype=np.float64, na_value=np.nan)
        x, y = np.where(one_sided & np.isnan(x), 0.0, x), np.where(one_sided & np.isnan(y), 0.0, y)
        scale = pd.Series(np.abs(x)).groupby(owners.to_numpy()).transform("max").to_numpy()
        allowed = FLOAT_TOLERANCE * (1 + np.abs(x)) + 2 * share * np.nan_to_num(scale)
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isnan(x) & np.isnan(y), 0.0, np.abs(x - y))
        gap = np.where(np.isnan(gap), np.inf, gap)
        largest = max(largest, float((gap / (1 + np.abs(np.nan_to_num(x)))).max(initial=0.0)))
        if (gap > allowed).any():
            worst = merged.iloc[int(np.argmax(gap - allowed))]
            problems.append(f"{column} differs beyond its bound in {int((gap > allowed).sum())} rows (e.g. "
                            f"{worst['model']}: {worst[column]!r} / {worst[f'{column}__rerun']!r})")
    parted = {m: s for m, s in shares.items() if (owners == m).any()}
    note = ("; ".join(f"{m}: {s:.0%} of its generations parted at a near-tie" for m, s in sorted(parted.items()))
            if parted else "")
    if problems:
        return Row(name, rows, DIFFERS, largest, "; ".join(problems + ([note] if note else [])))
    return Row(name, rows, NEAR if parted else WITHIN, largest, note)


def _float_difference(left: pd.Series, right: pd.Series) -> float:
    """The largest |a − b| / (1 + |a|) over the rows, NaN = NaN (a NaN against a number is infinite)."""
    x, y = left.to_numpy(dtype=np.float64), right.to_numpy(dtype=np.float64)
    if x.size == 0:
        return 0.0
    both_nan = np.isnan(x) & np.isnan(y)
    with np.errstate(invalid="ignore"):
        difference = np.abs(x - y) / (1 + np.abs(x))
    difference = np.where(both_nan | (x == y), 0.0, np.where(np.isnan(difference), np.inf, difference))
    return float(difference.max())
