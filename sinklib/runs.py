"""Typed run configs: one per notebook, whose fields are exactly that notebook's papermill parameters (a test
holds them equal, defaults included). `python -m sinklib.reproduce` checks given parameters against them before
anything runs; each notebook builds its config from its namespace and every artifact it writes records it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from sinklib._checks import did_you_mean
from sinklib.explorer import export_pages
from sinklib.generate import collect_traces, demo_trace
from sinklib.loading import load, load_models
from sinklib.plots import save_figure
from sinklib.provenance import describe, record_artifacts, write_parquet
from sinklib.registry import Registry
from sinklib.sinks import SinkRule
from sinklib.validation import Consent, Count, Index, NonNegative, Text, validated
from sinklib.zoo.data import prompts


@dataclass(frozen=True)
class RunConfig:
    """Fields shared by every notebook: where results go, and whether to show progress."""

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> "RunConfig":
        """The config from a notebook's variables (its parameters cell, with papermill's injections)."""
        return cls(**{f.name: namespace[f.name] for f in dataclasses.fields(cls)})

    @classmethod
    def parameter_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check_keys(cls, given: Mapping[str, Any]) -> None:
        names = cls.parameter_names()
        for key in given:
            if key not in names:
                raise ValueError(f"parameter {key!r} is not allowed: {cls.__name__} has no such field"
                                 f"{did_you_mean(key, names)}; allowed: {names}")

    def load(self) -> dict:
        """The run's models by name (sinklib.load with its device, dtype and trust_remote_code)."""
        return load_models(self.models, device=self.device, dtype=self.dtype, trust_remote_code=self.trust_remote_code)

    def save(self, result: "Result") -> "Result":
        """Write the result's figures (PNG + PDF), tables (parquet) and texts; each carries what defines it (config,
        seed, notebook) and is entered in its folder's PROVENANCE.json with versions, machine and sha256."""

        record = describe(self, notebook=type(self).NOTEBOOK)
        figures, results = Path(self.figures_dir), Path(getattr(self, "results_dir", self.figures_dir))
        written = []
        for name, fig in result.figures.items():
            written += save_figure(fig, name, figures, record)
        if result.tables:
            results.mkdir(parents=True, exist_ok=True)
        for name, frame in result.tables.items():
            written.append(write_parquet(frame, results / f"{name}.parquet", record))
        for name, text in result.texts.items():
            (figures / name).write_text(text)
            written.append(figures / name)
        record_artifacts(written, record)
        return result


@dataclass
class Result:
    """What one notebook section makes: figures by file stem, tables by parquet stem, texts by file name, and
    `shown`, the summary the notebook displays."""
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    shown: Any = None


def _check_layout(config) -> None:
    """gen_length must split into blocks of block_length (LLaDA / MMaDA's layout), when both are given."""
    if config.gen_length is not None and config.block_length is not None and config.gen_length % config.block_length:
        raise ValueError(f"gen_length={config.gen_length!r} is not allowed: gen_length must be a multiple of "
                         f"block_length={config.block_length}")


@validated
@dataclass(frozen=True)
class TracesRun(RunConfig):
    """Notebook 01: traces of every model on n_prompts prompts, then their score distributions."""
    NOTEBOOK = "01_attention_distributions"
    models: list[Text] = field(default_factory=lambda: ["tiny-llada", "tiny-dream", "tiny-arm", "smollm2-135m-instruct"])
    trust_remote_code: Consent = False
    device: str = "cpu"
    dtype: str | None = None
    n_prompts: Count = 6
    steps: Count | None = None
    gen_length: Count | None = None
    block_length: Count | None = None
    seed: Index = 0
    figures_dir: str = "../figures"
    results_dir: str = "../data/results"
    progress: bool = True

    def check(self) -> None:
        if not self.models:
            raise ValueError("models=[] is not allowed: models must be a non-empty list of model names")
        _check_layout(self)

    def collect(self) -> tuple[dict, dict]:
        """(loaded models by name, their traces by name): one generation per prompt with the family's settings."""
        loaded = self.load()
        traces = {name: collect_traces(model, prompts(self.n_prompts, plain_english=not model.is_zoo), seed=self.seed,
                                       progress=self.progress, **model.settings_for(steps=self.steps,
                                                                                    gen_length=self.gen_length,
                                                                                    block_length=self.block_length))
                  for name, model in loaded.items()}
        return loaded, traces


@validated
@dataclass(frozen=True)
class MovingSinksRun(TracesRun):
    """Notebook 02: sink tokens, dynamics and moving sinks, with the Eq. 3 threshold eps (sum units)."""
    NOTEBOOK = "02_moving_sinks"
    eps: NonNegative = 3.0

    @property
    def rule(self) -> SinkRule:
        return SinkRule(self.eps)


@validated
@dataclass(frozen=True)
class ThresholdSweepRun(TracesRun):
    """Notebook 03: the share of tokens Eq. 3 selects at each eps."""
    NOTEBOOK = "03_threshold_sweep"
    eps_values: list[NonNegative] = field(default_factory=lambda: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0])

    def check(self) -> None:
        super().check()
        if not self.eps_values:
            raise ValueError("eps_values=[] is not allowed: eps_values must be a non-empty list of numbers >= 0")


@validated
@dataclass(frozen=True)
class MaskingRun(RunConfig):
    """Notebook 04: Table 1, accuracy with the top-k sinks masked and a random-key control."""
    NOTEBOOK = "04_masking_ablation"
    models: list[Text] = field(default_factory=lambda: ["tiny-llada", "tiny-dream", "tiny-arm", "smollm2-135m-instruct"])
    task: str = "arithmetic"
    tasks: dict[str, str] = field(default_factory=lambda: {"smollm2-135m-instruct": "capitals"})
    task_path: str | None = None
    n_problems: Count | None = 100
    steps: Count | None = None
    gen_length: Count | None = None
    block_length: Count | None = None
    ks: list[Index] = field(default_factory=lambda: [0, 1, 5, 10])
    random_control: bool = True
    seed: Index = 0
    eps: NonNegative = 3.0
    batch_size: Count = 50
    allow_code_execution: Consent = False
    trust_remote_code: Consent = False
    device: str = "cpu"
    dtype: str | None = None
    figures_dir: str = "../figures"
    results_dir: str = "../data/results"
    progress: bool = True

    def check(self) -> None:
        if not self.models:
            raise ValueError("models=[] is not allowed: models must be a non-empty list of model names")
        if not self.ks:
            raise ValueError("ks=[] is not allowed: ks must be a non-empty list of integers >= 0")
        _check_layout(self)


@validated
@dataclass(frozen=True)
class ExplorerRun(RunConfig):
    """Notebook 05: one generation in the explorer, and a self-contained page per model."""
    NOTEBOOK = "05_explorer"
    models: list[Text] = field(default_factory=lambda: ["tiny-llada", "tiny-dream"])
    trust_remote_code: Consent = False
    device: str = "cpu"
    dtype: str | None = None
    prompt: Text = "Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:"
    steps: Count | None = None
    gen_length: Count | None = None
    block_length: Count | None = None
    seed: Index = 0
    eps: NonNegative = 3.0
    figures_dir: str = "../figures"

    def check(self) -> None:
        if not self.models:
            raise ValueError("models=[] is not allowed: models must be a non-empty list of model names")
        _check_layout(self)

    def explore(self) -> tuple:
        """(the first model loaded, its generation of `prompt`): what the explorer shows."""
        loaded = load(self.models[0], **self._load_options())
        return loaded, demo_trace(loaded, self.prompt, self.seed, self.steps, self.gen_length, self.block_length)

    def export_pages(self, traces: Mapping[str, Any]) -> list[Path]:
        """figures_dir/explorer_<model>.html for every model (those in `traces` reuse their trace)."""

        pages = export_pages(self.models, self.figures_dir, self.prompt, traces=traces, eps=self.eps, seed=self.seed,
                             load_options=self._load_options(),
                             sampling=dict(steps=self.steps, gen_length=self.gen_length, block_length=self.block_length))
        record_artifacts(pages, describe(self, notebook=self.NOTEBOOK))
        return pages

    def _load_options(self) -> dict:
        return dict(device=self.device, dtype=self.dtype, trust_remote_code=self.trust_remote_code)


RUNS: Registry[type] = Registry("notebook", {cls.NOTEBOOK: cls for cls in
                                             (TracesRun, MovingSinksRun, ThresholdSweepRun, MaskingRun, ExplorerRun)})


def run_for(notebook: str | Path) -> type:
    """The run config class of a notebook (by file name or stem)."""
    return RUNS.get(Path(notebook).stem)
