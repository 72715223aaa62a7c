"""sinklib: see, measure and intervene on attention sinks in diffusion language models."""
from sinklib.capture import AttentionCall, CaptureError, Recorder, capture
from sinklib.generate import generate
from sinklib.interventions import EvictOldest, Intervention, MaskKeys, MaskRandomKeys, MaskSinks
from sinklib.layers import AttentionLayer, attention_layers
from sinklib.loading import LoadedModel, load
from sinklib.sinks import (
    SinkRule,
    causal_uniform_scores,
    find_sinks,
    in_units,
    positions_to_mask,
    sink_margin,
    threshold_sweep,
    top_sinks,
    uniform_scores,
)
from sinklib.trace import Trace
from sinklib.evaluation import evaluate
from sinklib._version import __version__  # noqa: F401  (sinklib.__version__)

__all__ = [
    "AttentionCall", "AttentionLayer", "CaptureError", "EvictOldest", "Intervention", "MaskKeys", "MaskRandomKeys", "MaskSinks",
    "LoadedModel", "Recorder", "SinkRule", "Trace", "evaluate", "generate", "load", "attention_layers", "capture",
    "causal_uniform_scores", "find_sinks", "in_units",
    "positions_to_mask", "sink_margin", "threshold_sweep", "top_sinks", "uniform_scores",
]
