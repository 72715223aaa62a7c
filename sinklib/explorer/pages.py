"""One exported explorer page per model: what notebook 05 and `make figures` write into figures/."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tqdm.auto import tqdm

from sinklib.explorer.page import to_html
from sinklib.generation import demo_trace
from sinklib.loading import LoadedModel, load
from sinklib.settings import Settings
from sinklib.trace import Trace
from sinklib.validation import BadValue


def page_name(model: str) -> str:
    """explorer_<model>.html; a hub id or folder keeps only its last part (GSAI-ML/LLaDA-8B-Instruct →
    explorer_LLaDA-8B-Instruct.html)."""
    return f"explorer_{Path(str(model).rstrip('/')).name}.html"


def export_pages(models: Sequence[str], folder: str | Path, prompt: str, *, traces: Mapping[str, Trace] | None = None,
                 eps: float = 3.0, seed: int = 0, load_options: Mapping[str, Any] | None = None,
                 settings_for: Callable[[LoadedModel], Settings] | None = None, progress: bool = True) -> list[Path]:
    """Write folder/explorer_<model>.html for each model. A model with a trace in `traces` reuses it; the others
    are loaded one at a time (load_options → sinklib.load) and generate `prompt` with generate.demo_trace, under
    settings_for(loaded model) (None: each model's own settings, LoadedModel.settings_for())."""

    if isinstance(models, str):
        models = [models]
    names = [page_name(model) for model in models]
    clash = sorted({name for name in names if names.count(name) > 1})
    if clash:  # two folders with one last name would write one page over the other
        raise BadValue(f"models={list(models)!r} is not allowed: their pages would share the name {clash[0]!r}; "
                       "export them into separate folders")
    traces = dict(traces or {})
    written = []
    for name in tqdm(models, desc="explorer pages", disable=not progress):
        trace = traces.get(name)
        if trace is None:
            loaded = load(name, **dict(load_options or {}))
            trace = demo_trace(loaded, prompt, seed, settings_for(loaded) if settings_for is not None else None)
            del loaded
        written.append(to_html(trace, Path(folder) / page_name(name), eps=eps))
    return written
