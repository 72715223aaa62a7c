"""The explorer as one self-contained HTML page: data, script and style embedded; nothing fetched.

The page runs the widget's own front end (static/explorer.js) against a stand-in model that holds every
step's scores, so it shows the same views except the replayed attention maps. Same trace → same bytes.
"""
from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from sinklib.validation import BadValue, NonNegative, Positive, checked
from sinklib.explorer import payload
from sinklib.trace import Trace

_EXPORT = "export default { render };"
_BOOT = """
const data = JSON.parse(document.getElementById("sinklib-explorer-data").textContent);
render({ model: staticModel(data), el: document.getElementById("sinklib-explorer") });
"""


def page_layers(trace: Trace, layers: Sequence[int] | None, max_mb: float) -> list[int]:
    """The layers a page embeds: `layers` as given (checked), else all of them if the scores fit in max_mb,
    else as many evenly spaced layers as fit (first and last kept)."""
    steps, n_layers, heads, seq = trace.require_scores().shape
    if layers is not None:
        chosen = list(layers)
        if not chosen or any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n_layers
                             for i in chosen) or len(set(chosen)) != len(chosen):
            raise BadValue(f"layers={layers!r} is not allowed: layers must be distinct ints in 0..{n_layers - 1}")
        return sorted(int(i) for i in chosen)
    per_layer_mb = steps * heads * seq * 4 * 4 / 3 / 2**20  # float32 as base64
    fit = int(max_mb // per_layer_mb) if per_layer_mb > 0 else n_layers
    if fit < 1:
        raise BadValue(f"max_mb={max_mb!r} is not allowed: one layer of this trace needs {per_layer_mb:.1f} MB "
                       f"({steps} steps × {heads} heads × {seq} keys); raise max_mb")
    if fit >= n_layers:
        return list(range(n_layers))
    return sorted({int(round(x)) for x in np.linspace(0, n_layers - 1, fit)})


@checked
def page_html(trace: Trace, eps: NonNegative = 3.0, title: str | None = None, *, layers: Sequence[int] | None = None,
              max_mb: Positive = 25.0) -> str:
    """The page's text (see to_html)."""
    if trace.require_scores().shape[0] == 0:
        raise BadValue("trace is not allowed: it has no step (0 forwards); an explorer page shows steps")
    kept = page_layers(trace, layers, max_mb)
    model_layers = trace.require_scores().shape[1]
    if len(kept) < trace.require_scores().shape[1]:
        trace = dataclasses.replace(trace, scores=trace.scores[:, kept], masked_keys=None, maps={},
                                    layer_names=[trace.layer_names[i] for i in kept])
    scores = trace.require_scores()
    layer, head = payload.strongest_head_at_step(trace, 0)
    data = {"header": {**payload.header(trace, kept), "model_layers": model_layers}, "scores": payload.float32_base64(scores),
            "state": {"step": 0, "layer": layer, "head": head, "eps": eps}}
    script = (payload.STATIC / "explorer.js").read_text()
    if _EXPORT not in script:
        raise RuntimeError(f"explorer.js must end with {_EXPORT!r} (the page replaces it with its own start-up)")
    # Inside <script>, "</script" ends the element and "<!--<script" starts a state where the real end is not
    # seen (the page stays blank): every <, > and & travels as a JSON \u escape, which JSON.parse undoes.
    # allow_nan=False: a NaN or an infinity would write a bare NaN / -Infinity, which JSON.parse refuses.
    embedded = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    embedded = embedded.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = title or f"sinklib explorer — {trace.meta.get('model', 'trace')}"
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n"
            f"<style>\n{(payload.STATIC / 'explorer.css').read_text()}</style>\n</head>\n<body>\n"
            f"<div id=\"sinklib-explorer\"></div>\n"
            f"<script type=\"application/json\" id=\"sinklib-explorer-data\">{embedded}</script>\n"
            f"<script type=\"module\">\n{script.replace(_EXPORT, _BOOT)}</script>\n</body>\n</html>\n")


@checked
def to_html(trace: Trace, path: str | Path, eps: NonNegative = 3.0, title: str | None = None, *,
            layers: Sequence[int] | None = None, max_mb: Positive = 25.0) -> Path:
    """Write the explorer for `trace` as a self-contained page (for slides, nbviewer, e-mail): play through the
    steps, click a head, adjust ε. Deterministic: the same trace writes the same bytes.

    The page embeds every step's scores (a zoo trace: under 0.1 MB). A real 8B trace (128 steps × 32 layers ×
    32 heads × ~300 keys ≈ 200 MB) keeps `layers` if given, else as many evenly spaced layers as fit in max_mb."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace={type(trace).__name__} is not allowed: trace must be a sinklib.Trace")
    path = Path(path)
    if path.suffix != ".html":
        raise BadValue(f"path={str(path)!r} is not allowed: the page's file name must end in .html")
    text = page_html(trace, eps, title, layers=layers, max_mb=max_mb)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
