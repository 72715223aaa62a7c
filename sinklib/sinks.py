"""Sink statistics (paper Eq. 3): pure functions on score tensors of any leading shape.

Scores are the attention a key *receives*: s_j = sum_i A_ij over query rows i ("sum units"; for a square
pass the mean over keys is exactly 1). The last dimension is always the key axis.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from sinklib.ties import relative_gap
from sinklib.validation import bad_value, check_choice, check_eps, check_int

UNITS = ("sum", "mean")


def as_scores(scores: Any, param: str = "scores") -> torch.Tensor:
    """A float tensor [..., keys] from a tensor, a numpy array or a (nested) list of numbers; anything else is
    refused naming the parameter. Integer inputs become float32."""
    if isinstance(scores, torch.Tensor):
        tensor = scores
    elif isinstance(scores, (np.ndarray, list, tuple)):
        try:
            tensor = torch.as_tensor(np.asarray(scores, dtype=np.float32))
        except (ValueError, TypeError):
            raise bad_value(param, type(scores).__name__, "a tensor, numpy array or rectangular list of numbers") from None
    else:
        raise bad_value(param, type(scores).__name__, "a tensor, numpy array or rectangular list of numbers [..., keys]")
    if tensor.dim() == 0 or tensor.shape[-1] == 0:
        raise bad_value(param, f"a tensor of shape {tuple(tensor.shape)}", "at least one key on the last axis")
    if not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)):
        raise bad_value(param, f"a {tensor.dtype} tensor", "a real-valued tensor")
    if tensor.is_floating_point() and bool(torch.isinf(tensor).any()):  # NaN marks an absent key; ±inf has no meaning
        raise bad_value(param, f"a tensor holding {float(tensor[torch.isinf(tensor)][0])}",
                        "finite scores (NaN for keys that do not count)")
    return tensor if tensor.is_floating_point() else tensor.float()


def _valid_mask(scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Where keys count: `valid` (default all) and never where the score is NaN — an autoregressive trace holds
    NaN for keys a step could not see."""
    present = ~torch.isnan(scores)
    if valid is None:
        return present
    if not isinstance(valid, torch.Tensor):
        valid = torch.as_tensor(np.asarray(valid, dtype=bool))
    valid = valid.to(torch.bool)
    try:
        return valid.expand_as(scores) & present
    except RuntimeError:
        raise bad_value("valid", tuple(valid.shape),
                        f"a bool tensor broadcastable to the scores' shape {tuple(scores.shape)}") from None


def in_units(
    scores: torch.Tensor, units: str = "sum", *, valid: torch.Tensor | None = None, n_queries: torch.Tensor | int | None = None
) -> torch.Tensor:
    """Scores expressed in `units`: "sum" returns them as given; "mean" divides by the number of query rows
    (the paper's (1/S)·Σ_i A_ij). n_queries defaults to the number of valid keys (a square pass)."""
    check_choice(units, "units", UNITS)
    scores = as_scores(scores).float()
    if units == "sum":
        return scores
    if n_queries is None:
        n_queries = _valid_mask(scores, valid).sum(-1, keepdim=True).clamp(min=1)
    elif isinstance(n_queries, torch.Tensor):
        n_queries = n_queries.to(scores.device).float().unsqueeze(-1)
    return scores / n_queries


def sink_margin(scores: torch.Tensor, *, valid: torch.Tensor | None = None) -> torch.Tensor:
    """s_j − mean_{k≠j} s_k over valid keys (same units as `scores`); −inf where j is invalid or alone.
    NaN scores count as invalid keys."""
    scores = as_scores(scores).float()
    valid = _valid_mask(scores, valid)
    zeroed = torch.where(valid, scores, torch.zeros_like(scores))
    total = zeroed.sum(-1, keepdim=True)
    n_valid = valid.sum(-1, keepdim=True)
    mean_others = (total - zeroed) / (n_valid - 1).clamp(min=1)
    margin = scores - mean_others
    return torch.where(valid & (n_valid > 1), margin, torch.full_like(margin, float("-inf")))


def find_sinks(
    scores: torch.Tensor,
    eps: float = 3.0,
    units: str = "sum",
    *,
    valid: torch.Tensor | None = None,
    n_queries: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """Eq. 3: key j is a sink when s_j > mean_{k≠j} s_k + eps.

    Args:
        scores: [..., keys] attention received per key, sum units (Σ over queries).
        eps: the threshold, in `units`.
        units: "sum" (the default) or "mean" (divided by the number of query rows, the paper's (1/S)·Σ_i A_ij).
        valid: optional bool [..., keys]; invalid keys (padding) are never sinks and do not enter the mean; NaN
            scores (keys a step could not see) are invalid too.
        n_queries: the query rows behind each row of scores, for units="mean" (an int or a tensor of scores' leading
            shape); None: the number of valid keys (a square pass).

    Returns:
        A bool tensor shaped like scores: True where the key is a sink.

    Raises:
        BadValue: eps not a finite number >= 0, an unknown units.
    """
    eps = check_eps(eps)
    check_choice(units, "units", UNITS)
    scores = as_scores(scores)
    valid = _valid_mask(scores, valid)
    return sink_margin(in_units(scores, units, valid=valid, n_queries=n_queries), valid=valid) > eps


def top_sinks(
    scores: torch.Tensor,
    k: int,
    eps: float = 3.0,
    units: str = "sum",
    *,
    valid: torch.Tensor | None = None,
    threshold: bool = True,
) -> torch.Tensor:
    """Positions of the k highest-scoring sinks along the last axis, best first, padded with −1.

    Args:
        scores: [..., keys] attention received per key, sum units.
        k: how many sinks, 0 ≤ k ≤ keys.
        eps: Eq. 3's threshold, in `units`.
        units: "sum" or "mean", as for find_sinks.
        valid: optional bool [..., keys]: the keys that may be chosen.
        threshold: True (the paper): only keys passing Eq. 3 are eligible, so a row may hold fewer than k; False:
            the top-k valid keys regardless of eps. Ties go to the lower position.

    Returns:
        int64 [..., k]: key positions, −1 where a row has fewer than k eligible keys.
    """
    eps = check_eps(eps)
    scores = as_scores(scores)
    check_int(k, "k", 0, scores.shape[-1])
    eligible = find_sinks(scores, eps, units, valid=valid) if threshold else _valid_mask(scores, valid)
    if k == 0:
        return torch.empty(*scores.shape[:-1], 0, dtype=torch.long, device=scores.device)
    ranked = torch.where(eligible, scores.float(), torch.full_like(scores, float("-inf"), dtype=torch.float32))
    values, positions = ranked.sort(dim=-1, descending=True, stable=True)  # ties: lower position first
    values, positions = values[..., :k], positions[..., :k]
    return torch.where(torch.isfinite(values), positions, torch.full_like(positions, -1))


EXACTLY_ON_THRESHOLD = 1e-12  # selection_margin of an Eq. 3 test landing exactly on eps: a near-tie, not a tie


def selection_margin(
    scores: torch.Tensor,
    k: int,
    eps: float = 3.0,
    units: str = "sum",
    *,
    valid: torch.Tensor | None = None,
    threshold: bool = True,
) -> torch.Tensor:
    """float64 [...]: how close top_sinks(scores, k, ...) came to choosing other keys, relative (ties.relative_gap's
    scale): the gap between the k-th and (k+1)-th eligible keys' scores, and with threshold=True each of the top
    k+1 keys' Eq. 3 test, |s_j − mean_{k≠j} s_k − eps| / (1 + |s_j|) (only they can enter or leave the choice: the
    test is monotone in s_j). The smallest above 0; +inf where nothing could change the choice. Two scores exactly
    equal (masked keys, all 0) are an exact tie, broken by position the same on every CPU; a test exactly on eps
    counts as EXACTLY_ON_THRESHOLD."""
    scores = as_scores(scores)
    valid = _valid_mask(scores, valid)
    n = min(k + 1, scores.shape[-1])
    inf = torch.full(scores.shape[:-1], float("inf"), dtype=torch.float64, device=scores.device)
    if k == 0 or n == 0:
        return inf
    scaled = in_units(scores, units, valid=valid)
    margin = sink_margin(scaled, valid=valid)  # −inf for invalid keys
    top_margin, order = margin.topk(n, dim=-1)  # the top k+1 by score: the margin is monotone in the score
    top_scores = scaled.float().gather(-1, order)
    gaps = []
    if threshold:  # a test exactly on eps is no exact tie (rounding may put it either side): the closest near-tie
        tested = (top_margin.double() - eps).abs() / (1 + top_scores.double().abs())
        gaps.append(tested.clamp(min=EXACTLY_ON_THRESHOLD))
    if n == k + 1:  # the k-th and (k+1)-th keys, where both are eligible
        both = (top_margin[..., k] > eps) | (not threshold)
        rank = relative_gap(top_scores[..., k - 1], top_scores[..., k])
        gaps.append(torch.where(both & torch.isfinite(top_margin[..., k]), rank, inf)[..., None])
    gaps = torch.cat(gaps, dim=-1)
    return torch.where(torch.isfinite(gaps) & (gaps > 0), gaps, torch.full_like(gaps, float("inf"))).amin(-1)


@dataclass(frozen=True)
class SinkRule:
    """The sink rule (Eq. 3) as one value: key j is a sink when s_j > mean_{k≠j} s_k + eps.

    Checked when made, so a bad eps or units is refused before any model runs.

    Attributes:
        eps: the threshold, in `units` (the paper's 3, in sum units).
        units: "sum" (Σ over queries; mean 1 over keys for a square pass) or "mean" (divided by the query rows).
    """

    eps: float = 3.0
    units: str = "sum"

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", check_eps(self.eps))
        check_choice(self.units, "units", UNITS)

    def find(self, scores: torch.Tensor, *, valid: torch.Tensor | None = None,
             n_queries: torch.Tensor | int | None = None) -> torch.Tensor:
        """bool, shaped like scores [..., keys]: the sinks under this rule (find_sinks)."""
        return find_sinks(scores, self.eps, self.units, valid=valid, n_queries=n_queries)

    def top(self, scores: torch.Tensor, k: int, *, valid: torch.Tensor | None = None, threshold: bool = True) -> torch.Tensor:
        """int64 [..., k]: positions of the k strongest sinks under this rule, best first, −1-padded (top_sinks)."""
        return top_sinks(scores, k, self.eps, self.units, valid=valid, threshold=threshold)

    def selection_margin(self, scores: torch.Tensor, k: int, *, valid: torch.Tensor | None = None,
                         threshold: bool = True) -> torch.Tensor:
        """float64 [...]: how close `top` came to choosing other keys (selection_margin)."""
        return selection_margin(scores, k, self.eps, self.units, valid=valid, threshold=threshold)

    def share(self, scores: torch.Tensor | Sequence[torch.Tensor], *, valid: torch.Tensor | None = None) -> float:
        """The share of valid tokens this rule selects (one row of threshold_sweep)."""
        return float(threshold_sweep(scores, [self.eps], self.units, valid=valid)["share"].iloc[0])


def positions_to_mask(positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Turn [..., k] positions (−1 = none) into a bool [..., n_keys] mask."""
    mask = torch.zeros(*positions.shape[:-1], n_keys + 1, dtype=torch.bool, device=positions.device)
    mask.scatter_(-1, torch.where(positions < 0, n_keys, positions), True)
    return mask[..., :n_keys]


def threshold_sweep(
    scores: torch.Tensor | Sequence[torch.Tensor],
    eps_values: Sequence[float],
    units: str = "sum",
    *,
    valid: torch.Tensor | None = None,
) -> pd.DataFrame:
    """Share of (valid) tokens that Eq. 3 selects, for each eps (paper Fig. 10).

    Args:
        scores: one tensor [..., keys], or a list of them (sequences of different lengths), pooled; sum units.
        eps_values: the thresholds to try, in `units`.
        units: "sum" or "mean", as for find_sinks.
        valid: optional bool [..., keys] for a single tensor of scores.

    Returns:
        A tidy DataFrame with columns eps, units, selected, tokens, share (= selected / tokens), one row per eps.
    """
    check_choice(units, "units", UNITS)
    if len(eps_values) == 0:
        raise bad_value("eps_values", list(eps_values), "a non-empty sequence of finite numbers >= 0")
    eps_list = [check_eps(e, "eps_values[]") for e in eps_values]
    several = isinstance(scores, (list, tuple)) and scores and isinstance(scores[0], (torch.Tensor, np.ndarray))
    parts = [as_scores(part, "scores[]") for part in scores] if several else [as_scores(scores)]
    if valid is not None and len(parts) > 1:
        raise bad_value("valid", "a tensor", "None when scores is a list (mark invalid keys with NaN instead)")
    margins, tokens = [], 0
    for part in parts:
        part_valid = valid if valid is not None else ~torch.isnan(part)
        margins.append(sink_margin(in_units(torch.nan_to_num(part), units, valid=part_valid), valid=part_valid).flatten())
        tokens += int(_valid_mask(part, part_valid).sum())
    margin = torch.cat(margins)
    rows = []
    for eps in eps_list:
        selected = int((margin > eps).sum())
        rows.append({"eps": eps, "units": units, "selected": selected, "tokens": tokens, "share": selected / max(tokens, 1)})
    return pd.DataFrame(rows)


def single_row_scores(row: torch.Tensor, n_keys: torch.Tensor | int) -> torch.Tensor:
    """One query row's attention (it sums to 1: an autoregressive decoding step with a KV cache) in the sum units
    of a square pass (mean 1 over keys): × its number of keys. Unscaled, Eq. 3 with ε = 3 could never fire on it,
    so every autoregressive decoding row is scaled this way before Eq. 3. n_keys broadcasts against row's leading
    dimensions."""
    return row * n_keys


def uniform_scores(allowed: torch.Tensor) -> torch.Tensor:
    """Scores a uniform attention pattern would give under the same mask (the baseline a causal model must
    beat): each query row spreads 1 evenly over its allowed keys. allowed: bool [..., queries, keys] →
    [..., keys], sum units."""
    allowed = allowed.to(torch.bool)
    per_row = allowed.sum(-1, keepdim=True).clamp(min=1)
    return (allowed.float() / per_row).sum(-2)


def causal_uniform_scores(n: int) -> torch.Tensor:
    """The scores a uniform causal attention gives (the baseline of Fig. 10): s_j = Σ_{i≥j} 1/(i+1).

    Args:
        n: sequence length, at least 1.

    Returns:
        float32 [n]: the score of each key, sum units.
    """
    check_int(n, "n", 1)
    return uniform_scores(torch.ones(n, n, dtype=torch.bool).tril())
