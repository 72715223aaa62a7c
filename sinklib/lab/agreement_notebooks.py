"""A rerun's notebooks against the committed ones (reproduce --check): the text a reader sees in each — what it
prints and the plain text of its results — compared as nbval compares it, numbers within tolerance.

Left out, by design: images (the figures are compared as files), HTML (every table is also shown as text/plain),
progress bars and papermill's injected parameters (notebook_outputs), and the numbers of a line about a model that
decided a step at a near-tie ("<model> ≈ …", notebook_outputs.NEAR_TIE_LINE: its label is compared; its tables are
compared near-tie by near-tie). Nothing else a notebook prints changes between runs: its timings are read from the
committed speed store. Every other word must be the committed one; every number within FLOAT_TOLERANCE of
1 + |committed| plus one unit of its last printed digit (a value a rounding apart may print one digit up)."""
from __future__ import annotations

import re
from pathlib import Path

from sinklib.lab.agreement_rows import DIFFERS, FLOAT_TOLERANCE, IDENTICAL, WITHIN, Row, missing, one_line
from sinklib.lab.notebook_outputs import text_outputs

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def compare_notebook(committed: Path, rerun: Path) -> Row:
    """One notebook's text outputs (module docstring): the same cells, the same words, numbers within tolerance."""
    name = committed.name
    if absent := missing(committed, rerun, name):
        return absent
    try:
        a, b = text_outputs(committed), text_outputs(rerun)
    except (OSError, ValueError) as error:  # nbformat's read errors are ValueErrors
        return Row(name, "-", DIFFERS, detail=f"not a readable notebook: {one_line(error, 200)}")
    rows = f"{len(a)} / {len(b)}"
    if len(a) != len(b):
        return Row(name, rows, DIFFERS, detail=f"{len(a)} / {len(b)} code cells")
    for index, (x, y) in enumerate(zip(a, b)):
        if problem := text_difference("\n".join(x), "\n".join(y)):
            return Row(name, rows, DIFFERS, detail=f"code cell {index + 1} prints otherwise: {problem}")
    return Row(name, rows, IDENTICAL if a == b else WITHIN, detail="" if a == b else "numbers within tolerance")


def text_difference(committed: str, rerun: str) -> str:
    """'' where two printed texts are the same words with their numbers within tolerance, else the first difference."""
    words = [_NUMBER.split(text) for text in (committed, rerun)]
    numbers = [_NUMBER.findall(text) for text in (committed, rerun)]
    if words[0] != words[1] or len(numbers[0]) != len(numbers[1]):
        first = next((i for i, (x, y) in enumerate(zip(*words)) if x != y), min(map(len, words)))
        shown = [w[first].strip()[:60] if first < len(w) else "(end)" for w in words]
        return f"{shown[0]!r} / {shown[1]!r}"
    for x, y in zip(*numbers):
        if abs(float(x) - float(y)) > FLOAT_TOLERANCE * (1 + abs(float(x))) + _last_digit(x):
            return f"{x} / {y}"
    return ""


def _last_digit(printed: str) -> float:
    """One unit of a printed number's last digit (0 for an integer: a count is exact)."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if not decimals and not exponent:
        return 0.0
    return 10.0 ** (int(exponent or 0) - decimals)
