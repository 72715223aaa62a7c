"""sinklib: see, measure and intervene on attention sinks in diffusion language models.

The names here are what a user does: load a model, generate with a trace (or capture any forward), find the sinks,
intervene with a policy, evaluate and make Table 1. Extending sinklib (families, tasks, policies, Table 1 conditions,
notebooks) is `sinklib.extend`; the notebooks' layer is `sinklib.lab`, one module per notebook. No name here shadows a
module: `import sinklib.generation` is the module, `sinklib.generate` its verb.
"""
from sinklib.capturing import CaptureError, capture
from sinklib.generation import demo_trace, encode, generate
from sinklib.trace_store import collect_traces
from sinklib.interventions import AblateValues, EvictOldest, Intervention, MaskKeys, MaskRandomKeys, MaskSinks
from sinklib.loading import LoadedModel, load
from sinklib.sinks import SinkRule, causal_uniform_scores, find_sinks, threshold_sweep, top_sinks
from sinklib.trace import Trace
from sinklib.families.arm import ARMSettings
from sinklib.families.dream import DreamSettings
from sinklib.families.llada import LLaDASettings
from sinklib.evaluation import evaluate
from sinklib.evaluation.conditions import CONDITIONS, Condition, paper_masking
from sinklib.evaluation.table1 import masking_table
from sinklib.evaluation.tasks import Task, get_task
from sinklib.settings import Settings
from sinklib.validation import BadValue
from sinklib._version import __version__  # noqa: F401  (sinklib.__version__)

__all__ = [
    # models and generation
    "load", "LoadedModel", "generate", "collect_traces", "Trace", "encode", "demo_trace",
    # the settings: what every family's is (Settings), and each family's own
    "Settings", "LLaDASettings", "DreamSettings", "ARMSettings",
    # capture and sinks
    "capture", "CaptureError", "find_sinks", "top_sinks", "SinkRule", "threshold_sweep", "causal_uniform_scores",
    # interventions
    "Intervention", "MaskSinks", "MaskRandomKeys", "MaskKeys", "EvictOldest", "AblateValues",
    # evaluation and Table 1
    "evaluate", "masking_table", "Task", "get_task", "paper_masking", "Condition", "CONDITIONS",
    # the error every bad value raises
    "BadValue",
]
