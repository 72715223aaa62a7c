"""One function per paper figure (Figs. 1, 3–8, 10, Table 1): tidy data in, matplotlib Figure out. Scores are in sum
units (Σ over queries); every axis says so."""
from __future__ import annotations

import itertools

from pathlib import Path
from typing import Mapping, Sequence


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sinklib.dynamics import comparable_scores
from sinklib.trace import Trace
from sinklib.plots.style import CMAP, PALETTE, SCORE_LABEL, grid, in_order


def _token_labels(trace: Trace, step: int = -1) -> list[str]:
    return [trace.token_text(int(t)) for t in trace.tokens[step]]


def token_step_heatmap(trace: Trace, layer: int, head: int, max_labels: int = 60,
                       scores: pd.DataFrame | None = None) -> plt.Figure:
    """Fig. 1: incoming score of every token (x) at every denoising step (y) for one layer and head; `scores`: that
    head's comparable scores as rows (step, position, comparable: lab.nb01_attention_distributions.pick_token_step's),
    None: from the trace."""
    shape = (trace.n_steps, trace.tokens.shape[1])
    scores = comparable_scores(trace)[:, layer, head].numpy() if scores is None else grid(scores, shape, "comparable")
    fig, ax = plt.subplots(figsize=(min(16, 3 + 0.12 * scores.shape[1]), 4.5))
    image = ax.imshow(scores, aspect="auto", cmap=CMAP, interpolation="nearest")
    labels = _token_labels(trace)
    stride = max(1, len(labels) // max_labels)
    ax.set_xticks(range(0, len(labels), stride), labels[::stride], rotation=90, fontsize=6)
    ax.axvline(trace.prompt_len - 0.5, color="white", linestyle="--", linewidth=0.8)
    ax.set_xlabel("token (final canvas); dashed line: end of prompt")
    ax.set_ylabel("denoising step")
    ax.set_title(f"{trace.meta.get('model', '')} — layer {layer}, head {head}: incoming score per token and step")
    fig.colorbar(image, ax=ax, label=_score_label(trace))
    return fig


def _score_label(trace: Trace) -> str:
    if trace.is_autoregressive:
        return SCORE_LABEL + "\n(decoding rows × number of keys)"
    return SCORE_LABEL


def score_histograms(histograms: pd.DataFrame) -> plt.Figure:
    """Fig. 3 / 9: distribution of scores across steps, layers and heads, one panel per model (log count), from
    counts in bins (columns model, left, right, count: lab.nb01_attention_distributions.pick_score_histograms')."""
    models = in_order(histograms["model"])
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, model, colour in zip(axes[0], models, PALETTE):
        rows = histograms[histograms["model"] == model]
        ax.hist(rows["left"], bins=[*rows["left"], rows["right"].iloc[-1]], weights=rows["count"], color=colour, log=True)
        ax.set_title(model)
        ax.set_xlabel(SCORE_LABEL)
        ax.set_ylabel("count (log scale)")
    fig.suptitle("Most keys receive little attention; a few receive a lot")
    fig.tight_layout()
    return fig


def layer_head_map(frame: pd.DataFrame, model: str) -> plt.Figure:
    """Fig. 5: score of the main sink per layer and head, averaged over steps."""
    import seaborn as sns  # noqa: PLC0415  (2.4 s of import, scipy.stats with it: only this figure draws with it)

    grid = frame.pivot(index="layer", columns="head", values="score")
    fig, ax = plt.subplots(figsize=(1.2 + 0.35 * grid.shape[1], 1.2 + 0.3 * grid.shape[0]))
    sns.heatmap(grid, ax=ax, cmap=CMAP, cbar_kws={"label": "main-sink score (sum units), mean over steps"})
    ax.set_title(f"{model}: main sink per layer and head")
    return fig


MARK_STYLES = (":", "--", "-.")  # one line style per kind of marked position, in the order given


def attention_pair(maps: Sequence[np.ndarray], steps: Sequence[int], trace: Trace, layer: int, head: int,
                   marked: Sequence[int] | Mapping[str, Sequence[int]] = ()) -> plt.Figure:
    """Fig. 4 / 8: full attention maps (queries × keys) at consecutive steps, sink positions marked.

    `marked`: key positions drawn as vertical lines on every panel — a sequence (one style, "sink"), or a mapping from
    what the positions are (e.g. "greatest sink at step 3") to them, each with its own line style (MARK_STYLES, in
    order) and named in the legend."""
    kinds = dict(marked) if isinstance(marked, Mapping) else {"sink": list(marked)}
    fig, axes = plt.subplots(1, len(maps), figsize=(5.2 * len(maps), 4.6), squeeze=False)
    for ax, attention, step in zip(axes[0], maps, steps):
        image = ax.imshow(attention, cmap=CMAP, aspect="auto", interpolation="nearest")
        for (kind, positions), style in zip(kinds.items(), MARK_STYLES):
            for index, position in enumerate(positions):
                ax.axvline(position, color=PALETTE[3], linewidth=0.9, linestyle=style, label=None if index else kind)
        if isinstance(marked, Mapping) and kinds:
            ax.legend(loc="lower left", fontsize=7, framealpha=0.8)
        ax.set_title(f"step {step}")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        fig.colorbar(image, ax=ax, label="attention probability")
    fig.suptitle(f"{trace.meta.get('model', '')} — layer {layer}, head {head}: the sink moves between steps")
    fig.tight_layout()
    return fig


def greatest_sink_positions(frames: Mapping[str, pd.DataFrame]) -> plt.Figure:
    """Fig. 7: position of the greatest sink at each step for one head per model, with the unmasking frontier."""
    fig, axes = plt.subplots(1, len(frames), figsize=(4.4 * len(frames), 3.6), squeeze=False)
    for ax, (title, frame), colour in zip(axes[0], frames.items(), PALETTE):
        sinks = frame[frame["is_sink"]]
        ax.scatter(sinks["step"], sinks["position"], s=10, color=colour, label="greatest sink (Eq. 3)")
        other = frame[~frame["is_sink"]]
        ax.scatter(other["step"], other["position"], s=6, color="lightgrey", label="top key, not a sink")
        frontier = frame[frame["frontier"] >= 0]
        if len(frontier):
            ax.plot(frontier["step"], frontier["frontier"], color="black", linestyle="--", linewidth=0.8,
                    label="first masked position")
        if "rightmost_masked" in frame:
            rightmost = frame[frame["rightmost_masked"] >= 0]
            ax.plot(rightmost["step"], rightmost["rightmost_masked"], color="black", linestyle=":", linewidth=0.8,
                    label="last masked position")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("denoising step")
        ax.set_ylabel("position")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def threshold_sweep_plot(frame: pd.DataFrame, baseline: pd.DataFrame | None = None) -> plt.Figure:
    """Fig. 10: share of tokens selected as ε grows, per model, optionally with the causal-uniform baseline."""
    fig, ax = plt.subplots(figsize=(5.4, 3.8))
    colours = {}
    for (model, group), colour in zip(frame.groupby("model", sort=False), PALETTE):
        ax.plot(group["eps"], group["share"], marker="o", markersize=3, color=colour, label=model)
        colours[model] = colour
    for name, group in ([] if baseline is None else baseline.groupby("model", sort=False)):
        # one dotted curve per autoregressive model, in its colour: uniform causal attention over its lengths
        owner = next((m for m in colours if name.endswith(f"({m}'s lengths)")), None)
        ax.plot(group["eps"], group["share"], color=colours.get(owner, "black"), linestyle=":", label=name)
    ax.set_xlabel("ε (sum units)")
    ax.set_ylabel("share of tokens selected as sinks")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.legend(fontsize=8)
    ax.set_title("Sink threshold sweep")
    return fig


def query_split(attention: np.ndarray, is_masked: np.ndarray, trace: Trace, step: int, layer: int, head: int) -> plt.Figure:
    """Fig. 6a: mean attention that masked and unmasked queries give each key at one step."""
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    positions = np.arange(attention.shape[1])
    for (label, rows), colour in zip((("masked queries", is_masked), ("unmasked queries", ~is_masked)), PALETTE):
        if rows.any():
            ax.plot(positions, attention[rows].mean(0), color=colour, label=label)
    ax.set_xlabel("key position")
    ax.set_ylabel("mean attention probability")
    ax.set_title(f"{trace.meta.get('model', '')} — step {step}, layer {layer}, head {head}: masked vs unmasked queries")
    ax.legend(fontsize=8)
    return fig


def transient_sink(trace: Trace, step: int, layer: int, head: int, position: int,
                   scores: pd.DataFrame | None = None) -> plt.Figure:
    """Fig. 6b: a sink that exists for one step only — scores of that head at step−1, step and step+1; `scores`:
    those steps' comparable scores as rows (step, position, score: lab.nb02_moving_sinks.pick_transient_scores'), None: from the
    trace."""
    shape = (trace.n_steps, trace.tokens.shape[1])
    every = comparable_scores(trace)[:, layer, head].numpy() if scores is None else grid(scores, shape)
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for offset, colour in zip((-1, 0, 1), PALETTE):
        t = step + offset
        if 0 <= t < trace.n_steps:
            ax.plot(every[t], color=colour, label=f"step {t}")
    ax.axvline(position, color="grey", linestyle=":")
    ax.set_xlabel("key position")
    ax.set_ylabel(_score_label(trace))
    ax.set_title(f"{trace.meta.get('model', '')} — layer {layer}, head {head}: a one-step sink at position {position}")
    ax.legend(fontsize=8)
    return fig


def sink_token_bars(frame: pd.DataFrame, models: Sequence[str] | None = None, eps: float | None = None) -> plt.Figure:
    """Table 2 as bars: relative frequency of the most frequent sink tokens, per model. A model without any
    sink at ε gets a labelled empty panel that says so."""
    models = list(models) if models is not None else in_order(frame["model"])
    if not models:
        models = ["(no model)"]
    fig, axes = plt.subplots(1, len(models), figsize=(3.8 * len(models), 3.2), squeeze=False)
    for ax, model, colour in zip(axes[0], models, itertools.cycle(PALETTE)):
        part = frame[frame["model"] == model] if len(frame) else frame
        if len(part):
            ax.barh(part["token"][::-1], part["share"][::-1], color=colour)
        else:
            at = f" at ε = {eps:g}" if eps is not None else ""
            ax.text(0.5, 0.5, f"no sink detected{at}", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
        ax.set_title(Path(str(model)).name)
        ax.set_xlabel("share of sink detections")
    fig.tight_layout()
    return fig


def score_bars(scores: np.ndarray, sinks: np.ndarray, labels: Sequence[str], title: str) -> plt.Figure:
    """The explorer's bar chart: one head's scores at one step, sinks highlighted."""
    fig, ax = plt.subplots(figsize=(min(14, 2 + 0.18 * len(scores)), 3.0))
    colours = [PALETTE[3] if s else PALETTE[0] for s in sinks]
    ax.bar(range(len(scores)), scores, color=colours)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_ylabel(SCORE_LABEL, fontsize=8)
    ax.set_title(title)
    return fig


def masking_plot(frame: pd.DataFrame, task: str) -> plt.Figure:
    """Table 1 as a figure: accuracy against k (keys masked per layer and head), one line per model and condition
    (solid: the top-k sinks, dotted: k random keys), with standard errors. `frame`: MaskingTable.frame."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(in_order(frame["model"]))}
    unmasked = frame[frame["k"] == 0]
    for (name, condition), group in frame.groupby(["model", "condition"], sort=False):
        if condition != "sinks":  # each control's line starts from the model's unmasked accuracy
            group = pd.concat([unmasked[unmasked["model"] == name], group])
        style = "-" if condition == "sinks" else ":" if condition == "random keys" else "--"
        ax.errorbar(group["k"], group["accuracy"], yerr=group["stderr"], marker="o", capsize=3, color=colours[name],
                    linestyle=style, label=f"{name}, {condition}")
    ax.set_xlabel("keys masked per layer and head (k)")
    ax.set_ylabel(f"accuracy ({task})")
    ax.set_title("Top-k sinks masked (solid), k random keys (dotted), sink values ablated (dashed)", fontsize=8)
    ax.legend(fontsize=7)
    return fig
