"""Near-ties: how close each sampler decision came to going the other way on another CPU, in one place.

Two CPUs compute logits that agree to a few float32 roundings (benchmarks/cpu_rounding_bound.py measures how
few). Where a sampler's choice — the argmax token, the top-k confident positions — is decided by less than that,
another CPU may choose differently and the canvas differs from that step on. Samplers note each forward's margin
(note_decisions, inside recording_decisions); a margin of 0 is an exact tie (a fixed order breaks it the same way
everywhere), one in (0, NEAR_TIE] a near-tie, anything larger a decision every CPU makes the same way. A policy
that picks keys from the attention (interventions.MaskSinks) notes how close its pick came to other keys
(note_selection) when the pick is applied, and that forward's margin is the closer of the two: another CPU may mask
other keys, and decide otherwise at a step whose sampler margin is wide (tiny-dream with its top-2 sinks masked:
a step decided at 0.002 on one CPU, 0.00086 on another). The summary
marks models with near-ties, the evaluation runner writes each generation's closest margin, and sinklib.lab.agreement
excuses a rerun only where both runs decided a parting step within NEAR_TIE.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable, Iterator

import torch

from sinklib.validation import BadValue

NEAR_TIE = 1e-3  # a margin at most this (and above 0) is a decision another CPU could take the other way
NEAR_TIE_MARK = "≈"  # what a result decided at a near-tie is labelled with ("<model> ≈"), wherever it is shown


# --- what counts as a near-tie ----------------------------------------------------------------------------------
def is_near_tie(margin: float | None) -> bool:
    """A decision another CPU could decide the other way: a margin above 0 and at most NEAR_TIE. An exact tie (0:
    two confidences equal in float32, typically both saturated at 1.0) is not one: a fixed order (the lower index)
    breaks it, the same on every CPU. NaN (a sampled decision) and None (no margin recorded) are not either."""
    return margin is not None and math.isfinite(margin) and 0.0 < margin <= NEAR_TIE


def closest_margin(margins) -> float:
    """The smallest margin another CPU could act on: the smallest finite margin above 0 (exact ties are broken the
    same everywhere), +inf when every decision was an exact tie or unopposed, NaN when there is none."""
    finite = [float(m) for m in margins if m is not None and math.isfinite(float(m))]
    if not finite:
        return float("nan")
    return min((m for m in finite if m > 0.0), default=float("inf"))


def both_near_tie(margin_a: float, margin_b: float) -> bool:
    """Two runs that parted at a step both decided it within NEAR_TIE, and not both by an exact tie (0 in both: a
    fixed order decides the same everywhere; 0 in one run only: rounding moved the values off the tie — a near-tie)."""
    margins = (margin_a, margin_b)
    return all(math.isfinite(m) and 0.0 <= m <= NEAR_TIE for m in margins) and max(margins) > 0.0


def smallest_margin(trace) -> float | None:
    """The closest decision of the generation another CPU could act on (closest_margin over
    Trace.margins: exact ties, broken by a fixed order everywhere, do not count): above float rounding, another CPU
    writes the same output; None where no margin was recorded or a decision was sampled."""
    if trace.margins is None or not len(trace.margins) or bool(trace.margins.isnan().any()):
        return None
    return closest_margin(trace.margins.flatten().tolist())


# --- the margins samplers note, and how they are measured ------------------------------------------------------
_DECISIONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("sinklib_decisions", default=None)
_SELECTIONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("sinklib_selections", default=None)


@contextlib.contextmanager
def recording_decisions() -> Iterator[list[torch.Tensor]]:
    """Collect the margins samplers note inside this block: one float64 tensor [batch] per forward, each the closer
    of the sampler's decision and the key selections policies noted during that forward."""
    margins: list[torch.Tensor] = []
    tokens = _DECISIONS.set(margins), _SELECTIONS.set([])
    try:
        yield margins
    finally:
        _DECISIONS.reset(tokens[0])
        _SELECTIONS.reset(tokens[1])


def note_selection(margins: torch.Tensor) -> None:
    """Record how close a policy's choice of keys, applied in this forward, came to other keys: [batch] (or [k ×
    batch], e.g. a guided forward's doubled batch), relative, +inf where nothing could change it (a no-op outside
    recording_decisions)."""
    pending = _SELECTIONS.get()
    if pending is not None:  # kept where it was computed: one copy to the CPU per forward (note_decisions), not per layer
        pending.append(margins.detach().double().reshape(-1))


def note_decisions(margins: torch.Tensor) -> None:
    """Record this forward's decision margin per row, the closer of it and the selections noted since the last
    forward's (a no-op outside recording_decisions). A sampled decision (NaN) stays NaN."""
    log = _DECISIONS.get()
    if log is None:
        return
    margins = margins.detach().to("cpu", torch.float64)
    pending = _SELECTIONS.get()
    if pending:
        rows = margins.numel()
        closest = torch.stack([_per_row(selection, rows) for selection in pending]).amin(0).to("cpu")
        margins = torch.minimum(margins, closest.reshape(margins.shape))
        pending.clear()
    log.append(margins)


def _per_row(selection: torch.Tensor, rows: int) -> torch.Tensor:
    """A noted selection as one margin per decision row: its [k × rows] entries' closest per row, or, where its
    batch is not the decisions' (no such sampler is known), its closest entry for every row."""
    if selection.numel() and selection.numel() % rows == 0:
        return selection.reshape(-1, rows).amin(0)
    return selection.amin().expand(rows) if selection.numel() else \
        torch.full((rows,), math.inf, dtype=torch.float64, device=selection.device)


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
    if kind not in CONFIDENCE_KINDS:
        raise BadValue(f"kind={kind!r} is not allowed: choose one of {CONFIDENCE_KINDS}")
    if bool(logits_a.isnan().any() or logits_b.isnan().any()) or not (logits_a.isfinite().any(-1).all() and
                                                                        logits_b.isfinite().any(-1).all()):
        return float("nan")  # NaN logits, or a row with no finite logit: no decision to measure, never a near-tie
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
