"""Does a rerun agree with the committed results? Results files compared as a scientist would, not byte by byte.

Two CPUs (an AMD EPYC with AVX2, an Intel Xeon with AVX-512, or torch's portable kernels) round float32 sums
differently in the last bits. On the same canvas that moves a score by a few parts per million; where a
sampler's decision is closer than that — two positions equally confident, two tokens equally likely — the
other CPU may decide the other way, and the generation differs from that step on. So a rerun is compared
artifact by artifact:

- identical: the same frame;
- within tolerance: every identifying and discrete column equal, every float within FLOAT_TOLERANCE of
  1 + |committed value|;
- near-tie: everything else agrees, and the rows that differ all come after a generation parted from the
  committed one at a step whose decision margin was within NEAR_TIE in both runs (the generations table
  written by notebook 01 records each step's canvas and margin; Table 1's items table each sample's answer
  and its generation's closest margin). A near-tie excuses only what follows it in that one generation: an
  answer whose output parted, a pooled table within 2 × (the share of the model's generations that parted) of
  its scale, a Table 1 run's accuracy within (its parted answers) / n — and never the same output scored
  otherwise, nor an accuracy that is not the share of its own items answered correctly;
- differs: anything else (a discrete result that moved without a near-tie, a float out of tolerance, a row
  missing) — the check fails naming the artifact.

A decision's margin (families.base) is measured where it cannot saturate: a token's logit gap, relative; a
position's confidence in log-odds (or −log(−entropy)), with the two confidences' possible values on another CPU
bounded — logit gaps moved by LOGIT_ROUNDING, a float32 softmax's sum short of one lane's share of the rivals'
mass (LANE_SHARE), every result rounded — so that two probabilities of exactly 1.0 on every CPU are an exact tie
(margin 0, broken by the same fixed order everywhere) and two a rounding apart are a near-tie.

The bounds, measured (benchmarks/cpu_rounding_bound.py: the same generations with this CPU's AVX-512 kernels
and, in a child process, ATEN_CPU_CAPABILITY=default and =avx2): one forward's logits differ by at most 1.4e-5
of 1 + |logit| on the zoo and 4.5e-5 on SmolLM2 (6.6e-5 measured earlier on AVX2); 55 of 100 tiny-llada
generations part between AVX-512 and the portable kernels (33 against AVX2) — its low-confidence sampler ranks
many positions whose probabilities are 1 − 5e-6 apart by a few units of 2^-24 — and every parting step is a
near-tie in both runs, while no final answer differed; tiny-dream and tiny-arm parted nowhere. FLOAT_TOLERANCE =
1e-4 is about 30 times the largest attention-score difference (3.5e-6 of 1 + |score|) and covers the means, sums
and quantiles built from scores (float64 over float32 inputs).
"""
from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sinklib.provenance import read_layout, read_manifest
from sinklib.summary import Layout
from sinklib.ties import NEAR_TIE, both_near_tie, is_near_tie
from sinklib.validation import BadValue

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


@dataclass
class Report:
    """The comparison of a rerun with the committed results: one Row per artifact and where generations parted."""
    rows: list[Row] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    compared_with: list[str] = field(default_factory=list)  # what the committed side was (reproduce.check fills it)
    # how the committed artifacts' provenance (versions, machine, code) differs from the rerun's: told, not judged
    provenance: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Whether at least one artifact was compared and none differs (identical, within tolerance or near-tie all
        agree): a rerun that wrote nothing comparable confirms nothing."""
        return bool(self.rows) and all(row.status != DIFFERS for row in self.rows)

    @property
    def failing(self) -> list[str]:
        """The names of the artifacts that differ."""
        return [row.artifact for row in self.rows if row.status == DIFFERS]

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame, one column per Row field."""
        return pd.DataFrame([vars(row) for row in self.rows])

    def to_text(self) -> str:
        """The report as plain text: the rows' table, one line per divergence, and the tolerances used."""
        if not self.rows:
            return ("no artifact was compared: the rerun wrote no results file or explorer page that the committed "
                    "results hold (a notebook that only reads committed measurements, such as 06, writes none)")
        frame = self.frame()
        frame["largest_difference"] = [f"{v:.2g}" if v else "0" for v in frame["largest_difference"]]
        lines = [frame.to_string(index=False, justify="left")]
        lines += [f"- {d.describe()}" for d in self.divergences]
        lines += [f"provenance: {line}" for line in self.provenance]
        lines.append(f"tolerances: floats within {FLOAT_TOLERANCE:g} of 1 + |committed|; a near-tie is a decision "
                     f"margin <= {NEAR_TIE:g} in both runs")
        return "\n".join(lines)


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


def compare_folders(committed: Path, rerun: Path, rerun_only: bool = False, pages: tuple[Path, Path] | None = None
                    ) -> Report:
    """Compare every results file (*.parquet) of `committed` with the same file in `rerun` (rerun_only: only the
    files the rerun wrote, for a rerun of some of the notebooks), and, of the two figure folders in `pages`
    (committed, rerun), the explorer pages, the text tables (*.md, *.tex) and the figures (*.png, with their *.pdf)."""
    committed, rerun = Path(committed), Path(rerun)
    report = Report()
    names = {p.stem for p in rerun.glob("*.parquet")}
    if not rerun_only:
        names |= {p.stem for p in committed.glob("*.parquet")}
    names = sorted(names)
    explained: set[tuple] = set()
    if GENERATIONS in names:
        report.rows.append(_compare_generations(committed, rerun, report, explained))
    for name in (n for n in names if n.endswith(ITEMS)):
        report.rows.append(compare_items(committed / f"{name}.parquet", rerun / f"{name}.parquet", explained))
    for name in names:
        if name == GENERATIONS or name.endswith(ITEMS):
            continue
        report.rows.append(compare_file(committed / f"{name}.parquet", rerun / f"{name}.parquet", explained))
    if pages is not None:
        report.rows += _compare_figure_folder(Path(pages[0]), Path(pages[1]), rerun_only, report, committed)
    folders = [(committed, rerun)] + ([(Path(pages[0]), Path(pages[1]))] if pages is not None else [])
    _compare_parameters(report, folders)
    return report


def _files(committed: Path, rerun: Path, patterns: tuple[str, ...], rerun_only: bool) -> list[str]:
    """The names of the files matching `patterns` in the rerun's folder (and, unless rerun_only, the committed one's)."""
    folders = (rerun,) if rerun_only else (rerun, committed)
    return sorted({p.name for folder in folders for pattern in patterns for p in folder.glob(pattern) if p.is_file()})


def _compare_figure_folder(committed: Path, rerun: Path, rerun_only: bool, report: Report, results: Path) -> list[Row]:
    """The explorer pages (compare_page), the text tables (compare_text: each against its results table's row in
    `report`) and the figures (compare_figure: drawn from data of the same notebook as its tables) of two figure
    folders."""
    rows = [compare_page(committed / n, rerun / n) for n in _files(committed, rerun, ("explorer_*.html",), rerun_only)]
    by_table = {row.artifact: row for row in report.rows}
    rows += [compare_text(committed / n, rerun / n, by_table.get(Path(n).stem))
             for n in _files(committed, rerun, TEXT_TABLES, rerun_only)]
    parted = _notebooks_of(results, [row.artifact for row in report.rows if row.status == NEAR])
    notebooks = _notebooks_of(committed, None)
    for name in _files(committed, rerun, ("*.png",), rerun_only):
        near = notebooks.get(name) in parted.values()
        rows.append(compare_figure(committed / name, rerun / name, near))
    return rows


def _notebooks_of(folder: Path, stems: list[str] | None) -> dict[str, str]:
    """artifact file name → the notebook that wrote it, from the folder's PROVENANCE.json (for the artifacts whose
    stems are `stems`, or all); {} where it has none or cannot be read (compare_folders reports that file)."""
    try:
        manifest = read_manifest(folder)
    except (ValueError, OSError):
        return {}
    return {name: str(entry.get("notebook")) for name, entry in manifest.items()
            if stems is None or Path(name).stem in stems}


def compare_text(committed: Path, rerun: Path, table: Row | None) -> Row:
    """A text rendering of a results table (figures/*.md, *.tex): equal to the committed text, or, where the table it
    renders (`table`, its row of this report) agreed only up to a near-tie, allowed to differ as that table does."""
    name = committed.name
    missing = _missing(committed, rerun)
    if missing:
        return Row(name, "-", DIFFERS, detail=missing.detail)
    a, b = _read_bytes(committed), _read_bytes(rerun)
    if a == b:
        return Row(name, "1 / 1", IDENTICAL)
    if table is not None and table.status == NEAR:
        return Row(name, "1 / 1", NEAR, detail=f"renders {table.artifact}, which agrees up to a near-tie")
    why = "its table agrees exactly" if table is not None and table.status != DIFFERS else (
        "its table differs" if table is not None else "no results table of this name was compared")
    return Row(name, "1 / 1", DIFFERS, detail=f"the text differs from the committed one ({why})")


def compare_figure(committed: Path, rerun: Path, parted: bool = False) -> Row:
    """A figure (PNG; its PDF twin follows it): the same bytes, or the same size with at most FIGURE_PIXELS_WITHIN of
    its pixels changed (anti-aliasing of values that agree), or FIGURE_PIXELS_NEAR where its notebook's data parted
    at a near-tie (`parted`); the PDF twin must exist on both sides. Another plot, or a figure missing, differs."""
    name = committed.name
    pdfs = (committed.with_suffix(".pdf"), rerun.with_suffix(".pdf"))
    for pair in ((committed, rerun), *([pdfs] if any(path.exists() for path in pdfs) else [])):
        missing = _missing(*pair)
        if missing:
            return Row(name, "-", DIFFERS, detail=f"{pair[0].name} {missing.detail}")
    if _read_bytes(committed) == _read_bytes(rerun):
        return Row(name, "1 / 1", IDENTICAL)
    try:
        import matplotlib.image  # noqa: PLC0415  (the notebooks' extra: only a figure check decodes PNGs)

        a, b = matplotlib.image.imread(committed), matplotlib.image.imread(rerun)
    except (OSError, ValueError, SyntaxError) as error:
        return Row(name, "1 / 1", DIFFERS, detail=f"not a readable PNG: {' '.join(str(error).split())}")
    if a.shape != b.shape:
        return Row(name, "1 / 1", DIFFERS, detail=f"another size: {a.shape[:2]} / {b.shape[:2]} pixels")
    changed = float((a != b).any(axis=-1).mean()) if a.ndim == 3 else float((a != b).mean())
    detail = f"{changed:.2%} of its pixels differ"
    if changed <= FIGURE_PIXELS_WITHIN:
        return Row(name, "1 / 1", WITHIN, changed, detail)
    if parted and changed <= FIGURE_PIXELS_NEAR:
        return Row(name, "1 / 1", NEAR, changed, f"{detail}; its notebook's data parted at a near-tie")
    bound = FIGURE_PIXELS_NEAR if parted else FIGURE_PIXELS_WITHIN
    return Row(name, "1 / 1", DIFFERS, changed, f"{detail} (more than {bound:.0%}: another plot)")


def _read_bytes(path: Path) -> bytes:
    return Path(path).read_bytes()


PROVENANCE_FIELDS = ("versions", "machine", "code")


def provenance_differences(old: dict, new: dict) -> list[str]:
    """One line per provenance field (PROVENANCE_FIELDS' entries: package versions, CPU, code) whose committed values
    differ from the rerun's, over the artifacts both hold, each naming the artifacts it concerns (a count past 3)."""
    changes: dict[str, list[str]] = {}
    for name in sorted(set(old) & set(new)):
        for part in PROVENANCE_FIELDS:
            before, after = old[name].get(part) or {}, new[name].get(part) or {}
            for key in sorted(set(before) | set(after)):
                if before.get(key) != after.get(key):
                    changes.setdefault(f"{part}.{key}: {before.get(key)!r} → {after.get(key)!r}", []).append(name)
    return [f"{change} ({', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''})"
            for change, names in changes.items()]


def _compare_parameters(report: Report, folders: list[tuple[Path, Path]]) -> None:
    """Mark every compared artifact whose run parameters (the `config` its PROVENANCE.json records) differ between
    the committed folder and the rerun's as differing: a rerun with another eps or other models confirms nothing,
    however close its numbers."""
    configs: dict[str, tuple] = {}
    for committed, rerun in folders:
        try:
            old, new = read_manifest(committed), read_manifest(rerun)
        except (ValueError, OSError) as error:  # json's JSONDecodeError is a ValueError
            report.rows.append(Row(f"{committed.name}/PROVENANCE.json", "-", DIFFERS,
                                   detail=f"not readable: {' '.join(str(error).split())}"))
            continue
        for file_name in set(old) & set(new):
            configs[Path(file_name).stem if file_name.endswith(".parquet") else file_name] = (
                old[file_name].get("config"), new[file_name].get("config"))
        report.provenance += provenance_differences(old, new)
    for row in report.rows:
        before, after = configs.get(row.artifact, (None, None))
        if before is None or after is None or before == after:
            continue
        changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
        described = ", ".join(f"{key} {before.get(key)!r} → {after.get(key)!r}" for key in changed)
        row.status = DIFFERS
        row.detail = "; ".join(filter(None, [f"run parameters differ: {described}", row.detail]))


def compare_items(committed: Path, rerun: Path, explained: set[tuple]) -> Row:
    """Table 1's samples: the same samples in each run and the same answers, except an answer whose output parted
    from the committed one after a near-tie in both runs; the same output scored differently is never excused.
    Adds, per run (model, condition, k): ("answers", …, count) how many outputs parted so, ("flagged", …, count) how
    many samples decided a near-tie in both runs — the bounds compare_file gives that run's row."""
    name = committed.stem
    a, b, settled = _read_pair(committed, rerun)
    if settled:
        return settled
    rows = f"{len(a)} / {len(b)}"
    schema = _schema_problems(a, b, ["model", "condition", "k", "id"])
    if schema:
        return Row(name, rows, DIFFERS, detail="; ".join(schema))
    merged, unmatched = _matched(a, b, ["model", "condition", "k", "id"])
    near = merged["margin"].map(is_near_tie) & merged["margin__rerun"].map(is_near_tie)
    parted = merged["output"] != merged["output__rerun"]
    rescored = ~parted & (merged["correct"] != merged["correct__rerun"])
    problems = [f"{unmatched} samples on one side only"] if unmatched else []
    if rescored.any():
        first = merged[rescored].iloc[0]
        problems.append(f"{int(rescored.sum())} answers scored differently on the same output (e.g. {first['model']} "
                        f"{first['condition']} k={first['k']} sample {first['id']}: correct {first['correct']} / "
                        f"{first['correct__rerun']})")
    if (parted & ~near).any():
        first = merged[parted & ~near].iloc[0]
        problems.append(f"{int((parted & ~near).sum())} answers changed without a near-tie (e.g. {first['model']} "
                        f"{first['condition']} k={first['k']} sample {first['id']}: margin {first['margin']:.2g} / "
                        f"{first['margin__rerun']:.2g})")
    same = ~parted & ~near
    margins = _float_difference(merged.loc[same, "margin"], merged.loc[same, "margin__rerun"])
    if margins > MARGIN_TOLERANCE:
        problems.append(f"the closest margins of answers decided alike differ by up to {margins:.2g} of 1 + |margin| "
                        f"(rounding moves them at most {MARGIN_TOLERANCE:g})")
    problems += _answers_beyond_bound(merged, parted & near)
    for kind, flags in (("answers", parted & near), ("flagged", near)):
        counts = merged[flags].groupby(["model", "condition", "k"]).size()
        explained.update((kind, m, c, int(k), int(n)) for (m, c, k), n in counts.items())
    if problems:
        return Row(name, rows, DIFFERS, detail="; ".join(problems))
    if not parted.any():
        return Row(name, rows, WITHIN, detail="the same answers")
    return Row(name, rows, NEAR, detail=f"{int(parted.sum())} outputs changed, each after a near-tie "
                                        f"(closest margins <= {NEAR_TIE:g} in both runs)")


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


def _compare_generations(committed: Path, rerun: Path, report: Report, explained: set) -> Row:
    missing = _missing(committed / f"{GENERATIONS}.parquet", rerun / f"{GENERATIONS}.parquet")
    if missing:
        return missing
    a, b = pd.read_parquet(committed / f"{GENERATIONS}.parquet"), pd.read_parquet(rerun / f"{GENERATIONS}.parquet")
    schema = _schema_problems(a, b, ["model", "trace", "step"])
    schema += [f"the {side} table has no {column!r} column" for frame, side in ((a, "committed"), (b, "rerun"))
               for column in ("canvas", "margin") if column not in frame.columns]
    if not schema and any(a[key].dtype != b[key].dtype for key in ("model", "trace", "step")):
        schema.append("its identifying columns (model, trace, step) are of other types on the two sides")
    if schema:
        return Row(GENERATIONS, f"{len(a)} / {len(b)}", DIFFERS, detail="; ".join(schema))
    report.divergences = divergences(a, b)
    explained.update(("trace", d.model, d.trace) for d in report.divergences if d.near_tie)
    explained.update(("generations", str(m), int(n)) for m, n in a.groupby("model")["trace"].nunique().items())
    rows = f"{len(a)} / {len(b)}"
    margins = _margins_before_parting(a, b, report.divergences)
    if margins > MARGIN_TOLERANCE:
        return Row(GENERATIONS, rows, DIFFERS, margins, f"the margins of steps whose canvases agree differ by up to "
                   f"{margins:.2g} of 1 + |margin| (rounding moves them at most {MARGIN_TOLERANCE:g})")
    if not report.divergences:
        return Row(GENERATIONS, rows, IDENTICAL if a.equals(b) else WITHIN, margins, "every canvas identical")
    status = NEAR if all(d.near_tie for d in report.divergences) else DIFFERS
    return Row(GENERATIONS, rows, status, margins, "; ".join(d.describe() for d in report.divergences))


def _margins_before_parting(a: pd.DataFrame, b: pd.DataFrame, parted: list[Divergence]) -> float:
    """The largest difference (_float_difference) of the margins both generations tables record for a step before
    its generation parted (every step of a generation that never parted)."""
    merged = a.merge(b, on=["model", "trace", "step"], suffixes=("", "__rerun"))
    first = {(d.model, d.trace): d.step for d in parted}
    before = [step < first.get((str(model), int(trace)), math.inf)
              for model, trace, step in zip(merged["model"], merged["trace"], merged["step"])]
    merged = merged[np.array(before, dtype=bool)] if len(merged) else merged
    return _float_difference(merged["margin"], merged["margin__rerun"])


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


_PAGE_DATA = re.compile(r'(<script type="application/json" id="sinklib-explorer-data">)(.*?)(</script>)', re.S)
_PAGE_SHAPE = ("format", "model", "n_steps", "n_layers", "n_heads", "seq", "prompt_len", "layer_names", "layer_ids",
               "model_layers")


def compare_page(committed: Path, rerun: Path) -> Row:
    """Compare two explorer pages: the page around the data byte for byte (the front end, its style), the data's
    shape exactly, the canvases exactly up to a near-tie, and the embedded scores within FLOAT_TOLERANCE."""
    name = committed.name
    missing = _missing(committed, rerun)
    if missing:
        return Row(name, "-", DIFFERS, detail=missing.detail)
    a_text, b_text = committed.read_text(encoding="utf-8"), rerun.read_text(encoding="utf-8")
    if a_text == b_text:
        return Row(name, "1 / 1", IDENTICAL)
    (a_page, a), (b_page, b) = _page_parts(a_text), _page_parts(b_text)
    if a_page != b_page:
        return Row(name, "1 / 1", DIFFERS, detail="the page around the data differs (front end or style changed)")
    a_head, b_head = a["header"], b["header"]
    shape = [key for key in _PAGE_SHAPE if a_head.get(key) != b_head.get(key)]
    if shape:
        return Row(name, "1 / 1", DIFFERS, detail=f"the data's shape differs: {shape}")
    margins = lambda h: [float("nan") if m is None else m for m in h.get("margins") or []]  # noqa: E731
    steps = lambda h: pd.DataFrame({"model": h["model"], "trace": 0, "step": range(len(h["canvas"]) - 1),  # noqa: E731
                                    "canvas": h["canvas"][1:],
                                    "margin": (margins(h) + [math.nan] * len(h["canvas"]))[:len(h["canvas"]) - 1]})
    parted = divergences(steps(a_head), steps(b_head))
    if parted:
        return Row(name, "1 / 1", NEAR if parted[0].near_tie else DIFFERS, detail=parted[0].describe())
    scores = [np.frombuffer(base64.b64decode(d["scores"]), dtype="<f4") for d in (a, b)]
    largest = _float_difference(pd.Series(scores[0]), pd.Series(scores[1]))
    if largest > FLOAT_TOLERANCE:
        return Row(name, "1 / 1", DIFFERS, largest, f"scores differ by {largest:.2g} of 1 + |score|")
    return Row(name, "1 / 1", WITHIN, largest, "same canvases")


def _page_parts(text: str) -> tuple[str, dict]:
    found = _PAGE_DATA.search(text)
    if found is None:
        raise BadValue("this page holds no sinklib explorer data")
    return text[:found.start(2)] + text[found.end(2):], json.loads(found.group(2))


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
