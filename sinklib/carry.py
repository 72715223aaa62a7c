"""What a sink carries: the value vectors of the keys it is made of, and its share of the head's output.

A head's output for query i is Σ_j A_ij · W_O^h v_j. A key that receives much attention (a sink) but whose value
vector is small adds little to any output — the "no-op" sink of real pretrained models — while a sink with a large
value is a key the head really reads. The norm-based view (Kobayashi et al., 2020) measures what each key adds:
its *output share* in a head is s_j · ‖W_O^h v_j‖ / Σ_k s_k · ‖W_O^h v_k‖, with s_j the key's score (Σ_i A_ij, the
capture's sum units) and W_O^h the columns of the output projection that head h writes through. It needs the
scores the capture keeps and a forward that reads the value vectors (one per step of a diffusion trace, one for an
autoregressive trace): nothing is recomputed from attention maps.

Value vectors are read with forward hooks on each block's value projection (`v_proj`; LLaDA / MMaDA `v_proj` in
the block) and its output projection's weight (`o_proj`; LLaDA / MMaDA `attn_out`). Grouped-query heads read the
value head they share (query head h → value head h // (heads / value heads)).

Layers are chosen as capture and the lens choose theirs: `names_filter` over the activation names
"blocks.{layer}.attn.values" (sinklib.activation_names); a layer left out is neither hooked nor read.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from sinklib.activation_names import VALUES, NamesFilter, select_layers
from sinklib.dynamics import comparable_scores, sink_mask
from sinklib.layers import attention_layers
from sinklib.trace import Trace
from sinklib.validation import BadValue

VALUE_PROJECTIONS = ("v_proj",)
OUTPUT_PROJECTIONS = ("o_proj", "attn_out")


def _projection(layer_module: nn.Module, block: nn.Module, names: Sequence[str]) -> nn.Linear:
    for owner in (layer_module, block):
        for name in names:
            found = getattr(owner, name, None)
            if isinstance(found, nn.Linear):
                return found
    raise BadValue(f"{type(layer_module).__name__} has no value / output projection named {list(names)}: "
                   "sinklib.carry reads Llama-style attention (v_proj with o_proj, or LLaDA's v_proj with attn_out)")


def _blocks(model: nn.Module, layer_names: Sequence[str] | None) -> list[tuple[nn.Module, nn.Module, int]]:
    """(attention module, its block, its query heads) per layer: the block is the attention module's parent."""
    modules = dict(model.named_modules())
    pairs = []
    for layer in attention_layers(model, layer_names):
        parent = layer.name.rsplit(".", 1)[0] if "." in layer.name else ""
        if layer.n_heads is None:
            raise BadValue(f"{layer.name} states no head count (config num_attention_heads or n_heads): "
                           "sinklib.carry cannot split its values by head")
        pairs.append((layer.module, modules.get(parent, layer.module), layer.n_heads))
    return pairs


def _chosen_blocks(loaded, names_filter: NamesFilter) -> tuple[list[int], list[tuple[nn.Module, nn.Module, int]]]:
    """(the layers names_filter keeps, their _blocks entries); a filter that keeps none is refused."""
    pairs = _blocks(loaded.model, getattr(loaded, "layer_names", None))
    layers = select_layers(names_filter, len(pairs), VALUES)
    return layers, [pairs[layer] for layer in layers]


@torch.no_grad()
def value_norms(loaded, tokens: torch.Tensor, names_filter: NamesFilter = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖v_j‖, ‖W_O^h v_j‖), each float32 [layers, heads, seq], for one sequence of token ids [seq]: what each key
    would add to head h's output per unit of attention, before and after the output projection. names_filter: the
    layers, by activation name "blocks.{layer}.attn.values" (None: all; sinklib.activation_names), kept in order."""
    _, pairs = _chosen_blocks(loaded, names_filter)
    seen: list[torch.Tensor] = []
    hooks = [_projection(attn, block, VALUE_PROJECTIONS).register_forward_hook(
        lambda module, args, out: seen.append(out[0].detach().float())) for attn, block, _ in pairs]
    try:
        loaded.logits(tokens[None].to(loaded.device))
    finally:
        for hook in hooks:
            hook.remove()
    raw, written = [], []
    for (attn, block, heads), values in zip(pairs, seen):
        out_weight = _projection(attn, block, OUTPUT_PROJECTIONS).weight.detach().float()  # [d_model, heads × dim]
        head_dim = out_weight.shape[1] // heads
        per_value_head = values.view(values.shape[0], -1, head_dim)  # [seq, value heads, dim]
        per_head = per_value_head.repeat_interleave(heads // per_value_head.shape[1], dim=1)  # [seq, heads, dim]
        raw.append(per_head.norm(dim=-1).T)
        blocks = out_weight.view(out_weight.shape[0], heads, head_dim)  # W_O^h: [d_model, heads, dim]
        written.append(torch.einsum("mhd,shd->hsm", blocks, per_head).norm(dim=-1))
    return torch.stack(raw).cpu(), torch.stack(written).cpu()


def output_share(scores: torch.Tensor, output_norms: torch.Tensor) -> torch.Tensor:
    """[..., keys] each key's share of its head's output, s_j‖W_O v_j‖ / Σ_k s_k‖W_O v_k‖ (NaN scores: keys that
    do not exist at that step, given share NaN). Scale-free in the scores: sum units or a single row alike."""
    valid = ~torch.isnan(scores)
    mass = torch.where(valid, scores, torch.zeros_like(scores)) * output_norms
    share = mass / mass.sum(-1, keepdim=True).clamp(min=torch.finfo(mass.dtype).tiny)
    return torch.where(valid, share, torch.full_like(share, float("nan")))


def _step_values(loaded, trace: Trace, steps: Sequence[int],
                 names_filter: NamesFilter = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The value norms each step's keys had: one forward per step on its canvas (a causal model's keys keep their
    values as the sequence grows, so one forward over the final sequence serves every step)."""
    if trace.is_autoregressive:  # the sequence as the last forward saw it: every key any step had
        final = value_norms(loaded, loaded.family.replay_canvas(trace.tokens[-1], trace.is_masked[-1]), names_filter)
        return {step: final for step in steps}
    return {step: value_norms(loaded, loaded.family.replay_canvas(trace.tokens[step], trace.is_masked[step]),
                              names_filter) for step in steps}


def _chosen_steps(trace: Trace, steps: Sequence[int] | None) -> list[int]:
    """The steps sink_carry reads: every step (None) or the distinct ones listed, each a step of the trace."""
    chosen = list(range(trace.n_steps)) if steps is None else list(dict.fromkeys(steps))
    outside = [step for step in chosen if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < trace.n_steps]
    if not chosen or outside:
        raise BadValue(f"steps={steps!r} is not allowed: steps must be None or a non-empty list of step indices in "
                       f"0..{trace.n_steps - 1} (this trace's forwards)")
    return chosen


def sink_carry(loaded, trace: Trace, eps: float = 3.0, steps: Sequence[int] | None = None,
               names_filter: NamesFilter = None) -> pd.DataFrame:
    """One row per (step, layer, head): the greatest key (top score) — its position, whether it is an Eq. 3 sink,
    its score share (s_j / Σ s), its value norm and output norm against the median key's, and its output share
    (the norm-based view). `steps`: the steps to read (default every step; each costs one forward). names_filter:
    the layers, by activation name "blocks.{layer}.attn.values" (None: all; sinklib.activation_names); the `layer`
    column keeps the model's layer numbers."""
    scores = comparable_scores(trace)
    chosen = _chosen_steps(trace, steps)
    if len(trace.layer_names) != len(_blocks(loaded.model, getattr(loaded, "layer_names", None))):
        raise BadValue(f"trace={trace.meta.get('model')!r} is not allowed with model={getattr(loaded, 'name', '')!r}: "
                       f"its {len(trace.layer_names)} attention layers are not this model's")
    kept, _ = _chosen_blocks(loaded, names_filter)
    pick = slice(None) if names_filter is None else kept  # a view of every layer, as without a filter
    sinks = sink_mask(trace, eps)
    rows = []
    for step, (raw, written) in _step_values(loaded, trace, chosen, names_filter).items():
        step_scores = scores[step][pick]  # [layers, heads, keys]
        keys = min(step_scores.shape[-1], raw.shape[-1])
        step_scores, raw_k, written_k = step_scores[..., :keys], raw[..., :keys], written[..., :keys]
        valid = ~torch.isnan(step_scores)
        share = output_share(step_scores, written_k)
        top = torch.nan_to_num(step_scores, nan=float("-inf")).argmax(-1)[..., None]  # [layers, heads, 1]
        median_raw = _masked_median(raw_k, valid)
        median_written = _masked_median(written_k, valid)
        total = torch.where(valid, step_scores, torch.zeros_like(step_scores)).sum(-1)
        layers, heads = top.shape[:2]
        grid = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        rows.append(pd.DataFrame({
            "step": step, "layer": np.asarray(kept)[grid[0]].ravel(), "head": grid[1].ravel(),
            "position": top.squeeze(-1).numpy().ravel(),
            "is_sink": _at(sinks[step][pick][..., :keys], top).numpy().ravel(),
            "score_share": (_at(step_scores, top) / total).numpy().ravel(),
            "value_norm": _at(raw_k, top).numpy().ravel(), "median_value_norm": median_raw.numpy().ravel(),
            "output_norm": _at(written_k, top).numpy().ravel(), "median_output_norm": median_written.numpy().ravel(),
            "output_share": _at(share, top).numpy().ravel()}))
    frame = pd.concat(rows, ignore_index=True)
    frame["value_ratio"] = frame["value_norm"] / frame["median_value_norm"]
    frame["model"] = trace.meta.get("model", "")
    return frame


def _at(values: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """values [..., keys] at each head's greatest key (top [..., 1])."""
    return values.gather(-1, top).squeeze(-1)


def _masked_median(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The median over valid keys of [..., keys] (lower median, as torch.median)."""
    return torch.where(valid, values, torch.full_like(values, float("nan"))).nanmedian(-1).values


def carry_summary(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Per model, over the (step, layer, head)s whose greatest key is a sink: how many, the sinks' mean score share,
    the median of their value (and output) norm over the median key's (well below 1: a near no-op sink) and their
    mean output share."""
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.assign(output_ratio=frame["output_norm"] / frame["median_output_norm"])
    models = list(dict.fromkeys(frame["model"]))
    summary = frame[frame["is_sink"]].groupby("model", sort=False).agg(
        **{"sink heads": ("value_ratio", "size"), "score share": ("score_share", "mean"),
           "value / median key": ("value_ratio", "median"), "output norm / median key": ("output_ratio", "median"),
           "output share": ("output_share", "mean")})
    summary = summary.reindex(models)  # a model without any sink keeps its row: 0 sink heads, the rest NaN
    summary["sink heads"] = summary["sink heads"].fillna(0).astype(int)
    return summary
