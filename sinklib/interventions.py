"""Which keys to mask at an attention call. The capture asks `keys_to_mask(call)` before each call and
tells `observe(call, stats)` what was computed; masked keys get logit −∞ for every query of that
(batch, layer, head), so they receive exactly 0 attention and the rest renormalises.

Value-path ablation (`AblateValues`) is the other way to take a key out: the capture also asks
`values_to_ablate(call)`, and the keys it names keep their attention while their value vectors are zeroed or
replaced by the head's mean value — what the head reads from them is removed, where they sit in the softmax is not.
`Audited` wraps any policy and keeps what its masking did to the attention (the masked keys' score with the mask
lifted and as it ran)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import torch

from sinklib.validation import BadValue, Count, bad_value, check_choice, check_eps, check_int, check_value
from sinklib.attention_math import AttentionStats
from sinklib.digest import digest
from sinklib.capturing import AttentionCall, check_intervention
from sinklib.layers import AttentionLayer
from sinklib.registry import Registry
from sinklib.sinks import SinkRule, positions_to_mask, single_row_scores
from sinklib.ties import note_selection


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class Intervention:
    """Base policy: masks nothing. Subclasses override keys_to_mask and, if they need history, observe.

    Settings live in public attributes, state in attributes starting with "_" (see __repr__). The built-in policies
    are frozen dataclasses: their settings are their fields, compared and hashed by value. A policy is given to
    sinklib.capture, generate, evaluate or masking_table as `intervention`.
    """

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

    def values_to_ablate(self, call: AttentionCall) -> tuple[torch.Tensor, str] | None:
        """(bool [batch, heads, keys], "zero" or "mean"): keys whose value vectors are replaced at this call while
        they keep their attention; None for nothing (every masking policy)."""
        return None

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        """Sees the statistics of the call as it ran (with this intervention's masking applied)."""


def identity(intervention) -> str:
    """The text a resumable run records for `intervention` and compares on resume (its repr); refused, before
    any work, where that text names a memory address: it differs in every process, so the run could never resume."""
    text = repr(intervention)
    if _ADDRESS.search(text):
        raise BadValue(f"intervention={text} is not allowed: its repr names a memory address, which differs in every "
                       "process, so a saved run could never be resumed or compared; give the policy a __repr__ of its "
                       "settings, or keep them in public attributes (Intervention's own __repr__ lists those)")
    return text


def key_normalised(stats: AttentionStats, rows: str) -> torch.Tensor:
    """Scores rescaled so their mean over valid keys is 1, which is exactly the sum units of a square pass.

    rows="all": Σ over queries × (valid keys / counted queries); rows="last": the last query's row × valid
    keys — the paper's choice for an autoregressive model with a KV cache, where a single row sums to 1
    and Eq. 3 with ε = 3 could never fire on it unscaled."""
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


def _settle(policy: Intervention, **checked) -> None:
    """Write checked settings into a frozen policy (its __post_init__ normalises what the caller gave)."""
    for name, value in checked.items():
        object.__setattr__(policy, name, value)


@dataclass(frozen=True)
class MaskSinks(Intervention):
    """Mask the top-K sinks of each (batch, layer, head): the paper's Table 1 intervention.

    Attributes:
        top_k: how many sinks to mask per (batch, layer, head), at least 0; a head with fewer sinks masks fewer.
        eps: Eq. 3's threshold, sum units.
        source: where the sinks are read:
            "previous_step" (the paper): found with Eq. 3 on the attention step t−1 actually computed — itself
            masked when masking is on — and masked at step t. Step 0 masks nothing; a head without sinks masks
            nothing. Because a masked key receives ~0 at t, it is rarely re-selected for t+1.
            "previous_step_clean": as above, but step t−1's sinks are read from that layer's attention without the
            mask (same q and k, mask lifted), so masking does not hide the sinks it removed.
            "same_step": a clean pass of this very call picks the keys, the masked pass uses them.
        rows: "all" (column sums, the diffusion setting) or "last" (the last query row, the autoregressive setting).
        threshold: True applies Eq. 3 with eps; False takes the top-K keys regardless of eps.
        layers: mask only in these layers (None: every layer); sinks are found in all.
        steps: mask only at these steps (None: every step), e.g. range(0, 8): early steps only.
    """

    SOURCES = ("previous_step", "previous_step_clean", "same_step")  # class constants, not fields
    ROWS = ("all", "last")

    top_k: int
    eps: float = 3.0
    source: str = "previous_step"
    rows: str = "all"
    threshold: bool = True
    layers: tuple[int, ...] | None = None  # mask only in these layers (None: every layer); sinks are found in all
    steps: tuple[int, ...] | None = None  # mask only at these steps (None: every step), e.g. range(0, 8): early
    _chosen: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # layer → (step, keys, margin)

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, bool):
            raise bad_value("threshold", self.threshold, "True or False")
        _settle(self, top_k=check_int(self.top_k, "top_k", 0), eps=check_eps(self.eps),
                source=check_choice(self.source, "source", self.SOURCES),
                rows=check_choice(self.rows, "rows", self.ROWS), layers=_index_set(self.layers, "layers[]"),
                steps=_index_set(self.steps, "steps[]"))

    def __repr__(self) -> str:
        """The settings; layers and steps only where restricted (so unrestricted runs keep the identity they had)."""
        shown = {name: getattr(self, name) for name in ("top_k", "eps", "source", "rows", "threshold")}
        shown.update({name: getattr(self, name) for name in ("layers", "steps") if getattr(self, name) is not None})
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """Refuse layer or step indices this model or run does not have (they would mask nothing)."""
        _check_layers_steps(self.layers, self.steps, layers, n_steps)

    @property
    def rule(self) -> SinkRule:
        """The Eq. 3 rule this policy picks sinks with (sum units after key normalisation)."""
        return SinkRule(self.eps)

    def reset(self) -> None:
        """Forget the sinks chosen at earlier steps."""
        self._chosen.clear()

    def select(self, stats: AttentionStats) -> torch.Tensor:
        """bool [batch, heads, keys]: the top-K sinks of these statistics under this policy's rule."""
        return self._choose(stats)[0]

    def _choose(self, stats: AttentionStats) -> tuple[torch.Tensor, torch.Tensor]:
        """(select's mask, float64 [batch]: how close the choice came to other keys over the heads, relative
        (sinks.selection_margin): what the forward that applies it notes, ties.note_selection)."""
        scores = key_normalised(stats, self.rows)
        k = min(self.top_k, scores.shape[-1])
        valid = stats.key_valid[:, None, :]
        positions = self.rule.top(scores, k, valid=valid, threshold=self.threshold)
        margin = self.rule.selection_margin(scores, k, valid=valid, threshold=self.threshold).amin(-1)
        return positions_to_mask(positions, scores.shape[-1]), margin

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """bool [batch, heads, keys]: "same_step", the top-K sinks of a clean pass of this call; otherwise those this
        layer chose at step t−1 (fitted to this call's keys). None with top_k=0 or when this layer recorded no
        choice at step t−1 (step 0, for one)."""
        if self.top_k == 0 or not self.applies(call):
            return None
        if self.source == "same_step":
            keys, margin = self._choose(call.clean_stats())
            note_selection(margin)
            return keys
        chosen = self._chosen.get(call.layer)
        if chosen is None or chosen[0] != call.step - 1:
            return None
        note_selection(chosen[2])  # another CPU may have chosen other keys at step t−1: this forward's decisions
        return _fit_keys(chosen[1], call.n_keys)

    def applies(self, call: AttentionCall) -> bool:
        """Whether this call's layer and step are among those the policy masks."""
        return (self.layers is None or call.layer in self.layers) and (self.steps is None or call.step in self.steps)

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        """Choose this layer's top-K sinks for the next step from the call as it ran ("previous_step") or from its
        clean pass ("previous_step_clean"); nothing for "same_step" or top_k=0."""
        if self.top_k == 0 or self.source == "same_step":
            return
        source_stats = call.clean_stats() if self.source == "previous_step_clean" else stats
        self._chosen[call.layer] = (call.step, *self._choose(source_stats))


@dataclass(frozen=True)
class MaskRandomKeys(Intervention):
    """Control: mask k keys drawn uniformly among the valid keys of each (batch, layer, head).

    The draw is a function of the seed, the problem (its prompt's token ids: AttentionCall.rows), the step and the
    layer alone: a problem's keys are the same batched with any others, at any batch position or padding (under a
    bare sinklib.capture, where no prompt is known, a row's index in the batch stands for its problem). Each head
    draws among the row's own keys, counted from its first real one.

    Attributes:
        k: keys masked per (batch, layer, head), at least 0.
        seed: the draw's seed; the random-key control over several draws is this policy at seeds 0, 1, 2, ….
        start_step: the first step that masks (1 by default, like MaskSinks, which has no previous step at 0).
        draws: how the keys are drawn: "by problem", as above (the only way; named in the policy's identity, which
            is in a run's key, because earlier versions drew for a whole batch at once, so that a problem's keys
            depended on the batch it was in: their runs are other runs).
    """

    k: int
    seed: int = 0
    start_step: int = 1
    draws: str = "by problem"

    def __post_init__(self) -> None:
        _settle(self, k=check_int(self.k, "k", 0), seed=check_int(self.seed, "seed", 0),
                start_step=check_int(self.start_step, "start_step", 0),
                draws=check_choice(self.draws, "draws", ("by problem",)))

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """Refuse a start_step at or after the run's last forward (with k > 0): it would mask nothing."""
        if n_steps is not None and self.k and self.start_step >= n_steps:
            raise bad_value("start_step", self.start_step, f"< {n_steps}, the number of forwards this run makes "
                            "(from start_step on keys are masked; later than the last step masks nothing)")

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """bool [batch, heads, keys]: k valid keys drawn per (batch, head) (all of them where fewer are valid);
        None with k=0 or before start_step."""
        if self.k == 0 or call.step < self.start_step:
            return None
        valid = call.clean_stats().key_valid.cpu()
        chosen = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool)
        for row, problem in enumerate(call.rows if call.rows is not None else range(call.batch)):
            keys = valid[row].nonzero().squeeze(-1)  # the row's own keys, in order
            generator = torch.Generator().manual_seed(int(digest([self.seed, problem, call.step, call.layer]), 16))
            drawn = torch.rand(call.heads, len(keys), generator=generator).topk(min(self.k, len(keys)), dim=-1).indices
            chosen[row, torch.arange(call.heads)[:, None], keys[drawn]] = True
        return chosen.to(call.device)


def _check_layers_steps(chosen_layers, chosen_steps, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
    too_deep = sorted(x for x in chosen_layers or () if x >= len(layers))
    if too_deep:
        raise bad_value("layers", too_deep, f"layer indices < {len(layers)} (this model's attention layers)")
    late = sorted(x for x in chosen_steps or () if n_steps is not None and x >= n_steps)
    if late:
        raise bad_value("steps", late, f"step indices < {n_steps}, the number of forwards this run makes")


def _index_list(values: Sequence[int] | None, param: str, optional: bool = True) -> tuple[int, ...] | None:
    """None (every one; where `optional`), or a non-empty sequence of integers >= 0 as a tuple: an empty one would
    select nothing, so the policy would mask nothing and a masked condition run unmasked."""
    if values is None and optional:
        return None
    items = None if values is None else list(values.tolist() if isinstance(values, torch.Tensor) else values)
    if not items:
        name = param.removesuffix("[]")
        every = ", or None for every one" if optional else ""
        raise bad_value(name, values, f"a non-empty sequence of integers >= 0{every} (an empty {name} masks nothing)")
    return tuple(check_int(x, param, 0) for x in items)


def _index_set(values: Sequence[int] | None, param: str) -> tuple[int, ...] | None:
    return None if values is None else tuple(sorted(set(_index_list(values, param))))


@dataclass(frozen=True)
class MaskKeys(Intervention):
    """Mask an explicit list of key positions for every query.

    Attributes:
        positions: the key positions to mask (canvas positions, 0-based).
        layers: only in these layers (None: all).
        heads: only in these heads (None: all).
        steps: only at these steps (None: all). Each is given as any sequence and kept as a tuple, so the policy is
            hashable.
    """

    positions: tuple[int, ...]
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    steps: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _settle(self, positions=_index_list(self.positions, "positions[]", optional=False),
                layers=_index_set(self.layers, "layers[]"), heads=_index_list(self.heads, "heads[]"),
                steps=_index_set(self.steps, "steps[]"))

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """Refuse layer, head or step indices this model (its attention layers) or this run (n_steps forwards)
        does not have."""
        _check_layers_steps(self.layers, self.steps, layers, n_steps)
        known = [layer.n_heads for layer in layers if layer.n_heads is not None]
        bad_heads = sorted(h for h in self.heads or () if known and h >= min(known))
        if bad_heads:
            raise bad_value("heads", bad_heads, f"head indices < {min(known)} (heads per attention layer)")

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """bool [batch, heads, keys]: the positions masked in the chosen heads; None outside the chosen layers and
        steps. Positions or heads past this call's are refused."""
        if (self.layers is not None and call.layer not in self.layers) or \
                (self.steps is not None and call.step not in self.steps):
            return None
        too_far = [p for p in self.positions if p >= call.n_keys]
        if too_far:
            raise bad_value("positions", too_far, f"key positions < {call.n_keys} (the number of keys in {call.layer_name})")
        mask = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool, device=call.device)
        heads = list(self.heads) if self.heads is not None else list(range(call.heads))
        bad_heads = [h for h in heads if h >= call.heads]
        if bad_heads:
            raise bad_value("heads", bad_heads, f"head indices < {call.heads}")
        mask[:, heads, :] = positions_to_mask(torch.tensor(self.positions or [-1], device=call.device), call.n_keys)
        return mask


@dataclass(frozen=True)
class EvictOldest(Intervention):
    """The oldest context evicted, as a deployment that runs out of memory drops it (the paper's §5.3; StreamingLLM's
    window attention): the first `k` real keys of each row are masked for every query, in every layer and head, at
    every step — whether or not they are sinks.

    Attributes:
        k: the keys evicted, counted from the first real token (left padding skipped, the first token included);
            at least 1 (k = 0 would evict nothing: a run without an intervention is the unmasked one).
    """

    k: Count

    def __post_init__(self) -> None:
        _settle(self, k=check_value(self.k, Count, "k"))  # as declared (not @validated: its check() is the run's)

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """bool [batch, heads, keys]: each row's first k valid keys (all of them where fewer are valid); None
        with k=0."""
        if self.k == 0:
            return None
        valid = call.clean_stats().key_valid
        oldest = valid & (valid.long().cumsum(-1) <= self.k)
        return oldest[:, None, :].expand(call.batch, call.heads, call.n_keys).to(call.device)


@dataclass(frozen=True)
class AblateValues(Intervention):
    """Value-path ablation: the keys `select` would mask keep their attention, and their value vectors are ablated.

    Sinks are chosen from the attention as it ran, which this ablation leaves as it was at the ablated call (later
    layers and steps see its effect).

    Attributes:
        select: the policy choosing the keys (MaskSinks for the sinks, MaskRandomKeys for the equal-budget control);
            not itself an AblateValues.
        mode: "zero" (the values zeroed) or "mean" (replaced by the mean value of the head's valid keys). "mean"
            averages over every valid key of the call: in a causal call with several queries (a prefill) that
            includes keys later than some queries; the paper's previous-step policies ablate from step 1 on, where a
            KV-cache step has one query.
    """

    MODES = ("zero", "mean")

    select: Intervention
    mode: str = "zero"

    def __post_init__(self) -> None:
        if self.select is None or isinstance(self.select, AblateValues) or \
                not all(callable(getattr(self.select, name, None)) for name in ("reset", "keys_to_mask", "observe")):
            raise bad_value("select", self.select, "a masking policy (MaskSinks, MaskRandomKeys, MaskKeys) whose keys "
                            "have their values ablated")
        _settle(self, mode=check_choice(self.mode, "mode", self.MODES))

    def reset(self) -> None:
        """Forget the selecting policy's state."""
        self.select.reset()

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """The selecting policy's checks."""
        self.select.check(layers, n_steps)

    def values_to_ablate(self, call: AttentionCall) -> tuple[torch.Tensor, str] | None:
        """(the keys the selecting policy would mask, this mode), or None where it masks nothing."""
        keys = self.select.keys_to_mask(call)
        return None if keys is None else (keys, self.mode)

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        """The selecting policy sees the attention as it ran (unchanged by a value ablation)."""
        self.select.observe(call, stats)


class Audited(Intervention):
    """Any policy, with a ledger of what its masking did to the attention: at every call where it masked keys,
    their score (sum units) with the mask lifted (`before`: the same call's clean statistics) and as the call ran
    (`after`: ~0 when the attention really left them), and how many (batch, head, key) entries were masked. For a
    value ablation the attention is left in place: `before` and `after` are then both the kept score."""

    def __init__(self, policy: Intervention):
        if policy is None:
            raise bad_value("policy", policy, "a policy to audit (MaskSinks, MaskRandomKeys, MaskKeys, AblateValues)")
        check_intervention(policy)
        self.policy = policy
        self._ledger = {"masked": 0, "before": 0.0, "after": 0.0, "calls": 0}
        self._current = None

    def __repr__(self) -> str:
        """The wrapped policy's identity: auditing changes nothing a run computes."""
        return repr(self.policy)

    @property
    def ledger(self) -> dict:
        """Masked (batch, head, key) entries; their summed score before (mask lifted) and after (as run); the calls
        that masked anything. Kept across resets (one audit may span many captures)."""
        return dict(self._ledger)

    def reset(self) -> None:
        """Reset the wrapped policy (the ledger is kept)."""
        self.policy.reset()

    def check(self, layers: Sequence[AttentionLayer], n_steps: int | None) -> None:
        """The wrapped policy's checks."""
        self.policy.check(layers, n_steps)

    def keys_to_mask(self, call: AttentionCall) -> torch.Tensor | None:
        """The wrapped policy's keys, remembered for observe."""
        self._current = self.policy.keys_to_mask(call)
        return self._current

    def values_to_ablate(self, call: AttentionCall) -> tuple[torch.Tensor, str] | None:
        """The wrapped policy's value ablation, remembered for observe."""
        ablated = self.policy.values_to_ablate(call)
        if ablated is not None:
            self._current = ablated[0]
        return ablated

    def observe(self, call: AttentionCall, stats: AttentionStats) -> None:
        """Enter the masked keys' scores, then let the wrapped policy observe."""
        chosen, self._current = self._current, None
        if chosen is not None:
            chosen = chosen.to(stats.scores.device).expand_as(stats.scores)
            if bool(chosen.any()):
                self._ledger["masked"] += int(chosen.sum())
                self._ledger["before"] += float(call.clean_stats().scores[chosen].sum())
                self._ledger["after"] += float(stats.scores[chosen].sum())
                self._ledger["calls"] += 1
        self.policy.observe(call, stats)


# the masking policies by name (sinklib.speed.POLICIES are the samplers' settings, another thing)
MASKING_POLICIES: Registry[type] = Registry("policy", {"mask_sinks": MaskSinks, "mask_random_keys": MaskRandomKeys,
                                                        "mask_keys": MaskKeys, "ablate_values": AblateValues,
                                                        "evict_oldest": EvictOldest})


def make_policy(name: str, **settings) -> Intervention:
    """A registered masking policy by name, e.g. make_policy("mask_sinks", top_k=1)."""
    return MASKING_POLICIES.get(name)(**settings)
