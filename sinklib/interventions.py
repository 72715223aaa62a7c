"""Which keys to mask at an attention call. The capture asks `keys_to_mask(call)` before each call and
tells `observe(call, stats)` what was computed; masked keys get logit −∞ for every query of that
(batch, layer, head), so they receive exactly 0 attention and the rest renormalises."""
from __future__ import annotations

import re
from typing import Sequence

import torch

from sinklib._checks import bad_value, check_choice, check_eps, check_int
from sinklib.attention_math import AttentionStats
from sinklib.capture import AttentionCall
from sinklib.layers import AttentionLayer
from sinklib.sinks import positions_to_mask, single_row_scores, top_sinks


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class Intervention:
    """Base policy: masks nothing. Subclasses override keys_to_mask and, if they need history, observe.
    Settings live in public attributes, state in attributes starting with "_" (see __repr__)."""

    def __repr__(self) -> str:
        """The class and its public settings in the order they were set: what saved runs record and compare,
        so a policy without a __repr__ of its own still resumes (the default object repr is a memory address)."""
        settings = ", ".join(f"{name}={value!r}" for name, value in vars(self).items() if not name.startswith("_"))
        return f"{type(self).__name__}({settings})"

    def reset(self) -> None:
        """Forget all state; called when a capture starts."""

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """Refuse, before any forward runs, settings this model (its attention layers) or this run (n_steps
        forwards; None when unknown) could never apply — an out-of-range layer would otherwise mask nothing."""

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """bool [batch, heads, keys] (or broadcastable), or None for nothing."""
        return None

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        """Sees the statistics of the call as it ran (with this intervention's masking applied)."""


def identity(intervention) -> str:
    """The text a resumable run records for `intervention` and compares on resume (its repr); refused, before
    any work, where that text names a memory address: it differs in every process, so the run could never resume."""
    text = repr(intervention)
    if _ADDRESS.search(text):
        raise ValueError(f"intervention={text} is not allowed: its repr names a memory address, which differs in every "
                         "process, so a saved run could never be resumed or compared; give the policy a __repr__ of its "
                         "settings, or keep them in public attributes (Intervention's own __repr__ lists those)")
    return text


def key_normalised(stats: AttentionStats, rows: str) -> torch.Tensor:
    """Scores rescaled so their mean over valid keys is 1, which is exactly the sum units of a square pass.

    rows="all": Σ over queries × (valid keys / counted queries); rows="last": the last query's row × valid
    keys — the paper's choice for an autoregressive model with a KV cache, where a single row sums to 1
    and Eq. 3 with ε = 3 could never fire on it unscaled (SPEC §3)."""
    n_valid = stats.key_valid.sum(-1).float()  # [B]
    if rows == "last":
        return single_row_scores(stats.last_row, n_valid[:, None, None])
    factor = n_valid / stats.query_count.clamp(min=1)
    return stats.scores * factor[:, None, None]


def _fit_keys(mask: torch.Tensor, n_keys: int) -> torch.Tensor:
    """A mask chosen at an earlier step, fitted to this call's keys (a KV cache adds keys at the end)."""
    width = mask.shape[-1]
    if width >= n_keys:
        return mask[..., :n_keys]
    return torch.nn.functional.pad(mask, (0, n_keys - width), value=False)


class MaskSinks(Intervention):
    """Mask the top-K sinks of each (batch, layer, head).

    source:
      "previous_step" (the paper): sinks found with Eq. 3 on the attention step t−1 actually computed —
          itself masked when masking is on — are masked at step t. Step 0 masks nothing; a head without
          sinks masks nothing. Because a masked key receives ~0 at t, it is rarely re-selected for t+1.
      "previous_step_clean": as above, but step t−1's sinks are read from that layer's attention without
          the mask (same q and k, mask lifted), so masking does not hide the sinks it removed.
      "same_step": a clean pass of this very call picks the keys, the masked pass uses them.
    rows: "all" (column sums, the DLM setting) or "last" (the last query row, the ARM setting).
    threshold: True applies Eq. 3 with eps; False takes the top-K keys regardless of eps.
    """

    SOURCES = ("previous_step", "previous_step_clean", "same_step")
    ROWS = ("all", "last")

    def __init__(self, top_k: int, eps: float = 3.0, source: str = "previous_step", rows: str = "all", threshold: bool = True) -> None:
        self.top_k = check_int(top_k, "top_k", 0)
        self.eps = check_eps(eps)
        self.source = check_choice(source, "source", self.SOURCES)
        self.rows = check_choice(rows, "rows", self.ROWS)
        self.threshold = bool(threshold)
        self._chosen: dict[int, tuple[int, torch.Tensor]] = {}

    def __repr__(self) -> str:
        return (f"MaskSinks(top_k={self.top_k}, eps={self.eps}, source={self.source!r}, rows={self.rows!r}, "
                f"threshold={self.threshold})")

    def reset(self) -> None:
        self._chosen = {}

    def select(self, stats: AttentionStats) -> torch.Tensor:
        """bool [batch, heads, keys]: the top-K sinks of these statistics under this policy's rule."""
        scores = key_normalised(stats, self.rows)
        k = min(self.top_k, scores.shape[-1])
        positions = top_sinks(scores, k, self.eps, valid=stats.key_valid[:, None, :], threshold=self.threshold)
        return positions_to_mask(positions, scores.shape[-1])

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        if self.top_k == 0:
            return None
        if self.source == "same_step":
            return self.select(call.clean_stats())
        chosen = self._chosen.get(call.layer)
        if chosen is None or chosen[0] != call.step - 1:
            return None
        return _fit_keys(chosen[1], call.n_keys)

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        if self.top_k == 0 or self.source == "same_step":
            return
        source_stats = call.clean_stats() if self.source == "previous_step_clean" else stats
        self._chosen[call.layer] = (call.step, self.select(source_stats))


class MaskRandomKeys(Intervention):
    """Control: mask k keys drawn uniformly among the valid keys of each (batch, layer, head), from step
    `start_step` on (1 by default, like MaskSinks). Draws depend only on (seed, step, layer)."""

    def __init__(self, k: int, seed: int = 0, start_step: int = 1) -> None:
        self.k = check_int(k, "k", 0)
        self.seed = check_int(seed, "seed", 0)
        self.start_step = check_int(start_step, "start_step", 0)

    def __repr__(self) -> str:
        return f"MaskRandomKeys(k={self.k}, seed={self.seed}, start_step={self.start_step})"

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        if n_steps is not None and self.k and self.start_step >= n_steps:
            raise bad_value("start_step", self.start_step, f"< {n_steps}, the number of forwards this run makes "
                            "(from start_step on keys are masked; later than the last step masks nothing)")

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        if self.k == 0 or call.step < self.start_step:
            return None
        valid = call.clean_stats().key_valid[:, None, :].cpu()
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + call.step * 10_007 + call.layer)
        draws = torch.rand(call.batch, call.heads, call.n_keys, generator=generator)
        draws = torch.where(valid, draws, torch.full_like(draws, -1.0))
        values, positions = draws.topk(min(self.k, call.n_keys), dim=-1)
        positions = torch.where(values >= 0, positions, torch.full_like(positions, -1))
        return positions_to_mask(positions, call.n_keys).to(call.device)


class MaskKeys(Intervention):
    """Mask an explicit list of key positions for every query, optionally only in some layers, heads and
    steps (None = all)."""

    def __init__(self, positions: Sequence[int], layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, steps: Sequence[int] | None = None) -> None:
        if isinstance(positions, torch.Tensor):
            positions = positions.tolist()
        self.positions = [check_int(p, "positions[]", 0) for p in positions]
        self.layers = None if layers is None else {check_int(x, "layers[]", 0) for x in layers}
        self.heads = None if heads is None else [check_int(x, "heads[]", 0) for x in heads]
        self.steps = None if steps is None else {check_int(x, "steps[]", 0) for x in steps}

    def __repr__(self) -> str:
        return f"MaskKeys(positions={self.positions}, layers={self.layers}, heads={self.heads}, steps={self.steps})"

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        too_deep = sorted(x for x in self.layers or () if x >= len(layers))
        if too_deep:
            raise bad_value("layers", too_deep, f"layer indices < {len(layers)} (this model's attention layers)")
        known = [layer.n_heads for layer in layers if layer.n_heads is not None]
        bad_heads = sorted(h for h in self.heads or () if known and h >= min(known))
        if bad_heads:
            raise bad_value("heads", bad_heads, f"head indices < {min(known)} (heads per attention layer)")
        late = sorted(x for x in self.steps or () if n_steps is not None and x >= n_steps)
        if late:
            raise bad_value("steps", late, f"step indices < {n_steps}, the number of forwards this run makes")

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        if (self.layers is not None and call.layer not in self.layers) or (self.steps is not None and call.step not in self.steps):
            return None
        too_far = [p for p in self.positions if p >= call.n_keys]
        if too_far:
            raise bad_value("positions", too_far, f"key positions < {call.n_keys} (the number of keys in {call.layer_name})")
        mask = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool, device=call.device)
        heads = self.heads if self.heads is not None else list(range(call.heads))
        bad_heads = [h for h in heads if h >= call.heads]
        if bad_heads:
            raise bad_value("heads", bad_heads, f"head indices < {call.heads}")
        mask[:, heads, :] = positions_to_mask(torch.tensor(self.positions or [-1], device=call.device), call.n_keys)
        return mask
