"""Attention recomputed by running a model again under a capture: a full map of one (step, layer, head) of a
generation, and the column sums of one forward over a whole sequence."""
from __future__ import annotations

import torch

from sinklib.capturing import capture


def replay_map(loaded, trace, step: int, layer: int, head: int) -> torch.Tensor:
    """[queries, keys] float32: the full attention map of (step, layer, head), recomputed by running the model once
    on the canvas the sampler saw at that step (exact for runs without an intervention or guidance). `loaded` is
    sinklib.load's result (its module, layer names, family and calling convention); `trace` the generation's."""
    canvas = loaded.family.replay_canvas(trace.tokens[step], trace.is_masked[step])
    with torch.no_grad(), capture(loaded, maps=[(0, layer, head)]) as recorder:
        loaded.logits(canvas[None].to(loaded.device))
    return recorder.maps[(0, layer, head)][0]


def full_pass_scores(loaded, tokens: torch.Tensor) -> torch.Tensor:
    """[layers, heads, seq] scores (sum units) of one forward over a whole sequence of token ids (for an
    autoregressive model: the causal column sums a single pass gives, comparable with uniform causal attention)."""
    with torch.no_grad(), capture(loaded) as recorder:
        loaded.logits(tokens[None].to(loaded.device))
    return recorder.scores[0, :, 0]
