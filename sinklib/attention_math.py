"""Attention probabilities recomputed from the exact arguments a model passes to SDPA, reduced at the
source: float32, one query chunk at a time, so at most one chunk × keys block exists per head."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from sinklib.validation import BadValue

# The memory budget of one query chunk, in float32 (query, key) pairs: a GPU wants few large launches (16 MB);
# a CPU wants the chunk to stay in cache (2 MB: fastest of 1–16 MB at head dims 32 and 64, S 512–2048, measured).
DEFAULT_CHUNK_ELEMENTS = 1 << 22
CPU_CHUNK_ELEMENTS = 1 << 19
# Below this many (query, key) pairs per non-causal call, one exp(q·kᵀ − lse) block in cache beats a second fused
# call; above it, the fused call's blockwise pass wins (measured on 2 CPU cores, head dims 32 and 64: crossover at
# S ≈ 300–500 with 8–9 heads; benchmarks/capture_routes.py). Causal calls use the kernel's lse at any size (by
# blocks of rows below, else the fused call).
TRANSPOSED_ROUTE_MIN_ELEMENTS = 1 << 21
# For causal calls from this many query rows and this head size, the column sums Σ_i exp(q_i·k_j·scale − lse_i)
# are cheaper as blocks of 64 rows — q·kᵀ − lse, exp and one row sum per block, in cache, the causal half only —
# than as the second fused call, which also multiplies by its values. Measured on 2 CPU cores: head dim 64
# (SmolLM2's 9 heads over 3 KV heads) 1.2–1.7× faster at S = 128–512 and 1.3–1.5× at 1024–2048, within 1–15 % of
# the bare q·kᵀ, exp and column sum; head dim 128 (32 heads over 8) 2×; head dim 32 1.1–1.6× faster up to
# S = 384 but no faster at 512, so it keeps the fused call.
BLOCKWISE_ROUTE_MIN_QUERIES = 128
BLOCKWISE_ROUTE_MIN_HEAD_DIM = 64
BLOCKWISE_ROWS = 64
# A decoding row (one query, no mask) may leave its statistics to the end of its step, where the rows of every
# layer take one batched matmul and softmax instead of one each: SmolLM2's 30 layers at 100 keys cost 0.24 ms a step
# that way against 1.1 ms (2 CPU cores). Each row's keys are copied to wait, so only rows with at most this many
# key elements do (SmolLM2: 3 KV heads × 64 dims × ≤ 682 keys; at most 512 KB a layer waits); measured, batching
# still gains at 800 keys and loses at 1600, where the copy outgrows the per-call overhead it saves.
DEFERRED_ROW_MAX_KEY_ELEMENTS = 1 << 17
# The largest log-sum-exp of the fused kernel taken as it is at head dims above 64 (see trusted_lse).
LSE_TRUSTED_MAX = 24.0


@dataclass
class AttentionStats:
    """What attention_statistics gathers from one attention call: each key's score (sum units: the column sum
    over query rows), the query rows and keys that took part, and optionally kept maps and the last query row."""

    scores: torch.Tensor  # [B, H, Sk] float32: Σ over (weighted) query rows of A_ij
    query_count: torch.Tensor  # [B] float32: query rows that attended to something (weighted)
    key_valid: torch.Tensor  # [B, Sk] bool: keys that at least one query may attend to
    maps: dict[int, torch.Tensor] = field(default_factory=dict)  # head → [B, Sq, Sk]
    last_row: torch.Tensor | None = None  # [B, H, Sk]: the last query's attention row


def as_4d(mask: torch.Tensor) -> torch.Tensor:
    """The mask with leading singleton dimensions added until it has four ([Sq, Sk] → [1, 1, Sq, Sk])."""
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
    """k [B, Hk, S, D] with each KV head repeated for the n_heads // Hk query heads that share it ([B, H, S, D],
    the order transformers' repeat_kv gives); k itself when it already has n_heads heads."""
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
    lse: torch.Tensor | None = None,
) -> AttentionStats:
    """Scores s_j = Σ_i A_ij of softmax(q kᵀ·scale + mask) for q [B,H,Sq,D], k [B,Hk,Sk,D] (Hk divides H).

    lse: optional [B, H, Sq] log-sum-exp of each row, as the fused kernel that computed the output returned it;
    then A_ij = exp(logit_ij − lse_i) and the softmax's max and sum passes are not repeated (unless
    trusted_lse declines it: then the softmax is recomputed).

    Fully masked query rows contribute nothing. query_weight: optional [B, Sq] weights (0 drops a row,
    e.g. left padding). map_heads: heads whose full [B, Sq, Sk] map is kept.
    """
    batch, heads, n_queries, head_dim = q.shape
    n_keys, mask = k.shape[-2], as_4d(attn_mask) if attn_mask is not None else None
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    lse = trusted_lse(lse, head_dim)
    if n_queries == 1 and lse is None and query_weight is None and not is_causal:
        return _single_row_statistics(q, k, mask, scale, map_heads)
    if lse is not None and not map_heads and query_weight is None and chunk_size is None and _transposable(mask, is_causal, q, k):
        return _statistics_by_transposed_lse(q, k, mask, is_causal, scale, lse, want_last_row)
    chunk_size = chunk_size or _rows_per_chunk(q, n_keys)
    if lse is not None and mask is None and not is_causal and not map_heads and query_weight is None \
            and 0 < n_queries <= chunk_size:
        return _one_block_statistics(q, k, scale, lse, want_last_row)
    logits_of = _chunk_logits(q, k, scale)
    # The kernel's lse rides on the matmul (one pass less over each chunk) unless an additive mask must be added
    # before it: a bool mask only sets −∞, which is the same before or after.
    lse_in_matmul = lse is not None and (mask is None or mask.dtype == torch.bool)
    totals = _Totals(batch, heads, n_queries, n_keys, map_heads, q.device)
    probs = None
    for start in range(0, n_queries, chunk_size):
        stop = min(start + chunk_size, n_queries)
        rows_lse = None if lse is None else lse[:, :, start:stop]
        logits = logits_of(start, stop, rows_lse if lse_in_matmul else None)
        part, allowed = _apply_masks(logits, mask, is_causal, n_queries, start, stop)
        probs = _probabilities(logits, None if lse_in_matmul else rows_lse, part, allowed, lse_subtracted=lse_in_matmul)
        totals.add(probs, allowed, None if query_weight is None else query_weight[:, start:stop].float(), start, stop)
    last_row = probs[:, :, -1].clone() if (want_last_row and probs is not None) else None
    return AttentionStats(totals.scores, totals.query_count, totals.key_valid, totals.maps, last_row)


def _one_block_statistics(q: torch.Tensor, k: torch.Tensor, scale: float, lse: torch.Tensor,
                          want_last_row: bool) -> AttentionStats:
    """A call with no mask whose rows fit one chunk, given the kernel's lse (the zoo's bidirectional layers): the
    chunked route's sums — exp(q·kᵀ·scale − lse) over every pair, summed over the rows — without its
    bookkeeping, since every row and key takes part. The same bits; the bookkeeping cost a tenth of the
    statistics on these small calls (measured: 8 heads, S = 256, head dim 32)."""
    batch, _, n_queries, _ = q.shape
    probs = _chunk_logits(q, k, scale)(0, n_queries, lse).exp_()
    _, true = _unit_tensors(q.device)
    last_row = probs[:, :, -1].clone() if want_last_row else None
    query_count = torch.full((batch,), float(n_queries), dtype=torch.float32, device=q.device)
    return AttentionStats(probs.sum(-2), query_count, true.expand(batch, k.shape[-2]), {}, last_row)


def trusted_lse(lse: torch.Tensor | None, head_dim: int) -> torch.Tensor | None:
    """The fused kernel's lse where it keeps the scores within 1e-5 of float64, else None. Its float32 lse is off
    by about 4e-7 × lse (measured, every head dim), and exp passes that error to every probability of the row:
    at head dim 128 the scores left 1e-5 from lse ≈ 32 (measured 9.9e-6 at 31.9, 1.2e-5 at 44), while at head
    dim ≤ 64 they stayed within 8e-6 up to lse 230. So above LSE_TRUSTED_MAX, for head dims above 64, the
    statistics recompute the softmax themselves (one max and one sum pass more). The bound is on the scores (sums
    over rows, measured relative to 1 + |s|): a single row's probabilities, as last_row keeps them, are not
    averaged over rows, and at head dim 64 measured 1.2e-5 to 3.3e-5 off float64 at lse 90 to 195 (logits far
    beyond what a trained model's rows reach)."""
    if lse is None or head_dim <= 64 or lse.numel() == 0:
        return lse
    return lse if float(lse.float().masked_fill(lse == float("inf"), 0).max()) <= LSE_TRUSTED_MAX else None


def _single_row_statistics(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float,
                           map_heads: tuple[int, ...]) -> AttentionStats:
    """One query row (a decoding step): its softmax is its scores. The same sums as the chunked route, without
    its bookkeeping, which costs more than the row itself on every layer of every decoding step."""
    batch, heads, _, dim = q.shape
    if mask is None and not map_heads and k.shape[0] == batch and not (q.is_cuda and q.dtype == torch.bfloat16):
        kv_heads = k.shape[1]
        rows = (q.float() * scale).reshape(batch * kv_heads, heads // kv_heads, dim)
        scores = _rows_softmax(rows, k.float().reshape(batch * kv_heads, k.shape[-2], dim)).view(batch, heads, -1)
        one, true = _unit_tensors(q.device)
        return AttentionStats(scores, one.expand(batch), true.expand(batch, k.shape[-2]), {}, scores)
    logits = _chunk_logits(q, k, scale)(0, 1)
    part, allowed = _apply_masks(logits, mask, False, 1, 0, 1)
    probs = _probabilities(logits, None, part, allowed)
    scores = probs[:, :, 0]
    if allowed is None:
        query_count = torch.ones(batch, device=q.device)
        key_valid = torch.ones(batch, k.shape[-2], dtype=torch.bool, device=q.device)
    else:
        query_count = allowed.any(-1).any(1).expand(batch, 1)[:, 0].float()
        key_valid = allowed.any(-2).any(1).expand(batch, k.shape[-2])
    maps = {h: probs[:, h].clone() for h in map_heads}
    return AttentionStats(scores, query_count, key_valid, maps, scores)


def deferrable_row(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> bool:
    """Whether a call is a decoding row whose scores may wait for the end of its step (DecodingRows): one query,
    no mask, the float32 route, one key set per batch row, and keys small enough that copying them costs less
    than it saves."""
    return (q.shape[-2] == 1 and attn_mask is None and not is_causal and k.shape[0] == q.shape[0]
            and q.shape[1] % k.shape[1] == 0 and k.numel() <= DEFERRED_ROW_MAX_KEY_ELEMENTS
            and not (q.is_cuda and q.dtype == torch.bfloat16))


def _rows_softmax(rows_scaled: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """softmax(rows · keysᵀ) for rows [N, G, D] (scaled query rows of the G heads sharing a KV head) against keys
    [N, Sk, D]: the products and their order are _chunk_logits's grouped rows', so a decoding row has the bits the
    general route gives it, alone or batched with others. bmm directly: the kernel torch.matmul would call on
    these shapes, without its broadcasting work on the per-layer path."""
    return torch.bmm(rows_scaled, keys.mT).softmax(-1)


class DecodingRows:
    """Decoding rows of one shape (q [B, H, 1, D], k [B, Hk, Sk, D]) copied as their calls run, while their tensors
    are in cache, and scored together — one batched matmul and softmax — when their step ends. Copies, not
    references: what the model does with its tensors after the call cannot reach the scores. (Each copy is a fresh
    tensor: copying into one long-lived buffer measured 2–3× slower inside a real decoding step, whose weights push
    the buffer out of cache between layers.)"""

    def __init__(self) -> None:
        self.queries: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []

    def add(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Copy one call's query row and keys (as float32)."""
        self.queries.append(q.float().clone() if q.dtype == torch.float32 else q.float())
        self.keys.append(k.float().clone() if k.dtype == torch.float32 else k.float())

    def scores(self, scale: float) -> torch.Tensor:
        """[N, B, H, Sk] float32: each added row's softmax, in the order added."""
        batch, heads, _, dim = self.queries[0].shape
        kv_heads, n_keys = self.keys[0].shape[1], self.keys[0].shape[-2]
        rows = torch.stack(self.queries).mul_(scale).view(-1, heads // kv_heads, dim)
        keys = torch.stack(self.keys).view(-1, n_keys, dim)
        return _rows_softmax(rows, keys).view(len(self.queries), batch, heads, n_keys)


@functools.lru_cache(maxsize=None)
def _unit_tensors(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 1 and a bool True on `device`, made once: a decoding row's query count and valid keys are views of
    them (expand: no allocation on the per-layer path, and an in-place write to them raises instead of spreading)."""
    return torch.ones(1, device=device), torch.ones(1, dtype=torch.bool, device=device)


def _rows_per_chunk(q: torch.Tensor, n_keys: int) -> int:
    """Query rows per chunk: the device's memory budget over the [B, H, ·, Sk] block one row takes."""
    budget = CPU_CHUNK_ELEMENTS if q.device.type == "cpu" else DEFAULT_CHUNK_ELEMENTS
    return max(1, budget // max(1, q.shape[0] * q.shape[1] * n_keys))


def _transposable(mask: torch.Tensor | None, is_causal: bool, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the column sums should come from a second fused call (see _statistics_by_transposed_lse): a mask
    that is the same for every query, a causal pattern only when square, and — without one — a call large enough
    to gain from it. A causal call always gains: the fused kernel skips the pairs the pattern hides, where the
    one-block route computes every pair and then masks half of them (measured: 1.3–2.3× faster at S 64–512)."""
    large = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] > TRANSPOSED_ROUTE_MIN_ELEMENTS
    if is_causal:
        return mask is None and q.shape[-2] == k.shape[-2]
    return large and (mask is None or mask.shape[-2] == 1)


def _probabilities(logits: torch.Tensor, lse: torch.Tensor | None, part: torch.Tensor | None,
                   allowed: torch.Tensor | None, *, lse_subtracted: bool = False) -> torch.Tensor:
    """The chunk's attention probabilities (in place of its masked logits): a softmax, exp(logit − lse), or —
    lse_subtracted, the logits already less their row's lse — their exp."""
    if lse_subtracted:
        probs = logits.exp_()
    else:
        probs = torch.softmax(logits, dim=-1) if lse is None else logits.sub_(lse[..., None].float()).exp_()
    if part is not None:
        probs.nan_to_num_(0.0)  # a fully masked row (bool or −inf mask) attends to nothing
        if part.dtype != torch.bool:  # a row masked with finfo.min softmaxes to uniform: drop it too
            probs.masked_fill_(~allowed.any(-1, keepdim=True), 0.0)
    return probs


def _chunk_logits(q: torch.Tensor, k: torch.Tensor, scale: float):
    """A function (start, stop, lse=None) → float32 logits [B, H, stop − start, Sk] of those query rows; given
    their lse [B, H, stop − start], the logits less each row's lse, added in the same matmul (baddbmm).

    Grouped KV heads are not copied: the query rows of the heads that share a KV head are stacked into one
    matrix against that head's keys (heads h = kv·G + g, the order transformers' repeat_kv gives).
    A bf16 model on a GPU: every bf16 value is exact in TF32, so q·kᵀ in TF32 forms each product exactly and
    accumulates in fp32 — an fp32 result at tensor-core speed — provided the scale is applied afterwards
    (q·scale would no longer be a bf16 value). Elsewhere scale the small [Sq, D] side, not the logits."""
    batch, heads, _, dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[-2]
    groups = heads // kv_heads
    # [B·Hk, D, Sk], made once per call (torch.matmul would make it again for every chunk): a view of the model's
    # keys where their layout allows, else the copy matmul makes, so the products keep matmul's bits
    keys_t = k.float().transpose(-1, -2).expand(batch, -1, -1, -1).reshape(batch * kv_heads, dim, n_keys)
    tf32 = q.is_cuda and q.dtype == torch.bfloat16 and k.dtype == torch.bfloat16
    q_scaled = (q.float() if tf32 else q.float() * scale).reshape(batch, kv_heads, groups, -1, dim)

    def logits(start: int, stop: int, lse: torch.Tensor | None = None) -> torch.Tensor:
        rows = q_scaled[:, :, :, start:stop].reshape(batch * kv_heads, groups * (stop - start), dim)
        if tf32:
            with _tf32_matmul():
                products = torch.bmm(rows, keys_t).mul_(scale)
            return products.view(batch, heads, stop - start, n_keys) if lse is None else \
                products.sub_(lse.float().reshape(batch * kv_heads, -1, 1)).view(batch, heads, stop - start, n_keys)
        if lse is None:
            return torch.bmm(rows, keys_t).view(batch, heads, stop - start, n_keys)
        row_bias = lse.float().reshape(batch * kv_heads, groups * (stop - start), 1).neg().expand(-1, -1, n_keys)
        return torch.baddbmm(row_bias, rows, keys_t).view(batch, heads, stop - start, n_keys)
    return logits


def _apply_masks(logits: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, n_queries: int, start: int, stop: int):
    """Mask the chunk's logits in place; returns (the mask's rows for the chunk, allowed [.., chunk, Sk] or None)."""
    part = allowed = None
    if mask is not None:
        part = mask if mask.shape[-2] == 1 else mask[..., start:stop, :]
        if part.dtype == torch.bool:
            logits.masked_fill_(~part, float("-inf"))
        else:
            logits.add_(part.float())
        allowed = allowed_from_mask(part)
    if is_causal:
        causal = causal_allowed(n_queries, logits.shape[-1], logits.device, start, stop)
        logits.masked_fill_(~causal, float("-inf"))
        allowed = causal[None, None] if allowed is None else allowed & causal
    return part, allowed


class _Totals:
    """Running sums over query chunks: scores [B, H, Sk], live query rows [B], valid keys [B, Sk], kept maps."""

    def __init__(self, batch: int, heads: int, n_queries: int, n_keys: int, map_heads: tuple[int, ...], device) -> None:
        self.scores = torch.zeros(batch, heads, n_keys, dtype=torch.float32, device=device)
        self.query_count = torch.zeros(batch, dtype=torch.float32, device=device)
        self.key_valid = torch.zeros(batch, n_keys, dtype=torch.bool, device=device)
        self.maps = {h: torch.empty(batch, n_queries, n_keys, dtype=torch.float32, device=device) for h in map_heads}

    def add(self, probs: torch.Tensor, allowed: torch.Tensor | None, weight: torch.Tensor | None, start: int, stop: int) -> None:
        batch = self.scores.shape[0]
        if allowed is None:
            row_live = torch.ones(batch, stop - start, device=probs.device)
            self.key_valid.fill_(True)
        else:
            row_live = allowed.any(-1).any(1).expand(batch, stop - start).float()  # [B, chunk]
            self.key_valid |= allowed.any(-2).any(1).expand(batch, self.key_valid.shape[-1])
        if weight is not None:
            probs.mul_(weight[:, None, :, None])
            row_live = row_live * weight
        self.scores += probs.sum(-2)
        self.query_count += row_live.sum(-1)
        for h in self.maps:
            self.maps[h][:, start:stop] = probs[:, h]


class _tf32_matmul:
    """Allow TF32 in CUDA matmuls for the block, restoring the caller's setting after."""

    def __enter__(self):
        self.before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.before


def _statistics_by_transposed_lse(q, k, mask, is_causal: bool, scale: float, lse: torch.Tensor,
                                  want_last_row: bool) -> AttentionStats:
    """Column sums from the kernel's log-sum-exp instead of an S×S recompute: by blocks of rows for a long causal
    call with head dim ≥ 64 (_column_sums_by_blocks), else from a second fused call.

    s_j = Σ_i exp(scale·q_i·k_j − lse_i) is, read the other way, the exp of the log-sum-exp of an attention whose
    queries are the keys k_j and whose keys are the queries q_i, each with the additive bias −lse_i: a mask that is
    the same for every row, so the fused kernel runs blockwise in cache and returns that log-sum-exp. Causal
    attention (key j is seen by queries i ≥ j) becomes causal again with both sequences reversed. A key-only mask
    (the same row for every query) adds its bias b_j to key j's log-sum-exp (−∞ and transformers' finfo.min: the
    key gets 0)."""
    batch, heads, n_queries, _ = q.shape
    n_keys = k.shape[-2]
    queries = q.float()
    blockwise = is_causal and n_queries >= BLOCKWISE_ROUTE_MIN_QUERIES and q.shape[-1] >= BLOCKWISE_ROUTE_MIN_HEAD_DIM
    sums = _column_sums_by_blocks(q, k, lse, scale) if blockwise else None
    keys = repeat_heads(k, heads).float() if sums is None else None  # the block route stacks grouped heads instead
    column_lse = _column_log_sum_exp(keys, queries, lse.float(), is_causal, scale) if sums is None else None
    if mask is None:
        scores = column_lse.exp() if sums is None else sums
        key_valid = torch.ones(batch, n_keys, dtype=torch.bool, device=q.device)
    else:  # a key's own bias (the same for every query) multiplies its column by exp(bias)
        allowed = allowed_from_mask(mask)[:, :, 0, :].expand(batch, heads, n_keys)
        bias = mask[:, :, 0, :].float() if mask.dtype != torch.bool else None
        if sums is None:
            column = (column_lse if bias is None else column_lse + bias).exp()
        else:
            column = sums if bias is None else sums * bias.exp()
        scores = torch.where(allowed, column, torch.zeros_like(column))
        key_valid = allowed.any(1)
    query_count = torch.full((batch,), float(n_queries), device=q.device)
    last_row = None
    if want_last_row:  # causal with as many queries as keys: the last row sees every key
        logits = torch.matmul(queries[:, :, -1:] * scale, keys.transpose(-1, -2)) if keys is not None \
            else _chunk_logits(q[:, :, -1:], k, scale)(0, 1)
        if mask is not None:
            logits = logits.masked_fill(~allowed_from_mask(mask)[:, :, -1:, :].expand_as(logits), float("-inf")) \
                if mask.dtype == torch.bool else logits + mask[:, :, -1:, :].float()
        last_row = logits.sub_(lse[:, :, -1:, None].float()).exp_()[:, :, 0]
    return AttentionStats(scores, query_count, key_valid, {}, last_row)


def _column_sums_by_blocks(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float) -> torch.Tensor | None:
    """[B, H, S] float32 for square causal attention: s_j = Σ_i exp(scale·q_i·k_j − lse_i), BLOCKWISE_ROWS query
    rows at a time, each block against the keys it may see, its diagonal block masked. A +∞ lse (a row left out)
    weighs 0; None where some lse is −∞ or NaN (a row with no keys): the fused route takes those. A hidden or
    masked key's exp may overflow to inf; tril_ here and the caller's torch.where zero it, and it is never
    multiplied into a kept value."""
    if not bool((lse > float("-inf")).all()):
        return None
    batch, heads, n_queries, dim = q.shape
    n_keys = k.shape[-2]
    if n_keys != n_queries:
        raise BadValue(f"the block route is for square causal attention; got {n_queries} queries, {n_keys} keys")
    # The model's query rows as they are (a view, no copy): the scale rides on the matmul (alpha), where scaling
    # them first would write and read all of q once more, measured 5–7 % of this route in SmolLM2's layers.
    rows = q.float().reshape(batch * heads, n_queries, dim)
    # Each head against its own copy of its KV head's keys: one copy per call, where stacking the rows of a KV
    # head's query heads would copy every block's rows.
    keys_t = repeat_heads(k, heads).float().reshape(batch * heads, n_keys, dim).mT
    neg_lse = lse.float().reshape(batch * heads, n_queries, 1).neg()
    sums = torch.zeros(batch * heads, n_keys, dtype=torch.float32, device=q.device)
    for start in range(0, n_queries, BLOCKWISE_ROWS):
        stop = min(start + BLOCKWISE_ROWS, n_queries)
        # scale·q·kᵀ − lse in one matmul (baddbmm adds the −lse it starts from) before the exp: every visible pair's
        # probability is ≤ 1 (no overflow at any logit size), and the column sum is a plain sum — a weighted one
        # (exp(−lse) as a row vector times the block) runs as a matrix-vector product per head, 2× slower here
        row_bias = neg_lse[:, start:stop].expand(batch * heads, stop - start, stop)
        block = torch.baddbmm(row_bias, rows[:, start:stop], keys_t[..., :stop], alpha=scale).exp_()
        block[:, :, start:stop].tril_()  # keys after each row are hidden from it (8× faster than masked_fill_)
        sums[:, :stop] += block.sum(-2)
    return sums.view(batch, heads, n_keys)


def _column_log_sum_exp(keys: torch.Tensor, queries: torch.Tensor, lse: torch.Tensor, is_causal: bool,
                        scale: float) -> torch.Tensor:
    """[B, H, Sk]: log Σ_i exp(scale·q_i·k_j − lse_i), from the fused kernel run with the keys as its queries."""
    bias = lse.neg()[:, :, None, :]  # [B, H, 1, Sq]: one row, broadcast over every key
    if is_causal:
        keys, queries, bias = keys.flip(-2), queries.flip(-2), bias.flip(-1)
    _, column_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        keys, queries, queries, 0.0, is_causal, attn_mask=bias.contiguous(), scale=scale)
    return column_lse.flip(-1) if is_causal else column_lse


def sdpa_with_lse(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, enable_gqa: bool, kwargs: dict):
    """(output, lse) from the fused CPU kernel that F.scaled_dot_product_attention itself would run for these
    arguments, so the output is the same bits; None where it would run another kernel, on other devices, and for
    16-bit inputs: the kernel's lse from bf16 inputs is off by up to ~4e-5 relative (measured), more than the 1e-5
    parity the scores keep, so those rows get a float32 softmax of their own."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if (query.device.type != "cpu" or dropout_p or kwargs or query.dtype != torch.float32 or heads % kv_heads
            or (kv_heads != heads and not enable_gqa)):
        return None
    # Grouped KV heads go to the kernel as they are, as SDPA's enable_gqa path sends them (the same bits, tested):
    # repeating them first would copy every layer's keys and values for nothing.
    choice = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if int(choice) != 1:  # FLASH_ATTENTION
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~attn_mask, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype != query.dtype:
        return None
    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                             attn_mask=attn_mask, scale=scale)
    return output, lse

