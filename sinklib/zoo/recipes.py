"""The tiny zoo's recipes, as data: each model's (and each studied variant's) objective, seed, steps and
sizes (ZOO, VARIANTS, recipe), its answer slot (GEN_LENGTH) and the steps a run followed over training saves
(checkpoint_steps). The training itself is experiments/zoo/train.py, run from a checkout."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sinklib.validation import (BadValue, Count, Flag, Index, Positive, Text, bad_value, check_choice,
                                validated)


GEN_LENGTH = 16  # response slot: worked answer + "#### N" + [EOS] padding


# ZooSpec.objective: LLaDA's masked diffusion, next token, Dream's shifted one, uniform-noise diffusion (UDLM's)
OBJECTIVES = ("llada", "arm", "dream", "udlm")


@validated
@dataclass(frozen=True)
class ZooSpec:
    """One zoo model's recipe: its name, sampler family and training objective, causal or bidirectional attention,
    seed, optimiser steps and settings, the zoo model whose weights it starts from (init_from), and its sizes.
    Checked when made (validation.validated): each field as annotated, then `check`'s cross-field rules."""

    name: Text
    family: Text  # the sinklib sampler family
    objective: str  # "llada", "arm", "dream" or "udlm" (OBJECTIVES)
    causal: Flag
    seed: Index
    steps: Count
    batch_size: Count = 64
    lr: Positive = 2e-3
    warmup: Index = 100
    init_from: Text | None = None
    stratified_t: Flag = False  # t_i = (i + u_i) / B across the batch: the same U(0,1) marginal, lower variance
    mask_prompt: Flag = False  # diffusion objectives: in every other row the prompt after [BOS] is masked and predicted too
    gated_attention: Flag = False  # Qwen3.5's attention block: a sigmoid gate on each head's output, QK-norm
    hidden_size: Count = 128
    intermediate_size: Count = 344
    layers: Count = 4
    heads: Count = 4

    def check(self) -> None:
        """The objective and family by name ("did you mean"); settings only a diffusion objective reads refused for
        "arm" (they would be ignored); heads that divide the width."""
        from sinklib.families.base import family_names  # noqa: PLC0415  (the registry imports torch)

        check_choice(self.objective, "objective", OBJECTIVES)
        check_choice(self.family, "family", family_names())
        for setting in ("stratified_t", "mask_prompt"):
            if self.objective == "arm" and getattr(self, setting):
                raise bad_value(setting, True, "False when objective='arm' (only a diffusion objective masks tokens)")
        if self.mask_prompt and self.objective not in ("llada", "dream"):
            raise bad_value("mask_prompt", True, "False unless objective is 'llada' or 'dream' (only they mask a prompt)")
        if self.hidden_size % self.heads:
            raise bad_value("heads", self.heads, f"a divisor of hidden_size={self.hidden_size}")


ZOO = {
    "tiny-llada": ZooSpec("tiny-llada", "llada", "llada", causal=False, seed=11, steps=5000, lr=5e-4, stratified_t=True),
    "tiny-arm": ZooSpec("tiny-arm", "arm", "arm", causal=True, seed=12, steps=1200),
    "tiny-dream": ZooSpec("tiny-dream", "dream", "dream", causal=False, seed=13, steps=2600, init_from="tiny-arm",
                          stratified_t=True),
    # tiny-llada's recipe with uniform noise for the mask token (issue 70: do sinks need a mask token?)
    "tiny-udlm": ZooSpec("tiny-udlm", "udlm", "udlm", causal=False, seed=14, steps=5000, lr=5e-4, stratified_t=True),
    # tiny-llada's recipe with gated attention, which removes sinks in causal models (issue 70: a control without sinks)
    "tiny-llada-gated": ZooSpec("tiny-llada-gated", "llada", "llada", causal=False, seed=15, steps=5000, lr=5e-4,
                                stratified_t=True, gated_attention=True),
}


# Recipes that are studied but not shipped: each differs from a zoo model in one setting.
VARIANTS = {
    # LLaDA's pre-training masks the whole sequence, not only the answer: a prompt token may be missing, so no
    # single key can be relied on. Half of each batch (the odd rows, so both ends of the stratified t) trains so.
    "tiny-llada-prompt-masking": dataclasses.replace(ZOO["tiny-llada"], name="tiny-llada-prompt-masking",
                                                     mask_prompt=True),
}


def recipe(name: str) -> ZooSpec:
    """The recipe of a zoo model or a studied variant, by name."""
    if name in ZOO:
        return ZOO[name]
    if name in VARIANTS:
        return VARIANTS[name]
    raise BadValue(f"name={name!r} is not allowed: name must be one of {sorted(ZOO) + sorted(VARIANTS)}")


def checkpoint_steps(total: int, count: int = 8, first: int = 25) -> list[int]:
    """Step 0 (the initialisation) and `count` distinct steps log-spaced from `first` to `total` (the last is
    `total`): the steps after which a run followed over training saves its weights."""
    if count < 2 or not 1 <= first < total or count > total - first + 2:  # before building any step list
        raise BadValue(f"count={count} is not allowed with total={total}, first={first}: need count >= 2, "
                       "1 <= first < total and count <= total - first + 2 (one step per distinct checkpoint)")
    ratio = (total / first) ** (1 / (count - 1))
    steps = sorted({0, *(round(first * ratio ** i) for i in range(count - 1)), total})
    if len(steps) != count + 1:
        raise BadValue(f"count={count} is not allowed with total={total}: log-spaced steps from {first} would "
                       f"repeat; ask for fewer")
    return steps
