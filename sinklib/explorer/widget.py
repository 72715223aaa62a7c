"""The explorer as a Jupyter widget (anywidget: one ES module, no hand-rolled comms).

Python holds the Trace and sends what the front end draws: the header once, then one step's scores
[layers, heads, seq] when the step changes, and the replayed attention map of the selected (step, layer, head)
when a model is given. Maps are recomputed on demand and only the last few are kept.
"""
from __future__ import annotations

import math
from collections import OrderedDict
import anywidget
import numpy as np
import traitlets

from sinklib.explorer import payload
from sinklib.capturing.replay import replay_map
from sinklib.layers import attention_layers
from sinklib.loading import LoadedModel
from sinklib.trace import Trace
from sinklib.validation import BadValue

KEPT_MAPS = 8


def _in_range(name: str, value: int, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise traitlets.TraitError(f"{name}={value!r} is not allowed: {name} must be an int in 0..{size - 1}")
    return value


def _check_same_model(trace: Trace, loaded: LoadedModel) -> None:
    """Replayed maps are only the trace's own when the model that made it replays them: the same name (when the
    trace records one) and the same attention layers."""
    made_by = trace.meta.get("model")
    if made_by is not None and made_by != loaded.name:
        raise BadValue(f"loaded={loaded.name!r} is not allowed: this trace was made by {made_by!r}; pass that model "
                       "(or no model, to explore the recorded scores without replayed maps)")
    layers = trace.require_scores().shape[1]
    if len(attention_layers(loaded.model, loaded.layer_names)) != layers:
        raise BadValue(f"loaded={loaded.name!r} is not allowed: it has a different number of attention layers than "
                       f"the trace ({layers})")


class Explorer(anywidget.AnyWidget):
    """Play through the denoising steps of `trace`; click a head in the layer × head grid; ε is adjustable.
    With `loaded` (the model that made the trace) the selected head's attention map is replayed."""

    _esm = payload.STATIC / "explorer.js"
    _css = payload.STATIC / "explorer.css"

    header = traitlets.Dict().tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(0).tag(sync=True)
    eps = traitlets.Float(3.0).tag(sync=True)
    shown_step = traitlets.Int(0).tag(sync=True)
    scores = traitlets.Bytes(b"").tag(sync=True)
    attention = traitlets.Bytes(b"").tag(sync=True)
    attention_of = traitlets.List([]).tag(sync=True)

    def __init__(self, trace: Trace, loaded: LoadedModel | None = None, *, eps: float = 3.0, step: int = 0,
                 layer: int | None = None, head: int | None = None) -> None:
        if not isinstance(trace, Trace):
            raise TypeError(f"trace={type(trace).__name__} is not allowed: trace must be a sinklib.Trace")
        if loaded is not None and not isinstance(loaded, LoadedModel):
            raise TypeError(f"loaded={type(loaded).__name__} is not allowed: loaded must be the LoadedModel that made "
                            f"the trace, or None")
        if loaded is not None:
            _check_same_model(trace, loaded)
        self._trace, self._loaded = trace, loaded
        self._shape = tuple(trace.require_scores().shape)
        self._maps: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        _in_range("step", step, self._shape[0])
        strongest = payload.strongest_head_at_step(trace, step)
        layer = strongest[0] if layer is None else layer
        head = strongest[1] if head is None else head
        super().__init__(header=payload.header(trace), step=step, layer=layer, head=head, eps=eps)
        self._show()
        self.observe(lambda _: self._show(), names=["step", "layer", "head"])

    def __repr__(self) -> str:
        # what a notebook stores beside the live view (no memory address: a rerun writes the same text)
        steps, layers, heads, _ = self._trace.require_scores().shape
        made_by = self._trace.meta.get("model", "a trace")
        return f"Explorer({made_by}: {steps} steps, {layers} layers x {heads} heads, eps={self.eps})"

    @traitlets.validate("step")
    def _valid_step(self, proposal):
        return _in_range("step", proposal["value"], self._shape[0])

    @traitlets.validate("layer")
    def _valid_layer(self, proposal):
        return _in_range("layer", proposal["value"], self._shape[1])

    @traitlets.validate("head")
    def _valid_head(self, proposal):
        return _in_range("head", proposal["value"], self._shape[2])

    @traitlets.validate("eps")
    def _valid_eps(self, proposal):
        value = proposal["value"]
        if not math.isfinite(value) or value < 0:
            raise traitlets.TraitError(f"eps={value!r} is not allowed: eps must be a finite number >= 0")
        return value

    def attention_map(self, step: int, layer: int, head: int) -> np.ndarray:
        """[queries, keys] float32 map of (step, layer, head), replayed by the model (the last few are kept)."""
        key = (step, layer, head)
        if key not in self._maps:
            self._maps[key] = replay_map(self._loaded, self._trace, *key).numpy().astype("<f4")
            if len(self._maps) > KEPT_MAPS:
                self._maps.popitem(last=False)
        self._maps.move_to_end(key)
        return self._maps[key]

    def _show(self) -> None:
        with self.hold_sync():
            if self.shown_step != self.step or not self.scores:
                self.scores = payload.step_scores(self._trace, self.step)
                self.shown_step = self.step
            if self._loaded is not None:
                attention = self.attention_map(self.step, self.layer, self.head)
                self.attention = attention.tobytes()
                self.attention_of = [self.step, self.layer, self.head, *attention.shape]
