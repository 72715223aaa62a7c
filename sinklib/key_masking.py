"""Masking keys out of attention: the mask a masked forward passes (the model's own plus −∞ at the masked keys),
the (batch, head) pairs a key mask would leave with no key, and the causal route that computes a masked forward's
output and attention statistics without materialising a [B, H, Sq, Sk] mask."""
from __future__ import annotations

import math

import torch

from sinklib.attention_math import (AttentionStats, _statistics_by_transposed_lse, allowed_from_mask, as_4d,
                                    attention_statistics, causal_allowed, repeat_heads, sdpa_with_lse, trusted_lse)


def _base_allowed(attn_mask: torch.Tensor | None, is_causal: bool, shape: tuple[int, int, int, int], device) -> torch.Tensor:
    """The model's own [B, H, Sq, Sk] allowed pattern (its mask and/or is_causal)."""
    batch, heads, n_queries, n_keys = shape
    base = as_4d(attn_mask) if attn_mask is not None else torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    allowed = allowed_from_mask(base)
    if is_causal:
        allowed = allowed & causal_allowed(n_queries, n_keys, device)
    return allowed.expand(batch, heads, n_queries, n_keys)


def heads_left_without_keys(attn_mask: torch.Tensor | None, is_causal: bool, key_mask: torch.Tensor,
                            n_queries: int) -> torch.Tensor:
    """[B, H] bool: (batch, head) pairs where masking key_mask [B, H, Sk] leaves no query row any key — a mask
    that cannot be applied (softmax over nothing), which the capture refuses rather than silently skipping."""
    batch, heads, n_keys = key_mask.shape
    if attn_mask is None:  # every key is visible to the last row (causal or not): stranded iff all are masked
        return key_mask.all(-1)
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
    if attn_mask is None and not is_causal:  # no row can be left empty (refused earlier): one row serves all queries
        return ~key_mask[:, :, None, :]
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


def masked_causal_route(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor,
                        scale: float | None, enable_gqa: bool) -> tuple[torch.Tensor, AttentionStats] | None:
    """(output, statistics) of square causal attention with key_mask [B, H, Sk] masked for every query, without
    an S×S mask: the fused kernel takes the causal pattern itself and the masked keys as one additive row
    (−∞), and the statistics come from its log-sum-exp by the transposed route. The same semantics as
    mask_keys: a query row whose every visible key is masked — rows below a head's first unmasked key, in
    causal attention — keeps its own unmasked row (recomputed on that short prefix). None where the fused
    CPU kernel would not run (then the caller builds the full mask). Where the kernel's lse is not trusted
    (trusted_lse), the output stands and the statistics recompute the softmax under the full mask.

    This runs in every layer of a masked forward, so its bookkeeping is kept to a few tensor operations: each
    costs microseconds, tens of them a measurable share of a layer's attention."""
    batch, heads, n_queries, _ = q.shape
    n_keys = key.shape[-2]
    if n_queries != n_keys:
        return None
    bias = q.new_zeros(batch, heads, 1, n_keys).masked_fill_(key_mask[:, :, None, :], float("-inf"))
    fused = sdpa_with_lse(q, key, value, bias, 0.0, True, scale, enable_gqa, {})
    if fused is None:  # the caller's full-mask route then runs the call
        return None
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    first_live = key_mask.view(torch.uint8).argmin(-1)  # [B, H]: rows before it have only masked keys to see
    lowest, highest = (int(bound) for bound in first_live.aminmax())
    output, lse = fused
    dead = None
    if highest:
        output, lse, dead = _restore_dead_rows(q, key, value, output, lse, first_live, highest, lowest == highest,
                                               scale, enable_gqa)
    if trusted_lse(lse, q.shape[-1]) is None:  # the output stands; the statistics recompute the softmax
        return output, attention_statistics(q, key, mask_keys(None, True, key_mask, n_queries), False, scale,
                                            want_last_row=True)
    return output, _masked_causal_statistics(q, key, key_mask, lse, scale, highest, dead)


def _masked_causal_statistics(q, key, key_mask: torch.Tensor, lse: torch.Tensor, scale: float, highest: int,
                              dead: torch.Tensor | None) -> AttentionStats:
    """masked_causal_route's statistics from the fused call's lse: the live rows by the transposed route, then the
    dead rows' (the `highest` rows before a head's first unmasked key; `dead` [B, H, rows], None: in every head)."""
    # Live rows by the transposed route without the mask (a masked key's column is zeroed after); a dead row's lse
    # set to +∞ leaves it out. (Starting the blocks after the dead rows instead was slower: blocks whose key
    # counts are not multiples of 64 slow the matmul more than the rows saved.)
    live_lse = lse
    if highest:
        live_lse = lse.clone()
        if dead is None:
            live_lse[:, :, :highest] = float("inf")
        else:
            live_lse[:, :, :highest].masked_fill_(dead, float("inf"))
    stats = _statistics_by_transposed_lse(q, key, None, True, scale, live_lse, True)
    stats.scores.masked_fill_(key_mask, 0.0)
    stats.last_row.masked_fill_(key_mask, 0.0)
    stats.key_valid = (~key_mask).any(1)
    if highest:  # the dead rows see the masked keys before their head's first unmasked one
        stats.scores[..., :highest] += _causal_column_sums(q[:, :, :highest], key[:, :, :highest],
                                                           lse[:, :, :highest], scale, dead)
        # a key before a head's first unmasked one is seen by that head's dead rows
        stats.key_valid[:, :highest] |= True if dead is None else dead.any(1)
    return stats


def _restore_dead_rows(q, key, value, output, lse, first_live: torch.Tensor, rows: int, uniform: bool, scale: float,
                       enable_gqa: bool):
    """(output, lse, dead [B, H, rows] bool, or None when uniform): the rows before each head's first unmasked key
    (rows: the latest of them; uniform: the same in every head), which the masked call left with nothing to attend
    to, replaced by their own unmasked rows from a causal call on that prefix."""
    prefix_output, prefix_lse = sdpa_with_lse(q[:, :, :rows], key[:, :, :rows], value[:, :, :rows], None, 0.0, True,
                                              scale, enable_gqa, {})
    if output.requires_grad or lse.requires_grad:  # the kernel's backward keeps its own output and lse: not in place
        output, lse = output.clone(), lse.clone()
    if uniform:
        output[:, :, :rows] = prefix_output
        lse[:, :, :rows] = prefix_lse
        return output, lse, None
    dead = torch.arange(rows, device=q.device)[None, None, :] < first_live[:, :, None]
    output[:, :, :rows] = torch.where(dead[..., None], prefix_output, output[:, :, :rows])
    lse[:, :, :rows] = torch.where(dead, prefix_lse, lse[:, :, :rows])
    return output, lse, dead


def _causal_column_sums(q: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, scale: float,
                        rows_kept: torch.Tensor | None = None) -> torch.Tensor:
    """[B, H, Sk] float32: Σ_i exp(scale·q_i·k_j − lse_i) over the causal pairs of a short square call (a few
    rows: one matmul), over the rows where rows_kept [B, H, Sq] (bool) is True when given. A row left out is
    zeroed, not multiplied by 0: its lse may belong to another call (a live row's masked lse), where its exp
    overflows to +∞ and ∞·0 would be NaN."""
    rows = q.shape[-2]
    logits = torch.baddbmm(lse.float().reshape(-1, rows, 1).neg(), q.float().reshape(-1, rows, q.shape[-1]),
                           repeat_heads(key, q.shape[1]).float().reshape(-1, rows, key.shape[-1]).mT, alpha=scale)
    probs = logits.exp_().tril_().view(q.shape[:-1] + (rows,))
    return (probs if rows_kept is None else probs.masked_fill_(~rows_kept[..., None], 0.0)).sum(-2)
