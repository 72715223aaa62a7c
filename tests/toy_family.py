"""A family defined outside sinklib, in one file: proof that adding a family is this file plus one
`register_family` call (tests/unit/test_families.py). Each step decodes the next masked position at one end of the
answer with the argmax — a left-to-right (or right-to-left) "diffusion" sampler."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sinklib.validation import check_choice, check_int, validated
from sinklib.families.base import DiffusionFamily, FamilySettings


@validated
@dataclass(frozen=True)
class ToySettings(FamilySettings):
    steps: int
    gen_length: int
    direction: str = "left_to_right"
    mask_id: int = 0

    def check(self) -> None:  # run whenever settings are made (validated), dataclasses.replace included
        check_int(self.steps, "steps", 1)
        check_int(self.gen_length, "gen_length", self.steps, self.steps)  # one position a step
        check_choice(self.direction, "direction", ("left_to_right", "right_to_left"))


def sample(forward, prompt_ids, prompt_mask, settings: ToySettings, generator=None) -> list[torch.Tensor]:
    x = torch.nn.functional.pad(prompt_ids, (0, settings.gen_length), value=settings.mask_id)
    mask = positions = None
    if prompt_mask is not None and not bool(prompt_mask.all()):  # left padding: pads neither attend nor count
        mask = torch.nn.functional.pad(prompt_mask, (0, settings.gen_length), value=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
    canvases = [x.clone()]
    order = range(settings.gen_length) if settings.direction == "left_to_right" else reversed(range(settings.gen_length))
    for _, offset in zip(range(settings.steps), order):
        position = prompt_ids.shape[1] + offset
        x = x.clone()
        x[:, position] = forward(x, mask, positions)[:, position].argmax(-1)
        canvases.append(x.clone())
    return canvases


TOY = DiffusionFamily("toy", sample, ToySettings, default_mask_id=0, description="one end of the answer at a time",
                      zoo=ToySettings(steps=4, gen_length=4), model_types=("toydiff",))
