"""What the explorer's front end reads: a Trace as plain JSON-able data.

Scores travel as base64 little-endian float32 (NaN survives, unlike JSON numbers): the widget sends one step
at a time, the exported page embeds every step. Nothing here holds an attention map.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklib.trace import Trace

FORMAT = 1
STATIC = Path(__file__).parent / "static"  # the front end: explorer.js and explorer.css


def float32_base64(values: torch.Tensor | np.ndarray) -> str:
    """Row-major little-endian float32 bytes of `values`, base64-encoded."""
    array = values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode("ascii")


def main_sinks(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The strongest key of every (step, layer, head): its score (sum units, NaN keys ignored) and position,
    each [steps, layers, heads]. Ties go to the lower position."""
    filled = torch.nan_to_num(scores.float(), nan=float("-inf"))
    score, position = filled.max(-1)
    return score, position


def step_scores(trace: Trace, step: int) -> bytes:
    """One step's scores [layers, heads, seq] as little-endian float32 bytes (the widget's per-step message)."""
    return np.ascontiguousarray(trace.require_scores()[step].numpy(), dtype="<f4").tobytes()


def header(trace: Trace, layer_ids: list[int] | None = None) -> dict[str, Any]:
    """Everything but the per-step scores: shape, canvas per step, masks, decode steps, token texts and the
    main sink of every (step, layer, head) for the layer × head grid. layer_ids: the model's layer number of
    each layer in the trace's scores (default 0, 1, …; a page holding a subset of layers names them)."""
    scores = trace.require_scores()
    steps, layers, heads, seq = scores.shape
    main_score, main_position = main_sinks(scores)
    ids = sorted(set(trace.tokens.flatten().tolist()))
    return {
        "format": FORMAT,
        "model": str(trace.meta.get("model", "")),
        "text": trace.text,
        "n_steps": steps, "n_layers": layers, "n_heads": heads, "seq": seq, "prompt_len": trace.prompt_len,
        "layer_names": list(trace.layer_names),
        "layer_ids": list(range(layers)) if layer_ids is None else [int(i) for i in layer_ids],
        "vocab": {str(i): trace.token_text(i) for i in ids},
        "canvas": trace.tokens.tolist(),
        "masked": trace.is_masked.to(torch.int8).tolist(),
        "decoded_at": trace.unmasked_at.tolist(),
        "main_score": float32_base64(main_score),
        "main_position": main_position.tolist(),
        "score_max": _finite_max(main_score),
        # each step's decision margin (sinklib.trace); null where none was recorded or nothing was left to decide
        "margins": [m if np.isfinite(m) else None for m in trace.margins.tolist()] if trace.margins is not None
        else [None] * steps,
        # the positions each step's forward computed (a cached sampler's window, Trace.recomputed); null: all of them
        "recomputed": trace.recomputed.to(torch.int8).tolist() if trace.recomputed is not None else None,
    }


def _finite_max(values: torch.Tensor) -> float:
    """The largest finite value (0.0 when none is: an all-NaN trace still gives valid JSON)."""
    finite = values[torch.isfinite(values)]
    return float(finite.max()) if finite.numel() else 0.0


def strongest_head_at_step(trace: Trace, step: int = 0) -> tuple[int, int]:
    """(layer, head) whose main sink is strongest at this one `step`: where the explorer opens (not
    dynamics.strongest_head, the strongest averaged over every step: Fig. 1's head)."""
    score, _ = main_sinks(trace.require_scores()[step])
    flat = int(torch.argmax(score.flatten()))
    return divmod(flat, score.shape[1])
