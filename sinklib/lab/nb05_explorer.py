"""Notebook 05, the explorer: its run config (one generation explored, a self-contained page per model)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from sinklib.explorer import export_pages
from sinklib.generation import demo_trace
from sinklib.loading import load
from sinklib.provenance import describe, record_artifacts
from sinklib.validation import Folder, ModelNames, NonNegative, Text, validated
from sinklib.lab.runs import ModelsPart, RunConfig, SamplingPart, _check_layout, default_copy


@validated
@dataclass(frozen=True)
class ExplorerRun(SamplingPart, ModelsPart, RunConfig):
    """Notebook 05: one generation in the explorer, and a self-contained page per model."""
    NOTEBOOK = "05_explorer"
    models: ModelNames = default_copy(["tiny-llada", "tiny-dream", "smollm2-135m-diffusion"])  # the first is explored
    prompt: Text = "Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:"
    eps: NonNegative = 3.0
    figures_dir: Folder = "../figures"

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length."""
        _check_layout(self)

    def collect(self) -> tuple:
        """(the first model loaded, its generation of `prompt`): what the explorer shows."""
        loaded = load(self.models[0], **self._load_options())
        return loaded, demo_trace(loaded, self.prompt, self.seed, self.settings_for(loaded))

    def export_pages(self, traces: Mapping[str, Any]) -> list[Path]:
        """figures_dir/explorer_<model>.html for every model (those in `traces` reuse their trace)."""

        pages = export_pages(self.models, self.figures_dir, self.prompt, traces=traces, eps=self.eps, seed=self.seed,
                             load_options=self._load_options(),
                             settings_for=self.settings_for)
        record_artifacts(pages, describe(self, notebook=self.NOTEBOOK))
        return pages

    def _load_options(self) -> dict:
        return dict(device=self.device, dtype=self.dtype, trust_remote_code=self.trust_remote_code)
