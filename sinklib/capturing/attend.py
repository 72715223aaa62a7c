"""One attention call under a capture: run the model's own SDPA (with the intervention's keys masked, if any)
and, beside it, the statistics the capture keeps (attention_math). Outputs are bit-identical to the model's
own call when nothing is masked."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from sinklib.attention_math import AttentionStats, attention_statistics, sdpa_with_lse
from sinklib.key_masking import heads_left_without_keys, mask_keys, masked_causal_route
from sinklib.capturing.route import original_sdpa
from sinklib.layers import AttentionLayer
from sinklib.validation import BadValue


@dataclass
class AttentionCall:
    """What an intervention sees of one attention call, before it runs."""

    step: int
    layer: int
    layer_name: str
    batch: int
    heads: int
    n_queries: int
    n_keys: int
    device: torch.device
    _clean: Callable[[], AttentionStats]
    # each batch row's identity, a function of that row's prompt alone (Recorder.row_ids: sinklib.generate sets
    # it), so that a policy drawing at random draws for a problem what it draws for it batched any other way; None
    # under a bare sinklib.capture, whose rows are told apart by their index in the batch
    rows: tuple[int, ...] | None = None

    def clean_stats(self) -> AttentionStats:
        """Statistics of this call without any intervention (computed on first use, then cached)."""
        return self._clean()


@dataclass
class SdpaArgs:
    """The arguments the model passed to scaled_dot_product_attention, with the query in [B, heads, Sq, D]
    (`query` as the model gave it; `q` unpacked where transformers packed a GQA decoding query)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    kwargs: dict
    q: torch.Tensor = field(init=False)
    mask: torch.Tensor | None = field(init=False)
    packed: bool = field(init=False)

    def unpack(self, layer: AttentionLayer) -> "SdpaArgs":
        """Set q, mask and packed for `layer` (see unpack_single_query_gqa); returns self."""
        self.q, self.mask, self.packed = unpack_single_query_gqa(layer, self.query, self.key, self.attn_mask)
        return self

    def as_called(self, want_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output, lse or None): the model's own call, unchanged. The fused kernel's lse saves the statistics a
        softmax pass over many query rows; a single decoding row is cheaper to softmax again than to route.
        want_lse=False: the call exactly as the model made it, when nothing of it is to be recorded."""
        return self._sdpa(self.query, self.attn_mask, self.is_causal, self.enable_gqa,
                          fused=want_lse and not self.packed and self.q.shape[-2] > 1)

    def with_mask(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output in the model's layout, lse or None) with `mask` (bool or additive [B, H, Sq, Sk], the causal
        pattern folded in) in place of the model's mask."""
        sdpa_mask = mask.to(self.q.dtype) if mask.dtype != torch.bool else mask
        gqa = self.enable_gqa or self.key.shape[1] != self.q.shape[1]
        output, lse = self._sdpa(self.q, sdpa_mask, False, gqa, fused=True)
        if self.packed:
            output = output.reshape(*self.query.shape[:3], output.shape[-1])
        return output, lse

    def _sdpa(self, query, mask, is_causal: bool, gqa: bool, fused: bool):
        both = sdpa_with_lse(query, self.key, self.value, mask, self.dropout_p, is_causal, self.scale, gqa,
                             self.kwargs) if fused else None
        if both is not None:
            return both
        return original_sdpa(query, self.key, self.value, attn_mask=mask, dropout_p=self.dropout_p, is_causal=is_causal,
                             scale=self.scale, enable_gqa=gqa, **self.kwargs), None


def unmasked(args: SdpaArgs, map_heads: tuple[int, ...], stats_options: dict) -> tuple[torch.Tensor, AttentionStats]:
    """(output, stats) of the call as the model made it: the model's own SDPA and, beside it, its statistics
    (from the fused kernel's log-sum-exp where it gave one)."""
    output, lse = args.as_called()
    return output, attention_statistics(args.q, args.key, args.mask, args.is_causal, args.scale, map_heads=map_heads,
                                        want_last_row=True, lse=lse, **stats_options)


def attend(call: AttentionCall, args: SdpaArgs, intervention, map_heads: tuple[int, ...], stats_options: dict):
    """(output, stats, masked keys [B, H, Sk] bool, or None when none was masked) of one call: the intervention
    picks keys to mask, the call runs, and its statistics come from the attention as it ran."""
    ablation = intervention.values_to_ablate(call) if hasattr(intervention, "values_to_ablate") else None
    if ablation is not None:
        value_mask = checked_key_mask(ablation[0], call.batch, call.heads, call.n_keys, call.device)
        if bool(value_mask.any()):
            return _with_values_ablated(call, args, value_mask, ablation[1], map_heads, stats_options)
    key_mask = intervention.keys_to_mask(call)
    if key_mask is not None:
        key_mask = checked_key_mask(key_mask, call.batch, call.heads, call.n_keys, call.device)
    if key_mask is None or not bool(key_mask.any()):
        output, stats = unmasked(args, map_heads, stats_options)
        call._clean = lambda: stats  # nothing was masked: the call as it ran is the clean one
        return output, stats, None
    refuse_stranded_heads(call, args, key_mask, intervention)
    if _fits_masked_causal_route(call, args, map_heads, stats_options):
        routed = masked_causal_route(args.q, args.key, args.value, key_mask, args.scale, args.enable_gqa)
        if routed is not None:
            return routed[0], routed[1], key_mask
    masked = mask_keys(args.mask, args.is_causal, key_mask, call.n_queries)
    output, lse = args.with_mask(masked)
    stats = attention_statistics(args.q, args.key, masked, False, args.scale, map_heads=map_heads, want_last_row=True,
                                 lse=lse, **stats_options)
    return output, stats, key_mask


def _with_values_ablated(call: AttentionCall, args: SdpaArgs, value_mask: torch.Tensor, mode: str,
                         map_heads: tuple[int, ...], stats_options: dict):
    """(output, stats, None): the attention as the model computed it (the statistics are the clean ones), the
    output with the chosen keys' value vectors replaced per head — zeros, or the mean value over the keys some
    query may attend to. Grouped-query heads get their own copy of the value head they share."""
    _, stats = unmasked(args, map_heads, stats_options)
    call._clean = lambda: stats
    key, value = args.key, args.value
    heads = args.q.shape[1]
    if value.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    if mode == "zero":
        replacement = torch.zeros_like(value)
    else:
        valid = stats.key_valid.to(value.device)[:, None, :, None].to(value.dtype)
        replacement = ((value * valid).sum(-2, keepdim=True) / valid.sum(-2, keepdim=True).clamp(min=1)).expand_as(value)
    value = torch.where(value_mask[..., None], replacement, value)
    output = original_sdpa(args.q, key, value, attn_mask=args.mask, dropout_p=args.dropout_p, is_causal=args.is_causal,
                           scale=args.scale, **args.kwargs)
    if args.packed:
        output = output.reshape(*args.query.shape[:3], output.shape[-1])
    return output, stats, None


def _fits_masked_causal_route(call: AttentionCall, args: SdpaArgs, map_heads: tuple[int, ...], stats_options: dict) -> bool:
    """A square causal call with no mask of its own, nothing asked of it but column sums: masked without building
    an S×S mask (key_masking.masked_causal_route; faster at every length measured, 3× at S = 2048)."""
    return (args.attn_mask is None and args.is_causal and not args.packed and not map_heads
            and stats_options.get("query_weight") is None and stats_options.get("chunk_size") is None
            and call.n_queries == call.n_keys)


def refuse_stranded_heads(call: AttentionCall, args: SdpaArgs, key_mask: torch.Tensor, intervention) -> None:
    """Raise a ValueError naming the step, layer, batch and head when key_mask [B, H, Sk] would leave some head
    no key any query may attend to."""
    stranded = heads_left_without_keys(args.mask, args.is_causal, key_mask, call.n_queries)
    if bool(stranded.any()):
        b, h = (int(i) for i in stranded.nonzero()[0])
        raise BadValue(f"intervention={intervention!r} is not allowed here: at step {call.step}, {call.layer_name} "
                       f"(batch {b}, head {h}) it masks every key a query may attend to, which would leave "
                       "the softmax nothing; it must leave at least one key per head")


def clean_statistics(args: SdpaArgs, stats_options: dict) -> Callable[[], AttentionStats]:
    """A function giving the call's statistics without any intervention, computed on first use and cached."""
    cache: list[AttentionStats] = []

    def clean() -> AttentionStats:
        if not cache:
            cache.append(attention_statistics(args.q, args.key, args.mask, args.is_causal, args.scale,
                                              want_last_row=True, **stats_options))
        return cache[0]
    return clean


def unpack_single_query_gqa(layer: AttentionLayer, query, key, attn_mask):
    """transformers packs a single decoding query of a GQA model as [B, kv_heads, groups, D]; restore
    [B, heads, 1, D] so heads stay heads. Returns (query, mask, was_packed)."""
    heads = layer.n_heads
    if heads is None or query.shape[1] == heads or query.shape[1] != key.shape[1] or heads % query.shape[1]:
        return query, attn_mask, False
    groups = heads // query.shape[1]
    if query.shape[2] != groups:
        return query, attn_mask, False
    unpacked = query.reshape(query.shape[0], heads, 1, query.shape[-1])
    if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] == query.shape[1] and attn_mask.shape[2] == groups:
        attn_mask = attn_mask.reshape(attn_mask.shape[0], heads, 1, attn_mask.shape[-1])
    return unpacked, attn_mask, True


def checked_key_mask(key_mask: torch.Tensor, batch: int, heads: int, n_keys: int, device) -> torch.Tensor:
    """An intervention's key mask on `device`, broadcast to [B, H, Sk]; refused unless it is bool and broadcastable
    to that shape."""
    if key_mask.dtype != torch.bool:
        raise TypeError(f"an intervention returned a {key_mask.dtype} key mask; it must be bool [batch, heads, keys]")
    try:
        return key_mask.to(device).expand(batch, heads, n_keys)
    except RuntimeError:
        raise BadValue(f"an intervention returned a key mask of shape {tuple(key_mask.shape)}; expected "
                       f"[{batch}, {heads}, {n_keys}] (or broadcastable)") from None
