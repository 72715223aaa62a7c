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

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Base64Bytes, BaseModel, ValidationError

from sinklib.provenance import read_manifest
from sinklib.ties import NEAR_TIE
from sinklib.lab.agreement_answers import compare_items
from sinklib.lab.agreement_figures import compare_figure
from sinklib.lab.agreement_rows import (DIFFERS, FLOAT_TOLERANCE, GENERATIONS,
                                        IDENTICAL, ITEMS, MARGIN_TOLERANCE, NEAR, TEXT_TABLES, WITHIN, Divergence, Row,
                                        compare_file, divergences, float_difference, missing, one_line, schema_problems)


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

    def to_text(self) -> str:
        """The report as plain text: the rows' table, one line per divergence, and the tolerances used."""
        if not self.rows:
            return ("no artifact was compared: the rerun wrote no results file or explorer page that the committed "
                    "results hold (a notebook that only reads committed measurements, such as 06, writes none)")
        frame = pd.DataFrame([vars(row) for row in self.rows])
        frame["largest_difference"] = [f"{v:.2g}" if v else "0" for v in frame["largest_difference"]]
        lines = [frame.to_string(index=False, justify="left")]
        lines += [f"- {d.describe()}" for d in self.divergences]
        lines += [f"provenance: {line}" for line in self.provenance]
        lines.append(f"tolerances: floats within {FLOAT_TOLERANCE:g} of 1 + |committed|; a near-tie is a decision "
                     f"margin <= {NEAR_TIE:g} in both runs")
        return "\n".join(lines)


def compare_folders(committed: Path, rerun: Path, rerun_only: bool = False, pages: tuple[Path, Path] | None = None
                    ) -> Report:
    """Compare every results file (*.parquet) of `committed` with the same file in `rerun` (rerun_only: only the
    files the rerun wrote, for a rerun of some of the notebooks), and, of the two figure folders in `pages`
    (committed, rerun), the explorer pages, the text tables (*.md, *.tex) and the figures (*.png, with their *.pdf)."""
    committed, rerun = Path(committed), Path(rerun)
    report, explained = Report(), set()
    stems = sorted(Path(name).stem for name in _files(committed, rerun, ("*.parquet",), rerun_only))
    if GENERATIONS in stems:
        report.rows.append(_compare_generations(committed, rerun, report, explained))
    # the items first: they tell the bounds of their runs' rows (explained)
    for stem in sorted((s for s in stems if s != GENERATIONS), key=lambda s: not s.endswith(ITEMS)):
        compare = compare_items if stem.endswith(ITEMS) else compare_file
        report.rows.append(compare(committed / f"{stem}.parquet", rerun / f"{stem}.parquet", explained))
    folders = [(committed, rerun)]
    if pages is not None:
        folders.append((Path(pages[0]), Path(pages[1])))
        report.rows += _compare_figure_folder(*folders[1], rerun_only, report, committed)
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
    parted = set(_notebooks_of(results, [row.artifact for row in report.rows if row.status == NEAR]).values())
    notebooks = _notebooks_of(committed, None)
    rows += [compare_figure(committed / n, rerun / n, notebooks.get(n) in parted)
             for n in _files(committed, rerun, ("*.png",), rerun_only)]
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
    if absent := missing(committed, rerun, name):
        return absent
    if committed.read_bytes() == rerun.read_bytes():
        return Row(name, "1 / 1", IDENTICAL)
    if table is not None and table.status == NEAR:
        return Row(name, "1 / 1", NEAR, detail=f"renders {table.artifact}, which agrees up to a near-tie")
    why = "its table agrees exactly" if table is not None and table.status != DIFFERS else (
        "its table differs" if table is not None else "no results table of this name was compared")
    return Row(name, "1 / 1", DIFFERS, detail=f"the text differs from the committed one ({why})")


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
                                   detail=f"not readable: {one_line(error)}"))
            continue
        configs.update({Path(name).stem if name.endswith(".parquet") else name: (old[name].get("config"),
                        new[name].get("config")) for name in set(old) & set(new)})
        report.provenance += provenance_differences(old, new)
    for row in report.rows:
        before, after = configs.get(row.artifact, (None, None))
        if before is None or after is None or before == after:
            continue
        changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
        described = ", ".join(f"{key} {before.get(key)!r} → {after.get(key)!r}" for key in changed)
        row.status = DIFFERS
        row.detail = "; ".join(filter(None, [f"run parameters differ: {described}", row.detail]))


def _compare_generations(committed: Path, rerun: Path, report: Report, explained: set) -> Row:
    """The generations table: every canvas equal until a step decided at a near-tie in both runs (report.divergences
    names each parting), and the margins of the steps before it within MARGIN_TOLERANCE. Adds to `explained` the
    generations that parted at a near-tie, each with its parting step, and each model's count of generations."""
    paths = (committed / f"{GENERATIONS}.parquet", rerun / f"{GENERATIONS}.parquet")
    if absent := missing(*paths):
        return absent
    a, b = (pd.read_parquet(path) for path in paths)
    rows = f"{len(a)} / {len(b)}"
    schema = schema_problems(a, b, ["model", "trace", "step"], required=("canvas", "margin"))
    if schema:
        return Row(GENERATIONS, rows, DIFFERS, detail="; ".join(schema))
    report.divergences = divergences(a, b)
    explained.update(("trace", d.model, d.trace, d.step) for d in report.divergences if d.near_tie)
    explained.update(("generations", str(m), int(n)) for m, n in a.groupby("model")["trace"].nunique().items())
    margins = _margins_before_parting(a, b, report.divergences)
    if margins > MARGIN_TOLERANCE:
        return Row(GENERATIONS, rows, DIFFERS, margins, f"the margins of steps whose canvases agree differ by up to "
                   f"{margins:.2g} of 1 + |margin| (rounding moves them at most {MARGIN_TOLERANCE:g})")
    if not report.divergences:
        return Row(GENERATIONS, rows, IDENTICAL if a.equals(b) else WITHIN, margins, "every canvas identical")
    status = NEAR if all(d.near_tie for d in report.divergences) else DIFFERS
    return Row(GENERATIONS, rows, status, margins, "; ".join(d.describe() for d in report.divergences))


def _margins_before_parting(a: pd.DataFrame, b: pd.DataFrame, parted: list[Divergence]) -> float:
    """The largest difference (float_difference) of the margins both generations tables record for a step before
    its generation parted (every step of a generation that never parted)."""
    merged = a.merge(b, on=["model", "trace", "step"], suffixes=("", "__rerun"))
    first = {(d.model, d.trace): d.step for d in parted}
    before = np.array([step < first.get((str(model), int(trace)), math.inf)
                       for model, trace, step in zip(merged["model"], merged["trace"], merged["step"])], dtype=bool)
    return float_difference(merged["margin"][before], merged["margin__rerun"][before])


_PAGE_DATA = re.compile(r'<script type="application/json" id="sinklib-explorer-data">(.*?)</script>', re.S)


_PAGE_SHAPE = ("format", "model", "n_steps", "n_layers", "n_heads", "seq", "prompt_len", "layer_names", "layer_ids",
               "model_layers")  # the header's fields that make its shape (explorer.payload.header, explorer.page)


class _PageHeader(BaseModel, extra="allow"):
    model: str
    canvas: list[list[int]]  # the canvas before each step, and the final one
    margins: list[float | None] = []  # each step's decision margin; null where none was recorded


class _PageData(BaseModel):
    """The data an explorer page embeds, validated: its header and its scores (base64 of little-endian float32)."""
    header: _PageHeader
    scores: Base64Bytes

    def steps(self) -> pd.DataFrame:
        """The page's generation as a generations table (one trace): each step's canvas after it and its margin."""
        canvas, n = self.header.canvas, len(self.header.canvas) - 1
        margins = [math.nan if m is None else m for m in self.header.margins] + [math.nan] * n
        return pd.DataFrame({"model": self.header.model, "trace": 0, "step": range(n), "canvas": canvas[1:],
                             "margin": margins[:n]})


def compare_page(committed: Path, rerun: Path) -> Row:
    """Compare two explorer pages: the page around the data byte for byte (the front end, its style), the data's
    shape exactly, the canvases exactly up to a near-tie, and the embedded scores within FLOAT_TOLERANCE."""
    name = committed.name
    if absent := missing(committed, rerun, name):
        return absent
    a_text, b_text = committed.read_text(encoding="utf-8"), rerun.read_text(encoding="utf-8")
    if a_text == b_text:
        return Row(name, "1 / 1", IDENTICAL)
    try:
        (a_page, a), (b_page, b) = _page_parts(a_text), _page_parts(b_text)
    except (ValueError, ValidationError) as error:
        return Row(name, "1 / 1", DIFFERS, detail=f"its data is not readable: {one_line(error, 200)}")
    if a_page != b_page:
        return Row(name, "1 / 1", DIFFERS, detail="the page around the data differs (front end or style changed)")
    shape = [key for key in _PAGE_SHAPE if getattr(a.header, key, None) != getattr(b.header, key, None)]
    if shape:
        return Row(name, "1 / 1", DIFFERS, detail=f"the data's shape differs: {shape}")
    parted = divergences(a.steps(), b.steps())
    if parted:
        return Row(name, "1 / 1", NEAR if parted[0].near_tie else DIFFERS, detail=parted[0].describe())
    largest = float_difference(*(np.frombuffer(data.scores, dtype="<f4") for data in (a, b)))
    if largest > FLOAT_TOLERANCE:
        return Row(name, "1 / 1", DIFFERS, largest, f"scores differ by {largest:.2g} of 1 + |score|")
    return Row(name, "1 / 1", WITHIN, largest, "same canvases")


def _page_parts(text: str) -> tuple[str, _PageData]:
    """(the page without its data, the data validated); ValueError where the page holds no sinklib explorer data."""
    found = _PAGE_DATA.search(text)
    if found is None:
        raise ValueError("this page holds no sinklib explorer data")
    return text[:found.start(1)] + text[found.end(1):], _PageData.model_validate_json(found.group(1))
