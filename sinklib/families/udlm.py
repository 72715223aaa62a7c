"""Uniform-noise diffusion on one bidirectional model (UDLM's corruption): the tiny zoo's tiny-udlm.

There is no mask token. An answer block starts as uniformly random tokens and DiffusionGemma's sampler refines it
(families.diffusion_gemma): each step a token is drawn per position at a temperature falling from t_max to t_min, the
lowest-entropy draws are accepted within `entropy_bound`, every other position is re-noised with fresh random tokens,
and the block written is the last argmax canvas. Two things differ, both from the model, not the sampler:
- one forward over [prompt ; blocks written ; this block's canvas] with bidirectional attention (as tiny-llada is
  called: the 2-d key mask, positions 0..L-1) stands for DiffusionGemma's encoder cache and decoder step;
- no self-conditioning: the model has no input for the previous step's logits.
The trace's `is_masked` is "not yet accepted", as DiffusionGemma's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sinklib.families.diffusion_gemma import Canvases, DiffusionGemmaFamily, DiffusionGemmaSettings, _Sampler
from sinklib.families.base import Family
from sinklib.validation import Count, bad_value, validated


@validated
@dataclass(frozen=True)
class UniformNoiseSettings(DiffusionGemmaSettings):
    """DiffusionGemma's sampler (DiffusionGemmaSettings: steps, gen_length, entropy_bound, t_min, t_max, adaptive
    stopping) on a model without an encoder, and the vocabulary the noise is drawn from.

    Attributes:
        block_length: tokens per block, decoded left to right (a sampler's choice here, not the model's).
        vocab_size: the noise is uniform over token ids 0..vocab_size − 1, the vocabulary the model was trained to
            denoise (the model's own is filled in by LoadedModel, as its special ids are).
    """
    block_length: Count = 16
    vocab_size: Count | None = None


def sample(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, settings: UniformNoiseSettings,
           generator: torch.Generator | None = None) -> Canvases:
    """forward(ids, attention_mask) → logits [B, S, V] over [prompt ; blocks written ; the block's canvas] (the 2-d key
    mask, None without left padding). Returns the canvases [B, prompt + gen_length] before each forward and the final
    one, with `noised` (Canvases); blocks not begun hold pad_id."""
    if settings.vocab_size is None:
        raise bad_value("vocab_size", None, "the model's vocabulary size, which the noise is drawn from "
                                            "(LoadedModel.settings_for fills it in)")
    run = _Sampler(forward, settings, generator, prompt_ids)
    batch, prompt_len = prompt_ids.shape
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
    for start in range(prompt_len, prompt_len + settings.gen_length, settings.block_length):
        stop = start + settings.block_length
        mask = torch.nn.functional.pad(prompt_mask, (0, stop - prompt_len), value=1) if padded else None

        def block_logits(canvas, conditioning, start=start, stop=stop, mask=mask):  # conditioning: no input takes it
            return forward(run.x[:, :stop], mask)[:, start:stop]
        argmax = run.denoise(start, settings.vocab_size, block_logits)
        finished = run.finish(start, argmax, finished)
        if bool(finished.all()):
            break
    run.canvases.append(run.x.clone())
    return run.canvases


class UniformNoiseFamily(DiffusionGemmaFamily):
    """DiffusionGemma's sampler on one bidirectional causal-LM-shaped model (no encoder, no self-conditioning)."""
    native_class = "AutoModelForCausalLM"
    layer_names = Family.layer_names  # found by sinklib.layers, as every causal-LM-shaped model's
    run = Family.run  # called as one forward, never by stages


# The paper's generation for a model of this family outside the zoo (128 tokens, one forward per token, blocks of 32,
# as LLaDA's), and the tiny zoo's 16-token slot in one block; every step run (no adaptive stopping, so that each
# generation has tiny-llada's steps to compare step by step), DiffusionGemma's bound and temperatures.
PAPER = UniformNoiseSettings(steps=128, gen_length=128, block_length=32, confidence_threshold=None)
ZOO = UniformNoiseSettings(steps=16, gen_length=16, block_length=16, confidence_threshold=None)

UDLM = UniformNoiseFamily(
    "udlm", sample, UniformNoiseSettings, description="uniform-noise diffusion (tiny-udlm): DiffusionGemma's "
    "entropy-bound acceptance and re-noising on one bidirectional model", paper=PAPER, zoo=ZOO, model_types=("udlm",))
