"""Autoregressive models (Llama-3.1 and any causal LM): next-token decoding with a KV cache.

Step 0 is the prefill (all prompt queries); every later step is one new query over the cache, so its
scores are that single attention row. Decoding stops when every row has produced an end token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sinklib.validation import Count, Index, Temperature, bad_value, check_int, validated
from sinklib.families.base import AutoregressiveFamily, FamilySettings
from sinklib.ties import argmax_margin, note_decisions


@validated
@dataclass(frozen=True)
class ARMSettings(FamilySettings):
    """Greedy (or sampled) next-token decoding of up to `gen_length` tokens with a KV cache.

    Checked when made (check(), dataclasses.replace included).

    Attributes:
        gen_length: the most new tokens; decoding stops early at an end-of-answer id.
        temperature: sampling temperature; 0 is greedy.
        eos_ids: the ids that end an answer (a model's own are filled in by LoadedModel).
        pad_id: the id left padding uses.
        steps: unused (one step per token); accepted so callers can pass the same options to every family.
    """
    gen_length: Count
    temperature: Temperature = 0.0
    eos_ids: tuple[Index, ...] = ()
    pad_id: Index = 0
    steps: Count | None = None  # unused: one step per token; accepted so callers can pass it uniformly

    def check(self) -> None:
        """Refuse a gen_length below 1 or a negative temperature; run on construction (dataclasses.replace included)."""
        check_int(self.gen_length, "gen_length", 1)
        if not self.temperature >= 0:
            raise bad_value("temperature", self.temperature, "a number >= 0")


def next_token(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """[B] next token ids from logits [B, V]: the argmax at temperature 0, else a draw from
    softmax(logits / temperature) in float64."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, settings: ARMSettings,
           generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """forward(ids, attention_mask, position_ids, cache) → (logits, cache). Canvases grow by one token a step;
    rows that have finished are filled with pad_id."""
    batch = prompt_ids.shape[0]
    mask = prompt_mask if prompt_mask is not None else torch.ones_like(prompt_ids)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    x = prompt_ids
    canvases = [x.clone()]
    done = torch.zeros(batch, dtype=torch.bool, device=x.device)
    eos = torch.tensor(settings.eos_ids or [-1], device=x.device)
    logits, cache = forward(x, mask, positions, None)
    for _ in range(settings.gen_length):
        token = next_token(logits[:, -1], settings.temperature, generator)
        note_decisions(argmax_margin(logits[:, -1]) if settings.temperature == 0
                       else torch.full((batch,), float("nan")))
        token = torch.where(done, torch.full_like(token, settings.pad_id), token)
        done = done | torch.isin(token, eos)
        x = torch.cat([x, token[:, None]], dim=1)
        mask = torch.cat([mask, (~done | torch.isin(token, eos)).long()[:, None]], dim=1)
        canvases.append(x.clone())
        if bool(done.all()) or x.shape[1] - prompt_ids.shape[1] == settings.gen_length:
            break
        logits, cache = forward(token[:, None], mask, positions[:, -1:] + (x.shape[1] - prompt_ids.shape[1]), cache)
    return canvases


# Greedy decoding of the paper's 128 tokens; the tiny zoo's slot is 16 (ZOO_GEN_LENGTH).
PAPER = ARMSettings(gen_length=128)

ARM = AutoregressiveFamily("arm", sample, ARMSettings, description="any causal LM with a KV cache (Llama-3.1)",
                          paper=PAPER)
