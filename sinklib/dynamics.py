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

from sinklib.validation import BadValue, Flag, check_eps, check_int, checked
from sinklib.sinks import find_sinks, single_row_scores, sink_margin
from sinklib.stats import wilson_interval
from sinklib.trace import Trace


def _valid(trace: Trace) -> torch.Tensor:
    return ~torch.isnan(trace.require_scores())


def comparable_scores(trace: Trace) -> torch.Tensor:
    """Scores with mean 1 over the keys of every step: unchanged for diffusion traces and the prefill; an
    autoregressive decoding step's single row is multiplied by its number of keys, and a cached diffusion step's
    (Trace.recomputed: it sums over its window's rows only) by its keys over its rows."""
    if trace.recomputed is not None:
        rows = trace.recomputed.sum(-1).clamp(min=1).float()  # [steps]
        keys = _valid(trace).sum(-1, keepdim=True).float()  # [steps, layers, heads, 1]
        return trace.require_scores() * keys / rows[:, None, None, None]
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


def _top_keys(trace: Trace, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position, score, whether it is an Eq. 3 sink) of the top key of every step, layer and head, each
    [steps, layers, heads]."""
    scores = torch.nan_to_num(comparable_scores(trace), nan=float("-inf"))
    top_score, top_position = scores.max(-1)
    return top_position, top_score, sink_mask(trace, eps).gather(-1, top_position[..., None]).squeeze(-1)


def greatest_sinks(trace: Trace, eps: float = 3.0, layers: Sequence[int] | None = None,
                   heads: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per (step, layer, head): position, token and score of the top key, whether it is a sink,
    and the unmasking frontier at that step (paper Fig. 7)."""
    top_position, top_score, is_sink = _top_keys(trace, eps)
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


TRANSIENT_COLUMNS = ["step", "layer", "head", "position", "token", "score", "threshold_gap", "transient"]
# An Eq. 3 test closer to its threshold than this (relative, as threshold_gap) is one whose outcome a table of one-step
# sinks writes down either way (transient_sinks(undecided=True)): about 300 times the largest attention-score
# difference measured between two CPUs' kernels (3.5e-6 of 1 + |score|, sinklib.lab.agreement), so that a rerun on
# another CPU finds every row the committed table has, and can tell a one-step sink flipped by rounding from one
# written by hand.
THRESHOLD_BAND = 1e-3


@checked
def transient_sinks(trace: Trace, eps: float = 3.0, undecided: Flag = False) -> pd.DataFrame:
    """Positions that are a sink at one step only: not at step−1 nor at step+1 (paper Fig. 6b), `transient` True.
    threshold_gap: of the three steps that decide the event, the closest Eq. 3 test, |s_j − mean_{k≠j} s_k − eps| /
    (1 + |s_j|) (a relative float; where it is within float rounding, another CPU's scores may decide the event
    otherwise).

    undecided: also the positions that tests within THRESHOLD_BAND of their threshold could make one-step sinks
    (taking each such test either way), with `transient` False: what a rerun on another CPU needs to tell a one-step
    sink that rounding made or unmade from one that is not there."""
    sinks = sink_mask(trace, eps)
    if sinks.shape[0] < 3:
        return pd.DataFrame(columns=TRANSIENT_COLUMNS)
    alone = sinks[1:-1] & ~sinks[:-2] & ~sinks[2:]
    comparable = torch.nan_to_num(comparable_scores(trace))
    gaps = (sink_margin(comparable, valid=_valid(trace)) - eps).abs() / (1 + comparable.abs())  # inf: no test
    found = alone
    if undecided:
        firm = gaps > THRESHOLD_BAND
        could_be, surely = sinks | ~firm, sinks & firm
        found = could_be[1:-1] & ~surely[:-2] & ~surely[2:]
    steps, layers, heads, positions = found.nonzero().unbind(1)
    deciding = torch.stack([gaps[steps + shift, layers, heads, positions] for shift in (0, 1, 2)]).amin(0)
    scores = comparable_scores(trace)[steps + 1, layers, heads, positions]
    tokens = trace.tokens[steps + 1, positions].tolist()
    return pd.DataFrame({"step": (steps + 1).numpy(), "layer": layers.numpy(), "head": heads.numpy(),
                         "position": positions.numpy(), "token": [trace.token_text(t) for t in tokens],
                         "score": scores.double().numpy(), "threshold_gap": deciding.double().numpy(),
                         "transient": alone[steps, layers, heads, positions].numpy()},
                        columns=TRANSIENT_COLUMNS)


def dynamics_summary(traces: Sequence[Trace], eps: float = 3.0) -> pd.DataFrame:
    """Per trace: mean lifetime of the greatest sink (consecutive steps at one position), move rate (share of
    consecutive step pairs with sinks at both whose greatest sink moved), mean distance from the greatest
    sink to the unmasking frontier, and the share of heads × steps that have any sink."""
    rows = []
    for index, trace in enumerate(traces):
        position, _, sink = (tensor.numpy() for tensor in _top_keys(trace, eps))  # [steps, layers, heads]
        # a head's greatest sink lives from the step it appears, or moves, to the step it moves or vanishes: every
        # sink step belongs to one such run, so the mean lifetime is sink steps over runs
        both = sink[1:] & sink[:-1]  # consecutive steps with a sink at each
        moved = both & (position[1:] != position[:-1])
        runs = int(sink[0].sum()) + int((sink[1:] & ~(both & ~moved)).sum())
        frontier = first_masked(trace).numpy()[:, None, None]
        with_frontier = sink & (frontier >= 0)
        distance = int((position - frontier)[with_frontier].sum())  # exact: integers
        rows.append({"trace": index, "model": trace.meta.get("model", ""), "family": trace.meta.get("family", ""),
                     "mean_lifetime": int(sink.sum()) / runs if runs else float("nan"),
                     "move_rate": int(moved.sum()) / int(both.sum()) if both.any() else float("nan"),
                     "mean_distance_to_frontier": distance / int(with_frontier.sum()) if with_frontier.any() else float("nan"),
                     "share_heads_with_sink": int(sink.sum()) / sink.size})
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
        raise BadValue(f"trace has no map for (step, layer, head)={key}: generate with maps=[{key}]")
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


def transient_events(traces: Sequence[Trace], eps: float = 3.0, undecided: bool = False) -> pd.DataFrame:
    """transient_sinks of every trace (with the `undecided` ones), with a `trace` column (its index in `traces`)."""
    return pd.concat([transient_sinks(t, eps, undecided).assign(trace=i) for i, t in enumerate(traces)])


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


# --- do sinks move? both measures, split by key type ---------------------------------------------------------------
KEY_TYPES = ("all", "prompt", "decoded", "masked")

STABILITY_COLUMNS = ["model", "key_type", "move_rate", "move_rate_ci_low", "move_rate_ci_high", "pairs_with_sinks",
                     "jaccard_mean", "jaccard_pairs", "k", "k_used_min", "k_used_max"]



def key_types(trace: Trace) -> torch.Tensor:
    """int64 [steps, seq]: each key's type when each step ran, as an index into KEY_TYPES — 1 prompt (position <
    prompt_len), 2 decoded (a generated position no longer masked), 3 masked (still masked; for an autoregressive
    trace, not yet written). Never 0: "all" is every key."""
    types = torch.where(trace.is_masked, 3, 2)
    types[:, :trace.prompt_len] = 1
    return types


def _pair_candidates(trace: Trace, key_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [steps−1, layers, heads, seq] twice: the keys each step pair (t−1, t) ranks at t−1 and at t. "all": the
    keys existing at each step, as topk_overlap and _moves rank them; a type: the keys of that type at t−1 that
    exist at both steps — one set for both, so a key decoded at t still counts as masked for this pair."""
    valid = _valid(trace)
    if key_type == "all":
        return valid[:-1], valid[1:]
    of_type = (key_types(trace)[:-1] == KEY_TYPES.index(key_type))[:, None, None, :]
    both = valid[:-1] & valid[1:] & of_type
    return both, both


def _chosen_top(scores: torch.Tensor, candidates: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """bool like scores: each row's `width` best candidates (width [...] varies by row; torch.topk needs one)."""
    widest = max(int(width.max()), 1) if width.numel() else 1
    top = scores.masked_fill(~candidates, float("-inf")).topk(widest, dim=-1).indices
    keep = torch.arange(widest) < width[..., None]
    return torch.zeros_like(candidates).scatter(-1, top, keep) & candidates


def _typed_pairs(trace: Trace, key_type: str, scores: torch.Tensor, sinks: torch.Tensor, k: int) -> pd.DataFrame:
    """One row per (step pair, layer, head) for one key type: `counted` (the type's top key is an Eq. 3 sink at both
    steps), `moved` (its position changed), `jaccard` of the type's top-k keys (NaN with no key of the type), `k_used`."""
    before, after = _pair_candidates(trace, key_type)
    has_keys = before.any(-1) & after.any(-1)
    top_before = scores[:-1].masked_fill(~before, float("-inf")).max(-1).indices
    top_after = scores[1:].masked_fill(~after, float("-inf")).max(-1).indices
    counted = sinks[:-1].gather(-1, top_before[..., None]).squeeze(-1) & sinks[1:].gather(-1, top_after[..., None]).squeeze(-1)
    width = before.sum(-1).clamp(max=k)
    a, b = _chosen_top(scores[:-1], before, width), _chosen_top(scores[1:], after, width)
    jaccard = (a & b).sum(-1).double() / (a | b).sum(-1).double().clamp(min=1)
    pairs, layers, heads = width.shape
    grid = np.meshgrid(np.arange(1, pairs + 1), np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.DataFrame({"step": grid[0].ravel(), "layer": grid[1].ravel(), "head": grid[2].ravel(), "key_type": key_type,
                          "counted": (counted & has_keys).numpy().ravel(), "moved": (top_before != top_after).numpy().ravel(),
                          "jaccard": jaccard.where(has_keys, torch.nan).numpy().ravel(), "k_used": width.numpy().ravel()})
    # an autoregressive prefill (column sums over the prompt) and a decoding row are different quantities
    return frame[frame["step"] > 1] if trace.is_autoregressive else frame


def _stability_row(model: str, key_type: str, pairs: pd.DataFrame, k: int) -> dict:
    moved = pairs.loc[pairs["counted"], "moved"]
    with_keys = pairs[pairs["jaccard"].notna()]
    low, high = wilson_interval(int(moved.sum()), len(moved))
    return {"model": model, "key_type": key_type, "move_rate": float(moved.mean()) if len(moved) else float("nan"),
            "move_rate_ci_low": low, "move_rate_ci_high": high, "pairs_with_sinks": len(moved),
            "jaccard_mean": float(with_keys["jaccard"].mean()) if len(with_keys) else float("nan"),
            "jaccard_pairs": len(with_keys), "k": k,
            "k_used_min": int(with_keys["k_used"].min()) if len(with_keys) else 0,
            "k_used_max": int(with_keys["k_used"].max()) if len(with_keys) else 0}


def stability_by_key_type(traces: Sequence[Trace], k: int = 5, eps: float = 3.0) -> pd.DataFrame:
    """Do sinks move between consecutive denoising steps, measured both ways, per (model, key type in KEY_TYPES):

    - `move_rate` (the paper's measure): of the (trace, layer, head, step pair) whose greatest key of that type is an
      Eq. 3 sink at both steps (`pairs_with_sinks` of them), the share where that key changed position — pooled over
      pairs. Eq. 3 is judged on the whole row of scores (all keys), only the candidate is restricted to the type.
      `move_rate_ci_low` / `_high`: a Wilson 95 % interval on that pooled share. Pairs of one head and one trace are
      not independent, so the interval is optimistic (too narrow).
    - `jaccard_mean` (the set measure): the mean over (trace, layer, head, step pair) — `jaccard_pairs` of them — of
      the Jaccard overlap of the head's top-k keys of that type at t−1 and at t. `k` is as asked; each pair caps it
      at its number of keys of that type (`k_used_min` / `k_used_max` over pairs); pairs with none are skipped.

    A key's type for the pair (t−1, t) is its type at the EARLIER step t−1 (a masked key decoded at t is still a
    masked key for that pair), and both steps rank the same keys: those of that type at t−1 that exist at both
    steps. "all" ranks every key existing at each step, as topk_overlap and _moves do, so its row matches
    stability_by_layer's pooled data — except that k is capped per pair (by the keys existing at t−1, as
    topk_overlap's docstring says; its code caps at step 0's keys: they differ for an autoregressive trace whose
    prompt is shorter than k). Scores are comparable_scores (sum units, mean 1 over keys). Autoregressive
    traces skip the pair (prefill, first decoding row); their masked keys are not written yet (NaN scores), so their
    "masked" row has no pairs: NaN measures, zero counts. One row per model and key type, models in trace order."""
    check_int(k, "k", 1)
    check_eps(eps)
    frames = []
    for trace in traces:
        scores = torch.nan_to_num(comparable_scores(trace), nan=float("-inf"))
        sinks = sink_mask(trace, eps)
        model = trace.meta.get("model", "")
        frames += [_typed_pairs(trace, key_type, scores, sinks, k).assign(model=model) for key_type in KEY_TYPES]
    if not frames:
        return pd.DataFrame(columns=STABILITY_COLUMNS)
    pairs = pd.concat(frames, ignore_index=True)
    models = list(dict.fromkeys(trace.meta.get("model", "") for trace in traces))
    rows = [_stability_row(model, key_type, pairs[(pairs["model"] == model) & (pairs["key_type"] == key_type)], k)
            for model in models for key_type in KEY_TYPES]
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)

