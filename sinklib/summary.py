"""What a notebook shows of a run: a table with one row per model, its numbers rounded as `significant` says, and
findings — sentences written from those numbers, with the paper's values beside them.

A row whose model decided some step of its generations by less than ties.NEAR_TIE (two positions or two
tokens equally likely up to float rounding) is labelled "<model> ≈": on another CPU that decision may go the
other way, and every number of the row with it. Its findings lines start with the same label. The notebooks'
nbval configuration (tests/notebooks/nbval_sanitize.cfg) compares every other line exactly and masks these;
`python -m sinklib.reproduce --check` compares their numbers, near-tie by near-tie.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from sinklib.ties import NEAR_TIE, NEAR_TIE_MARK, closest_margin, is_near_tie

FOOTNOTE = (f"{NEAR_TIE_MARK}: in this run, this model decided some step by a relative margin of at most {NEAR_TIE:g}, "
            "small enough that another CPU's float differences (measured below 7e-5) could decide it the other way, "
            "and these numbers with it.")


def near_tie_models(traces: Mapping[str, Sequence]) -> set[str]:
    """The models any of whose traces has a step decided within NEAR_TIE."""
    flagged = set()
    for name, model_traces in traces.items():
        margins = [m for t in model_traces if t.margins is not None for m in t.margins.tolist()]
        if is_near_tie(closest_margin(margins)):
            flagged.add(name)
    return flagged


def label(model: str, near_tie: set[str]) -> str:
    """The row label of a model: its name, then " ≈" when its run had a near-tie."""
    return f"{model} {NEAR_TIE_MARK}" if model in near_tie else model


def significant(value) -> str:
    """A number as shown: three significant digits from 1 up ("37.3", "8.64", "104"), three decimals below 1
    ("0.292", "0.000"). Decimals, not significant digits, below 1: a score or share near 0 carries float noise
    of about 1e-6 in absolute terms on another CPU, far below 0.001 but not below its own fourth digit.
    Integers and text as they are."""
    if isinstance(value, (bool, np.bool_, str)) or value is None:
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.3f}"


def _formatted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda column: column.map(significant)) if len(frame.columns) else frame


@dataclass
class Summary:
    """A table indexed by model (labels already carry the near-tie mark) and its findings, displayed together.

    table: the numbers as computed; shown by `significant`. findings: one line each, starting
    with the model's label when it is about one model."""
    table: pd.DataFrame
    findings: list[str] = field(default_factory=list)

    @classmethod
    def by_model(cls, table: pd.DataFrame, near_tie: set[str], findings: Sequence[str] = ()) -> "Summary":
        """Relabel a table whose index holds model names."""
        table = table.copy()
        table.index = [label(str(name), near_tie) for name in table.index]
        table.index.name = "model"
        return cls(table, list(findings))

    @property
    def has_near_tie(self) -> bool:
        """Whether any row's label carries the near-tie mark (then the footnote is shown)."""
        return any(str(name).endswith(f" {NEAR_TIE_MARK}") for name in self.table.index)

    def text(self) -> str:
        """The table as shown by `significant`, then the findings, then the near-tie footnote when a row has one."""
        parts = [_formatted(self.table).to_string()]
        if self.findings:
            parts.append("\n".join(self.findings))
        if self.has_near_tie:
            parts.append(FOOTNOTE)
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        parts = [_formatted(self.table).to_html()]
        if self.findings:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in self.findings) + "</ul>")
        if self.has_near_tie:
            parts.append(f"<p><small>{html.escape(FOOTNOTE)}</small></p>")
        return "\n".join(parts)


def caption(trace) -> str:
    """"<model label>: <generated text>" — the label marks a generation with a near-tie."""
    name = str(trace.meta.get("model", ""))
    flagged = near_tie_models({name: [trace]})
    return f"{label(name, flagged)}: {trace.text}"


@dataclass(frozen=True)
class Layout:
    """How a rerun of one results table is compared with the committed one (sinklib.lab.agreement): the columns that
    identify a row, and which generation a row comes from. A table carries its layout in its parquet metadata.

    scope: "trace" (rows carry model and trace columns), "first" (rows come from each model's first generation),
    "model" (rows pool all of a model's generations), "run" (a row is one evaluation run — Table 1 — bounded by
    its samples whose answers parted at a near-tie) or "none" (nothing to blame: must agree).
    threshold: see below.
    """
    keys: tuple[str, ...]
    scope: Literal["trace", "first", "model", "run", "none"] = "model"
    index: bool = False  # the frame's index holds the model names (pandas describe())
    # a column holding how close the threshold tests that decide each row came to their threshold, relative
    # (dynamics.transient_sinks' threshold_gap), and the bool column they decide (its `transient`). The table holds,
    # beside the rows whose outcome is True, those a test within dynamics.THRESHOLD_BAND could make True (False):
    # the outcome may differ between two runs only where both runs' gaps are within float tolerance, and a row only
    # one side has must be False there (a test crossed the band's edge), never an outcome True the other run lacks
    threshold: str | None = None
    outcome: str | None = None


EVALUATION = Layout(("model", "condition", "k"), "run")  # Table 1: a row is one evaluation run
EVALUATION_ITEMS = Layout(("model", "condition", "k", "id"), "run")  # Table 1's samples, one row each


@dataclass
class Result:
    """What one notebook section makes: figures by file stem, tables by parquet stem with each table's Layout by
    the same stem, texts by file name, and `shown`, the summary the notebook displays."""
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    layouts: dict[str, Layout] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    shown: Any = None

    def add_table(self, name: str, frame: pd.DataFrame, layout: Layout) -> pd.DataFrame:
        """Add `frame` as table `name` compared by `layout`; returns the frame."""
        self.tables[name], self.layouts[name] = frame, layout
        return frame


VERDICT_COLUMNS = ["model", "claim", "n", "estimate", "low", "high", "threshold", "verdict"]


@dataclass
class Verdicts:
    """What a run shows about claims, one row each (VERDICT_COLUMNS: who, the claim, n, the estimate and its 95 %
    interval, the number the rule compares it with, and "supports", "contradicts" or "cannot decide"), shown as
    Markdown in a notebook and as lines in text. A row about a model of `near_tie` is labelled as Summary labels it.

    table: the verdicts as computed. notes: the rules, said once under the table."""
    table: pd.DataFrame
    near_tie: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One sentence per verdict: "<label>: <claim>: <verdict> (estimate [low, high], n = N; rule: threshold)"."""
        return [f"{label(row.model, self.near_tie)}: {row.claim}: {row.verdict} ({significant(row.estimate)} "
                f"[{significant(row.low)}, {significant(row.high)}], n = {row.n:,}; against {significant(row.threshold)})"
                for row in self.table.itertuples()]

    def text(self) -> str:
        """The verdicts as lines, then the notes."""
        return "\n".join(self.lines() + self.notes)

    def __repr__(self) -> str:
        return self.text()

    def _repr_markdown_(self) -> str:
        shown = pd.DataFrame({
            "": [label(name, self.near_tie) for name in self.table["model"]], "claim": self.table["claim"],
            "n": [f"{n:,}" for n in self.table["n"]],
            "estimate [95 % interval]": [f"{significant(e)} [{significant(lo)}, {significant(hi)}]" for e, lo, hi
                                         in zip(self.table["estimate"], self.table["low"], self.table["high"])],
            "against": [significant(t) for t in self.table["threshold"]],
            "verdict": [f"**{v}**" for v in self.table["verdict"]]})
        return "\n\n".join([shown.to_markdown(index=False), *self.notes])
