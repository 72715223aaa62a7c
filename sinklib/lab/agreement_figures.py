"""Figures of a rerun against the committed ones (sinklib.lab.agreement): a PNG by its pixels, its PDF twin by the
drawing it holds.

A rerun on another CPU draws from numbers that agree within FLOAT_TOLERANCE: a line or a marker moves by far less
than a pixel, so its PNG is the same but for a few anti-aliased edge pixels, in strips one or two pixels wide, and a
colour by at most a level or two of a colormap (cividis, viridis: at most 4 of 255 between neighbouring levels).
What a rerun cannot do is move a contiguous region by much: a block painted over, a cell of another value. So a
pixel counts as changed where a channel moved by more than FIGURE_LEVEL; a figure whose data agree may have at most
FIGURE_PIXELS_WITHIN of its pixels changed, and none of them filling a FIGURE_BLOCK × FIGURE_BLOCK square. Where its
notebook's data parted at a near-tie, a generation drawn otherwise may change whole cells: FIGURE_PIXELS_NEAR.

Matplotlib writes a PDF without timestamps (plots.save_figure), so two PDFs of the same drawing differ only where
its numbers do: a PDF is compared by its drawing — every stream decompressed, its operators, names and text equal,
coordinates within half a PNG pixel (PDF_POINTS), colours within FIGURE_LEVEL, images' samples within FIGURE_LEVEL —
and its page size and Subject (the run record) equal. Where the notebook's data parted, the drawing may differ
(other cells, other paths); its page size, its Subject and its words (the text drawn at label sizes, every number
in it written #: the title naming the model, axis labels, legends) must still be the committed figure's.
"""
from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

from sinklib.lab.agreement_rows import DIFFERS, IDENTICAL, NEAR, WITHIN, Row, missing, one_line

FIGURE_LEVEL = 8 / 255  # a channel moved by more than this changed the pixel (1-bit noise, a colormap level do not)
FIGURE_PIXELS_WITHIN, FIGURE_PIXELS_NEAR = 0.002, 0.10  # shares of changed pixels: data that agree / that parted
FIGURE_BLOCK = 5  # a square of this many pixels a side, all changed, is a region redrawn, not anti-aliasing
PDF_POINTS = 72 / 130 / 2  # half a pixel of the PNG twin (plots.save_figure: 130 dpi), in PDF points

_STREAM = re.compile(rb"obj\s*<<((?:(?!endobj).)*?)>>\s*stream\r?\n(.*?)endstream", re.S)
_TOKEN = re.compile(rb"\((?:\\.|[^\\)])*\)|[-+]?(?:\d+\.\d*|\.\d+|\d+)(?![\w.])|/[^\s/\[\]()<>{}%]+|<<|>>|[\[\]{}]"
                    rb"|<[0-9A-Fa-f\s]*>|[A-Za-z'\"*][\w*']*")
_NUMBER = re.compile(rb"[-+]?(?:\d+\.\d*|\.\d+|\d+)")
_COLOUR_OPERATORS = {b"rg", b"RG", b"g", b"G", b"k", b"K", b"sc", b"SC", b"scn", b"SCN"}


def compare_figure(committed: Path, rerun: Path, parted: bool = False) -> Row:
    """A figure (PNG, and its PDF twin where either side has one): both files on both sides, the PNG within its
    pixel bounds (png_change) and the PDF the same drawing (pdf_difference)."""
    name = committed.name
    pdfs = (committed.with_suffix(".pdf"), rerun.with_suffix(".pdf"))
    for pair in ((committed, rerun), *([pdfs] if any(path.exists() for path in pdfs) else [])):
        if absent := missing(*pair):
            return Row(name, "-", DIFFERS, detail=f"{pair[0].name} {absent.detail}")
    pdf = pdf_difference(*pdfs, parted) if pdfs[0].exists() else None
    if pdf:
        return Row(name, "1 / 1", DIFFERS, detail=f"{pdfs[0].name}: {pdf}")
    if committed.read_bytes() == rerun.read_bytes():
        return Row(name, "1 / 1", IDENTICAL)
    try:
        changed, block = png_change(committed, rerun)
    except (OSError, ValueError, SyntaxError) as error:
        return Row(name, "1 / 1", DIFFERS, detail=one_line(error))
    detail = f"{changed:.2%} of its pixels changed by more than {FIGURE_LEVEL * 255:.0f}/255"
    if changed <= FIGURE_PIXELS_WITHIN and not block:
        return Row(name, "1 / 1", WITHIN, changed, detail)
    if parted and changed <= FIGURE_PIXELS_NEAR:
        return Row(name, "1 / 1", NEAR, changed, f"{detail}; its notebook's data parted at a near-tie")
    why = (f"a region of at least {FIGURE_BLOCK} × {FIGURE_BLOCK} pixels redrawn" if block and changed <= FIGURE_PIXELS_WITHIN
           else f"more than {FIGURE_PIXELS_NEAR if parted else FIGURE_PIXELS_WITHIN:.1%}")
    return Row(name, "1 / 1", DIFFERS, changed, f"{detail} ({why}: another plot)")


def png_change(committed: Path, rerun: Path) -> tuple[float, bool]:
    """(the share of pixels a channel of which moved by more than FIGURE_LEVEL, whether some FIGURE_BLOCK square is
    changed throughout); ValueError naming it where a file is no PNG or the sizes differ."""
    import matplotlib.image  # noqa: PLC0415  (the notebooks' extra: only a figure check decodes PNGs)

    try:
        a, b = matplotlib.image.imread(committed), matplotlib.image.imread(rerun)
    except (OSError, ValueError, SyntaxError) as error:
        raise ValueError(f"not a readable PNG: {one_line(error)}") from error
    if a.shape != b.shape:
        raise ValueError(f"another size: {a.shape[:2]} / {b.shape[:2]} pixels")
    moved = np.abs(a.astype(np.float64) - b.astype(np.float64))
    changed = (moved.max(axis=-1) if moved.ndim == 3 else moved) > FIGURE_LEVEL + 1e-9
    return float(changed.mean()), _has_block(changed, FIGURE_BLOCK)


def _has_block(changed: np.ndarray, side: int) -> bool:
    """Whether some side × side square of `changed` is True throughout (an integral image's window sums)."""
    if changed.shape[0] < side or changed.shape[1] < side:
        return False
    total = np.pad(changed.astype(np.int64).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    window = total[side:, side:] - total[:-side, side:] - total[side:, :-side] + total[:-side, :-side]
    return bool((window == side * side).any())


def pdf_difference(committed: Path, rerun: Path, parted: bool = False) -> str:
    """'' where two PDFs hold the same drawing (module docstring: where the data parted, the same page and words),
    else what differs."""
    a, b = committed.read_bytes(), rerun.read_bytes()
    if a == b:
        return ""
    try:
        (a_page, a_streams), (b_page, b_streams) = _pdf_parts(a), _pdf_parts(b)
    except (zlib.error, ValueError) as error:
        return f"not a readable PDF: {one_line(error)}"
    if a_page[1] != b_page[1]:
        return "another run record (Subject)"
    if not _numbers_close(a_page[0], b_page[0], PDF_POINTS):
        return f"another page size: {a_page[0]} / {b_page[0]} points"
    if parted:
        words = [_words(streams) for streams in (a_streams, b_streams)]
        return "" if words[0] == words[1] else f"other words: {sorted(words[0] ^ words[1])[:6]}"
    if len(a_streams) != len(b_streams):
        return f"another drawing: {len(a_streams)} / {len(b_streams)} streams"
    for index, (x, y) in enumerate(zip(a_streams, b_streams)):
        if problem := _stream_difference(x, y):
            return f"another drawing (stream {index + 1} of {len(a_streams)}: {problem})"
    return ""


def _pdf_parts(data: bytes) -> tuple[tuple[list[float], bytes], list[tuple[bool, bytes]]]:
    """((the page's MediaBox, its Subject), every stream as (whether it is an image, its decoded bytes))."""
    if not data.startswith(b"%PDF"):
        raise ValueError("no %PDF header")
    box = re.search(rb"/MediaBox\s*\[([^\]]*)\]", data)
    subject = re.search(rb"/Subject\s*(\((?:\\.|[^\\)])*\))", data)
    streams = []
    for found in _STREAM.finditer(data):
        flate = b"/FlateDecode" in found.group(1)  # decompressobj: the end-of-line before endstream is not data
        body = zlib.decompressobj().decompress(found.group(2)) if flate else found.group(2).rstrip(b"\r\n")
        streams.append((b"/Image" in found.group(1), body))
    page = [float(n) for n in _NUMBER.findall(box.group(1))] if box else []
    return (page, subject.group(1) if subject else b""), streams


def _stream_difference(a: tuple[bool, bytes], b: tuple[bool, bytes]) -> str:
    """'' where two decoded streams draw alike: images' samples within FIGURE_LEVEL; content streams with the same
    operators, names and text, each operator's numbers within PDF_POINTS (coordinates) or FIGURE_LEVEL (colours)."""
    if a[0] != b[0]:
        return "an image against a drawing"
    if a[0]:
        x, y = (np.frombuffer(stream, dtype=np.uint8).astype(np.int64) for _, stream in (a, b))
        same = x.shape == y.shape and bool((np.abs(x - y) <= FIGURE_LEVEL * 255).all())
        return "" if same else "an image's samples differ"
    x, y = _TOKEN.findall(a[1]), _TOKEN.findall(b[1])
    if len(x) != len(y):
        return f"{len(x)} / {len(y)} tokens"
    operands: list[tuple[float, float]] = []
    for left, right in zip(x, y):
        if _NUMBER.fullmatch(left) and _NUMBER.fullmatch(right):
            operands.append((float(left), float(right)))
            continue
        if left != right:
            return f"{left[:40]!r} / {right[:40]!r}"
        bound = FIGURE_LEVEL if left in _COLOUR_OPERATORS else PDF_POINTS
        if any(abs(p - q) > bound for p, q in operands):
            return f"the numbers of {left.decode('latin-1')!r} differ: {operands[:4]}"
        operands = []
    return "trailing numbers differ" if any(abs(p - q) > PDF_POINTS for p, q in operands) else ""


def _numbers_close(a, b, bound: float) -> bool:
    """Two sequences of numbers of the same length, each pair within `bound`."""
    return len(a) == len(b) and all(abs(x - y) <= bound for x, y in zip(a, b))


def _words(streams: list[tuple[bool, bytes]]) -> set[bytes]:
    """The text a PDF draws at 8 points or more, every number in it written #: titles, axis labels, legends — what
    names the figure rather than what its data put in it (tick values, steps, positions; small token labels)."""
    found = set()
    for image, stream in streams:
        for size, body in ([] if image else re.findall(rb"/F\d+ ([\d.]+) Tf(.*?)ET", stream, re.S)):
            text = b"".join(re.findall(rb"\(((?:\\.|[^\\)])*)\)", body))
            if float(size) >= 8 and text:
                found.add(re.sub(rb"\d+", b"#", text))
    return found
