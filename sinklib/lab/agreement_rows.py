"""Row-level comparisons for sinklib.lab.agreement: the verdict words and tolerances, one results table
against its rerun (identifying columns equal, floats within FLOAT_TOLERANCE, near-ties named), Table 1's run
tables and pooled tables. The module docstring of sinklib.lab.agreement says how each tolerance was measured."""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import TypeAdapter, ValidationError

from sinklib.dynamics import THRESHOLD_BAND
from sinklib.provenance import read_layout
from sinklib.summary import Layout
from sinklib.ties import both_near_tie


FLOAT_TOLERANCE = 1e-4  # floats within FLOAT_TOLERANCE of 1 + |committed value| (sinklib.lab.agreement)
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
ACCURACIES = ("accuracy", "accuracy_flexible", "stderr")  # a Table 1 run's shares: moved by its parted answers / n
_BASELINE = re.compile(r"^uniform causal attention \((.+)'s lengths\)$")  # fig10's reference rows, per model
_LAYOUT = TypeAdapter(Layout)  # the layout record a table carries (provenance.read_layout), validated


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
    parts at step 0; a step only one side has parts there, with NaN for the other side's margin)."""
    keys = ["model", "trace", "step"]
    merged = _merged(committed[[*keys, "canvas", "margin"]], rerun[[*keys, "canvas", "margin"]], keys)
    both = (merged["_merge"] == "both").to_numpy()
    same = [ok and list(a) == list(b) for ok, a, b in zip(both, merged["canvas"], merged["canvas__rerun"])]
    first = merged[~np.array(same, dtype=bool)].sort_values(keys).groupby(["model", "trace"], sort=False).head(1)
    return [Divergence(str(m), int(t), int(s), float(a), float(b)) for m, t, s, a, b in
            zip(first["model"], first["trace"], first["step"], first["margin"], first["margin__rerun"])]


def compare_file(committed: Path, rerun: Path, explained: set[tuple] = frozenset()) -> Row:
    """Compare one results file; rows downstream of the `explained` near-ties may differ within their bounds
    (("trace", model, trace, step): a generation that parted at a near-tie at that step, which explains its rows from
    that step on; ("answers" / "flagged", model, condition, k,
    count): an evaluation run's samples whose outputs parted / that decided a near-tie, from compare_items)."""
    name = committed.stem
    a, b, settled = read_pair(committed, rerun)
    if settled and settled.status == DIFFERS:
        return settled
    try:
        layout = _layout(committed, rerun)
    except ValidationError as error:
        return Row(name, f"{len(a)} / {len(b)}", DIFFERS, detail=f"its layout is not readable: {one_line(error, 200)}")
    if settled and not (layout is not None and layout.scope == "run"):  # identical runs still match their items
        return settled
    rows = f"{len(a)} / {len(b)}"
    if layout is None:
        return Row(name, rows, DIFFERS, detail="no layout for this file: only an identical frame agrees")
    if layout.index:
        a, b = a.reset_index(), b.reset_index()
    schema = schema_problems(a, b, list(layout.keys))
    if schema:
        return Row(name, rows, DIFFERS, detail="; ".join(schema))
    if layout.scope == "model":
        return _compare_pooled(name, rows, a, b, layout, _parted_shares(explained))
    if layout.scope == "run":
        items = (committed.with_name(f"{name}{ITEMS}.parquet"), rerun.with_name(f"{name}{ITEMS}.parquet"))
        return _compare_runs(name, rows, a, b, layout, explained, items)
    aside_a, aside_b = _downstream(a, layout, explained), _downstream(b, layout, explained)
    return _compare_rows(name, rows, a[~aside_a], b[~aside_b], layout, int(aside_a.sum()))


def _layout(committed: Path, rerun: Path) -> Layout | None:
    """The layout the table carries (summary.Layout, written with it, validated by pydantic): the rerun's, which the
    code under test wrote, else the committed file's; None when neither carries one."""
    for path in (rerun, committed):
        found = read_layout(path) if path.exists() else None
        if found is not None:
            return _LAYOUT.validate_python(found)
    return None


def one_line(error: Exception, limit: int | None = None) -> str:
    """An error's message on one line (at most `limit` characters): for a report's detail."""
    return " ".join(str(error).split())[:limit]


def missing(committed: Path, rerun: Path, name: str | None = None) -> Row | None:
    """The row of a file one side lacks (artifact `name`, else the file's stem), or None when both have it."""
    if committed.exists() and rerun.exists():
        return None
    side = "the committed results" if not committed.exists() else "the rerun"
    return Row(name or committed.stem, "-", DIFFERS, detail=f"missing from {side}")


def read_pair(committed: Path, rerun: Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None, Row | None]:
    """(committed frame, rerun frame, None), or the row that settles the comparison already: a file missing or
    unreadable on one side (frames None), or two identical frames (IDENTICAL, with the frames)."""
    if absent := missing(committed, rerun):
        return None, None, absent
    frames = []
    for path, side in ((committed, "committed"), (rerun, "rerun")):
        try:
            frames.append(pd.read_parquet(path))
        except Exception as error:  # noqa: BLE001  (pyarrow raises many kinds; a damaged file is a finding)
            return None, None, Row(committed.stem, "-", DIFFERS,
                                   detail=f"the {side} file is not a readable table: {one_line(error, 200)}")
    a, b = frames
    return a, b, Row(committed.stem, f"{len(a)} / {len(b)}", IDENTICAL) if a.equals(b) else None



def schema_problems(a: pd.DataFrame, b: pd.DataFrame, keys: list[str], required: tuple[str, ...] = ()) -> list[str]:
    """What makes two tables incomparable row by row: other columns (renamed, dropped or added), identifying or
    `required` columns missing, rows whose identifying columns repeat, identifying columns of other kinds."""
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
        problems += [f"the {side} table has no {column!r} column" for column in required if column not in frame.columns]
    if not problems and any(a[key].dtype.kind != b[key].dtype.kind for key in keys):
        problems.append(f"its identifying columns ({', '.join(keys)}) are of other types on the two sides")
    return problems


def _merged(a: pd.DataFrame, b: pd.DataFrame, keys) -> pd.DataFrame:
    """Every row of a and b by their keys, side by side (b's columns suffixed __rerun; _merge says which sides)."""
    return a.merge(b, on=list(keys), how="outer", suffixes=("", "__rerun"), indicator=True)


def matched(a: pd.DataFrame, b: pd.DataFrame, keys) -> tuple[pd.DataFrame, int]:
    """The rows of a and b with the same keys side by side, and how many rows only one side has."""
    merged = _merged(a, b, keys)
    both = merged["_merge"] == "both"
    return merged[both], int((~both).sum())


def verdict(name: str, rows: str, problems: list[str], largest: float, note: str, agreeing: str) -> Row:
    """DIFFERS naming the problems (and the note), else `agreeing` with the note."""
    if problems:
        return Row(name, rows, DIFFERS, largest, "; ".join(problems + ([note] if note else [])))
    return Row(name, rows, agreeing, largest, note)


def _floats(values) -> np.ndarray:
    if isinstance(values, pd.Series):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


def _gaps(x, y) -> np.ndarray:
    """|x − y| per row: 0 where both are NaN or equal, infinite where one only is NaN."""
    x, y = _floats(x), _floats(y)
    with np.errstate(invalid="ignore"):
        gap = np.abs(x - y)
    return np.where((np.isnan(x) & np.isnan(y)) | (x == y), 0.0, np.where(np.isnan(gap), np.inf, gap))


def float_difference(left, right) -> float:
    """The largest |a − b| / (1 + |a|) over the rows, NaN = NaN (a NaN against a number is infinite)."""
    x = _floats(left)
    return float((_gaps(x, right) / (1 + np.abs(np.nan_to_num(x)))).max(initial=0.0))


def _changed(merged: pd.DataFrame, column: str) -> int:
    """How many matched rows hold another value of a discrete column."""
    return int((merged[column].astype(object).values != merged[f"{column}__rerun"].astype(object).values).sum())


def _is_float(merged: pd.DataFrame, column: str) -> bool:
    return all(pd.api.types.is_float_dtype(merged[c]) for c in (column, f"{column}__rerun"))


def _beyond(merged: pd.DataFrame, column: str, x: np.ndarray, y: np.ndarray, extra, unit: str,
            why="beyond its bound", rounding: float = FLOAT_TOLERANCE) -> tuple[str, float]:
    """(a problem or '', the largest gap relative to 1 + |committed|) for one column of rows matched in `merged`,
    its values x (committed) and y (rerun) allowed to differ by rounding · (1 + |committed|) + extra (per row);
    `why` (per row, or one for all) says how the worst row differs."""
    gap, base = _gaps(x, y), 1 + np.abs(np.nan_to_num(x))
    allowed = rounding * base + extra
    beyond = gap > allowed
    largest = float((gap / base).max(initial=0.0))
    if not beyond.any():
        return "", largest
    worst = int(np.argmax(np.where(beyond, gap - allowed, -np.inf)))
    row = merged.iloc[worst]
    example = f"{row['model']} {row['condition']} k={row['k']}" if unit == "runs" else str(row["model"])
    return (f"{column} differs {np.broadcast_to(np.asarray(why), beyond.shape)[worst]} in {int(beyond.sum())} "
            f"{unit} (e.g. {example}: {row[column]!r} / {row[f'{column}__rerun']!r})"), largest


def _owners(frame: pd.DataFrame) -> pd.Series:
    """Each row's model: fig10's reference rows belong to the model whose lengths they take."""
    return frame["model"].astype(str).str.replace(_BASELINE, r"\1", regex=True)


def _model_scale(x: np.ndarray, models) -> np.ndarray:
    """Per row, the largest |value| of its column for its model (0 where there is none)."""
    return np.nan_to_num(pd.Series(np.abs(x)).groupby(np.asarray(models)).transform("max").to_numpy())


def _downstream(frame: pd.DataFrame, layout: Layout, explained: set[tuple]) -> np.ndarray:
    """Which rows a near-tie explains: rows of a generation that parted at a near-tie (scope "trace": the row's;
    "first": its model's first) from its parting step on — a row at an earlier step was computed on canvases both
    runs agree on, so it must agree; a row with no step column summarises the whole generation."""
    if layout.scope not in ("trace", "first"):
        return np.zeros(len(frame), dtype=bool)
    parted = {(entry[1], int(entry[2])): int(entry[3]) if len(entry) > 3 else 0
              for entry in explained if entry[0] == "trace"}
    traces = frame["trace"] if layout.scope == "trace" else [0] * len(frame)
    steps = frame["step"] if "step" in frame.columns else [math.inf] * len(frame)
    return np.array([(m, int(t)) in parted and step >= parted[(m, int(t))]
                     for m, t, step in zip(_owners(frame), traces, steps)], dtype=bool)


def _compare_rows(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout, skipped: int) -> Row:
    """Row by row (scopes trace, first, none): every row on both sides (but those of a threshold test within the band
    that a table of its outcomes keeps on one side only: _undecided), discrete columns equal (an outcome column may
    flip where both runs' tests were within rounding), floats within FLOAT_TOLERANCE; `skipped` rows after a near-tie
    set aside (the committed ones: the rerun's may number more or fewer)."""
    merged = _merged(a, b, layout.keys)
    at_band, flipped = _undecided(merged, layout)
    one_sided = int((merged["_merge"] != "both").sum()) - at_band
    problems, largest = [f"{one_sided} rows on one side only"] if one_sided else [], 0.0
    merged = merged[merged["_merge"] == "both"]
    for column in (c for c in a.columns if c not in layout.keys):
        if _is_float(merged, column):
            difference = float_difference(merged[column], merged[f"{column}__rerun"])
            largest = max(largest, difference)
            problems += [f"{column} differs by {difference:.2g} of 1 + |value|"] if difference > FLOAT_TOLERANCE else []
        elif changed := _changed(merged, column) - (flipped if column == layout.outcome else 0):
            problems.append(f"{column} differs in {changed} rows" + (
                f" whose {layout.threshold} is not within rounding in both runs" if column == layout.outcome else ""))
    note = "; ".join(part for part in (
        f"{skipped} rows after a near-tie set aside (its generation's, from its parting step on)" if skipped else "",
        f"{flipped} rows' {layout.outcome} decided otherwise by a threshold test within rounding in both runs"
        if flipped else "",
        f"{at_band} rows on one side only, each not {layout.outcome}, at the edge of the band of undecided tests"
        if at_band else "") if part)
    return verdict(name, rows, problems, largest, note, NEAR if note else WITHIN)


def _undecided(merged: pd.DataFrame, layout: Layout) -> tuple[int, int]:
    """(rows only one side has that its threshold tests explain, rows whose outcome the two runs decided otherwise
    that they explain) for a table of a threshold test's outcomes (layout.threshold: the closest test's relative gap;
    layout.outcome: what the tests decided). Such a table also holds the rows a test within
    dynamics.THRESHOLD_BAND could decide otherwise (outcome False), so another CPU's rerun has every row the
    committed table has, bar one whose test crossed the band's edge — never a row whose outcome is True. An
    outcome may differ only where both runs' gaps are within FLOAT_TOLERANCE: a committed row written by hand
    (a fabricated gap of 0) is held against the rerun's own scores."""
    if layout.threshold is None or layout.outcome is None or layout.threshold not in merged.columns:
        return 0, 0
    left = merged["_merge"] == "left_only"
    side = lambda column: merged[column].where(left, merged[f"{column}__rerun"])  # noqa: E731
    gap, outcome = side(layout.threshold).astype(np.float64), side(layout.outcome)
    at_band = (merged["_merge"] != "both") & ~outcome.astype(bool) & (gap <= THRESHOLD_BAND + FLOAT_TOLERANCE)
    both = merged["_merge"] == "both"
    flipped = both & (merged[layout.outcome].astype(object).values != merged[f"{layout.outcome}__rerun"].astype(object).values)
    within = (merged[layout.threshold].astype(np.float64) <= FLOAT_TOLERANCE) & \
        (merged[f"{layout.threshold}__rerun"].astype(np.float64) <= FLOAT_TOLERANCE)
    return int(at_band.sum()), int((flipped & within).sum())


def _parted_shares(explained: set[tuple]) -> dict[str, float]:
    """model → the share of its generations that parted from the committed ones at a near-tie."""
    totals = {entry[1]: entry[2] for entry in explained if entry[0] == "generations"}
    parted = Counter(entry[1] for entry in explained if entry[0] == "trace")
    return {model: count / max(1, totals.get(model, count)) for model, count in parted.items()}


def _compare_pooled(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout,
                    shares: dict[str, float]) -> Row:
    """A table pooled over each model's generations: where a share s of a model's generations parted at a near-tie,
    each of its values may move by at most 2 · s · (the largest |value| of that column for the model) beyond float
    tolerance, and a row only one side has counts as zeros on the other; every other model must agree within
    tolerance. So one parted generation of six excuses a sixth of the scale, never a tripled or deleted row."""
    merged = _merged(a, b, layout.keys)
    owners = _owners(merged)
    share = owners.map(lambda m: shares.get(m, 0.0)).to_numpy(dtype=np.float64)
    one_sided = (merged["_merge"] != "both").to_numpy()
    unexplained = int((one_sided & (share == 0)).sum())
    problems, largest = [f"{unexplained} rows on one side only"] if unexplained else [], 0.0
    for column in (c for c in a.columns if c not in layout.keys):
        x, y = (np.where(one_sided & np.isnan(v), 0.0, v) for v in (_floats(merged[column]),
                                                                     _floats(merged[f"{column}__rerun"])))
        problem, gap = _beyond(merged, column, x, y, 2 * share * _model_scale(x, owners), "rows")
        problems, largest = problems + ([problem] if problem else []), max(largest, gap)
    parted = {m: s for m, s in shares.items() if (owners == m).any()}
    note = "; ".join(f"{m}: {s:.0%} of its generations parted at a near-tie" for m, s in sorted(parted.items()))
    return verdict(name, rows, problems, largest, note, NEAR if parted else WITHIN)


def _compare_runs(name: str, rows: str, a: pd.DataFrame, b: pd.DataFrame, layout: Layout, explained: set[tuple],
                  items: tuple[Path, Path]) -> Row:
    """Table 1's runs (one row per model, condition, k): each side's accuracy must be the mean of its own items'
    correctness; the accuracies may move by at most (the run's parted answers) / n, the other floats — summed over
    the run's generations — by at most 2 · (its samples decided at a near-tie) / n of the column's largest |value|
    for the model; the audit's columns as _compare_audit says; everything else must be equal."""
    problems = [p for p in (_accuracy_from_items(a, items[0], "committed"), _accuracy_from_items(b, items[1], "rerun"))
                if p]
    merged, one_sided = matched(a, b, layout.keys)
    problems += [f"{one_sided} runs on one side only"] if one_sided else []
    parted, flagged = (_run_shares(merged, explained, kind) for kind in ("answers", "flagged"))
    audit_near = (np.array([both_near_tie(float(m), float(n)) for m, n in
                            zip(merged["audit_margin"], merged["audit_margin__rerun"])], dtype=bool)
                  if "audit_margin" in merged else np.zeros(len(merged), dtype=bool))
    largest = 0.0
    for column in (c for c in a.columns if c not in layout.keys):
        problem, gap = (_compare_audit(column, merged, audit_near) if column in AUDIT_COLUMNS
                        else _compare_run_column(column, merged, parted, flagged))
        problems, largest = problems + ([problem] if problem else []), max(largest, gap)
    note = f"{int((parted > 0).sum())} runs with answers parted at a near-tie" if (parted > 0).any() else ""
    return verdict(name, rows, problems, largest, note, NEAR if note else IDENTICAL if a.equals(b) else WITHIN)


def _run_shares(merged: pd.DataFrame, explained: set[tuple], kind: str) -> np.ndarray:
    """Per matched run, its samples of `kind` ("answers": outputs parted at a near-tie; "flagged": decided a
    near-tie in both runs, from compare_items) as a share of its n."""
    counts = {entry[1:4]: entry[4] for entry in explained if entry[0] == kind}
    found = [counts.get(key, 0) for key in zip(merged["model"], merged["condition"], merged["k"].astype(int))]
    return np.array(found, dtype=np.float64) / merged["n"].to_numpy(dtype=np.float64).clip(min=1)


def _compare_run_column(column: str, merged: pd.DataFrame, parted: np.ndarray, flagged: np.ndarray) -> tuple[str, float]:
    """(a problem or '', the largest relative gap) for one result column of Table 1's matched runs: the accuracies
    within the run's parted share, other floats within 2 × its flagged share of the model's scale, the rest equal."""
    if not _is_float(merged, column):
        changed = _changed(merged, column)
        return (f"{column} differs in {changed} runs" if changed else ""), 0.0
    x = _floats(merged[column])
    moved = parted if column in ACCURACIES else 2 * flagged * _model_scale(x, merged["model"])
    return _beyond(merged, column, x, _floats(merged[f"{column}__rerun"]), moved, "runs")


def _compare_audit(column: str, merged: pd.DataFrame, near: np.ndarray) -> tuple[str, float]:
    """(a problem or '', the largest relative gap) for one audit column of Table 1's matched runs: within rounding
    (the margin within MARGIN_TOLERANCE, the rest within FLOAT_TOLERANCE: counts equal) where the audited generation
    decided no near-tie in both runs, within AUDIT_SHIFT of the larger side where it did."""
    x, y = _floats(merged[column]), _floats(merged[f"{column}__rerun"])
    margin = column == "audit_margin"
    extra = np.where(near, np.inf if margin else AUDIT_SHIFT * np.fmax(np.abs(x), np.abs(y)), 0.0)
    why = np.where(near, f"beyond {AUDIT_SHIFT:.0%} although its audit decided a near-tie",
                   "beyond rounding, its audit deciding no near-tie in both runs")
    return _beyond(merged, column, x, y, extra, "runs", why, MARGIN_TOLERANCE if margin else FLOAT_TOLERANCE)


def _accuracy_from_items(table: pd.DataFrame, items: Path, side: str) -> str:
    """'' if each run's accuracy is the mean of its items' correctness (or there are no items), else what is not."""
    if not items.exists():
        return ""
    means = pd.read_parquet(items).groupby(["model", "condition", "k"])["correct"].mean()
    joined = table.set_index(["model", "condition", "k"])[["accuracy"]].join(means.rename("from_items"), how="left")
    wrong = joined[~np.isclose(joined["accuracy"], joined["from_items"], rtol=0, atol=1e-9)]
    if wrong.empty:
        return ""
    (model, condition, k), row = next(iter(wrong.iterrows()))
    return (f"the {side} accuracy of {len(wrong)} runs is not the share of its items answered correctly (e.g. "
            f"{model} {condition} k={k}: {row['accuracy']!r}, its items {row['from_items']!r})")
