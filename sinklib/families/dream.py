"""Dream: masked diffusion initialised from an autoregressive model, as upstream `diffusion_generate` does it.

x = prompt + max_new_tokens masks; timesteps = linspace(1, final_time, steps + 1) (upstream calls final_time `eps`;
here eps is only ever the Eq. 3 sink threshold). Each step: one forward, logits
shifted right by one (position i is predicted from output i−1); temperature, top-p and top-k act on the
logits before the softmax (even at temperature 0, so they change confidences); confidence by `alg`:
maskgit_plus = max prob, topk_margin = top1 − top2, entropy = Σ p log p. int(mean masked · (1 − s/t))
positions are written per step (all the rest on the last), the most confident masked ones anywhere, or
sampled with alg_temp > 0. alg="origin" writes each masked token with probability 1 − s/t.
With left padding, padded positions neither attend nor are attended, and position ids skip them.

Block-wise (`block_length`, Fast-dLLM's Dream sampler): blocks of the answer in turn, each with steps / blocks
steps on its own schedule linspace(1, final_time, steps per block + 1); a block's first forward writes the block's
first position (predicted from the position before it, in full context), and each later step writes by `alg` among
the block's masks. `threshold` (with alg="maskgit_plus": confidence is the top probability, upstream's
"confidence_threshold") writes every masked position of the block at or above it, at least the most confident one,
until the block has no masks; `cache` ("prefix" / "dual") makes the block's later steps windows that reuse the
first forward's keys (families.cached).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from sinklib.validation import (Count, Index, NonNegative, Number, Share, Temperature, Threshold, bad_value, check_choice,
                                check_int, validated)
from sinklib.families.base import DiffusionFamily, FamilySettings, Forward, check_block_layout
from sinklib.families.cached import BlockCache, check_refresh, threshold_choice, threshold_margin
from sinklib.ties import argmax_margin, choice_margin, note_decisions

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# what each deterministic alg ranks positions by, for the decision margins (ties.confidence_margin)
CONFIDENCE_KIND = {"maskgit_plus": "probability", "topk_margin": "probability_gap", "entropy": "entropy"}


@validated
@dataclass(frozen=True)
class DreamSettings(FamilySettings):
    """Dream's sampler: `steps` forwards for `gen_length` new tokens, confidence by `alg`.

    Checked when made (check(), dataclasses.replace included). Build one with LoadedModel.settings_for(**overrides).

    Attributes:
        steps: forwards in all (with blocks: a multiple of the number of blocks, at least 2 a block without a
            threshold).
        gen_length: new tokens.
        temperature: sampling temperature of the logits, 0–100; 0 is greedy.
        alg: how confidence is measured: "origin", "maskgit_plus", "topk_margin" or "entropy".
        alg_temp: with alg_temp > 0, the positions to write are sampled by confidence; None or 0: the most confident.
        top_p: nucleus sampling's mass in (0, 1]; None: off.
        top_k: sample among the k likeliest tokens (k ≥ 1); None: off.
        final_time: where the schedule ends (upstream's `eps`): it runs from t = 1 down to this, in (0, 1).
        mask_id: the mask token's id (Dream's 151666; a model's own is filled in by LoadedModel).
        block_length: None: the whole answer at once (Dream's own sampler); else Fast-dLLM's blocks of this many
            tokens (gen_length a multiple of it).
        threshold: parallel decoding (with blocks and alg="maskgit_plus"): write every masked position of the block
            at least this confident; None: a fixed number per step.
        cache: "prefix" or "dual": reuse each block's first forward's keys (with blocks); None: none.
        refresh: with a cache, recompute it when a layer's greatest sink moves or its share changes by this much
            (a share in [0, 1]); None: never.
    """
    KEYED_WHEN_SET: ClassVar[tuple[str, ...]] = ("block_length", "threshold", "cache", "refresh")  # families.base.record
    steps: Count
    gen_length: Count
    temperature: Temperature = 0.0
    alg: str = "entropy"
    alg_temp: NonNegative | None = None
    top_p: Number | None = None
    top_k: Count | None = None
    final_time: Number = 1e-3  # upstream Dream's `eps`: the schedule runs from t = 1 down to this
    mask_id: Index = 151666
    block_length: Count | None = None  # None: the whole answer at once (Dream's own sampler); else Fast-dLLM's blocks
    threshold: Threshold | None = None  # parallel decoding (with blocks and alg="maskgit_plus")
    cache: Literal["prefix", "dual"] | None = None  # reuse each block's first forward's keys (with blocks)
    refresh: Share | None = None  # with a cache: refresh when a layer's greatest sink moves or its share by this much

    def check(self) -> None:
        """Refuse steps or gen_length below 1, an unknown alg, a negative temperature, top_p outside (0, 1], top_k
        below 1 or final_time outside (0, 1); with blocks, a gen_length that is not a multiple of block_length, steps
        that are not a multiple of the number of blocks or fewer than 2 a block (without a threshold) and
        alg="origin"; a threshold or cache without blocks, a threshold with an alg other than maskgit_plus and a
        refresh without a cache; run on construction (dataclasses.replace included)."""
        check_int(self.steps, "steps", 1)
        check_int(self.gen_length, "gen_length", 1)
        check_choice(self.alg, "alg", ALGS)
        if not self.temperature >= 0:
            raise bad_value("temperature", self.temperature, "a number >= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise bad_value("top_p", self.top_p, "None or a number in (0, 1]")
        if self.top_k is not None:
            check_int(self.top_k, "top_k", 1)
        if not 0 < self.final_time < 1:
            raise bad_value("final_time", self.final_time, "a number in (0, 1)")
        check_refresh(self.refresh, self.cache)
        if self.block_length is None:
            for name in ("threshold", "cache"):
                if getattr(self, name) is not None:
                    raise bad_value(name, getattr(self, name), "None without block_length (Dream's parallel and cached "
                                                               "decoding run block by block: set block_length)")
        else:
            self._check_blocks()

    def _check_blocks(self) -> None:
        blocks = check_block_layout(self.steps, self.gen_length, self.block_length)
        if self.threshold is None and self.block_length > 1 and self.steps // blocks < 2:
            raise bad_value("steps", self.steps, f"at least 2 a block ({2 * blocks}): a block's first step writes "
                                                 "only its first position")
        if self.alg == "origin":
            raise bad_value("alg", self.alg, "one of maskgit_plus, topk_margin, entropy with block_length (upstream's "
                                             "block-wise sampler ranks positions; origin writes at random)")
        if self.threshold is not None and self.alg != "maskgit_plus":
            raise bad_value("alg", self.alg, f"'maskgit_plus' with threshold={self.threshold} (the threshold compares "
                                             "each position's top probability, upstream's confidence_threshold)")


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """logits [..., V] divided by temperature (when > 0), then every token outside the top-p nucleus or the top-k
    set to the dtype's minimum, as upstream Dream does before its softmax."""
    if temperature > 0:
        logits = logits / temperature
    floor = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative > top_p
        drop[..., 1:] = drop[..., :-1].clone()  # keep the first token above the threshold
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), floor)
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = logits.masked_fill(logits < kth, floor)
    return logits


def sample_tokens(logits: torch.Tensor, settings: DreamSettings, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (confidence, token) per row of logits [N, V], by settings.alg."""
    probs = torch.softmax(filter_logits(logits, settings.temperature, settings.top_p, settings.top_k), dim=-1)
    if settings.temperature > 0:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        confidence = probs.gather(-1, tokens[:, None]).squeeze(-1)
    else:
        confidence, tokens = probs.max(dim=-1)
    if settings.alg == "topk_margin":
        top2 = probs.topk(2, dim=-1).values if probs.shape[-1] > 1 else torch.cat([probs, torch.zeros_like(probs)], -1)
        confidence = top2[:, 0] - top2[:, 1]
    elif settings.alg == "entropy":
        confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
    return confidence, tokens


def shift_right(logits: torch.Tensor) -> torch.Tensor:
    """Dream's output i predicts token i+1: align predictions with the positions they fill."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _step(x, logits, i, timesteps, last: bool, settings: DreamSettings, generator) -> torch.Tensor:
    """Step i of the schedule `timesteps` over x [B, W] (the canvas, or a block) with logits [B, W, V] aligned to
    it; `last`: the schedule's last step, which writes every mask left."""
    mask_index = x == settings.mask_id
    mask_logits = logits[mask_index]
    t, s = timesteps[i], timesteps[i + 1]
    x = x.clone()
    if settings.alg == "origin":  # random by design: no margin to note
        note_decisions(torch.full((x.shape[0],), float("nan")))
        p_transfer = 1.0 if last else float(1 - s / t)
        x0 = torch.full((mask_logits.shape[0],), settings.mask_id, dtype=torch.long, device=x.device)
        chosen = torch.rand(x0.shape, generator=generator, device=x.device) < p_transfer
        if chosen.any():
            x0[chosen] = sample_tokens(mask_logits[chosen], settings, generator)[1]
        x[mask_index] = x0
        return x
    confidence, x0 = sample_tokens(mask_logits, settings, generator)
    mean_masked = mask_index.sum() / mask_index.shape[0]
    count = int(mean_masked) if last else int(mean_masked * (1 - s / t))
    if count == 0:
        note_decisions(torch.full((x.shape[0],), float("inf")))
        return x
    full_confidence = torch.full(x.shape, float("-inf"), dtype=logits.dtype, device=x.device)
    full_confidence[mask_index] = confidence.to(logits.dtype)
    if settings.alg_temp:
        weights = torch.softmax(full_confidence / settings.alg_temp, dim=-1)
        transfer = torch.multinomial(weights, count, generator=generator)
    else:
        transfer = full_confidence.topk(count, dim=-1).indices
    candidate = torch.full_like(x, settings.mask_id)
    candidate[mask_index] = x0
    rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(transfer)
    x[rows, transfer] = candidate[rows, transfer]
    note_decisions(_margin(logits, full_confidence, rows, transfer, settings))
    return x


def _margin(logits, confidence, rows, transfer, settings: DreamSettings) -> torch.Tensor:
    """Per row: the smaller of the position choice's and the written tokens' argmax margins (NaN when sampled)."""
    if settings.temperature > 0 or settings.alg_temp:
        return torch.full((logits.shape[0],), float("nan"), dtype=torch.float64)
    chosen = torch.zeros(confidence.shape, dtype=torch.bool, device=confidence.device)
    chosen[rows, transfer] = True
    def sampler_filter(rows_logits: torch.Tensor) -> torch.Tensor:
        return filter_logits(rows_logits, settings.temperature, settings.top_p, settings.top_k)

    written = sampler_filter(logits[rows, transfer])
    position = choice_margin(confidence, chosen, logits, CONFIDENCE_KIND[settings.alg], sampler_filter)
    return torch.minimum(position, argmax_margin(written).amin(-1).cpu())


def sample(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, settings: DreamSettings,
           generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """forward(ids, attention_mask, position_ids) → logits [B, S, V] (both None without left padding). Returns the
    steps + 1 canvases [B, prompt + gen_length]: before the first step and after each one, mask_id where masked."""
    x = torch.nn.functional.pad(prompt_ids, (0, settings.gen_length), value=settings.mask_id)
    attention_mask = position_ids = None
    if prompt_mask is not None and not bool(prompt_mask.all()):
        attention_mask = torch.nn.functional.pad(prompt_mask, (0, settings.gen_length), value=1)
        position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    if settings.block_length is not None:
        return _blocks(forward, x, attention_mask, position_ids, prompt_ids.shape[1], settings, generator)
    timesteps = torch.linspace(1, settings.final_time, settings.steps + 1, device=x.device)
    canvases = [x.clone()]
    for i in range(settings.steps):
        logits = shift_right(forward(x, attention_mask, position_ids))
        x = _step(x, logits, i, timesteps, i == settings.steps - 1, settings, generator)
        canvases.append(x.clone())
    return canvases


def _blocks(forward: Forward, x, attention_mask, position_ids, prompt_len: int, settings: DreamSettings,
            generator) -> list[torch.Tensor]:
    """Fast-dLLM's block-wise Dream sampler (its generation_utils_block.py), block after block (_block)."""
    canvases = [x.clone()]
    steps_per_block = settings.steps // (settings.gen_length // settings.block_length)
    timesteps = torch.linspace(1, settings.final_time, steps_per_block + 1, device=x.device)
    for start in range(prompt_len, x.shape[1], settings.block_length):
        x = _block(forward, x, attention_mask, position_ids, start, timesteps, settings, generator, canvases)
    return canvases


def _block(forward: Forward, x, attention_mask, position_ids, start: int, timesteps, settings: DreamSettings,
           generator, canvases: list) -> torch.Tensor:
    """One block from `start`: a full forward that writes the block's first position (predicted from the position
    before it, in full context), then steps until the block has no masks (tested before each forward: a block its
    first step cleared costs no more; at most its length or schedule), each over the block alone (prefix cache:
    the block and after; dual: the block; no cache: a full forward; a refresh bound: a full forward again whenever
    the window's greatest sinks drift, families.cached.BlockCache) by the threshold rule or the block's schedule.
    Appends each forward's canvas to `canvases`; returns the last."""
    end = start + settings.block_length
    stop = end if settings.cache == "dual" else x.shape[1]
    cache = None if settings.cache is None else BlockCache(
        lambda ids, **cached: forward(ids, attention_mask, position_ids, **cached), start, stop, settings.refresh,
        canvases)
    logits = forward(x, attention_mask, position_ids) if cache is None else cache.full(x)
    first = shift_right(logits)[:, start]
    token = sample_tokens(first, settings, generator)[1]
    note_decisions(argmax_margin(filter_logits(first, settings.temperature, settings.top_p, settings.top_k)).cpu()
                   if settings.temperature == 0 else torch.full((x.shape[0],), float("nan")))
    x = x.clone()
    x[:, start] = token
    canvases.append(x.clone())
    steps_per_block = len(timesteps) - 1
    # at most one step per position (threshold) or the block's schedule: a model that predicts the mask id itself
    # would otherwise keep upstream's loop going for ever
    last = settings.block_length if settings.threshold is not None else steps_per_block
    step = 1
    while bool((x[:, start:end] == settings.mask_id).any()) and step < last:
        window = None if cache is None else cache.window(x)
        if window is not None:
            logits = shift_right(window)[:, :end - start]
        else:
            logits = shift_right(forward(x, attention_mask, position_ids) if cache is None else cache.full(x))[:, start:end]
        block = x[:, start:end]
        x = x.clone()
        if settings.threshold is not None:
            x[:, start:end] = _threshold_step(block, logits, settings, generator)
        else:
            x[:, start:end] = _step(block, logits, step, timesteps, step == steps_per_block - 1, settings, generator)
        canvases.append(x.clone())
        step += 1
    return x


def _threshold_step(block, logits, settings: DreamSettings, generator) -> torch.Tensor:
    """Write every masked position of `block` [B, W] whose top probability (logits [B, W, V]) is at or above
    settings.threshold, and at least the most confident one."""
    mask_index = block == settings.mask_id
    confidence, x0 = sample_tokens(logits[mask_index], settings, generator)
    full_confidence = torch.full(block.shape, float("-inf"), dtype=logits.dtype, device=block.device)
    full_confidence[mask_index] = confidence.to(logits.dtype)
    transfer = threshold_choice(full_confidence, mask_index, settings.threshold)
    candidate = torch.full_like(block, settings.mask_id)
    candidate[mask_index] = x0
    if settings.temperature > 0:
        note_decisions(torch.full((block.shape[0],), float("nan")))
    else:
        filtered = filter_logits(logits, settings.temperature, settings.top_p, settings.top_k)
        written = torch.where(transfer, argmax_margin(filtered).cpu(), torch.full(transfer.shape, float("inf"),
                              dtype=torch.float64)).amin(-1)
        note_decisions(torch.minimum(written, threshold_margin(full_confidence, mask_index, settings.threshold)))
    return torch.where(transfer, candidate, block)


# The paper's generation: 128 tokens in 128 steps, confidence by entropy (as Dream's Table 1 runs decode: one token
# per step, so a task's longer answers keep one step per token); the tiny zoo's 16-token slot likewise.
PAPER = DreamSettings(steps=128, gen_length=128, alg="entropy")
ZOO = DreamSettings(steps=16, gen_length=16, alg="entropy")


def call_remote(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids=None) -> torch.Tensor:
    """Dream's own code takes (ids, mask, position ids): "full" for no padding, else a 4-d boolean mask where a
    query and a key must both be real tokens (as upstream `diffusion_generate` builds it)."""
    if attention_mask is None:
        return model(ids, "full", None).logits
    both = attention_mask.bool()
    return model(ids, both[:, None, None, :] & both[:, None, :, None], position_ids).logits


DREAM = DiffusionFamily("dream", sample, DreamSettings, default_mask_id=151666,
                        description="Dream-v0-Instruct-7B: shifted logits, confidence-ordered unmasking anywhere",
                        paper=PAPER, zoo=ZOO, model_types=("dream",), remote_call=call_remote)
