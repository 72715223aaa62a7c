"""Cached and parallel decoding for the block-wise diffusion samplers, by Fast-dLLM's rules (developer notes:
docs/fast-dllm-rules.md, which cites the upstream lines).

`cache` (a field of LLaDASettings and DreamSettings): each block's first step is one full forward, which computes
every position and keeps its keys and values; the block's later steps compute only a window of query rows, whose
keys and values stand beside the kept ones:
- "prefix": the window is the block and every later (still masked) position; the kept keys are those before the
  block;
- "dual": the window is the block alone; the kept keys are those before and after it.
The kept keys are stale by design (computed when the block was all masks), exactly as upstream keeps them.

`threshold`: a step writes every masked position of the block whose confidence is at or above it, and at least the
most confident one, so a block can end in fewer steps than its schedule (upstream's confidence-threshold rule).

`refresh` (a bound in [0, 1]; with a cache): the sink-anchored refresh, Elastic-Cache's trigger read with this project's
sink rule. Each refresh (a full forward) is followed by one window forward beside its fresh keys, which records, per
layer, the key the window's queries attend most (averaged over heads and queries), whether it is a sink by Eq. 3, and
its share. Every later window forward is watched the same way; when a layer's greatest sink moved (or appeared, or
vanished), or the most-attended key's share moved by `refresh` or more, that forward's result is dropped and the step
refreshes instead. refresh=0 refreshes every step:
the tokens of the sampler without a cache. Every forward is a step of the trace (Trace.recomputed says what it
computed); a dropped window and a refresh write nothing, the window after a refresh writes the step's tokens from the
refresh's logits.

The window forward is a transformers forward with a cache whose `update` returns the kept keys with the window's
own keys in place (upstream writes them in place into its cached tensors: the same keys). transformers keeps keys
after RoPE, upstream before; at a fixed position both give the same key up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers.cache_utils import DynamicCache

from sinklib.sinks import top_sinks
from sinklib.ties import note_decisions
from sinklib.validation import bad_value

CACHES = ("prefix", "dual")
SINK_EPS = 3.0  # Eq. 3's threshold for the refresh's greatest sink: the paper's, as everywhere in sinklib


@dataclass(frozen=True)
class Window:
    """The query rows a cached forward computes, canvas columns [start, stop), and the keys and values kept from
    the last full forward: one (keys, values) pair [batch, kv_heads, positions, head_dim] per layer."""
    start: int
    stop: int
    kept: list[tuple[torch.Tensor, torch.Tensor]]


class WindowCache(DynamicCache):
    """A transformers cache for one window forward: each layer's `update` returns the kept keys and values before
    the window, the window's own, and the kept ones after it; nothing is stored (the next step reuses the same
    kept keys, as upstream's prefix and dual caches do)."""

    def __init__(self, window: Window):
        super().__init__()
        self.before = [(k[:, :, :window.start], v[:, :, :window.start]) for k, v in window.kept]
        self.after = [(k[:, :, window.stop:], v[:, :, window.stop:]) for k, v in window.kept]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        (keys_before, values_before), (keys_after, values_after) = self.before[layer_idx], self.after[layer_idx]
        return (torch.cat([keys_before, key_states, keys_after], dim=-2),
                torch.cat([values_before, value_states, values_after], dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.before[layer_idx][0].shape[-2]

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        query = query_length if isinstance(query_length, int) else query_length.shape[-1]
        return self.before[layer_idx][0].shape[-2] + query + self.after[layer_idx][0].shape[-2], 0


def kept_keys(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) from the cache a full forward returned."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers < 4.56


def forward_cached(model: torch.nn.Module, ids: torch.Tensor, key_mask: torch.Tensor | None,
                   position_ids: torch.Tensor | None, window: Window | None, cache_keyword: str):
    """A native bidirectional model's forward for the cached samplers. Without a window: one full forward over
    `ids` [batch, positions] → (logits [batch, positions, vocab], the kept keys). With one: only the window's rows
    of `ids` are computed, attending the kept keys and each other → logits [batch, stop − start, vocab].
    key_mask [batch, positions] (1 = a real token; None: all real) and position_ids [batch, positions] (None:
    0..positions−1) describe the whole canvas."""
    batch, width = ids.shape
    keys = torch.ones(batch, width, dtype=torch.bool, device=ids.device) if key_mask is None else key_mask.bool()
    if window is None:
        mask = keys[:, None, None, :].expand(batch, 1, width, width) if key_mask is not None else None
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True)
        return out.logits, kept_keys(getattr(out, cache_keyword))
    rows = window.stop - window.start
    positions = position_ids[:, window.start:window.stop] if position_ids is not None else \
        torch.arange(window.start, window.stop, device=ids.device)[None, :].expand(batch, -1)
    out = model(input_ids=ids[:, window.start:window.stop], attention_mask=keys[:, None, None, :].expand(batch, 1, rows, width),
                position_ids=positions, use_cache=True, **{cache_keyword: WindowCache(window)})
    return out.logits


def threshold_choice(confidence: torch.Tensor, candidates: torch.Tensor, threshold: float) -> torch.Tensor:
    """The positions a confidence-threshold step writes, bool [batch, positions]: every candidate whose confidence
    is at or above `threshold`, and the most confident candidate of a row whatever its confidence (upstream keeps
    rank 0 of its top-k and drops the lower ranks below the threshold). confidence [batch, positions]; candidates
    bool, same shape (the block's masked positions)."""
    chosen = candidates & (confidence >= threshold)
    ranked = torch.where(candidates, confidence, torch.full_like(confidence, float("-inf")))
    best = ranked.argmax(-1)
    rows = torch.arange(confidence.shape[0], device=confidence.device)
    chosen[rows, best] |= candidates[rows, best]
    return chosen


def threshold_margin(confidence: torch.Tensor, candidates: torch.Tensor, threshold: float) -> torch.Tensor:
    """How close a threshold step came to another choice, per row (float64 [batch], +inf without candidates): the
    smallest relative gap (c − threshold) / (1 + |c|) between a candidate's confidence and the threshold."""
    confidence = confidence.double()
    gap = (confidence - threshold).abs() / (1 + confidence.abs())
    return torch.where(candidates, gap, torch.full_like(gap, float("inf"))).amin(-1).cpu()


def check_refresh(refresh: float | None, cache: str | None) -> None:
    """A refresh bound watches a cache: refused without one."""
    if refresh is not None and cache is None:
        raise bad_value("refresh", refresh, "None without a cache (the bound says when cached keys are refreshed: "
                                            "give cache='prefix' or 'dual')")


def greatest_sinks(scores: torch.Tensor, query_count: torch.Tensor, eps: float = SINK_EPS
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each layer's greatest sink in one forward and the share of its most-attended key: scores [layers, batch, heads,
    keys] (the capture's column sums over the forward's query rows), query_count [layers, batch] → (key [layers,
    batch] int64: the most-attended key if it passes Eq. 3 with `eps` on the layer's attention averaged over heads
    and query rows, put in sum units (mean 1 over the keys attended at all), else −1; share [layers, batch]: the most
    -attended key's attention, averaged over heads and query rows, in [0, 1])."""
    received = scores.nan_to_num(0.0).sum(2) / (scores.shape[2] * query_count.clamp(min=1))[..., None]
    attended = received > 0  # padding, and keys an intervention masked, receive exactly 0
    key = top_sinks(received * attended.sum(-1, keepdim=True), 1, eps, "sum", valid=attended)[..., 0]
    return key, received.amax(-1)


def drifted(anchor: tuple[torch.Tensor, torch.Tensor], now: tuple[torch.Tensor, torch.Tensor], bound: float) -> bool:
    """Whether any layer of any row has another greatest sink than at the anchor (a sink that moved, appeared or
    vanished; a layer with no key passing Eq. 3 either time has none to move), or its most-attended key's share moved
    by `bound` or more (so bound 0 is always a drift): greatest_sinks after the last refresh against this forward's."""
    (anchor_key, anchor_share), (key, share) = anchor, now
    return bool((key != anchor_key).any() or ((share - anchor_share).abs() >= bound).any())


class BlockCache:
    """The forwards of one block's steps under a cache: `full` (a refresh: every key recomputed and kept) and
    `window` (only the window's rows, beside the kept keys). With a `refresh` bound, each refresh is followed by a
    watched window forward that anchors each layer's greatest sink, and a window whose sinks drifted from the anchor is
    dropped (None) so that the step refreshes instead; each forward that writes nothing appends the unchanged canvas
    to `canvases` and notes no decision (ties), so the trace keeps one canvas per forward.

    run(x, keep=…, window=…, watch=…) is the family's forward: keep=True → (logits, kept keys); a window → its logits;
    watch=True → (logits, (scores, query_count)) as the capture recorded that forward."""

    def __init__(self, run: Callable, start: int, stop: int, refresh: float | None, canvases: list):
        self.run, self.start, self.stop, self.refresh, self.canvases = run, start, stop, refresh, canvases
        self.kept: list | None = None
        self.anchor: tuple[torch.Tensor, torch.Tensor] | None = None

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """A refresh: the full forward's logits [batch, positions, vocab]; its keys and values are kept, and with a
        refresh bound the window beside them anchors the greatest sinks (two forwards: the step's tokens come from
        the first, and are written after the second)."""
        logits, self.kept = self.run(x, keep=True)
        if self.refresh is not None:
            self._wrote_nothing(x)
            _, attention = self.run(x, window=self._window(), watch=True)
            self.anchor = greatest_sinks(*attention)
        return logits

    def window(self, x: torch.Tensor) -> torch.Tensor | None:
        """The window's logits [batch, stop − start, vocab] beside the kept keys; None when the watched sinks drifted
        beyond the refresh bound (the caller then refreshes with `full`)."""
        if self.refresh is None:
            return self.run(x, window=self._window())
        logits, attention = self.run(x, window=self._window(), watch=True)
        if not drifted(self.anchor, greatest_sinks(*attention), self.refresh):
            return logits
        self._wrote_nothing(x)
        return None

    def _window(self) -> Window:
        return Window(self.start, self.stop, self.kept)

    def _wrote_nothing(self, x: torch.Tensor) -> None:
        self.canvases.append(x.clone())
        note_decisions(torch.full((x.shape[0],), float("inf"), dtype=torch.float64))
