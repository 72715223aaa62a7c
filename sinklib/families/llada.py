"""LLaDA and MMaDA: semi-autoregressive blocks of masked diffusion, as upstream `generate` does it.

x = prompt + gen_length masks. Each of gen_length/block_length blocks gets steps/num_blocks steps; in a
block with M masks and s steps, step i unmasks M//s tokens plus one for the first M % s steps. Each step
is one forward: x0 = argmax of Gumbel-perturbed logits (float64, exp(l) / (−log U)^T), confidence =
softmax of the noise-free logits at x0 (LLaDA: in the logits' dtype; MMaDA: float64) or uniform noise for
remasking="random"; positions past the block and already-decoded positions get −inf; the top-k confident
positions are written. Classifier-free guidance batches the unconditional (prompt masked) copy.

Fast-dLLM's additions (families.cached): `threshold` writes every masked position of the block at or above it (at
least the most confident one) and ends a block as soon as it has no masks; `cache` ("prefix" or "dual") makes each
block's first step a full forward whose keys and values the block's later steps reuse.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch

from sinklib.validation import (Count, GuidanceScale, Index, Share, Temperature, Threshold, bad_value, check_choice,
                                check_int, validated)
from sinklib.families.base import DiffusionFamily, FamilySettings, Forward, check_block_layout
from sinklib.families.cached import BlockCache, check_refresh, threshold_choice, threshold_margin
from sinklib.ties import argmax_margin, choice_margin, note_decisions

REMASKING = ("low_confidence", "random")


@validated
@dataclass(frozen=True)
class LLaDASettings(FamilySettings):
    """LLaDA's / MMaDA's sampler: `steps` forwards for `gen_length` new tokens in blocks of `block_length`.

    Checked when made (check(), dataclasses.replace included). Build one with LoadedModel.settings_for(**overrides),
    which keeps the layout valid.

    Attributes:
        steps: forwards in all, a multiple of the number of blocks (gen_length / block_length).
        gen_length: new tokens, a multiple of block_length.
        block_length: tokens per block, decoded left to right; None: one block of gen_length.
        temperature: Gumbel noise on the logits, 0–100; 0 is greedy.
        remasking: "low_confidence" (write the most confident positions) or "random".
        cfg_scale: classifier-free guidance scale, 0–1e4; 0: none.
        mask_id: the mask token's id (LLaDA's 126336; a model's own is filled in by LoadedModel).
        confidence_dtype: the dtype confidences are compared in ("float16", "bfloat16", "float32", "float64");
            None: the logits' (MMaDA's defaults use float64).
        threshold: parallel decoding (Fast-dLLM): write every masked position of the block at least this confident
            (a probability in (0, 1]); None: a fixed number per step.
        cache: "prefix" or "dual": reuse the block-start forward's keys and values (Fast-dLLM); None: none.
        refresh: with a cache, recompute it when a layer's greatest sink moves or its share changes by this much (a
            share in [0, 1]); None: never.
    """
    KEYED_WHEN_SET: ClassVar[tuple[str, ...]] = ("threshold", "cache", "refresh")  # families.base.record
    steps: Count
    gen_length: Count
    block_length: Count | None = None
    temperature: Temperature = 0.0
    remasking: str = "low_confidence"
    cfg_scale: GuidanceScale = 0.0
    mask_id: Index = 126336
    confidence_dtype: Literal["float16", "bfloat16", "float32", "float64"] | None = None  # None: the logits' dtype
    threshold: Threshold | None = None  # parallel decoding: write every masked position of the block this confident
    cache: Literal["prefix", "dual"] | None = None  # reuse the block-start forward's keys and values (Fast-dLLM)
    refresh: Share | None = None  # with a cache: refresh when a layer's greatest sink moves or its share by this much

    def check(self) -> None:
        """Refuse steps or gen_length below 1, a gen_length that is not a multiple of block_length, steps that are
        not a multiple of the number of blocks, a negative temperature or cfg_scale, an unknown remasking, a
        threshold with random remasking (it compares confidences), a cache with classifier-free guidance
        (upstream's cached samplers take none) or a refresh without a cache; run on construction (dataclasses.replace
        included)."""
        check_int(self.steps, "steps", 1)
        check_int(self.gen_length, "gen_length", 1)
        check_block_layout(self.steps, self.gen_length, self.gen_length if self.block_length is None else self.block_length)
        if not self.temperature >= 0:
            raise bad_value("temperature", self.temperature, "a number >= 0")
        if not self.cfg_scale >= 0:
            raise bad_value("cfg_scale", self.cfg_scale, "a number >= 0")
        check_choice(self.remasking, "remasking", REMASKING)
        if self.threshold is not None and self.remasking != "low_confidence":
            raise bad_value("threshold", self.threshold, "None with remasking='random' (a threshold compares "
                                                         "confidences; use remasking='low_confidence')")
        if self.cache is not None and self.cfg_scale:
            raise bad_value("cache", self.cache, f"None with cfg_scale={self.cfg_scale} (the cached samplers take no "
                                                 "classifier-free guidance)")
        check_refresh(self.refresh, self.cache)


def transfer_counts(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to unmask at each of `steps` steps for rows with `masked` [B] masks: M//s, plus one for the
    first M % s steps. → int64 [B, steps]."""
    base = (masked // steps)[:, None]
    extra = torch.arange(steps, device=masked.device)[None, :] < (masked % steps)[:, None]
    return base + extra.long()


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Token ids [...] from logits [..., V]: the argmax at temperature 0, else the argmax of the Gumbel-perturbed
    exp(l) / (−log U)^temperature in float64."""
    if temperature == 0:
        return logits.argmax(-1)
    noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator, device=logits.device)
    return (logits.double().exp() / (-torch.log(noise)) ** temperature).argmax(-1)


def _guided_logits(forward: Forward, x, attention_mask, prompt_index, settings: LLaDASettings, **cached):
    if settings.cfg_scale == 0:
        return forward(x, attention_mask, **cached)
    unconditional = x.masked_fill(prompt_index, settings.mask_id)
    both_mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
    logits, un_logits = forward(torch.cat([x, unconditional]), both_mask).chunk(2)
    return un_logits + (settings.cfg_scale + 1) * (logits - un_logits)


def _step(x, logits, block_end, count, settings: LLaDASettings, generator) -> torch.Tensor:
    """One denoising step: write the `count` [B] most confident predictions among masked positions < block_end
    (count None: those at or above settings.threshold, at least the most confident one). x [B, W] and logits
    [B, W, V] may be a window of the canvas; block_end counts from its start."""
    mask_index = x == settings.mask_id
    x0 = gumbel_argmax(logits, settings.temperature, generator)
    if settings.remasking == "low_confidence":
        dtype = getattr(torch, settings.confidence_dtype) if settings.confidence_dtype else logits.dtype
        probs = torch.softmax(logits.to(dtype), dim=-1)
        confidence = probs.gather(-1, x0[..., None]).squeeze(-1)
    else:
        confidence = torch.rand(x0.shape, generator=generator, device=x0.device)
    confidence[:, block_end:] = float("-inf")
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, confidence, torch.full_like(confidence, float("-inf")))
    transfer = torch.zeros_like(mask_index)
    if count is None:
        transfer = threshold_choice(confidence, confidence.isfinite(), settings.threshold)
    token_margin = torch.full((x.shape[0],), float("inf"), dtype=torch.float64)
    for row in range(x.shape[0]):
        if count is None:
            chosen = transfer[row].nonzero()[:, 0]
        else:
            _, chosen = torch.topk(confidence[row], k=int(count[row]))
            transfer[row, chosen] = True
        if settings.temperature == 0 and len(chosen):
            token_margin[row] = argmax_margin(logits[row, chosen]).min()
    kind = "probability" if settings.remasking == "low_confidence" and settings.temperature == 0 else None
    margin = torch.minimum(choice_margin(confidence, transfer, logits if kind else None, kind), token_margin)
    if count is None:
        margin = torch.minimum(margin, threshold_margin(confidence, confidence.isfinite(), settings.threshold))
    note_decisions(margin if settings.temperature == 0 else torch.full_like(margin, float("nan")))
    return torch.where(transfer, x0, x)


def sample(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, settings: LLaDASettings,
           generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """forward(ids, attention_mask) → logits [B, S, V] (mask None without left padding; 2B rows, the unconditional
    copies after, with cfg_scale > 0); with a cache, forward(ids, attention_mask, keep=True) → (logits, kept keys)
    and forward(ids, attention_mask, window=Window) → the window's logits (families.cached). Returns the canvas
    before the first forward and after each one [B, prompt + gen_length], mask_id where masked: steps + 1 of them
    without a threshold, fewer with one."""
    batch, prompt_len = prompt_ids.shape
    block_length = settings.block_length or settings.gen_length
    x = torch.full((batch, prompt_len + settings.gen_length), settings.mask_id, dtype=torch.long, device=prompt_ids.device)
    x[:, :prompt_len] = prompt_ids
    attention_mask = None
    if prompt_mask is not None and not bool(prompt_mask.all()):
        answer_mask = torch.ones(batch, settings.gen_length, dtype=prompt_mask.dtype, device=prompt_mask.device)
        attention_mask = torch.cat([prompt_mask, answer_mask], 1)
    prompt_index = x != settings.mask_id
    num_blocks = settings.gen_length // block_length
    steps_per_block = settings.steps // num_blocks
    canvases = [x.clone()]
    for block in range(num_blocks):
        block_end = prompt_len + (block + 1) * block_length
        counts = transfer_counts((x[:, block_end - block_length:block_end] == settings.mask_id).sum(1), steps_per_block)
        if settings.cache is None and settings.threshold is None:  # the paper's sampler: every scheduled step
            for i in range(steps_per_block):
                logits = _guided_logits(forward, x, attention_mask, prompt_index, settings)
                x = _step(x, logits, block_end, counts[:, i], settings, generator)
                canvases.append(x.clone())
            continue
        x = _fast_block(forward, x, attention_mask, prompt_index, block_end - block_length, block_end, counts,
                        settings, generator, canvases)
    return canvases


def _fast_block(forward: Forward, x, attention_mask, prompt_index, start: int, block_end: int, counts,
                settings: LLaDASettings, generator, canvases: list) -> torch.Tensor:
    """One block by Fast-dLLM's loop: steps until the block has no masks (the test before each forward, as its
    later generate.py has it), the threshold rule or the schedule's counts; with a cache, the block's first step a
    full forward whose keys the later steps' windows reuse (prefix: the block and after; dual: the block), and with
    a refresh bound, a full forward again whenever the window's greatest sinks drift (families.cached.BlockCache)."""
    stop = block_end if settings.cache == "dual" else x.shape[1]
    cache = None if settings.cache is None else BlockCache(
        lambda ids, **cached: _guided_logits(forward, ids, attention_mask, prompt_index, settings, **cached),
        start, stop, settings.refresh, canvases)
    # at most one step per position (threshold) or the schedule's steps: a model that predicts the mask id itself
    # would otherwise keep upstream's loop going for ever
    last = block_end - start if settings.threshold is not None else counts.shape[1]
    step = 0
    while bool((x[:, start:block_end] == settings.mask_id).any()) and step < last:
        count = None if settings.threshold is not None else counts[:, step]
        logits = None if cache is None or step == 0 else cache.window(x)
        if logits is not None:
            x = x.clone()
            x[:, start:stop] = _step(x[:, start:stop], logits, block_end - start, count, settings, generator)
        else:
            logits = _guided_logits(forward, x, attention_mask, prompt_index, settings) if cache is None else cache.full(x)
            x = _step(x, logits, block_end, count, settings, generator)
        canvases.append(x.clone())
        step += 1
    return x



# The paper's generation: 128 tokens, 128 steps, blocks of 32 (a task's longer answers keep the blocks of 32 and
# one step per token, as Table 1 runs GSM8K and HumanEval); the tiny zoo's 16-token slot in blocks of 8.
PAPER = LLaDASettings(steps=128, gen_length=128, block_length=32)
ZOO = LLaDASettings(steps=16, gen_length=16, block_length=8)


def call_remote(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids=None) -> torch.Tensor:
    """LLaDA's and MMaDA's own code take the ids and a 2-d key mask (no position ids: positions are 0..L-1)."""
    return model(ids, attention_mask=attention_mask).logits


LLADA = DiffusionFamily("llada", sample, LLaDASettings, default_mask_id=126336,
                        description="LLaDA-8B-Instruct: blockwise low-confidence remasking", paper=PAPER, zoo=ZOO,
                        model_types=("llada",), remote_call=call_remote)
MMADA = DiffusionFamily("mmada", sample, LLaDASettings, default_mask_id=126336,
                        description="MMaDA-8B: LLaDA's sampler with float64 confidences",
                        paper=replace(PAPER, confidence_dtype="float64"), zoo=replace(ZOO, confidence_dtype="float64"),
                        model_types=("mmada",),
                        remote_call=call_remote)
