"""The figures of this project's own questions, beyond the paper's: sinks over training (notebook 06), what a sink
carries, step stability and the logit lens (07), sinks for speed (08). Tidy data in, matplotlib Figure out."""
from __future__ import annotations

import itertools

from typing import Mapping


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sinklib.dynamics import comparable_scores
from sinklib.trace import Trace
from sinklib.plots.style import CMAP, PALETTE, grid, in_order


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
        # tens of thousands of points: drawn as pixels in the PDF (its axes, text and legend stay vector), so the
        # PDF is a few hundred kB that a viewer opens at once, not a megabyte of markers
        right.scatter(rows["score_share"], rows["output_share"], s=4, alpha=0.3, color=PALETTE[index % len(PALETTE)],
                      label=name, rasterized=True)
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
