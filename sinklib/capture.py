"""Capture: see every attention call of a model and reduce it at the source.

While `capture(model)` is active, `torch.nn.functional.scaled_dot_product_attention` is routed through
sinklib *only inside the model's attention modules* (entered and left through forward hooks, so layer
identity is explicit, never inferred from call counts). Each call is passed to the real SDPA with the
model's own arguments (outputs stay bit-identical) and, beside it, the attention probabilities are
summed over queries (from the fused kernel's log-sum-exp where it applies, else recomputed in float32 one
query chunk at a time; see attention_math). One forward of `model` is one
step. Nothing else is kept unless asked for: full maps only for requested (step, layer, head) triples.

This sees native transformers models running with attn_implementation="sdpa" and remote-code models
(LLaDA, Dream, MMaDA) that call `torch.nn.functional.scaled_dot_product_attention` themselves.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sinklib._checks import check_int, did_you_mean
from sinklib.attention_math import AttentionStats, attention_statistics, heads_left_without_keys, mask_keys, sdpa_with_lse
from sinklib.layers import AttentionLayer, attention_layers

MapRequest = tuple[int, "int | str", int]

_patch_lock = threading.Lock()
_patch_users = 0
_original_sdpa: Callable | None = None
_thread_state = threading.local()  # .frames: stack of (Recorder, AttentionLayer) for the running layer


class CaptureError(RuntimeError):
    """The capture cannot see or cannot safely record this model's attention."""


def _frames() -> list:
    if not hasattr(_thread_state, "frames"):
        _thread_state.frames = []
    return _thread_state.frames


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kwargs):
    frames = _frames()
    if not frames:
        return _original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa, **kwargs)
    recorder, layer = frames[-1]
    return recorder._attend(layer, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs)


def _install_route() -> None:
    global _patch_users, _original_sdpa
    with _patch_lock:
        if _patch_users == 0:
            _original_sdpa = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _routed_sdpa
        _patch_users += 1


def _remove_route() -> None:
    global _patch_users
    with _patch_lock:
        _patch_users -= 1
        if _patch_users == 0 and F.scaled_dot_product_attention is _routed_sdpa:
            F.scaled_dot_product_attention = _original_sdpa


@dataclass
class AttentionCall:
    """What an intervention sees of one attention call, before it runs."""

    step: int
    layer: int
    layer_name: str
    batch: int
    heads: int
    n_queries: int
    n_keys: int
    device: torch.device
    _clean: Callable[[], AttentionStats]

    def clean_stats(self) -> AttentionStats:
        """Statistics of this call without any intervention (computed on first use, then cached)."""
        return self._clean()


class Recorder:
    """What a capture saw. Scores are float32 sums over query rows (sum units), indexed
    [step, layer, batch, head, key]; `layer_names` are the attention modules' paths in the model."""

    def __init__(self, model: nn.Module, layers: list[AttentionLayer], maps: Sequence[MapRequest] | None,
                 intervention, chunk_size: int | None, store_device: str | torch.device | None,
                 keep_steps: bool = True) -> None:
        self.model = model
        self.layers = layers
        self.layer_names = [layer.name for layer in layers]
        self.intervention = intervention
        self.chunk_size = chunk_size
        self.store_device = store_device
        self.query_mask: torch.Tensor | None = None  # optional [B, S] weights; 0 drops a query row (padding)
        self.maps: dict[tuple[int, int, int], torch.Tensor] = {}
        self._wanted_maps = self._resolve_maps(maps or [])
        self.keep_steps = keep_steps
        self._steps: list[dict] = []
        self._completed = 0
        self._open: dict | None = None

    # -- public view -------------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        """Forward passes completed (counted even when keep_steps=False stores nothing)."""
        return self._completed

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def layer_index(self, layer: int | str) -> int:
        """A layer given by index or module path → its index; unknown ones raise with a suggestion."""
        if isinstance(layer, str):
            if layer in self.layer_names:
                return self.layer_names.index(layer)
            raise ValueError(f"layer={layer!r} is not an attention layer of this model"
                             f"{did_you_mean(layer, self.layer_names)}; layers are {self.layer_names[:3]}…")
        return check_int(layer, "layer", 0, self.n_layers - 1)

    def step_scores(self, step: int) -> torch.Tensor:
        """[layers, batch, heads, keys] scores of one step (sum units)."""
        self._require_steps()
        return self._steps[check_int(step, "step", 0, self.n_steps - 1)]["scores"]

    @property
    def scores(self) -> torch.Tensor:
        """[steps, layers, batch, heads, keys]; steps with fewer keys (KV-cache decoding) are NaN-padded."""
        return self._stack("scores", float("nan"))

    @property
    def masked_keys(self) -> torch.Tensor | None:
        """[steps, layers, batch, heads, keys] bool: keys the intervention masked; None without one."""
        if self.intervention is None:
            return None
        return self._stack("masked", False)

    @property
    def query_counts(self) -> torch.Tensor:
        """[steps, layers, batch]: query rows summed into each score vector."""
        self._require_steps()
        return torch.stack([step["query_count"] for step in self._steps]) if self._steps else torch.empty(0)

    def _require_steps(self) -> None:
        if not self.keep_steps:
            raise ValueError("this capture was opened with keep_steps=False: it kept no per-step scores "
                             "(open it with keep_steps=True to read them)")

    def _stack(self, key: str, fill) -> torch.Tensor:
        self._require_steps()
        if not self._steps:
            raise ValueError("no step was recorded: run a forward pass of the model inside the capture first")
        width = max(step[key].shape[-1] for step in self._steps)
        padded = [torch.nn.functional.pad(step[key], (0, width - step[key].shape[-1]), value=fill) for step in self._steps]
        return torch.stack(padded)

    # -- map requests ------------------------------------------------------------------------------
    def _resolve_maps(self, maps: Sequence[MapRequest]) -> dict[tuple[int, int], set[int]]:
        wanted: dict[tuple[int, int], set[int]] = {}
        for item in maps:
            if not (isinstance(item, (tuple, list)) and len(item) == 3):
                raise ValueError(f"maps item {item!r} is not allowed: each item must be a (step, layer, head) triple")
            step, layer, head = item
            step = check_int(step, "maps step", 0)
            index = self.layer_index(layer)
            n_heads = self.layers[index].n_heads
            head = check_int(head, f"maps head (layer {self.layer_names[index]})", 0, None if n_heads is None else n_heads - 1)
            wanted.setdefault((step, index), set()).add(head)
        return wanted

    # -- step bookkeeping (hooks) ------------------------------------------------------------------
    def _begin_step(self, module, args, kwargs) -> None:
        wants_maps = kwargs.get("output_attentions")
        if wants_maps is None:
            wants_maps = getattr(getattr(module, "config", None), "output_attentions", False)
        if wants_maps:
            raise CaptureError("output_attentions=True is not allowed under sinklib.capture: it switches the model to "
                               "eager attention, which the capture cannot see; ask the capture for maps=[(step, layer, "
                               "head), ...] instead")
        if self._open is not None:
            raise CaptureError("the captured model's forward was re-entered before it returned; one forward = one step")
        self._open = {"scores": {}, "masked": {}, "query_count": {}, "layers_ran": set()}

    def _end_step(self, module, args, output) -> None:
        record, self._open = self._open, None
        if record is None or output is None:
            return
        if not record["scores"]:
            if record["layers_ran"]:
                impl = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
                raise CaptureError(
                    f"capture saw no attention call: {len(record['layers_ran'])} attention layers ran but none called "
                    f"torch.nn.functional.scaled_dot_product_attention (attn_implementation={impl!r}). Load the model with "
                    "attn_implementation='sdpa' (or call model.set_attn_implementation('sdpa')); flash-attn kernels, "
                    "eager attention and output_attentions=True paths cannot be captured.")
            return
        self._completed += 1
        if self.keep_steps:
            self._steps.append(self._finish(record))

    def _finish(self, record: dict) -> dict:
        order = sorted(record["scores"])
        width = max(record["scores"][i].shape[-1] for i in order)
        template = record["scores"][order[0]]
        def gather(key: str, fill):
            rows = []
            for index in range(self.n_layers):
                value = record[key].get(index)
                if value is None:
                    shape = (*template.shape[:-1], width) if key != "query_count" else template.shape[:1]
                    value = torch.full(shape, fill, dtype=torch.bool if key == "masked" else torch.float32, device=template.device)
                rows.append(value)
            stacked = torch.stack(rows)
            return stacked.to(self.store_device) if self.store_device is not None else stacked
        return {"scores": gather("scores", float("nan")), "masked": gather("masked", False),
                "query_count": gather("query_count", float("nan"))}

    def _enter_layer(self, layer: AttentionLayer) -> None:
        if self._open is None:
            raise CaptureError(f"attention layer {layer.name!r} ran outside a forward of the captured module "
                               f"{type(self.model).__name__}: pass the module you call to sinklib.capture()")
        self._open["layers_ran"].add(layer.index)
        _frames().append((self, layer))

    def _leave_layer(self) -> None:
        frames = _frames()
        if frames and frames[-1][0] is self:
            frames.pop()

    # -- the attention call ------------------------------------------------------------------------
    def _attend(self, layer, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs):
        record = self._open
        if layer.index in record["scores"]:
            raise CaptureError(f"{layer.name} called attention twice in one forward pass; pass layer_names=[...] "
                               "naming one module per attention call")
        step = self.n_steps
        q, mask, packed = _unpack_single_query_gqa(layer, query, key, attn_mask)
        batch, heads, n_queries, _ = q.shape
        n_keys = key.shape[-2]
        wanted_heads = tuple(sorted(self._wanted_maps.get((step, layer.index), ())))
        for head in wanted_heads:
            if head >= heads:
                raise ValueError(f"maps head={head} is not allowed: layer {layer.name} has {heads} heads (0..{heads - 1})")
        weight = self._query_weight(batch, n_queries)
        stats_kwargs = dict(query_weight=weight, chunk_size=self.chunk_size)
        cache: dict[str, AttentionStats] = {}

        def clean() -> AttentionStats:
            if "clean" not in cache:
                cache["clean"] = attention_statistics(q, key, mask, is_causal, scale, want_last_row=True, **stats_kwargs)
            return cache["clean"]

        call = AttentionCall(step, layer.index, layer.name, batch, heads, n_queries, n_keys, q.device, clean)
        key_mask = self.intervention.keys_to_mask(call) if self.intervention is not None else None
        if key_mask is not None:
            key_mask = _checked_key_mask(key_mask, batch, heads, n_keys, q.device)
        if key_mask is not None and bool(key_mask.any()):
            stranded = heads_left_without_keys(mask, is_causal, key_mask, n_queries)
            if bool(stranded.any()):
                b, h = (int(i) for i in stranded.nonzero()[0])
                raise ValueError(f"intervention={self.intervention!r} is not allowed here: at step {step}, {layer.name} "
                                 f"(batch {b}, head {h}) it masks every key a query may attend to, which would leave "
                                 "the softmax nothing; it must leave at least one key per head")
            eff_mask = mask_keys(mask, is_causal, key_mask, n_queries)
            sdpa_mask = eff_mask.to(q.dtype) if eff_mask.dtype != torch.bool else eff_mask
            gqa = enable_gqa or key.shape[1] != heads
            fused = sdpa_with_lse(q, key, value, sdpa_mask, dropout_p, False, scale, gqa, kwargs)
            if fused is None:
                output = _original_sdpa(q, key, value, attn_mask=sdpa_mask, dropout_p=dropout_p, is_causal=False, scale=scale,
                                        enable_gqa=gqa, **kwargs)
            else:
                output = fused[0]
            if packed:
                output = output.reshape(query.shape[0], query.shape[1], query.shape[2], output.shape[-1])
            stats = attention_statistics(q, key, eff_mask, False, scale, map_heads=wanted_heads, want_last_row=True,
                                         lse=None if fused is None else fused[1], **stats_kwargs)
        else:
            fused = None if packed else sdpa_with_lse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs)
            if fused is None:
                output = _original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                        scale=scale, enable_gqa=enable_gqa, **kwargs)
            else:
                output = fused[0]
            stats = attention_statistics(q, key, mask, is_causal, scale, map_heads=wanted_heads, want_last_row=True,
                                         lse=None if fused is None else fused[1], **stats_kwargs)
            cache["clean"] = stats
            key_mask = torch.zeros(batch, heads, n_keys, dtype=torch.bool, device=q.device)
        if self.intervention is not None:
            self.intervention.observe(call, stats)
        record["scores"][layer.index] = stats.scores
        record["masked"][layer.index] = key_mask
        record["query_count"][layer.index] = stats.query_count
        for head, attention_map in stats.maps.items():
            stored = attention_map if self.store_device is None else attention_map.to(self.store_device)
            self.maps[(step, layer.index, head)] = stored
        return output

    def _query_weight(self, batch: int, n_queries: int) -> torch.Tensor | None:
        if self.query_mask is None:
            return None
        if tuple(self.query_mask.shape) != (batch, n_queries):
            if self.query_mask.shape[0] == batch and n_queries == 1:
                return None  # a KV-cache decoding step: its single query is always real
            raise ValueError(f"recorder.query_mask has shape {tuple(self.query_mask.shape)} but the attention call has "
                             f"batch {batch} and {n_queries} queries")
        return self.query_mask


def _unpack_single_query_gqa(layer: AttentionLayer, query, key, attn_mask):
    """transformers packs a single decoding query of a GQA model as [B, kv_heads, groups, D]; restore
    [B, heads, 1, D] so heads stay heads. Returns (query, mask, was_packed)."""
    heads = layer.n_heads
    if heads is None or query.shape[1] == heads or query.shape[1] != key.shape[1] or heads % query.shape[1]:
        return query, attn_mask, False
    groups = heads // query.shape[1]
    if query.shape[2] != groups:
        return query, attn_mask, False
    unpacked = query.reshape(query.shape[0], heads, 1, query.shape[-1])
    if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] == query.shape[1] and attn_mask.shape[2] == groups:
        attn_mask = attn_mask.reshape(attn_mask.shape[0], heads, 1, attn_mask.shape[-1])
    return unpacked, attn_mask, True


def _checked_key_mask(key_mask: torch.Tensor, batch: int, heads: int, n_keys: int, device) -> torch.Tensor:
    if key_mask.dtype != torch.bool:
        raise TypeError(f"an intervention returned a {key_mask.dtype} key mask; it must be bool [batch, heads, keys]")
    try:
        return key_mask.to(device).expand(batch, heads, n_keys)
    except RuntimeError:
        raise ValueError(f"an intervention returned a key mask of shape {tuple(key_mask.shape)}; expected "
                         f"[{batch}, {heads}, {n_keys}] (or broadcastable)") from None


def _check_sdpa_visible(model: nn.Module) -> None:
    """Native transformers models choose their attention kernel from the config: reject the ones the
    capture cannot see before any forward runs. Remote-code models are checked on their first step."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    native = type(model).__module__.startswith("transformers.models.")
    if native and impl not in (None, "sdpa"):
        raise CaptureError(f"model.config._attn_implementation={impl!r} cannot be captured: sinklib sees attention through "
                           "torch's scaled_dot_product_attention; load with attn_implementation='sdpa' or call "
                           "model.set_attn_implementation('sdpa')")


def _as_module(model, layer_names):
    """A LoadedModel (sinklib.load's result) stands for its module and its layer names; anything else must be an
    nn.Module."""
    from sinklib.loading import LoadedModel

    if isinstance(model, LoadedModel):
        return model.model, layer_names if layer_names is not None else model.layer_names
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__} is not allowed: capture takes a torch nn.Module or the "
                        "LoadedModel that sinklib.load returns")
    return model, layer_names


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


@contextlib.contextmanager
def capture(
    model: nn.Module,
    maps: Sequence[MapRequest] | None = None,
    intervention=None,
    *,
    layer_names: Sequence[str] | None = None,
    chunk_size: int | None = None,
    store_device: str | torch.device | None = "cpu",
    keep_steps: bool = True,
) -> Iterator[Recorder]:
    """Record attention scores of every forward of `model` while the block runs.

    maps: (step, layer, head) triples whose full [batch, queries, keys] map is kept (layer: index or
    module path). intervention: an object with keys_to_mask(call) / observe(call, stats), e.g. MaskSinks;
    it may change the model's output, nothing else does. layer_names: explicit attention module paths,
    one per layer. store_device: where finished steps are kept (None: where they were computed).
    keep_steps: False keeps no per-step scores (steps are still counted, maps and the intervention still
    work): for long evaluation runs that only need the tokens.
    """
    model, layer_names = _as_module(model, layer_names)
    check_intervention(intervention)
    if getattr(model, "_sinklib_capture_active", False):
        raise CaptureError("capture is already active on this model; nesting captures of one model is not supported "
                           "(ask one capture for all maps and the intervention you need)")
    if chunk_size is not None:
        check_int(chunk_size, "chunk_size", 1)
    _check_sdpa_visible(model)
    layers = attention_layers(model, layer_names)
    recorder = Recorder(model, layers, maps, intervention, chunk_size, store_device, keep_steps)
    if intervention is not None:
        check_fits = getattr(intervention, "check", None)
        if callable(check_fits):
            check_fits(layers, None)
        intervention.reset()
    handles = [model.register_forward_pre_hook(recorder._begin_step, with_kwargs=True),
               model.register_forward_hook(recorder._end_step, always_call=True)]
    for layer in layers:
        handles.append(layer.module.register_forward_pre_hook(lambda module, args, layer=layer: recorder._enter_layer(layer)))
        handles.append(layer.module.register_forward_hook(lambda module, args, out: recorder._leave_layer(), always_call=True))
    model._sinklib_capture_active = True
    _install_route()
    try:
        yield recorder
    finally:
        _remove_route()
        for handle in handles:
            handle.remove()
        model._sinklib_capture_active = False
        recorder._open = None
