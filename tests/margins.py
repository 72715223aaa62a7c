"""Decision margins in plain numpy, one candidate at a time, from the rules ties.confidence_margin states
(its docstring and its constants' comments): the reference the samplers' margins are tested against."""
from __future__ import annotations

import math

import numpy as np

from sinklib.ties import NEAR_TIE
from sinklib.ties import LANE_SHARE, LOGIT_ROUNDING


def relative_gap(high: float, low: float) -> float:
    return (high - low) / (1 + abs(high))


def _extreme(logits: np.ndarray, shift: int) -> tuple[np.ndarray, float]:
    """(every rival's float32 probability, the top token's) with each logit gap to the top moved by
    shift × LOGIT_ROUNDING × (1 + gap) and, moved down, the rivals' mass in the sum short of LANE_SHARE."""
    top = int(np.argmax(logits))
    moved = np.zeros_like(logits)
    for j, value in enumerate(logits):
        if j != top:
            gap = logits[top] - value
            moved[j] = math.exp(-gap + shift * LOGIT_ROUNDING * (1 + gap))
    total = float(np.float32(1 + moved.sum() * ((1 - LANE_SHARE) if shift < 0 else 1)))
    return np.float32(moved / total).astype(np.float64), float(np.float32(1 / total))


def _entropy(probs: np.ndarray, head: float) -> float:
    return float(sum(p * math.log(p + 1e-10) for p in probs if p > 0)) + (head * math.log(head) if head > 0 else 0.0)


def bounds(logits, kind: str) -> tuple[float, float, float]:
    """(s, lowest, highest) of one position's confidence: s in its non-saturating space (log-odds of a probability,
    −log(1 − gap) of a probability gap, −log(−entropy) of an entropy)."""
    logits = np.asarray(logits, dtype=np.float64)
    top = int(np.argmax(logits))
    relative = np.array([0.0 if j == top else math.exp(v - logits[top]) for j, v in enumerate(logits)])
    rest = relative.sum()
    (up_rivals, low_head), (down_rivals, high_head) = _extreme(logits, 1), _extreme(logits, -1)
    if kind == "probability":
        return -math.log(rest), low_head, high_head
    if kind == "probability_gap":
        s = -math.log((rest + relative.max()) / (1 + rest))
        return s, float(np.float32(low_head - up_rivals.max())), float(np.float32(high_head - down_rivals.max()))
    probs = relative / (1 + rest)
    centre = _entropy(probs, 1 / (1 + rest))
    return (-math.log(-centre) if centre < 0 else math.inf), _entropy(up_rivals, low_head), _entropy(down_rivals, high_head)


def choice_margin(candidates: list[tuple[float, list]], count: int, kind: str | None) -> float:
    """candidates: (float32 confidence, logits row) of every open position, sorted by descending confidence as
    the sampler ranks them; the first `count` were chosen. kind None: the relative gap of the confidences."""
    if count == 0 or count >= len(candidates):
        return math.inf
    weakest, strongest = candidates[count - 1][0], candidates[count][0]
    if kind is None:
        return relative_gap(weakest, strongest)
    up = np.nextafter(np.float32(weakest), np.float32(np.inf))  # one rounding step up: the spacing at the next value
    step_up = float(np.float32(weakest) + (np.nextafter(up, np.float32(np.inf)) - up))
    spacing = float(np.nextafter(np.float32(strongest), np.float32(np.inf))) - strongest
    chosen = [bounds(row, kind) for value, row in candidates[:count] if value <= step_up]
    rejected = [bounds(row, kind) for value, row in candidates[count:] if value >= strongest - 2 * spacing]
    every = [v for b in chosen + rejected for v in b[1:]]
    if all(v == every[0] for v in every):
        return 0.0
    s_a, s_b = min(b[0] for b in chosen), max(b[0] for b in rejected)
    if math.isinf(s_a) or math.isinf(s_b):
        gap = 0.0 if s_a == s_b else math.inf
    else:
        gap = abs(s_a - s_b) / (1 + max(abs(s_a), abs(s_b)))
    if min(b[1] for b in chosen) > max(b[2] for b in rejected):
        return max(gap, 2 * NEAR_TIE)
    return min(gap, NEAR_TIE) if gap > 0 else NEAR_TIE
