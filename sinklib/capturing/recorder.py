"""The Recorder: what a capture saw, and the hooks that tell it which forward (step) and which attention layer
is running. Steps live in a StepStore (steps.py), each call is handled by attend.py, the SDPA route by route.py."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from sinklib.activation_names import SCORES, activation_name, select_layers
from sinklib.validation import BadValue, check_int, did_you_mean
from sinklib.attention_math import deferrable_row
from sinklib.capturing import route
from sinklib.capturing.attend import AttentionCall, SdpaArgs, attend, clean_statistics, unmasked
from sinklib.capturing.steps import StepStore
from sinklib.layers import AttentionLayer

MapRequest = tuple[int, "int | str", int]


class CaptureError(RuntimeError):
    """The capture cannot see or cannot safely record this model's attention."""


@dataclass(frozen=True)
class CaptureOptions:
    """What one capture keeps and does (see `capture`): maps as (step, layer, head) triples, the intervention,
    explicit attention module paths, the query chunk of the recompute (None: from a memory budget), where
    finished steps are stored (None: where computed), whether per-step scores are kept, and which layers' scores
    (names_filter over "blocks.{layer}.attn.scores": sinklib.activation_names; None: all)."""

    maps: tuple[MapRequest, ...] = ()
    intervention: object = None
    layer_names: tuple[str, ...] | None = None
    chunk_size: int | None = None
    store_device: str | torch.device | None = "cpu"
    keep_steps: bool = True
    names_filter: object = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "maps", tuple(self.maps or ()))
        if self.layer_names is not None:
            object.__setattr__(self, "layer_names", tuple(self.layer_names))
        if self.chunk_size is not None:
            check_int(self.chunk_size, "chunk_size", 1)
        check_intervention(self.intervention)


def check_intervention(intervention) -> None:
    """An intervention is None or an object with reset(), keys_to_mask(call) and observe(call, stats) — e.g.
    sinklib.MaskSinks(top_k=1); refused here, before any forward, rather than failing inside one."""
    if intervention is None:
        return
    missing = [name for name in ("reset", "keys_to_mask", "observe") if not callable(getattr(intervention, name, None))]
    if missing:
        raise TypeError(f"intervention={intervention!r} is not allowed: it must be None or a sinklib Intervention "
                        f"(MaskSinks, MaskRandomKeys, MaskKeys, or an object with reset, keys_to_mask and observe); "
                        f"it lacks {missing}")


class Recorder:
    """What a capture saw. Scores are float32 sums over query rows (sum units), indexed
    [step, layer, batch, head, key]; `layer_names` are the attention modules' paths in the model, `layer_ids` their
    blocks' numbers (every block, unless a names_filter kept some). `layers` are all the model's attention layers:
    each is watched (an intervention acts in every one), only the kept ones are recorded."""

    def __init__(self, model: nn.Module, layers: list[AttentionLayer], options: CaptureOptions) -> None:
        self.model = model
        self.layers = layers
        self.layer_ids = select_layers(options.names_filter, len(layers), SCORES)
        self.layer_names = [layers[index].name for index in self.layer_ids]
        self._kept = set(self.layer_ids)
        self.closed = False
        self.options = options
        self.intervention = options.intervention
        self.query_mask: torch.Tensor | None = None  # optional [B, S] weights; 0 drops a query row (padding)
        # each batch row's identity, a function of its prompt alone (AttentionCall.rows): set by sinklib.generate
        self.row_ids: tuple[int, ...] | None = None
        self.watch = False  # the next forwards' attention is computed and kept as `last_step`, whatever keep_steps says
        self.maps: dict[tuple[int, int, int], torch.Tensor] = {}
        self._wanted_maps = self._resolve_maps(options.maps)
        self._store = StepStore(len(layers), options.store_device, options.keep_steps, self.layer_ids)

    # -- public view -------------------------------------------------------------------------------
    @property
    def keep_steps(self) -> bool:
        """Whether per-step scores are kept (False: only the steps are counted)."""
        return self.options.keep_steps

    @property
    def n_steps(self) -> int:
        """Forward passes completed (counted even when keep_steps=False stores nothing)."""
        return self._store.completed

    @property
    def n_layers(self) -> int:
        """Attention layers whose scores the capture keeps (the scores' layer axis)."""
        return len(self.layer_ids)

    @property
    def names(self) -> list[str]:
        """The activation names the scores' layer axis holds: "blocks.{layer}.attn.scores" (activation_names)."""
        return [activation_name(layer, SCORES) for layer in self.layer_ids]

    def layer_index(self, layer: int | str) -> int:
        """A layer given by index or module path → its index among the model's attention layers; unknown ones
        raise with a suggestion."""
        if isinstance(layer, str):
            every = [known.name for known in self.layers]
            if layer in every:
                return every.index(layer)
            raise BadValue(f"layer={layer!r} is not an attention layer of this model"
                           f"{did_you_mean(layer, every)}; layers are {every[:3]}…")
        return check_int(layer, "layer", 0, len(self.layers) - 1)

    def step_scores(self, step: int) -> torch.Tensor:
        """[layers, batch, heads, keys] scores of one step (sum units)."""
        return self._store.step(step)

    @property
    def last_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores [layers, batch, heads, keys], query_count [layers, batch]) of the last forward run with
        `watch` on: what a sampler that watches its own attention (families.cached.BlockCache) reads."""
        if self._store.last is None:
            raise BadValue("no watched forward was recorded: set recorder.watch = True before the forward")
        return self._store.last["scores"], self._store.last["query_count"]

    @property
    def scores(self) -> torch.Tensor:
        """[steps, layers, batch, heads, keys]; steps with fewer keys (KV-cache decoding) are NaN-padded."""
        return self._store.stack("scores")

    @property
    def masked_keys(self) -> torch.Tensor | None:
        """[steps, layers, batch, heads, keys] bool: keys the intervention masked; None without one."""
        return None if self.intervention is None else self._store.stack("masked")

    @property
    def query_counts(self) -> torch.Tensor:
        """[steps, layers, batch]: query rows summed into each score vector."""
        self._store.require()
        return self._store.stack("query_count") if self.n_steps else torch.empty(0)

    def _resolve_maps(self, maps: Sequence[MapRequest]) -> dict[tuple[int, int], set[int]]:
        wanted: dict[tuple[int, int], set[int]] = {}
        for item in maps:
            if not (isinstance(item, (tuple, list)) and len(item) == 3):
                raise BadValue(f"maps item {item!r} is not allowed: each item must be a (step, layer, head) triple")
            step, layer, head = item
            step = check_int(step, "maps step", 0)
            index = self.layer_index(layer)
            n_heads = self.layers[index].n_heads
            head = check_int(head, f"maps head (layer {self.layers[index].name})", 0, None if n_heads is None else n_heads - 1)
            wanted.setdefault((step, index), set()).add(head)
        return wanted

    # -- hooks: one forward of the model is one step -----------------------------------------------
    def begin_step(self, module, args, kwargs) -> None:
        """Forward pre-hook of the captured module: open a step; refuses output_attentions=True and a re-entered
        forward."""
        wants_maps = kwargs.get("output_attentions")
        if wants_maps is None:
            wants_maps = getattr(getattr(module, "config", None), "output_attentions", False)
        if wants_maps:
            raise CaptureError("output_attentions=True is not allowed under sinklib.capture: it switches the model to "
                               "eager attention, which the capture cannot see; ask the capture for maps=[(step, layer, "
                               "head), ...] instead")
        if self._store.current is not None:
            raise CaptureError("the captured model's forward was re-entered before it returned; one forward = one step")
        self._store.begin()

    def end_step(self, module, args, output) -> None:
        """Forward hook of the captured module: close the step (dropped when the forward raised); refuses a forward
        in which attention layers ran but none called SDPA."""
        if output is None:  # the forward raised: nothing of it counts
            self._store.current = None
            return
        self._check_kept_ran()
        record = self._store.end(keep_last=self.watch)
        if record is not None and not record["called"] and record["layers_ran"]:
            impl = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
            raise CaptureError(
                f"capture saw no attention call: {len(record['layers_ran'])} attention layers ran but none called "
                f"torch.nn.functional.scaled_dot_product_attention (attn_implementation={impl!r}). Load the model with "
                "attn_implementation='sdpa' (or call model.set_attn_implementation('sdpa')); flash-attn kernels, "
                "eager attention and output_attentions=True paths cannot be captured.")

    def _check_kept_ran(self) -> None:
        """Refuse a step in which attention ran, but in none of the layers a names_filter kept (nothing to stack)."""
        current = self._store.current
        if current["called"] and not current["scores"] and (self.keep_steps or self.watch):
            self._store.current = None
            raise CaptureError(f"names_filter={self.options.names_filter!r} kept layers {self.layer_ids}, none of which "
                               f"called attention in this forward (layers {sorted(current['called'])} did)")

    def enter_layer(self, layer: AttentionLayer) -> None:
        """Forward pre-hook of an attention layer: route SDPA calls to this recorder until leave_layer; refuses a
        layer running outside a forward of the captured module."""
        if self._store.current is None:
            raise CaptureError(f"attention layer {layer.name!r} ran outside a forward of the captured module "
                               f"{type(self.model).__name__}: pass the module you call to sinklib.capture()")
        self._store.current["layers_ran"].add(layer.index)
        route.enter(self, layer)

    def leave_layer(self) -> None:
        """Forward hook of an attention layer: stop routing its SDPA calls here."""
        route.leave(self)

    def close(self) -> None:
        """Stop recording: drop any open step and mark the recorder closed (the route then ignores its frames)."""
        self._store.current = None
        self.closed = True

    # -- the attention call (route.py sends it here) -----------------------------------------------
    def attend(self, layer, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs):
        """One SDPA call of `layer`, handed over by the route: the intervention picks keys to mask, the call runs,
        and its scores, masked keys, query count and asked-for maps are stored. Returns the attention output in
        the model's layout."""
        if layer.index in self._store.current["called"]:
            raise CaptureError(f"{layer.name} called attention twice in one forward pass; pass layer_names=[...] "
                               "naming one module per attention call")
        args = SdpaArgs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs).unpack(layer)
        step = self._store.completed
        batch, heads, n_queries, _ = args.q.shape
        map_heads = self._map_heads(step, layer, heads) if self._wanted_maps else ()
        stats_options = {"query_weight": None if self.query_mask is None else self._query_weight(batch, n_queries),
                         "chunk_size": self.options.chunk_size}
        kept = (self.keep_steps or self.watch) and layer.index in self._kept
        if self.intervention is None and not map_heads and not kept:  # nothing is kept
            self._store.add(layer.index, None, None, None)
            return args.as_called(want_lse=False)[0]
        if self.intervention is None and not map_heads and stats_options["query_weight"] is None \
                and deferrable_row(args.q, key, args.mask, is_causal):  # a decoding row: scored with its step's others
            self._store.defer(layer.index, args.q, key, 1.0 / math.sqrt(args.q.shape[-1]) if scale is None else scale)
            return args.as_called()[0]
        if self.intervention is None:  # the common case, once per layer of every step: no call record to build
            output, stats = unmasked(args, map_heads, stats_options)
            key_mask = None
        else:
            rows = self.row_ids if self.row_ids is not None and len(self.row_ids) == batch else None
            call = AttentionCall(step, layer.index, layer.name, batch, heads, n_queries, key.shape[-2], args.q.device,
                                 clean_statistics(args, stats_options), rows)
            output, stats, key_mask = attend(call, args, self.intervention, map_heads, stats_options)
            self.intervention.observe(call, stats)
        self._store.add(layer.index, stats.scores, key_mask, stats.query_count)
        if stats.maps:
            store = self.options.store_device
            for head, attention_map in stats.maps.items():
                self.maps[(step, layer.index, head)] = attention_map if store is None else attention_map.to(store)
        return output

    def _map_heads(self, step: int, layer: AttentionLayer, heads: int) -> tuple[int, ...]:
        """The heads of (step, layer) whose full map was asked for; refuses a head the call does not have."""
        map_heads = tuple(sorted(self._wanted_maps.get((step, layer.index), ())))
        for head in map_heads:
            if head >= heads:
                raise BadValue(f"maps head={head} is not allowed: layer {layer.name} has {heads} heads (0..{heads - 1})")
        return map_heads

    def _query_weight(self, batch: int, n_queries: int) -> torch.Tensor | None:
        if self.query_mask is None:
            return None
        if tuple(self.query_mask.shape) != (batch, n_queries):
            if self.query_mask.shape[0] == batch and n_queries == 1:
                return None  # a KV-cache decoding step: its single query is always real
            raise BadValue(f"recorder.query_mask has shape {tuple(self.query_mask.shape)} but the attention call has "
                           f"batch {batch} and {n_queries} queries")
        return self.query_mask
