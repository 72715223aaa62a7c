"""LLaDA and MMaDA: semi-autoregressive blocks of masked diffusion, as upstream `generate` does it.

x = prompt + gen_length masks. Each of gen_length/block_length blocks gets steps/num_blocks steps; in a
block with M masks and s steps, step i unmasks M//s tokens plus one for the first M % s steps. Each step
is one forward: x0 = argmax of Gumbel-perturbed logits (float64, exp(l) / (−log U)^T), confidence =
softmax of the noise-free logits at x0 (LLaDA: in the logits' dtype; MMaDA: float64) or uniform noise for
remasking="random"; positions past the block and already-decoded positions get −inf; the top-k confident
positions are written. Classifier-free guidance batches the unconditional (prompt masked) copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from sinklib.validation import Count, GuidanceScale, Index, Temperature, bad_value, check_choice, check_int, validated
from sinklib.families.base import DiffusionFamily, Forward
from sinklib.ties import argmax_margin, choice_margin, note_decisions

REMASKING = ("low_confidence", "random")


@validated
@dataclass(frozen=True)
class LLaDASettings:
    """LLaDA's / MMaDA's sampler: `steps` forwards for `gen_length` new tokens in blocks of `block_length`."""
    steps: Count
    gen_length: Count
    block_length: Count | None = None
    temperature: Temperature = 0.0
    remasking: str = "low_confidence"
    cfg_scale: GuidanceScale = 0.0
    mask_id: Index = 126336
    confidence_dtype: Literal["float16", "bfloat16", "float32", "float64"] | None = None  # None: the logits' dtype

    def validate(self) -> "LLaDASettings":
        """Refuse steps or gen_length below 1, a gen_length that is not a multiple of block_length, steps that are
        not a multiple of the number of blocks, a negative temperature or cfg_scale, or an unknown remasking;
        returns self."""
        check_int(self.steps, "steps", 1)
        check_int(self.gen_length, "gen_length", 1)
        block = self.gen_length if self.block_length is None else check_int(self.block_length, "block_length", 1)
        if self.gen_length % block:
            raise bad_value("gen_length", self.gen_length, f"a multiple of block_length={block}")
        blocks = self.gen_length // block
        if self.steps % blocks:
            raise bad_value("steps", self.steps, f"a multiple of the number of blocks ({blocks} = gen_length "
                                                 f"{self.gen_length} / block_length {block})")
        if not self.temperature >= 0:
            raise bad_value("temperature", self.temperature, "a number >= 0")
        if not self.cfg_scale >= 0:
            raise bad_value("cfg_scale", self.cfg_scale, "a number >= 0")
        check_choice(self.remasking, "remasking", REMASKING)
        return self


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


def _guided_logits(forward: Forward, x, attention_mask, prompt_index, settings: LLaDASettings) -> torch.Tensor:
    if settings.cfg_scale == 0:
        return forward(x, attention_mask)
    unconditional = x.masked_fill(prompt_index, settings.mask_id)
    both_mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
    logits, un_logits = forward(torch.cat([x, unconditional]), both_mask).chunk(2)
    return un_logits + (settings.cfg_scale + 1) * (logits - un_logits)


def _step(x, logits, block_end, count, settings: LLaDASettings, generator) -> torch.Tensor:
    """One denoising step: write the `count` [B] most confident predictions among masked positions < block_end."""
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
    token_margin = torch.full((x.shape[0],), float("inf"), dtype=torch.float64)
    for row in range(x.shape[0]):
        _, chosen = torch.topk(confidence[row], k=int(count[row]))
        transfer[row, chosen] = True
        if settings.temperature == 0 and len(chosen):
            token_margin[row] = argmax_margin(logits[row, chosen]).min()
    kind = "probability" if settings.remasking == "low_confidence" and settings.temperature == 0 else None
    margin = torch.minimum(choice_margin(confidence, transfer, logits if kind else None, kind), token_margin)
    note_decisions(margin if settings.temperature == 0 else torch.full_like(margin, float("nan")))
    return torch.where(transfer, x0, x)


def sample(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, settings: LLaDASettings,
           generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """forward(ids, attention_mask) → logits [B, S, V] (mask None without left padding; 2B rows, the unconditional
    copies after, with cfg_scale > 0). Returns the steps + 1 canvases [B, prompt + gen_length]: before the first
    step and after each one, mask_id where masked."""
    settings.validate()
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
        for i in range(steps_per_block):
            logits = _guided_logits(forward, x, attention_mask, prompt_index, settings)
            x = _step(x, logits, block_end, counts[:, i], settings, generator)
            canvases.append(x.clone())
    return canvases


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
                        extra={"confidence_dtype": "float64"}, paper=PAPER, zoo=ZOO, model_types=("mmada",),
                        remote_call=call_remote)
