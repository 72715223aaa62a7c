"""What a model family is (its sampler, its special ids), and the registry of families.

A sampler is a plain function: sample(forward, prompt_ids, prompt_mask, settings, generator) → list of
canvases [batch, seq], the canvas before each forward and the final one. `forward(ids, mask_2d,
position_ids)` returns logits; the caller decides how a model is called and what is recorded.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from sinklib._checks import check_choice, did_you_mean

Forward = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "diffusion" or "autoregressive"
    sample: Callable[..., list[torch.Tensor]]
    settings: type
    default_mask_id: int | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # sampler settings by context: "paper" (SPEC §2, the figures), "zoo" (the tiny zoo's 16-token slot) and one
    # per evaluation task (Table 1); each is keyword arguments of generate
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def preset(self, context: str) -> dict[str, Any]:
        """A copy of this family's sampler settings for `context` ("paper", "zoo" or a task name)."""
        if context not in self.presets:
            raise ValueError(f"context={context!r} is not allowed: the {self.name} family has presets for "
                             f"{sorted(self.presets)}{did_you_mean(context, self.presets)}")
        return dict(self.presets[context])


_FAMILIES: dict[str, str] = {
    "llada": "sinklib.families.llada:LLADA",
    "mmada": "sinklib.families.llada:MMADA",
    "dream": "sinklib.families.dream:DREAM",
    "arm": "sinklib.families.arm:ARM",
}


def register_family(name: str, target: str) -> None:
    """Register a family by import path "module:ATTRIBUTE" (imported on first use)."""
    _FAMILIES[name] = target


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> Family:
    check_choice(name, "family", family_names())
    module, attribute = _FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists (as upstream batched sampling does) → ids [B, P] and attention mask [B, P]."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask
