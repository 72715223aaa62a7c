"""Capture: see every attention call of a model and reduce it at the source.

While `capture(model)` is active, `torch.nn.functional.scaled_dot_product_attention` is routed through
sinklib *only inside the model's attention modules* (entered and left through forward hooks, so layer
identity is explicit, never inferred from call counts; route.py). Each call is passed to the real SDPA with
the model's own arguments (outputs stay bit-identical) and, beside it, the attention probabilities are
summed over queries (from the fused kernel's log-sum-exp where it applies, else recomputed in float32 one
query chunk at a time; attend.py, attention_math); a KV-cache decoding step's one-query rows are scored
together when the step ends. One forward of `model` is one step (steps.py). Nothing else is kept unless asked
for: full maps only for requested (step, layer, head) triples, and no scores at all with keep_steps=False.

This sees native transformers models running with attn_implementation="sdpa" and remote-code models
(LLaDA, Dream, MMaDA) that call `torch.nn.functional.scaled_dot_product_attention` themselves.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import torch
from torch import nn

from sinklib.activation_names import NamesFilter
from sinklib.capturing import route
from sinklib.capturing.attend import AttentionCall
from sinklib.capturing.recorder import CaptureError, CaptureOptions, MapRequest, Recorder, check_intervention
from sinklib.layers import attention_layers

__all__ = ["AttentionCall", "CaptureError", "CaptureOptions", "MapRequest", "Recorder", "capture", "check_intervention"]


@contextlib.contextmanager
def capture(
    model: nn.Module,
    maps: Sequence[MapRequest] | None = None,
    intervention=None,
    *,
    names_filter: NamesFilter = None,
    layer_names: Sequence[str] | None = None,
    chunk_size: int | None = None,
    store_device: str | torch.device | None = "cpu",
    keep_steps: bool = True,
) -> Iterator[Recorder]:
    """Record the attention scores of every forward of `model` while the block runs.

        with sinklib.capture(model) as recorder:
            model(ids)
        recorder.scores  # [steps, layers, batch, heads, keys], sum units

        with sinklib.capture(model, names_filter=["blocks.0.attn.scores", "blocks.2.attn.scores"]) as kept:
            model(ids)
        kept.scores  # [steps, layers, batch, heads, keys], the layers: kept.layer_ids, blocks 0 and 2

    Args:
        model: the torch module (a LoadedModel's .model, or any transformers model the capture supports).
        maps: (step, layer, head) triples whose full [batch, queries, keys] map is kept (layer: an index or a module
            path); None: none.
        intervention: an object with keys_to_mask(call) / observe(call, stats), e.g. MaskSinks; it may change the
            model's output, nothing else the capture does can.
        names_filter: which layers' scores to keep, by activation name "blocks.{layer}.attn.scores" (as carry and the
            lens choose theirs; sinklib.activation_names): None (all), a name, a list of names or a callable name →
            bool. It filters what is recorded: every layer still runs under the capture (an intervention acts in
            all of them), and a kept layer's scores are those of a capture without a filter.
        layer_names: explicit attention module paths, one per layer, for a model whose attention sinklib.layers
            cannot find (it declares the layers; names_filter chooses among them); None: found by sinklib.layers.
        chunk_size: query rows per chunk when the probabilities are recomputed chunk by chunk (bounds memory on
            long canvases; at least 1); None: sized by the attention maths to the keys.
        store_device: where finished steps are kept (None: where they were computed).
        keep_steps: False keeps no per-step scores (steps are still counted, maps and the intervention still
            work): for long evaluation runs that only need the tokens.

    Yields:
        The Recorder, filled as the model runs.

    Raises:
        CaptureError: the capture cannot see or cannot safely record this model's attention.
    """
    model, layer_names = _as_module(model, layer_names)
    options = CaptureOptions(maps or (), intervention, layer_names, chunk_size, store_device, keep_steps, names_filter)
    _check_sdpa_visible(model)
    _claim(model)
    handles, recorder, installed = [], None, False
    try:
        recorder = Recorder(model, attention_layers(model, options.layer_names), options)
        _prepare_intervention(intervention, recorder)
        handles = _hook(model, recorder)
        route.install()
        installed = True
        yield recorder
    finally:
        if installed:
            route.remove()
        for handle in handles:
            handle.remove()
        if recorder is not None:
            route.forget(recorder)
            recorder.close()
        model._sinklib_capture_active = False


_claims = threading.Lock()


def _claim(model: nn.Module) -> None:
    """Mark `model` as captured, atomically: of two threads opening a capture of one model, one is refused."""
    with _claims:
        if getattr(model, "_sinklib_capture_active", False):
            raise CaptureError("capture is already active on this model; nesting captures of one model (or capturing "
                               "it from two threads) is not supported: ask one capture for all maps and the "
                               "intervention you need")
        model._sinklib_capture_active = True


def _prepare_intervention(intervention, recorder: Recorder) -> None:
    if intervention is None:
        return
    check_fits = getattr(intervention, "check", None)
    if callable(check_fits):
        check_fits(recorder.layers, None)
    intervention.reset()


def _hook(model: nn.Module, recorder: Recorder) -> list:
    """Forward hooks: the model's forward is a step, each attention module's forward enters and leaves a layer."""
    handles = [model.register_forward_pre_hook(recorder.begin_step, with_kwargs=True),
               model.register_forward_hook(recorder.end_step, always_call=True)]
    for layer in recorder.layers:
        handles.append(layer.module.register_forward_pre_hook(lambda module, args, layer=layer: recorder.enter_layer(layer)))
        handles.append(layer.module.register_forward_hook(lambda module, args, out: recorder.leave_layer(), always_call=True))
    return handles


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
    """The nn.Module to capture and its attention layers' names: an nn.Module as given, or anything holding one
    as `.model` beside its `.layer_names` (sinklib.load's LoadedModel), so capture needs nothing from loading."""
    if isinstance(model, nn.Module):
        return model, layer_names
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module):
        return inner, layer_names if layer_names is not None else getattr(model, "layer_names", None)
    raise TypeError(f"model={type(model).__name__} is not allowed: capture takes a torch nn.Module or the "
                    "LoadedModel that sinklib.load returns")
