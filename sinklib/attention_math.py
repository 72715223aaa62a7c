"""Attention probabilities recomputed from the exact arguments a model passes to SDPA, reduced at the
source: float32, one query chunk at a time, so at most one chunk × keys block exists per head."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

DEFAULT_CHUNK_ELEMENTS = 1 << 22  # ≈ 16 MB of float32 probabilities per chunk


@dataclass
class AttentionStats:
    scores: torch.Tensor  # [B, H, Sk] float32: Σ over (weighted) query rows of A_ij
    query_count: torch.Tensor  # [B] float32: query rows that attended to something (weighted)
    key_valid: torch.Tensor  # [B, Sk] bool: keys that at least one query may attend to
    maps: dict[int, torch.Tensor] = field(default_factory=dict)  # head → [B, Sq, Sk]
    last_row: torch.Tensor | None = None  # [B, H, Sk]: the last query's attention row


def as_4d(mask: torch.Tensor) -> torch.Tensor:
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def allowed_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Where a mask lets attention through: bool masks as given; additive masks wherever they are above
    half the dtype's minimum (transformers masks with finfo.min, not −inf)."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def causal_allowed(n_queries: int, n_keys: int, device: torch.device, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """SDPA's is_causal pattern (top-left aligned: key j ≤ query i) for query rows start:stop."""
    rows = torch.arange(start, n_queries if stop is None else stop, device=device)[:, None]
    return torch.arange(n_keys, device=device)[None, :] <= rows


def repeat_heads(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    if k.shape[1] == n_heads:
        return k
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def attention_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    query_weight: torch.Tensor | None = None,
    map_heads: tuple[int, ...] = (),
    want_last_row: bool = False,
    chunk_size: int | None = None,
) -> AttentionStats:
    """Scores s_j = Σ_i A_ij of softmax(q kᵀ·scale + mask) for q [B,H,Sq,D], k [B,Hk,Sk,D] (Hk divides H).

    Fully masked query rows contribute nothing. query_weight: optional [B, Sq] weights (0 drops a row,
    e.g. left padding). map_heads: heads whose full [B, Sq, Sk] map is kept.
    """
    batch, heads, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    keys_t = repeat_heads(k, heads).float().transpose(-1, -2)
    mask = as_4d(attn_mask) if attn_mask is not None else None
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // max(1, batch * heads * n_keys))
    scores = torch.zeros(batch, heads, n_keys, dtype=torch.float32, device=q.device)
    query_count = torch.zeros(batch, dtype=torch.float32, device=q.device)
    key_valid = torch.zeros(batch, n_keys, dtype=torch.bool, device=q.device)
    maps = {h: torch.empty(batch, n_queries, n_keys, dtype=torch.float32, device=q.device) for h in map_heads}
    probs = None
    q_scaled = q.float() * scale  # scale the small [Sq, D] side, not the [Sq, Sk] logits
    for start in range(0, n_queries, chunk_size):
        stop = min(start + chunk_size, n_queries)
        logits = torch.matmul(q_scaled[:, :, start:stop], keys_t)
        allowed = None
        if mask is not None:
            part = mask if mask.shape[-2] == 1 else mask[..., start:stop, :]
            if part.dtype == torch.bool:
                logits.masked_fill_(~part, float("-inf"))
            else:
                logits.add_(part.float())
            allowed = allowed_from_mask(part)
        if is_causal:
            causal = causal_allowed(n_queries, n_keys, q.device, start, stop)
            logits.masked_fill_(~causal, float("-inf"))
            allowed = causal[None, None] if allowed is None else allowed & causal
        probs = torch.softmax(logits, dim=-1)
        if mask is not None:
            probs.nan_to_num_(0.0)  # a fully masked row (bool or −inf mask) attends to nothing
            if part.dtype != torch.bool:  # a row masked with finfo.min softmaxes to uniform: drop it too
                probs.masked_fill_(~allowed.any(-1, keepdim=True), 0.0)
        if allowed is None:
            row_live = torch.ones(batch, stop - start, device=q.device)
            key_valid.fill_(True)
        else:
            row_live = allowed.any(-1).any(1).expand(batch, stop - start).float()  # [B, chunk]
            key_valid |= allowed.any(-2).any(1).expand(batch, n_keys)
        if query_weight is not None:
            weight = query_weight[:, start:stop].float()
            probs.mul_(weight[:, None, :, None])
            row_live = row_live * weight
        scores += probs.sum(-2)
        query_count += row_live.sum(-1)
        for h in map_heads:
            maps[h][:, start:stop] = probs[:, h]
    last_row = probs[:, :, -1].clone() if (want_last_row and probs is not None) else None
    return AttentionStats(scores, query_count, key_valid, maps, last_row)


def _base_allowed(attn_mask: torch.Tensor | None, is_causal: bool, shape: tuple[int, int, int, int], device) -> torch.Tensor:
    """The model's own [B, H, Sq, Sk] allowed pattern (its mask and/or is_causal)."""
    batch, heads, n_queries, n_keys = shape
    base = as_4d(attn_mask) if attn_mask is not None else torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    allowed = allowed_from_mask(base)
    if is_causal:
        allowed = allowed & causal_allowed(n_queries, n_keys, device)
    return allowed.expand(batch, heads, n_queries, n_keys)


def heads_left_without_keys(attn_mask: torch.Tensor | None, is_causal: bool, key_mask: torch.Tensor, n_queries: int) -> torch.Tensor:
    """[B, H] bool: (batch, head) pairs where masking key_mask [B, H, Sk] leaves no query row any key — a mask
    that cannot be applied (softmax over nothing), which the capture refuses rather than silently skipping."""
    batch, heads, n_keys = key_mask.shape
    allowed = _base_allowed(attn_mask, is_causal, (batch, heads, n_queries, n_keys), key_mask.device)
    had_keys = allowed.any(-1).any(-1)
    keeps_keys = (allowed & ~key_mask[:, :, None, :]).any(-1).any(-1)
    return had_keys & ~keeps_keys


def mask_keys(
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    key_mask: torch.Tensor,
    n_queries: int,
) -> torch.Tensor:
    """A [B, H, Sq, Sk] mask equal to the model's own plus −∞ at key_mask [B, H, Sk] for every query.

    A query row that the extra keys would leave with nothing to attend to keeps its original row, so the
    intervention never produces NaN (e.g. a causal first token whose only key is a chosen sink). A mask that
    would leave *every* row of a head without keys is refused earlier (heads_left_without_keys)."""
    batch, heads, n_keys = key_mask.shape
    device = key_mask.device
    base_allowed = _base_allowed(attn_mask, is_causal, (batch, heads, n_queries, n_keys), device)
    kill = key_mask[:, :, None, :].expand(batch, heads, n_queries, n_keys)
    dead_rows = ~(base_allowed & ~kill).any(-1, keepdim=True)
    kill = kill & ~dead_rows
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return base_allowed & ~kill
    additive = as_4d(attn_mask).expand(batch, heads, n_queries, n_keys)
    if is_causal:
        additive = additive.masked_fill(~causal_allowed(n_queries, n_keys, device), float("-inf"))
    return additive.masked_fill(kill, float("-inf"))
