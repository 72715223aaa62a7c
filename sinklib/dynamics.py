"""How sinks behave across denoising steps: pure functions from Traces to tidy DataFrames.

All scores are in sum units (Σ over queries). "Greatest sink" of a (step, layer, head) is the key with the
highest score, counted as a sink only when it passes Eq. 3 with `eps`.

Autoregressive traces: after the prefill, each step is one query's attention row, which sums to 1, so Eq. 3
with ε = 3 could never fire on it. As when sinks are masked in an autoregressive model (MaskSinks(rows="last")),
such rows are scaled by their number of keys before Eq. 3 (mean 1, the units of a square pass's column sums) —
see `comparable_scores`.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Collection, Sequence

import numpy as np
import pandas as pd
import torch

from sinklib.validation import check_int
from sinklib.sinks import find_sinks, single_row_scores
from sinklib.trace import Trace


def _valid(trace: Trace) -> torch.Tensor:
    return ~torch.isnan(trace.require_scores())


def comparable_scores(trace: Trace) -> torch.Tensor:
    """Scores with mean 1 over the keys of every step: unchanged for diffusion traces and the prefill; an
    autoregressive decoding step's single row is multiplied by its number of keys."""
    if not trace.is_autoregressive or trace.n_steps < 2:
        return trace.require_scores()
    keys = _valid(trace).sum(-1, keepdim=True).float()
    scaled = trace.scores.clone()
    scaled[1:] = single_row_scores(scaled[1:], keys[1:])
    return scaled


def sink_mask(trace: Trace, eps: float = 3.0) -> torch.Tensor:
    """bool [steps, layers, heads, seq]: Eq. 3 sinks of every step, layer and head."""
    return find_sinks(torch.nan_to_num(comparable_scores(trace)), eps, valid=_valid(trace))


def first_masked(trace: Trace) -> torch.Tensor:
    """[steps] the leftmost position still masked when each step ran (the unmasking frontier); −1 if none."""
    masked = trace.is_masked
    index = torch.arange(masked.shape[1]).expand_as(masked)
    first = torch.where(masked, index, torch.full_like(index, masked.shape[1])).amin(1)
    return torch.where(first == masked.shape[1], torch.full_like(first, -1), first)


def greatest_sinks(trace: Trace, eps: float = 3.0, layers: Sequence[int] | None = None,
                   heads: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per (step, layer, head): position, token and score of the top key, whether it is a sink,
    and the unmasking frontier at that step (paper Fig. 7)."""
    scores = torch.nan_to_num(comparable_scores(trace), nan=float("-inf"))
    top_score, top_position = scores.max(-1)
    is_sink = sink_mask(trace, eps).gather(-1, top_position[..., None]).squeeze(-1)
    steps, n_layers, n_heads = top_score.shape
    grid = np.meshgrid(np.arange(steps), np.arange(n_layers), np.arange(n_heads), indexing="ij")
    frame = pd.DataFrame({"step": grid[0].ravel(), "layer": grid[1].ravel(), "head": grid[2].ravel(),
                          "position": top_position.numpy().ravel(), "score": top_score.numpy().ravel(),
                          "is_sink": is_sink.numpy().ravel()})
    tokens = trace.tokens[:-1].numpy()
    frame["token"] = [trace.token_text(tokens[s, p]) for s, p in zip(frame["step"], frame["position"])]
    frame["frontier"] = first_masked(trace).numpy()[frame["step"]]
    if layers is not None:
        frame = frame[frame["layer"].isin(list(layers))]
    if heads is not None:
        frame = frame[frame["head"].isin(list(heads))]
    return frame.reset_index(drop=True)


EVENT_COLUMNS = ["step", "layer", "head", "position_before", "position", "shift", "token_before", "token", "score_before",
                 "score", "frontier"]


def empty_events() -> pd.DataFrame:
    """No moving-sink event (e.g. an autoregressive-only run): the same columns, and a `model` and `trace` column."""
    return pd.DataFrame(columns=["model", "trace", *EVENT_COLUMNS])


def moving_sink_events(trace: Trace, eps: float = 3.0) -> pd.DataFrame:
    """(step, layer, head) where the greatest sink moved: a sink at step−1 and at step, at different
    positions (paper Fig. 4, 8). Sorted by the size of the jump in score."""
    top = greatest_sinks(trace, eps)
    previous = top.copy()
    previous["step"] += 1
    pairs = top.merge(previous, on=["step", "layer", "head"], suffixes=("", "_before"))
    moved = pairs[pairs["is_sink"] & pairs["is_sink_before"] & (pairs["position"] != pairs["position_before"])]
    moved = moved.assign(shift=moved["position"] - moved["position_before"])
    return moved[EVENT_COLUMNS].sort_values(["score", "step"], ascending=[False, True]).reset_index(drop=True)


def transient_sinks(trace: Trace, eps: float = 3.0) -> pd.DataFrame:
    """Positions that are a sink at one step only: not at step−1 nor at step+1 (paper Fig. 6b)."""
    sinks = sink_mask(trace, eps)
    if sinks.shape[0] < 3:
        return pd.DataFrame(columns=["step", "layer", "head", "position", "token", "score"])
    alone = sinks[1:-1] & ~sinks[:-2] & ~sinks[2:]
    found = alone.nonzero()
    steps, layers, heads, positions = (found[:, i] for i in range(4))
    scores = comparable_scores(trace)[steps + 1, layers, heads, positions]
    tokens = trace.tokens[steps + 1, positions].tolist()
    return pd.DataFrame({"step": (steps + 1).numpy(), "layer": layers.numpy(), "head": heads.numpy(),
                         "position": positions.numpy(), "token": [trace.token_text(t) for t in tokens],
                         "score": scores.double().numpy()},
                        columns=["step", "layer", "head", "position", "token", "score"])


def dynamics_summary(traces: Sequence[Trace], eps: float = 3.0) -> pd.DataFrame:
    """Per trace: mean lifetime of the greatest sink (consecutive steps at one position), move rate (share of
    consecutive step pairs with sinks at both whose greatest sink moved), mean distance from the greatest
    sink to the unmasking frontier, and the share of heads × steps that have any sink."""
    rows = []
    for index, trace in enumerate(traces):
        top = greatest_sinks(trace, eps)
        lifetimes, moves, pairs = [], 0, 0
        for _, group in top.groupby(["layer", "head"]):
            positions = group.sort_values("step")[["position", "is_sink"]].to_numpy()
            run = 0
            for t in range(len(positions)):
                if not positions[t, 1]:
                    if run:
                        lifetimes.append(run)
                    run = 0
                    continue
                if t and positions[t - 1, 1]:
                    pairs += 1
                    if positions[t, 0] != positions[t - 1, 0]:
                        moves += 1
                        lifetimes.append(run)
                        run = 0
                run += 1
            if run:
                lifetimes.append(run)
        with_frontier = top[top["is_sink"] & (top["frontier"] >= 0)]
        rows.append({"trace": index, "model": trace.meta.get("model", ""), "family": trace.meta.get("family", ""),
                     "mean_lifetime": float(np.mean(lifetimes)) if lifetimes else float("nan"),
                     "move_rate": moves / pairs if pairs else float("nan"),
                     "mean_distance_to_frontier": float((with_frontier["position"] - with_frontier["frontier"]).mean())
                     if len(with_frontier) else float("nan"),
                     "share_heads_with_sink": float(top["is_sink"].mean())})
    return pd.DataFrame(rows)


def sink_token_frequency(traces: Sequence[Trace], eps: float = 3.0, top: int | None = 5) -> pd.DataFrame:
    """Relative frequency of the tokens detected as sinks, over every step, layer and head of every trace
    (paper Table 2): columns token, count, share; the `top` most frequent (None: every token)."""
    if top is not None:
        check_int(top, "top", 1)
    counts: dict[str, int] = {}
    for trace in traces:
        sinks = sink_mask(trace, eps)
        steps, _, _, position = sinks.nonzero(as_tuple=True)
        ids = trace.tokens[:-1][steps, position]
        for token_id, count in zip(*torch.unique(ids, return_counts=True)):
            text = trace.token_text(int(token_id))
            counts[text] = counts.get(text, 0) + int(count)
    total = sum(counts.values())
    frame = pd.DataFrame(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])), columns=["token", "count"])
    frame["share"] = frame["count"] / total if total else 0.0
    return (frame if top is None else frame.head(top)).reset_index(drop=True)


TOKEN_GROUPS = ("mask", "special", "punctuation", "content")


def token_group(text: str, *, mask_token: str | None, special_tokens: Collection[str] = (),
                markers: Collection[str] = ()) -> str:
    """Which of TOKEN_GROUPS a token's text belongs to: the mask token; another special token; punctuation —
    symbols, whitespace (byte-level "Ċ" newline, "Ġ" space; SentencePiece "▁" and byte tokens such as "<0x0A>")
    and the prompt format's own markers (`markers`, e.g. the zoo's "Q:", "A:", "####"); or content, every other
    token (words, names, numbers)."""
    if mask_token is not None and text == mask_token:
        return "mask"
    if text in special_tokens:
        return "special"
    byte = _BYTE_FALLBACK.fullmatch(text)
    if byte:  # SentencePiece byte fallback ("<0x0A>" is a newline): an ASCII byte is its own character; a byte from
        value = int(byte.group(1), 16)  # 0x80 up is a piece of a multi-byte character (a letter, mostly): content
        return "punctuation" if value < 0x80 and not chr(value).isalnum() else "content"
    if text in markers or all(char in "ĊĠ" or unicodedata.category(char)[0] in "PSZ" for char in text.strip()):
        return "punctuation"
    return "content"


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def sink_token_groups(frequency: pd.DataFrame, **group_options) -> dict[str, float]:
    """Share of sink detections per token group (TOKEN_GROUPS, each present, summing to 1 when there are any) from
    sink_token_frequency(..., top=None); group_options as token_group takes them."""
    shares = dict.fromkeys(TOKEN_GROUPS, 0.0)
    for text, share in zip(frequency["token"], frequency["share"]):
        shares[token_group(text, **group_options)] += float(share)
    return shares


def main_sink_by_layer_head(trace: Trace) -> pd.DataFrame:
    """Score of the main (top) key of each layer and head, averaged over steps (paper Fig. 5)."""
    top = torch.nan_to_num(comparable_scores(trace), nan=float("-inf")).amax(-1).mean(0)  # [layers, heads]
    layers, heads = top.shape
    grid = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    return pd.DataFrame({"layer": grid[0].ravel(), "head": grid[1].ravel(), "score": top.numpy().ravel()})


def score_distribution(traces: Sequence[Trace], layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Every (step, layer, head, key) score as a long table with the model name (paper Fig. 3, 9)."""
    frames = []
    for trace in traces:
        scores = comparable_scores(trace)
        scores = scores if layers is None else scores[:, list(layers)]
        values = scores[~torch.isnan(scores)].numpy()
        frames.append(pd.DataFrame({"model": trace.meta.get("model", ""), "score": values}))
    return pd.concat(frames, ignore_index=True)


def query_group_split(trace: Trace, step: int, layer: int, head: int) -> pd.DataFrame:
    """From a kept map: the key that masked queries attend to most and the one unmasked queries attend to
    most, with the attention each group gives it (paper Fig. 6a). Needs trace.maps[(step, layer, head)]."""
    key = (step, layer, head)
    if key not in trace.maps:
        raise ValueError(f"trace has no map for (step, layer, head)={key}: generate with maps=[{key}]")
    attention = trace.maps[key]
    masked = trace.is_masked[step]
    rows = []
    for group, selector in (("masked queries", masked), ("unmasked queries", ~masked)):
        if selector.any():
            received = attention[selector].mean(0)
            position = int(received.argmax())
            rows.append({"group": group, "queries": int(selector.sum()), "top_key": position,
                         "token": trace.token_text(int(trace.tokens[step, position])),
                         "mean_attention": float(received[position])})
    return pd.DataFrame(rows)


def split_candidates(trace: Trace, eps: float = 3.0, limit: int = 5) -> pd.DataFrame:
    """(step, layer, head) triples worth a map for Fig. 6a: steps where both masked and unmasked queries
    exist and the head has at least two sinks (so the two groups can favour different ones)."""
    sinks = sink_mask(trace, eps)
    both = trace.is_masked.any(1) & (~trace.is_masked).any(1)
    counts = sinks.sum(-1)
    rows = [{"step": s, "layer": layer, "head": h, "sinks": int(counts[s, layer, h])}
            for s, layer, h in (counts >= 2).nonzero().tolist() if both[s]]
    frame = pd.DataFrame(rows, columns=["step", "layer", "head", "sinks"])
    return frame.sort_values(["sinks", "step"], ascending=[False, True]).head(limit).reset_index(drop=True)


# --- what the notebooks pick to draw ---------------------------------------------------------------------------
def strongest_head(trace: Trace) -> tuple[int, int]:
    """(layer, head) whose main sink is strongest averaged over steps (Fig. 1's head)."""
    top = main_sink_by_layer_head(trace).sort_values("score", ascending=False).iloc[0]
    return int(top["layer"]), int(top["head"])


def busiest_head(greatest: pd.DataFrame) -> tuple[int, int]:
    """(layer, head) with the most steps that have a sink, from greatest_sinks() (Fig. 7's head; ties: the
    lowest layer, then head)."""
    return tuple(int(i) for i in greatest.groupby(["layer", "head"])["is_sink"].sum().idxmax())


def moving_events(traces: Sequence[Trace], eps: float = 3.0) -> pd.DataFrame:
    """moving_sink_events of every trace, with a `trace` column (its index in `traces`), in trace order."""
    return pd.concat([moving_sink_events(t, eps).assign(trace=i) for i, t in enumerate(traces)])


def transient_events(traces: Sequence[Trace], eps: float = 3.0) -> pd.DataFrame:
    """transient_sinks of every trace, with a `trace` column (its index in `traces`)."""
    return pd.concat([transient_sinks(t, eps).assign(trace=i) for i, t in enumerate(traces)])


def top_moving_event(events: pd.DataFrame) -> pd.Series | None:
    """The strongest of `moving_events(traces, eps)` (greatest score; ties: the earliest trace, then step), with
    its `trace` index; None when no sink moved. Takes the events already found, so they are computed once."""
    if not len(events):
        return None
    return events.sort_values(["score", "trace", "step"], ascending=[False, True, True], kind="stable").iloc[0]


def topk_overlap(trace: Trace, k: int = 5) -> pd.DataFrame:
    """One row per (step pair, layer, head): the Jaccard overlap |A ∩ B| / |A ∪ B| of the head's top-k keys (by
    score, among the keys that exist) at step t−1 and step t — 1 when attention keeps to the same keys, 0 when it
    moves entirely. `k` is capped by the keys that exist at the earlier step."""
    check_int(k, "k", 1)
    scores = torch.nan_to_num(comparable_scores(trace), nan=float("-inf"))
    valid = _valid(trace)
    steps, layers, heads, keys = scores.shape
    width = min(k, int(valid[0].sum(-1).min()))
    top = scores.topk(width, dim=-1).indices  # [steps, layers, heads, width]
    chosen = torch.zeros(steps, layers, heads, keys, dtype=torch.bool).scatter(-1, top, True) & valid
    both = (chosen[1:] & chosen[:-1]).sum(-1).double()
    either = (chosen[1:] | chosen[:-1]).sum(-1).double()
    grid = np.meshgrid(np.arange(1, steps), np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.DataFrame({"step": grid[0].ravel(), "layer": grid[1].ravel(), "head": grid[2].ravel(),
                          "jaccard": (both / either.clamp(min=1)).numpy().ravel(), "k": width,
                          "model": trace.meta.get("model", "")})
    # an autoregressive prefill (column sums over the prompt) and a decoding row are different quantities
    return frame[frame["step"] > 1].reset_index(drop=True) if trace.is_autoregressive else frame


def stability_by_layer(traces: Sequence[Trace], k: int = 5, eps: float = 3.0) -> pd.DataFrame:
    """Per (model, layer): the mean and standard deviation over (trace, head, step pair) of the top-k Jaccard
    overlap between consecutive steps, and the greatest sink's move rate — the share of consecutive step pairs,
    both with a sink, whose greatest sink changed position — with its standard deviation over (trace, head)."""
    overlaps = pd.concat([topk_overlap(trace, k) for trace in traces], ignore_index=True)
    moves = pd.concat([_moves(trace, index, eps) for index, trace in enumerate(traces)], ignore_index=True)
    per_head = moves.groupby(["model", "layer", "trace", "head"])["moved"].mean().reset_index()
    frame = overlaps.groupby(["model", "layer"], sort=False)["jaccard"].agg(["mean", "std"])
    frame.columns = ["jaccard_mean", "jaccard_std"]
    rates = per_head.groupby(["model", "layer"])["moved"].agg(["mean", "std", "size"])
    rates.columns = ["move_rate", "move_rate_std", "heads_with_pairs"]
    return frame.join(rates, how="left").reset_index()


def _moves(trace: Trace, index: int, eps: float) -> pd.DataFrame:
    """One row per (layer, head, step pair) with a sink at both steps: whether the greatest sink moved."""
    top = greatest_sinks(trace, eps).sort_values(["layer", "head", "step"])
    before = top.groupby(["layer", "head"])[["position", "is_sink", "step"]].shift(1)
    first = 1 if trace.is_autoregressive else 0  # the prefill's sink is not a decoding row's
    pairs = top[top["is_sink"] & before["is_sink"].eq(True) & (top["step"] - before["step"] == 1)
                & (before["step"] >= first)]
    return pd.DataFrame({"model": trace.meta.get("model", ""), "trace": index, "layer": pairs["layer"],
                         "head": pairs["head"], "moved": (pairs["position"] != before.loc[pairs.index, "position"])})
