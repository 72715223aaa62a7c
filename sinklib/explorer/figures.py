"""The interactive explorer's logic as plain functions (the notebook only wires widgets to them)."""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from sinklib import plots
from sinklib.capturing.replay import replay_map
from sinklib.loading import LoadedModel
from sinklib.sinks import find_sinks
from sinklib.trace import Trace
from sinklib.validation import BadValue


@dataclass
class View:
    """What the explorer shows for one (step, layer, head): the attention map with its sinks marked, the bar chart
    of scores, the canvas text, and the sinks' positions (indices among the keys that exist at that step)."""

    attention: plt.Figure
    scores: plt.Figure
    canvas: str  # the canvas at that step, masked tokens shown as ▢
    sinks: list[int]


def canvas_text(trace: Trace, step: int) -> str:
    """The canvas before `step` (the final one for step == n_steps) as space-separated token texts, positions still
    masked at that step shown as ▢."""
    words = []
    for position, token in enumerate(trace.tokens[step].tolist()):
        if trace.is_masked[min(step, trace.n_steps - 1), position] and step < trace.n_steps:
            words.append("▢")
        else:
            words.append(trace.token_text(token))
    return " ".join(words)


def check_view(trace: Trace, step: int, layer: int, head: int) -> None:
    """Refuse a step, layer or head outside the trace's scores (and a trace kept without scores)."""
    steps, layers, heads, _ = trace.require_scores().shape
    for name, value, size in (("step", step, steps), ("layer", layer, layers), ("head", head, heads)):
        if not 0 <= value < size:
            raise BadValue(f"{name}={value} is not allowed: {name} must be in 0..{size - 1}")


def render(loaded: LoadedModel, trace: Trace, step: int, layer: int, head: int, eps: float = 3.0) -> View:
    """Everything the explorer shows for one (step, layer, head)."""
    check_view(trace, step, layer, head)
    scores = trace.scores[step, layer, head]
    keep = ~scores.isnan()
    scores = scores[keep]
    sinks = find_sinks(scores, eps)
    labels = [trace.token_text(t) for t in trace.tokens[step][keep].tolist()]
    title = f"{trace.meta.get('model', '')} — step {step}, layer {layer}, head {head} (ε = {eps})"
    attention = replay_map(loaded, trace, step, layer, head).numpy()
    attention_fig = plots.attention_pair([attention], [step], trace, layer, head, marked=sinks.nonzero().flatten().tolist())
    bars = plots.score_bars(scores.numpy(), sinks.numpy(), labels, title)
    plt.close(attention_fig)
    plt.close(bars)
    return View(attention_fig, bars, canvas_text(trace, step), sinks.nonzero().flatten().tolist())
