"""One function per paper figure: tidy data in, matplotlib Figure out. Scores are in sum units
(Σ over queries); every axis says so. Palettes are colour-blind safe (seaborn "colorblind", cividis)."""
from __future__ import annotations

import itertools
import warnings

from pathlib import Path
from typing import Any, Mapping, Sequence


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from sinklib.dynamics import comparable_scores
from sinklib.provenance import KEY, as_text, content_part
from sinklib.trace import Trace

PALETTE = sns.color_palette("colorblind")
CMAP = "cividis"
SCORE_LABEL = "incoming attention score (sum over queries)"
# matplotlib warns whenever placing a loc="best" legend took over a second (when saving, and again when a notebook
# shows the figure): a measure of the machine's load, not of the figure, which made a notebook's committed output
# change with how busy the machine was
warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow')


def in_order(column: pd.Series) -> list:
    """The column's distinct values in order of first appearance. (pd.unique, not dict.fromkeys: iterating a
    column of millions of scores' model names one by one took most of notebook 01's time.)"""
    return list(pd.unique(column))


def save_figure(fig: plt.Figure, name: str, folder: str | Path = "figures",
                record: dict[str, Any] | None = None) -> list[Path]:
    """Write `name`.png and `name`.pdf (reproducible: no timestamps in the PDF). `record` (sinklib.provenance):
    its content part (config, seed, notebook) goes in the PNG's "sinklib" text chunk and the PDF's Subject."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    content = None if record is None else as_text(content_part(record))
    text = {} if content is None else {"png": {KEY: content}, "pdf": {"Subject": content}}
    fig.savefig(paths[0], dpi=130, bbox_inches="tight", metadata={"Software": None, **text.get("png", {})})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None, "Creator": None, "Producer": None,
                                                         **text.get("pdf", {})})
    return paths


def _token_labels(trace: Trace, step: int = -1) -> list[str]:
    return [trace.token_text(int(t)) for t in trace.tokens[step]]


def grid(frame: pd.DataFrame, shape: tuple[int, int], value: str = "score") -> np.ndarray:
    """[steps, positions] float: `frame`'s `value` at its (step, position) rows, NaN where it has none."""
    values = np.full(shape, np.nan)
    values[frame["step"].to_numpy(int), frame["position"].to_numpy(int)] = frame[value].to_numpy(float)
    return values


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


GROUP_COLOURS = {"mask": PALETTE[3], "special": PALETTE[0], "punctuation": PALETTE[2], "content": PALETTE[7]}


def training_dynamics_plot(frame: pd.DataFrame) -> plt.Figure:
    """Sinks over training, one row per zoo model, checkpoints left to right (log-spaced steps, so evenly spaced
    here), the shipped model last: accuracy unmasked / top-1 sink masked / one random key masked; the share of
    sink detections per token group; the top key's score; how often a head's greatest sink moves.
    `frame`: over_training's rows for one measurement setting."""
    names = in_order(frame["model"])
    fig, axes = plt.subplots(len(names), 4, figsize=(17, 3.1 * len(names)), squeeze=False)
    for row, name in zip(axes, names):
        rows = frame[frame["model"] == name].sort_values(["checkpoint"], key=lambda c: c == "shipped", kind="stable")
        x = np.arange(len(rows))
        labels = ["shipped" if c == "shipped" else str(s) for c, s in zip(rows["checkpoint"], rows["step"])]
        _training_accuracy(row[0], x, rows)
        row[1].stackplot(x, *(rows[f"share_{g}"] for g in GROUP_COLOURS), labels=list(GROUP_COLOURS),
                         colors=list(GROUP_COLOURS.values()), alpha=0.85)
        row[1].set_ylim(0, 1)
        row[1].set_ylabel("share of sink detections")
        row[2].plot(x, rows["top_key_score_mean"], marker="o", color="black", label="mean over layers × heads")
        row[2].plot(x, rows["top_key_score_max_head"], marker="s", color=PALETTE[1], label="strongest head")
        row[2].set_ylabel("top key's score (sum units)")
        row[3].plot(x, rows["move_rate"], marker="o", color=PALETTE[4], label="greatest sink moves (share of step pairs)")
        row[3].plot(x, rows["share_heads_with_sink"], marker="s", color=PALETTE[9], label="heads × steps with a sink")
        row[3].set_ylim(-0.02, 1.02)
        for ax in row:
            ax.set_xticks(x, labels, rotation=45, fontsize=7)
            if (rows["checkpoint"] == "shipped").any():
                ax.axvline(len(rows) - 1.5, color="grey", linewidth=0.8, linestyle="--")
        for ax, title in zip(row, ["accuracy (held-out)", "which tokens host the sinks", "main sink's score",
                                   "sink motion and prevalence"]):
            ax.set_title(f"{name} · {title}", fontsize=9)
    for ax in axes[0]:
        ax.legend(fontsize=7, loc="best")
    for ax in axes[-1]:
        ax.set_xlabel("training step (checkpoint)")
    fig.tight_layout()
    return fig


def _training_accuracy(ax: plt.Axes, x: np.ndarray, rows: pd.DataFrame) -> None:
    ax.errorbar(x, rows["accuracy"], yerr=rows["accuracy_stderr"], marker="o", color="black", capsize=2,
                label="unmasked")
    ax.plot(x, rows["accuracy_top1_masked"], marker="v", color=PALETTE[3], label="top-1 sink masked")
    ax.plot(x, rows["accuracy_random1_masked"], marker="^", color=PALETTE[0], linestyle=":", label="1 random key masked")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy")


def carry_plot(frame: pd.DataFrame) -> plt.Figure:
    """What sinks carry, per model: left, each sink head's value norm over its median key's (log scale; below 1 a
    near no-op sink); right, the sink's share of the head's output against its share of the attention.
    `frame`: carry.sink_carry rows (only those whose greatest key is a sink are drawn)."""
    sinks = frame[frame["is_sink"]]
    names = in_order(frame["model"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.boxplot([sinks.loc[sinks["model"] == name, "value_ratio"].dropna() for name in names], showfliers=False)
    left.set_xticks(range(1, len(names) + 1), names, rotation=20, fontsize=7, ha="right")
    left.set_yscale("log")
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    left.set_ylabel("sink value norm / median key's")
    left.set_title("Does the sink carry a value?", fontsize=9)
    for index, name in enumerate(names):
        rows = sinks[sinks["model"] == name]
        right.scatter(rows["score_share"], rows["output_share"], s=4, alpha=0.3, color=PALETTE[index % len(PALETTE)],
                      label=name)
    right.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
    right.set_xlabel("sink's share of the head's attention")
    right.set_ylabel("sink's share of the head's output")
    right.set_title("Attention that reaches the output (norm-based)", fontsize=9)
    right.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    return fig


def stability_plot(frame: pd.DataFrame) -> plt.Figure:
    """Step-to-step stability per layer and model: the Jaccard overlap of each head's top-k keys between
    consecutive steps (mean ± sd) and the greatest sink's move rate (mean ± sd over heads).
    `frame`: dynamics.stability_by_layer rows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    for index, (name, rows) in enumerate(frame.groupby("model", sort=False)):
        colour = PALETTE[index % len(PALETTE)]
        depth = rows["layer"] / max(1, rows["layer"].max())  # relative depth: models of 3 and 30 layers side by side
        left.errorbar(depth, rows["jaccard_mean"], yerr=rows["jaccard_std"], color=colour, marker="o", markersize=3,
                      capsize=2, label=name)
        right.errorbar(depth, rows["move_rate"], yerr=rows["move_rate_std"], color=colour, marker="o", markersize=3,
                       capsize=2, label=name)
    left.set_ylabel("top-k overlap (Jaccard), step t−1 → t")
    right.set_ylabel("greatest sink's move rate")
    for ax in (left, right):
        ax.set_xlabel("layer (relative depth)")
        ax.set_ylim(-0.05, 1.05)
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig


def key_type_stability_plot(frame: pd.DataFrame) -> plt.Figure:
    """"Do sinks move?" both ways, by key type: left, the greatest sink's move rate between consecutive steps (the
    paper's measure) with its Wilson 95 % interval; right, the mean top-k Jaccard overlap (the set measure). One group
    of bars per key type (all keys, prompt, decoded, still masked), one bar per model. `frame`:
    dynamics.stability_by_key_type rows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    models = in_order(frame["model"])
    types = in_order(frame["key_type"])
    width = 0.8 / max(1, len(models))
    for index, name in enumerate(models):
        rows = frame[frame["model"] == name].set_index("key_type").reindex(types)
        x = np.arange(len(types)) + (index - (len(models) - 1) / 2) * width
        colour = PALETTE[index % len(PALETTE)]
        rate = rows["move_rate"].to_numpy(dtype=float)
        error = np.vstack([rate - rows["move_rate_ci_low"].to_numpy(dtype=float),
                           rows["move_rate_ci_high"].to_numpy(dtype=float) - rate])
        left.bar(x, np.nan_to_num(rate), width, yerr=np.nan_to_num(error), color=colour, capsize=2, label=name)
        right.bar(x, np.nan_to_num(rows["jaccard_mean"].to_numpy(dtype=float)), width, color=colour, label=name)
    for ax, ylabel in ((left, "greatest sink's move rate (paper)"), (right, "top-k overlap (Jaccard), t−1 → t")):
        ax.set_xticks(np.arange(len(types)), [f"{t} keys" for t in types])
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 1.05)
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig


def lens_plot(curve: pd.DataFrame) -> plt.Figure:
    """What sinks store (logit lens): by layer (relative depth), the share of positions whose lens argmax is already
    the token the generation ends with there, one panel per model, one line per group (masked sinks, other masked
    positions, sinks on decoded or prompt keys). `curve`: lab.nb07_what_sinks_carry.share_final_by_layer of the lens's reads."""
    models = in_order(curve["model"])
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.6), squeeze=False)
    styles = {"masked sink": ("tab:red", "-"), "other masked": ("tab:blue", "-"), "sink, not masked": ("tab:red", ":"),
              "other": ("grey", ":")}
    for ax, name in zip(axes[0], models):
        rows = curve[curve["model"] == name]
        for group, (colour, line) in styles.items():
            part = rows[rows["group"] == group]
            if len(part):
                depth = part["layer"] / max(1, rows["layer"].max())
                ax.plot(depth, part["share_final"], color=colour, linestyle=line, marker="o", markersize=3,
                        label=f"{group} (n = {int(part['n'].iloc[-1])} per layer)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("layer (relative depth)")
        ax.set_ylabel("lens names the final token")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def frontier_plot(table: pd.DataFrame) -> plt.Figure:
    """Speed against accuracy, one panel per diffusion model: each policy at its median seconds per answer (log
    scale) and its accuracy with the Wilson 95 % interval; the plain sampler's interval shaded; an autoregressive
    model's answer time drawn as a dashed line on every panel. `table`: sinklib.speed.frontier rows."""
    autoregressive = table[table["policy"] == "KV cache"]
    diffusion = table[table["policy"] != "KV cache"]
    models = in_order(diffusion["model"])
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 3.8), squeeze=False)
    markers = dict(zip(sorted(set(diffusion["policy"])), itertools.cycle("osD^v<>p")))
    colours = dict(zip(sorted(set(diffusion["policy"])), itertools.cycle(PALETTE)))
    for ax, model in zip(axes[0], models):
        rows = diffusion[diffusion["model"] == model]
        plain = rows[rows["policy"] == "plain"]
        if len(plain):
            ax.axhspan(float(plain["ci_low"].iloc[0]), float(plain["ci_high"].iloc[0]), color="0.9", zorder=0,
                       label="plain sampler's 95 % interval")
        for _, row in rows.iterrows():
            ax.errorbar(row["seconds_per_answer"], row["accuracy"],
                        yerr=[[row["accuracy"] - row["ci_low"]], [row["ci_high"] - row["accuracy"]]],
                        marker=markers[row["policy"]], color=colours[row["policy"]], capsize=3, linestyle="none",
                        label=row["policy"])
        for _, row in autoregressive.iterrows():
            ax.axvline(row["seconds_per_answer"], color="0.3", linestyle="--", linewidth=1,
                       label=f"{row['model']} (KV cache)")
        ax.set_xscale("log")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("seconds per answer (median, one thread)")
        ax.set_ylabel("accuracy (95 % interval)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        more_handles, more_labels = ax.get_legend_handles_labels()
        handles += [handle for handle, text in zip(more_handles, more_labels) if text not in labels]
        labels += [text for text in more_labels if text not in labels]
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def columns_by_setting_plot(frame: pd.DataFrame, title: str = "") -> plt.Figure:
    """Accuracy with its Wilson 95 % interval per Table 1 column (x, in the frame's order), one colour per (model,
    sampler); the lines join a setting's columns. `frame`: analyses' rows with model, sampler, column, accuracy,
    ci_low, ci_high."""
    columns = in_order(frame["column"])
    settings = list(dict.fromkeys(zip(frame["model"], frame["sampler"])))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(columns), 3.6))
    width = 0.5 / max(1, len(settings))
    for index, ((model, sampler), colour) in enumerate(zip(settings, itertools.cycle(PALETTE))):
        rows = frame[(frame["model"] == model) & (frame["sampler"] == sampler)].set_index("column").reindex(columns)
        x = np.arange(len(columns)) + (index - (len(settings) - 1) / 2) * width
        ax.errorbar(x, rows["accuracy"], yerr=[rows["accuracy"] - rows["ci_low"], rows["ci_high"] - rows["accuracy"]],
                    marker="o", color=colour, capsize=3, label=f"{model} ({sampler})")
    ax.set_xticks(np.arange(len(columns)), columns)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy (95 % interval)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left", frameon=False)
    fig.tight_layout()
    return fig


def cached_attention_plot(traces: Mapping[str, Trace], means: pd.DataFrame | None = None) -> plt.Figure:
    """What caching does to attention, one panel per trace of the same prompt: each step's incoming attention per
    position (comparable scores, mean over layers and heads; log colour), the greatest key of each step ringed, and
    on the left which steps were full forwards and which a cached window's (Trace.recomputed). `means`: the averaged
    scores as rows (trace, step, position, score: lab.nb08_sinks_for_speed.pick_mean_scores'), None: from the traces."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 2.2 + 1.6 * len(traces)), squeeze=False)
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        shape = (trace.n_steps, trace.tokens.shape[1])
        scores = _mean_scores(trace) if means is None else grid(means[means["trace"] == name], shape)
        image = ax.imshow(np.log10(np.clip(scores, 1e-3, None)), aspect="auto", cmap=CMAP, interpolation="nearest")
        top = np.nanargmax(np.where(np.isnan(scores), -np.inf, scores), axis=1)
        ax.scatter(top, np.arange(len(top)), s=14, facecolors="none", edgecolors="white", linewidths=0.8)
        full = np.ones(trace.n_steps, bool) if trace.recomputed is None else trace.recomputed.all(-1).numpy()
        ax.set_yticks(np.arange(trace.n_steps))
        ax.set_yticklabels(["full" if f else "window" for f in full], fontsize=5)
        ax.axvline(trace.prompt_len - 0.5, color="white", linewidth=0.8)
        ax.set_title(f"{name}: {trace.n_steps} forwards, {int(full.sum())} of them full", fontsize=9)
        ax.set_xlabel("position (the white line ends the prompt)")
        fig.colorbar(image, ax=ax, label="log10 score (mean 1)", fraction=0.03)
    fig.tight_layout()
    return fig


def _mean_scores(trace: Trace) -> np.ndarray:
    """[steps, positions] comparable scores averaged over layers and heads (NaN where a key did not exist)."""
    return comparable_scores(trace).nanmean(dim=(1, 2)).numpy()
