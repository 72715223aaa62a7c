"""What a model family is, and the registry of families.

A Family owns everything that differs between model families: its sampler and the settings dataclass it
takes (whose fields are the family's option names), presets by context, the special ids, which configs
declare it, how its remote modelling code is called, and how its canvases become traces. Adding a family is
one file defining a Family and one `register_family` call.

A sampler is a plain function: sample(forward, prompt_ids, prompt_mask, settings, generator) → list of
canvases [batch, seq], the canvas before each forward and the final one. `forward(ids, mask_2d,
position_ids)` returns logits (an autoregressive family's forward also takes and returns a KV cache); the
caller decides how a model is called and what is recorded.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping

import torch

from sinklib._checks import did_you_mean
from sinklib.registry import Registry

Forward = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Canvas:
    """A batch's canvases as traces store them: tokens [forwards + 1, batch, width] (short canvases filled),
    is_masked [forwards, batch, width], and each row's left padding [batch]."""
    tokens: torch.Tensor
    is_masked: torch.Tensor
    padding: torch.Tensor


@dataclass(frozen=True)
class Family:
    """A model family, as the registry holds it: its sampler and settings dataclass, presets, the mask id used when
    the tokenizer has none (default_mask_id, diffusion families), settings defaults of its own (extra, applied when
    not given) and how its remote code is called. Subclasses set `kind` and how canvases become traces."""
    name: str
    sample: Callable[..., list[torch.Tensor]]
    settings: type  # a frozen dataclass with validate(); its fields are this family's option names
    default_mask_id: int | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # sampler settings by context: "paper" (the paper's generation settings, used for the figures), "zoo" (the tiny
    # zoo's 16-token answer slot) and one per evaluation task (Table 1); each is keyword arguments of generate
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # words in a config's model_type / architectures that declare this family (remote-code checkpoints)
    model_types: tuple[str, ...] = ()
    # how the family's own (remote) modelling code is called: (model, ids, mask_2d, position_ids) → logits
    remote_call: Callable[..., torch.Tensor] | None = None

    kind: ClassVar[str] = ""

    def preset(self, context: str) -> dict[str, Any]:
        """A copy of this family's sampler settings for `context` ("paper", "zoo" or a task name)."""
        if context not in self.presets:
            raise ValueError(f"context={context!r} is not allowed: the {self.name} family has presets for "
                             f"{sorted(self.presets)}{did_you_mean(context, self.presets)}")
        return dict(self.presets[context])

    def option_names(self) -> list[str]:
        """The field names of this family's settings dataclass, in declaration order (special ids included)."""
        return [f.name for f in dataclasses.fields(self.settings)]

    def declared_by(self, config_text: str) -> bool:
        """Whether a config whose model_type and architectures read `config_text` (lower case) declares this family."""
        return any(word in config_text for word in self.model_types)

    def matches_native(self, config: Any) -> bool:
        """Whether a transformers-native config with no family words is this family (the fallback for causal LMs)."""
        return False

    def call(self, model: torch.nn.Module, ids, attention_mask, position_ids) -> torch.Tensor:
        """Logits from this family's remote modelling code, called the way that code expects."""
        if self.remote_call is None:
            raise TypeError(f"the {self.name} family has no remote modelling code to call")
        return self.remote_call(model, ids, attention_mask, position_ids)

    def make_settings(self, options: dict[str, Any], special: dict[str, Any]):
        """Validated settings from the given options (None = not given) and the model's special ids."""
        names = set(self.option_names())
        given = {k: v for k, v in options.items() if k in names and v is not None}
        given.update({k: v for k, v in special.items() if k in names})
        given.update({k: v for k, v in self.extra.items() if k in names and k not in given})
        return self.settings(**given).validate()

    # --- how a run's canvases become traces (diffusion and autoregressive families differ) ---
    uses_cache: ClassVar[bool] = False

    def n_forwards(self, settings) -> int:
        """How many model forwards a run with these (validated) settings makes."""
        raise NotImplementedError

    def layout(self, canvases: list[torch.Tensor], prompt_lengths: list[int], settings, mask_id, pad_id) -> Canvas:
        """The sampler's canvases (each [batch, width_t], the one before each forward and the final one) as a Canvas
        of one width, with each row's left padding worked out from `prompt_lengths`."""
        raise NotImplementedError

    def extent(self, tokens: torch.Tensor, prompt_len: int, forwards: int, eos_ids) -> tuple[int, int]:
        """(positions kept, steps kept) of one row's tokens [forwards + 1, width] (already without left padding)."""
        raise NotImplementedError

    def replay_canvas(self, tokens: torch.Tensor, is_masked: torch.Tensor) -> torch.Tensor:
        """The ids one full forward sees to replay a step (the canvas of that step)."""
        return tokens


class DiffusionFamily(Family):
    """Every forward sees the whole canvas; masked positions hold the mask id until decoded."""
    kind: ClassVar[str] = "diffusion"

    def n_forwards(self, settings) -> int:
        """One forward per denoising step: settings.steps."""
        return settings.steps

    def layout(self, canvases, prompt_lengths, settings, mask_id, pad_id) -> Canvas:
        """The canvases stacked (all share one width); a position is masked where it holds `mask_id` before the
        forward, and a row's left padding is the width less gen_length and its prompt length."""
        tokens = torch.stack(canvases).cpu()
        padding = tokens.shape[-1] - settings.gen_length - torch.tensor(prompt_lengths)
        return Canvas(tokens, tokens[:-1] == mask_id, padding)

    def extent(self, tokens, prompt_len, forwards, eos_ids) -> tuple[int, int]:
        """Every position and every step: the whole canvas is generated at once, end tokens included."""
        return tokens.shape[1], forwards


class AutoregressiveFamily(Family):
    """The canvas grows by one token a forward (a KV cache holds the rest); positions not yet generated count as
    masked; a row ends at its first end token."""
    kind: ClassVar[str] = "autoregressive"
    uses_cache: ClassVar[bool] = True

    def matches_native(self, config: Any) -> bool:
        """True for a causal decoder config (a *ForCausalLM architecture, is_decoder, or a Llama, Qwen2, Mistral or
        Gemma model type) unless it declares itself not causal (is_causal=False or bidirectional attention)."""
        model_type = str(getattr(config, "model_type", "")).lower()
        architectures = " ".join(getattr(config, "architectures", None) or []).lower()
        if getattr(config, "is_causal", True) is False or getattr(config, "use_bidirectional_attention", False):
            return False
        return "forcausallm" in architectures or bool(getattr(config, "is_decoder", False)) or \
            model_type in ("llama", "qwen2", "mistral", "gemma")

    def n_forwards(self, settings) -> int:
        """One forward per generated token: settings.gen_length."""
        return settings.gen_length

    def layout(self, canvases, prompt_lengths, settings, mask_id, pad_id) -> Canvas:
        """The growing canvases right-padded with `pad_id` to the final width and stacked; positions at or past a
        forward's canvas length (not yet generated) are masked; left padding is the first canvas's width less each
        prompt length."""
        width = canvases[-1].shape[1]
        tokens = torch.stack([torch.nn.functional.pad(c, (0, width - c.shape[1]), value=pad_id) for c in canvases]).cpu()
        lengths = torch.tensor([c.shape[1] for c in canvases])
        batch = tokens.shape[1]
        is_masked = (torch.arange(width)[None, :] >= lengths[:-1, None])[:, None, :].expand(-1, batch, -1)
        return Canvas(tokens, is_masked, canvases[0].shape[1] - torch.tensor(prompt_lengths))

    def extent(self, tokens, prompt_len, forwards, eos_ids) -> tuple[int, int]:
        """Positions up to and including the first end token after the prompt in the final canvas (all when there is
        none), and the forwards that produced them."""
        final = tokens[-1]
        keep = next((p + 1 for p in range(prompt_len, final.shape[0]) if int(final[p]) in eos_ids), final.shape[0])
        return keep, min(forwards, keep - prompt_len)

    def replay_canvas(self, tokens, is_masked) -> torch.Tensor:
        """The tokens that existed at that step (the not-masked ones): prompt and tokens generated so far, [seq]."""
        return tokens[~is_masked]


FAMILIES: Registry[Family] = Registry("family", {
    "llada": "sinklib.families.llada:LLADA",
    "mmada": "sinklib.families.llada:MMADA",
    "dream": "sinklib.families.dream:DREAM",
    "arm": "sinklib.families.arm:ARM",
})


def fit_layout(preset: Mapping[str, Any], steps: int | None = None, gen_length: int | None = None,
               block_length: int | None = None) -> dict[str, Any]:
    """`preset` (sampler settings) with the given values overriding; options the preset does not have are dropped
    (block_length for dream/arm, steps for arm).

    A gen_length given alone keeps a valid layout: block_length becomes the largest divisor of gen_length not
    above the preset's block (32 → 16 for gen_length 16), and steps keep the preset's steps per token,
    rounded up to a multiple of the number of blocks."""
    fitted = dict(preset)
    for key, value in (("steps", steps), ("gen_length", gen_length), ("block_length", block_length)):
        if value is not None and key in preset:
            fitted[key] = value
    if gen_length is not None and block_length is None and "block_length" in preset:
        fitted["block_length"] = max(d for d in range(1, min(preset["block_length"], gen_length) + 1) if gen_length % d == 0)
    if gen_length is not None and steps is None and "steps" in preset:
        blocks = gen_length // fitted.get("block_length", gen_length)
        wanted = max(1, -(-gen_length * preset["steps"] // preset["gen_length"]))
        fitted["steps"] = -(-wanted // blocks) * blocks
    return fitted


def register_family(name: str, target: "str | Family", *, replace: bool = False) -> None:
    """Register a family: a Family or its import path "module:ATTRIBUTE" (imported on first use)."""
    FAMILIES.register(name, target, replace=replace)


def family_names() -> list[str]:
    """The registered family names, sorted."""
    return FAMILIES.names()


def get_family(name: str) -> Family:
    """The family registered as `name` (imported on first use); an unknown name is refused with "did you mean"."""
    return FAMILIES.get(name)


SPECIAL_IDS = ("mask_id", "eos_ids", "pad_id")  # settings fields filled from the model, never given as options


def option_owners() -> dict[str, list[str]]:
    """option name → the families whose settings have it (special ids excluded: they come from the model)."""
    owners: dict[str, list[str]] = {}
    for name in family_names():
        for option in get_family(name).option_names():
            if option not in SPECIAL_IDS:
                owners.setdefault(option, []).append(name)
    return owners


# --- decision margins: how close each step's choice came to going the other way ---------------------------------
# Two CPUs compute logits that agree to a few float32 roundings; where a sampler's choice (the argmax token, the
# top-k confident positions) is decided by less than that, another CPU may choose differently and the canvas
# differs from that step on. Samplers note each forward's margin so such a divergence can be named as a near-tie.
_DECISIONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("sinklib_decisions", default=None)


@contextlib.contextmanager
def recording_decisions() -> Iterator[list[torch.Tensor]]:
    """Collect the margins samplers note inside this block: one float64 tensor [batch] per forward."""
    margins: list[torch.Tensor] = []
    token = _DECISIONS.set(margins)
    try:
        yield margins
    finally:
        _DECISIONS.reset(token)


def note_decisions(margins: torch.Tensor) -> None:
    """Record this forward's decision margin per row (a no-op outside recording_decisions)."""
    log = _DECISIONS.get()
    if log is not None:
        log.append(margins.detach().to("cpu", torch.float64))


def relative_gap(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """(high − low) / (1 + |high|): a gap in units of the compared values' own rounding scale."""
    high, low = high.double(), low.double()
    return (high - low) / (1 + high.abs())


def argmax_margin(logits: torch.Tensor) -> torch.Tensor:
    """Relative gap between the best and second-best entry of the last dim (+inf with a single entry)."""
    if logits.shape[-1] < 2:
        return torch.full(logits.shape[:-1], float("inf"), dtype=torch.float64, device=logits.device)
    top2 = logits.topk(2, dim=-1).values
    return relative_gap(top2[..., 0], top2[..., 1])


def choice_margin(values: torch.Tensor, chosen: torch.Tensor, logits: torch.Tensor | None = None,
                  kind: str | None = None, transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Per row of values [B, N]: how far a top-k choice was from taking another entry — the weakest chosen entry
    against the strongest finite entry not chosen (+inf where either side is empty), float64 [B].

    Without `logits`: the relative gap of the values themselves. With `logits` [B, N, V] (the logits each value
    was computed from) and `kind` ("probability": the top token's softmax probability; "probability_gap": top-1
    minus top-2 probability; "entropy": Σ p log(p + 1e-10)), confidence_margin between the chosen and the rejected
    entries within a rounding step or two of that boundary: 0 for a tie every CPU breaks the same way. `transform`: what
    the sampler did to those logits before its softmax (Dream's top-p / top-k filter)."""
    inf = torch.tensor(float("inf"), dtype=values.dtype, device=values.device)
    weakest = torch.where(chosen, values, inf).amin(-1)
    rejected = torch.where(~chosen & values.isfinite(), values, -inf).amax(-1)
    opposed = weakest.isfinite() & rejected.isfinite()
    margins = torch.full(weakest.shape, float("inf"), dtype=torch.float64)
    if logits is None:
        return torch.where(opposed.cpu(), relative_gap(weakest, rejected).cpu(), margins)
    for row in opposed.nonzero()[:, 0].tolist():
        # every entry that could sit on the boundary: the chosen ones up to one rounding step above the weakest (the
        # spacing at the next value up), the rejected ones down to two steps below the strongest (saturated values
        # tie in numbers)
        near_a = chosen[row] & (values[row] <= _ulp(_ulp(weakest[row]) + weakest[row]) + weakest[row])
        near_b = ~chosen[row] & values[row].isfinite() & (values[row] >= rejected[row] - 2 * _ulp(rejected[row]))
        side_a, side_b = logits[row, near_a], logits[row, near_b]
        if transform is not None:
            side_a, side_b = transform(side_a), transform(side_b)
        margins[row] = confidence_margin(side_a, side_b, values.dtype, kind)
    return margins


CONFIDENCE_KINDS = ("probability", "probability_gap", "entropy")


def confidence_margin(logits_a: torch.Tensor, logits_b: torch.Tensor, dtype: torch.dtype, kind: str) -> float:
    """Could another CPU have ranked the chosen positions (logits_a [na, V]) below a rejected one (logits_b [nb, V])?
    `dtype` is the precision the sampler compared confidences in (float32 on CPU). Returns:

    - 0, an exact tie: every confidence of both sides takes one and the same value (probabilities of 1.0, entropies
      of 0) under every perturbation another CPU could make (_confidence_bounds: logit gaps moved by LOGIT_ROUNDING
      × (1 + gap), the softmax's sum short of LANE_SHARE of the rivals' mass, results rounded to `dtype`), so the
      fixed order that broke the tie breaks it the same way on every CPU;
    - at most NEAR_TIE, a near-tie: under those perturbations a rejected confidence could reach a chosen one;
    - otherwise the relative gap (s_a − s_b) / (1 + max |s|) between the weakest chosen and the strongest rejected
      confidence where they do not saturate, s in float64 from the logits: the log-odds log p − log(1 − p) of a
      probability, −log(1 − gap) of a probability gap, −log(−entropy) of an entropy (logit units; at least 2 NEAR_TIE).
    """
    from sinklib.agreement import NEAR_TIE  # noqa: PLC0415  (agreement imports the families' margin conventions)

    if kind not in CONFIDENCE_KINDS:
        raise ValueError(f"kind={kind!r} is not allowed: choose one of {CONFIDENCE_KINDS}")
    with torch.no_grad():
        s_a, low_a, high_a = _confidence_bounds(logits_a.double(), kind, dtype, LOGIT_ROUNDING)
        s_b, low_b, high_b = _confidence_bounds(logits_b.double(), kind, dtype, LOGIT_ROUNDING)
    weakest, strongest = float(s_a.min()), float(s_b.max())
    bounds = torch.cat([low_a, high_a, low_b, high_b])
    if bool((bounds == bounds[0]).all()):
        return 0.0
    if math.isinf(weakest) or math.isinf(strongest):
        gap = 0.0 if weakest == strongest else math.inf
    else:
        gap = abs(weakest - strongest) / (1 + max(abs(weakest), abs(strongest)))
    if float(low_a.min()) > float(high_b.max()):
        return max(gap, 2 * NEAR_TIE)
    return min(gap, NEAR_TIE) if gap > 0 else NEAR_TIE


# A float32 softmax divides by its running sum 1 + (the rivals' mass relative to the top token), and that sum holds
# the top token's 1 in one lane of a vector accumulator: rivals added into that lane round at 1's spacing and can be
# lost, up to one lane's share of their mass (one in 8 with 8-float vectors: AVX2 and torch's portable kernels).
# Measured with benchmarks/cpu_rounding_bound.py: AVX-512 and the portable kernels put tiny-llada's probabilities
# near 1 up to 6 units of 2^-24 apart where the rivals held about 90 such units (7 %).
LANE_SHARE = 1 / 8
# How far another CPU's logits may sit from these, in units of 1 + |logit gap|: measured (the same script) up to
# 1.4e-5 on the zoo and 4.5e-5 (6.6e-5 in an earlier session, against AVX2) on SmolLM2's 30 layers; 1.5 times the
# largest (a bound per model would be tighter: at the zoo's, 3e-5, tiny-dream's near-ties fall from 29 % to 8 %).
LOGIT_ROUNDING = 1e-4


def _confidence_bounds(logits: torch.Tensor, kind: str, dtype: torch.dtype, slack: float):
    """(s: the confidence in its non-saturating space; the lowest and highest value the confidence can take in
    `dtype` on another CPU: the logit gaps perturbed by `slack` × (1 + |gap|), the rivals' mass in the softmax's sum
    short of up to LANE_SHARE, every division and sum rounded to `dtype`), float64 [n] each, from logits [n, V] in
    float64."""
    top = logits.max(-1)
    rival = (top.values[:, None] - logits).scatter(-1, top.indices[:, None], math.inf)  # gaps to the top logit
    stretch = slack * (1 + rival.clamp(max=1e300))  # each rival's share moves by up to exp(±stretch)
    relative = (-rival).exp()  # exp(l_j − l_top): 0 at the top itself
    rest = relative.sum(-1)  # the rivals' mass beside the top token's 1
    log_probs = logits - logits.logsumexp(-1)[:, None]

    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.to(dtype).double()

    def extremes(shift: int):
        """(the rivals' mass in the sum, each rival's probability, the top token's probability) with the rivals moved
        by exp(shift × stretch) and, where they are made smaller, short of LANE_SHARE in the sum."""
        moved = (relative * torch.exp(shift * stretch)).masked_fill(rival.isinf(), 0.0)
        in_sum = rounded(1 + moved.sum(-1) * (1 - LANE_SHARE if shift < 0 else 1))
        return rounded(moved / in_sum[:, None]), rounded(1 / in_sum)

    if kind == "probability":
        odds = -torch.log(rest)  # log p − log(1 − p), with 1 − p = rest / (1 + rest)
        return odds, extremes(1)[1], extremes(-1)[1]
    if kind == "probability_gap":
        second = relative.max(-1).values
        s = -torch.log((rest + second) / (1 + rest))  # −log(1 − (p1 − p2))
        (rivals_up, top_low), (rivals_down, top_high) = extremes(1), extremes(-1)
        return s, rounded(top_low - rivals_up.amax(-1)), rounded(top_high - rivals_down.amax(-1))
    # kind is "entropy" here: confidence_margin refused any other before calling
    def entropy(probs: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        # the sampler's Σ p log(p + 1e-10), the top token's term apart (its 1e-10 is below float32's spacing at 1)
        return (probs * torch.log(probs + 1e-10)).sum(-1) + head * torch.log(head)

    probs = log_probs.exp().masked_fill(rival.isinf(), 0.0)
    centre = entropy(probs, 1 / (1 + rest))
    return -torch.log(-centre), entropy(*extremes(1)), entropy(*extremes(-1))


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of x's float type at x: its distance to the next representable value up."""
    return torch.nextafter(x, torch.full_like(x, math.inf)) - x


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
