"""Typed run configs: one per notebook. The notebook's parameters cell is the one declaration of its parameters
and their defaults (read here with papermill's inspection, as papermill reads it to inject values); a config
declares only each parameter's type and rules. `python -m sinklib.reproduce` checks given parameters against them before
anything runs; each notebook builds its config from its namespace and every artifact it writes records it."""
from __future__ import annotations

import ast
import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import pandas as pd

import papermill
from annotated_types import Ge

from sinklib.validation import (Consent, Count, DType, Device, Flag, Folder, Index, Ks, ModelNames, NonNegative,
                                Text, did_you_mean, validated)
from sinklib.evaluation.table1 import by_task, masking_table
from sinklib.evaluation.tasks import get_task, task_names, trace_prompts
from sinklib.explorer import export_pages
from sinklib.generate import collect_traces, demo_trace
from sinklib.loading import load, load_models
from sinklib.paths import NOTEBOOKS
from sinklib.plots import save_figure
from sinklib.provenance import describe, record_artifacts, write_parquet
from sinklib.registry import Registry
from sinklib.sinks import SinkRule
from sinklib.summary import Result
from sinklib.zoo import over_training


def parameters_from_notebook(cls: type) -> type:
    """Give every field of a run config class the default its notebook's parameters cell declares (its own
    fields and those it inherits), before @dataclass reads them. The class must type exactly the notebook's
    parameters: one missing on either side is refused when the module is imported."""
    inspected = papermill.inspect_notebook(str(NOTEBOOKS / f"{cls.NOTEBOOK}.ipynb"))
    defaults = {name: ast.literal_eval(info["default"]) for name, info in inspected.items()}
    hints = {}
    for klass in reversed(cls.__mro__):
        hints.update(klass.__dict__.get("__annotations__", {}))
    typed = {name: hint for name, hint in hints.items() if name != "NOTEBOOK"}
    if set(typed) != set(defaults):
        raise TypeError(f"{cls.__name__} and notebooks/{cls.NOTEBOOK}.ipynb disagree: parameters without a type "
                        f"{sorted(set(defaults) - set(typed))}, types without a parameter {sorted(set(typed) - set(defaults))}")
    cls.__annotations__ = typed  # inherited fields are declared again here, so that they take this notebook's defaults
    for name, value in defaults.items():
        mutable = isinstance(value, (list, dict))
        setattr(cls, name, field(default_factory=lambda value=value: copy.deepcopy(value)) if mutable else value)
    return cls


@dataclass(frozen=True)
class RunConfig:
    """Fields shared by every notebook: where results go, and whether to show progress."""

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> "RunConfig":
        """The config from a notebook's variables (its parameters cell, with papermill's injections)."""
        return cls(**{f.name: namespace[f.name] for f in dataclasses.fields(cls)})

    @classmethod
    def parameter_names(cls) -> list[str]:
        """The notebook's parameter names: this config's fields, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check_keys(cls, given: Mapping[str, Any]) -> None:
        """Refuse (ValueError, with "did you mean") any key of `given` that is not one of this config's parameters."""
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


def _check_task_limits(config) -> None:
    """task, the tasks given per model, and the keys of n_problems_by_task (and ks_by_task) name registered tasks
    only (a misspelt one would fail after the first model's traces, or silently change nothing)."""
    known = task_names()
    if config.task not in known:
        raise ValueError(f"task={config.task!r} is not allowed: task must be one of {known}"
                         f"{did_you_mean(config.task, known)}")
    wrong = {model: task for model, task in config.tasks.items() if task not in known}
    if wrong:
        raise ValueError(f"tasks={config.tasks!r} is not allowed: {wrong} name no task; tasks are {known}")
    for name in ("n_problems_by_task", "ks_by_task"):
        given = getattr(config, name, {})
        unknown = sorted(set(given) - set(task_names()))
        if unknown:
            raise ValueError(f"{name}={given!r} is not allowed: {unknown} are not tasks; tasks are {task_names()}")


def _check_consent(config) -> None:
    """A task that runs model-written code (HumanEval) needs allow_code_execution=True, and a task_path must be a file:
    both would otherwise fail only after the first model's generations."""
    for task in dict.fromkeys([config.task, *config.tasks.values()]):
        if get_task(task).executes_code and not config.allow_code_execution:
            raise ValueError(f"allow_code_execution=False is not allowed with task={task!r}: scoring it runs the "
                             "model-written code; pass allow_code_execution=True to consent (it runs isolated)")
    if config.task_path is not None and not (NOTEBOOKS / config.task_path).is_file():  # read from notebooks/
        raise ValueError(f"task_path={config.task_path!r} is not allowed: task_path must be an existing file of samples")


def _check_layout(config) -> None:
    """gen_length must split into blocks of block_length (LLaDA / MMaDA's layout), when both are given."""
    if config.gen_length is not None and config.block_length is not None and config.gen_length % config.block_length:
        raise ValueError(f"gen_length={config.gen_length!r} is not allowed: gen_length must be a multiple of "
                         f"block_length={config.block_length}")


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class TracesRun(RunConfig):
    """Notebook 01: traces of every model on n_prompts prompts, then their score distributions."""
    NOTEBOOK = "01_attention_distributions"
    models: ModelNames
    trust_remote_code: Consent
    device: Device
    dtype: DType | None
    n_prompts: Count
    steps: Count | None
    gen_length: Count | None
    block_length: Count | None
    seed: Index
    figures_dir: Folder
    results_dir: Folder
    progress: Flag

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length."""
        _check_layout(self)

    def collect(self) -> tuple[dict, dict]:
        """(loaded models by name, their traces by name): one generation per prompt with the family's settings."""
        loaded = self.load()
        traces = {name: collect_traces(model, trace_prompts(model.is_zoo, self.n_prompts), seed=self.seed,
                                       progress=self.progress, **model.settings_for(steps=self.steps,
                                                                                    gen_length=self.gen_length,
                                                                                    block_length=self.block_length))
                  for name, model in loaded.items()}
        return loaded, traces


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class MovingSinksRun(TracesRun):
    """Notebook 02: sink tokens, dynamics and moving sinks, with the Eq. 3 threshold eps (sum units)."""
    NOTEBOOK = "02_moving_sinks"
    eps: NonNegative

    @property
    def rule(self) -> SinkRule:
        """The sink rule (Eq. 3) with this run's eps, in sum units."""
        return SinkRule(self.eps)


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class ThresholdSweepRun(TracesRun):
    """Notebook 03: the share of tokens Eq. 3 selects at each eps."""
    NOTEBOOK = "03_threshold_sweep"
    eps_values: list[NonNegative]

    def check(self) -> None:
        """TracesRun's rules, and at least one eps value."""
        super().check()
        if not self.eps_values:
            raise ValueError("eps_values=[] is not allowed: eps_values must be a non-empty list of numbers >= 0")


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class MaskingRun(RunConfig):
    """Notebook 04: Table 1, accuracy with the top-k sinks masked and a random-key control."""
    NOTEBOOK = "04_masking_ablation"
    models: ModelNames
    task: str
    tasks: dict[str, str]
    task_path: str | None
    n_problems: Count | None
    n_problems_by_task: dict[str, Count]
    steps: Count | None
    gen_length: Count | None
    block_length: Count | None
    ks: Ks
    random_control: Flag
    seed: Index
    eps: NonNegative
    batch_size: Count
    allow_code_execution: Consent
    trust_remote_code: Consent
    device: Device
    dtype: DType | None
    figures_dir: Folder
    results_dir: Folder
    progress: Flag

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length, tasks that exist,
        consent for a task that runs model-written code, and a task_path that exists."""
        _check_layout(self)
        _check_task_limits(self)
        _check_consent(self)


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class ExplorerRun(RunConfig):
    """Notebook 05: one generation in the explorer, and a self-contained page per model."""
    NOTEBOOK = "05_explorer"
    models: ModelNames
    trust_remote_code: Consent
    device: Device
    dtype: DType | None
    prompt: Text
    steps: Count | None
    gen_length: Count | None
    block_length: Count | None
    seed: Index
    eps: NonNegative
    figures_dir: Folder

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length."""
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


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class TrainingDynamicsRun(RunConfig):
    """Notebook 06: sinks over training. Reads the measured checkpoints from `measurements`; with retrain, first
    retrains the zoo models from their seeds into checkpoints_dir and measures every checkpoint there (both resume)."""
    NOTEBOOK = "06_sinks_over_training"
    recipes: list[over_training.RecipeName]
    retrain: Consent  # a real bool: a string "false" must not start an hour of training
    checkpoint_count: Annotated[int, Ge(2)]
    n_problems: Count
    n_traces: Count
    eps: NonNegative
    seed: Index
    measurements: Text | None
    checkpoints_dir: Text | None
    figures_dir: Folder
    progress: Flag

    def check(self) -> None:
        """At least one recipe, each once, and a checkpoint_count each recipe's steps can hold."""
        if not self.recipes or len(set(self.recipes)) != len(self.recipes):
            raise ValueError(f"recipes={self.recipes!r} is not allowed: recipes must be a non-empty list of "
                             "distinct recipe names (zoo models and variants)")
        for name in self.recipes:  # a count the log-spaced steps cannot hold is refused at once (none are built)
            total = over_training.recipe(name).steps
            try:
                over_training.checkpoint_steps(total, self.checkpoint_count)
            except ValueError as error:
                raise ValueError(f"checkpoint_count={self.checkpoint_count!r} is not allowed: recipe {name} trains "
                                 f"{total} steps ({error})") from None

    @property
    def measurement(self) -> over_training.Measurement:
        """How each checkpoint is measured: this run's n_problems, n_traces, eps and seed."""
        return over_training.Measurement(self.n_problems, self.n_traces, self.eps, self.seed)

    def rows(self) -> pd.DataFrame:
        """This run's measured rows (retraining and measuring first when `retrain`), one model after another."""
        measurements = over_training.RESULTS_PATH if self.measurements is None else Path(self.measurements)
        checkpoints = over_training.CHECKPOINTS_DIR if self.checkpoints_dir is None else Path(self.checkpoints_dir)
        if self.retrain:
            # tiny-dream starts from the shipped tiny-arm, so the order of retraining does not matter
            for name in self.recipes:
                over_training.retrain(name, checkpoints, self.checkpoint_count, progress=self.progress)
            over_training.measure_all(list(self.recipes), self.measurement, count=self.checkpoint_count,
                                      folder=checkpoints, results=measurements, progress=self.progress)
        return over_training.select(over_training.read_rows(measurements), self.measurement, self.recipes,
                                    self.checkpoint_count)


@validated
@dataclass(frozen=True)
@parameters_from_notebook
class CarryRun(TracesRun):
    """Notebook 07: what sinks carry (value and output norms), dose–response of masking the top-k sinks against k
    random keys and against ablating the sinks' values, and step-to-step stability of the top keys."""
    NOTEBOOK = "07_what_sinks_carry"
    task: str
    tasks: dict[str, str]
    masking_skip: list[Text]
    n_problems: Count
    n_problems_by_task: dict[str, Count]
    ks: list[Index]
    ks_by_task: dict[str, list[Index]]
    value_ablation: Literal["zero", "mean"]
    top_k: Count
    eps: NonNegative
    batch_size: Count

    def check(self) -> None:
        """TracesRun's rules; ks distinct, with 0 (the unmasked baseline) among them."""
        super().check()
        _check_task_limits(self)
        for name, ks in {"ks": self.ks, **{f"ks_by_task[{t!r}]": k for t, k in self.ks_by_task.items()}}.items():
            if 0 not in ks or len(set(ks)) != len(ks):
                raise ValueError(f"{name}={ks!r} is not allowed: {name} must be distinct integers >= 0 and include 0 "
                                 "(unmasked)")

    def dose_response(self, loaded: dict) -> dict:
        """Table 1 per task over this run's ks for every model not in masking_skip: the top-k sinks masked, k random
        keys, the sinks' values ablated; every (model, condition) resumable under results_dir/table1-<task>/, each row
        with its checks."""
        loaded = {name: model for name, model in loaded.items() if name not in self.masking_skip}
        if not loaded:
            raise ValueError(f"masking_skip={self.masking_skip!r} is not allowed: it leaves no model of {self.models} "
                             "for the dose-response")
        return {task: masking_table(group, task, self.ks_by_task.get(task, self.ks), True, self.eps,
                                    limit=self.n_problems_by_task.get(task, self.n_problems),
                                    out_dir=Path(self.results_dir) / f"table1-{task}", batch_size=self.batch_size,
                                    seed=self.seed, progress=self.progress, value_ablation=self.value_ablation)
                for task, group in by_task(loaded, self.task, self.tasks).items()}


RUNS: Registry[type] = Registry("notebook", {cls.NOTEBOOK: cls for cls in
                                             (TracesRun, MovingSinksRun, ThresholdSweepRun, MaskingRun, ExplorerRun,
                                              TrainingDynamicsRun, CarryRun)})


def run_for(notebook: str | Path) -> type:
    """The run config class of a notebook (by file name or stem)."""
    return RUNS.get(Path(notebook).stem)
