"""Typed run configs: one per notebook, composed from shared parts (models, sampling, task, outputs). A config
declares each parameter once, with its type, rules and default; the notebook's parameters cell shows the same
defaults to the reader, and a test holds the two equal (agreement_with_notebook). `python -m sinklib.reproduce`
checks given parameters against the configs before anything runs; each notebook builds its config from its
namespace and every artifact it writes records it."""
from __future__ import annotations

import ast
import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping

import pandas as pd

from annotated_types import Ge

from sinklib.validation import (BadValue, Consent, Count, DType, Device, Flag, Folder, Index, Ks, ModelNames, NonNegative,
                                Text, did_you_mean, validated)
from sinklib.evaluation.table1 import CONDITIONS, MaskingTable, by_task, masking_table
from sinklib.evaluation.tasks import TRACE_TASKS, get_task, task_names, trace_prompts
from sinklib.explorer import export_pages
from sinklib.generation import demo_trace, encode
from sinklib.derived import derived
from sinklib.loading import load, load_models
from sinklib.paths import NOTEBOOKS
from sinklib.plots import save_figure
from sinklib.provenance import describe, record_artifacts, write_parquet
from sinklib.registry import Registry
from sinklib.sinks import SinkRule
from sinklib import speed
from sinklib.summary import Result
from sinklib.trace_store import stored_traces
from sinklib.zoo import over_training


def agreement_with_notebook(config: type, notebook: str | Path | None = None) -> list[str]:
    """How a run config and its notebook's parameters cell disagree, one line per difference ([] when they agree):
    a parameter without a field, a field without a parameter, or a default that differs. The config declares the
    defaults (so `sinklib.runs` imports without the checkout's notebooks/); the cell shows them to the reader, and
    tests/unit/test_runs.py holds the two equal with this function."""
    import papermill  # noqa: PLC0415  (the notebooks' extra: only the agreement check reads a notebook)

    path = Path(notebook) if notebook is not None else NOTEBOOKS / f"{config.NOTEBOOK}.ipynb"
    cell = {name: ast.literal_eval(info["default"]) for name, info in papermill.inspect_notebook(str(path)).items()}
    defaults = config()
    fields = config.parameter_names()
    return ([f"parameter {name!r} has no field in {config.__name__}" for name in cell if name not in fields]
            + [f"field {name!r} of {config.__name__} is not a parameter of {path.name}" for name in fields
               if name not in cell]
            + [f"{name}: {path.name} says {cell[name]!r}, {config.__name__} {getattr(defaults, name)!r}"
               for name in fields if name in cell and cell[name] != getattr(defaults, name)])


def default_copy(value: Any) -> Any:
    """A field defaulting to a copy of `value` (a list or dict default is copied for every config made)."""
    return field(default_factory=lambda: copy.deepcopy(value))


# The defaults the notebooks share: every figure runs the zoo, SmolLM2 and its two adapted twins, each on its task.
MODELS = ["tiny-llada", "tiny-dream", "tiny-arm", "smollm2-135m-instruct", "smollm2-135m-diffusion",
          "smollm2-135m-autoregressive"]
TASK_PER_MODEL = {"smollm2-135m-instruct": "capitals", "smollm2-135m-diffusion": "arithmetic-english",
                  "smollm2-135m-autoregressive": "arithmetic-english"}


RUNS: Registry[type] = Registry("notebook")  # notebook stem → its run config (each registers itself)

# Traces that take minutes to make and that only one analysis reads, kept apart from the traces store so that
# `make figures` reads them rather than making them again (sinklib.reproduce.COMMITTED_RUNS): notebook 02's canvases
# under the paper's layout (the twin: 128 tokens in 128 forwards, about 80 s) and the generations notebook 07's logit
# lens reads, with its measurements (a forward and a vocabulary softmax per step and layer: about 2 minutes).
LONG_TRACES = "long-traces"
# The speed–accuracy evaluations of notebook 08 (sinklib.speed; benchmarks/fast_sampling.py makes them): about an
# hour on one core, most of it the diffusion twin's plain sampler on 200 problems. Read by `make figures`.
FAST_SAMPLING = "fast-sampling"
SPEED_MODELS = ["smollm2-135m-diffusion", "smollm2-135m-autoregressive", "tiny-llada", "tiny-dream"]
# The tables the notebooks pick from their traces, each under the key of what it was derived from (sinklib.derived):
# committed, so that a reader and nbval redraw every figure without the traces' scores, which are a cache.
PICKS = "picks"


@dataclass(frozen=True)
class RunConfig:
    """What every notebook's config can do: be made from the notebook's namespace, check given keys, `collect()` what
    the notebook analyses (the one verb every config has) and `save` a section's result. A subclass that names its
    NOTEBOOK registers itself in RUNS, so a notebook needs its file and its config, nothing else."""
    NOTEBOOK: ClassVar[str] = ""
    # the notebooks whose stores this one reads: a run of several notebooks starts it after them (sinklib.reproduce)
    READS_FROM: ClassVar[tuple[str, ...]] = ()
    # wall seconds to run it with its stores made again, one torch thread, 2-core CPU: the slowest starts first
    SECONDS_TO_REGENERATE: ClassVar[int] = 20

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "NOTEBOOK" in cls.__dict__:
            RUNS.register(cls.NOTEBOOK, cls, replace=True)  # a class made again (a reload) replaces the old one

    def collect(self) -> Any:
        """What the notebook analyses (models and traces, tables, measured rows: each config says)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its notebook collects")

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
                raise BadValue(f"parameter {key!r} is not allowed: {cls.__name__} has no such field"
                               f"{did_you_mean(key, names)}; allowed: {names}")

    def pick(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)`, a pick of the notebook's (a DataFrame, or Verdicts), kept under
        results_dir/picks by the key of what it was derived from (sinklib.derived): read back when the same inputs and
        code made it before, so the traces' scores are read (or generated) only when something changed."""
        return derived(Path(getattr(self, "results_dir", self.figures_dir)) / PICKS, function, *args, **kwargs)

    def save(self, result: "Result") -> "Result":
        """Write the result's figures (PNG + PDF), tables (parquet, each with its comparison layout) and texts; each
        carries what defines it (config, seed, notebook) and is entered in its folder's PROVENANCE.json with versions,
        machine and sha256. A table without a layout is refused before anything is written."""
        unlaid = sorted(set(result.tables) - set(result.layouts))
        if unlaid:
            raise BadValue(f"result.tables={unlaid!r} is not allowed: every table needs a summary.Layout in "
                           "result.layouts (the columns that identify a row, for comparing a rerun)")
        record = describe(self, notebook=type(self).NOTEBOOK)
        figures, results = Path(self.figures_dir), Path(getattr(self, "results_dir", self.figures_dir))
        written = []
        for name, fig in result.figures.items():
            written += save_figure(fig, name, figures, record)
        if result.tables:
            results.mkdir(parents=True, exist_ok=True)
        for name, frame in result.tables.items():
            written.append(write_parquet(frame, results / f"{name}.parquet", record, result.layouts[name]))
        for name, text in result.texts.items():
            (figures / name).write_text(text)
            written.append(figures / name)
        record_artifacts(written, record)
        return result


@dataclass(frozen=True)
class ModelsPart:
    """Which models a notebook runs, and how they load (sinklib.load's device, dtype and consent)."""
    models: ModelNames = default_copy(MODELS)  # zoo names, named real models, hub ids or folders
    trust_remote_code: Consent = False
    device: Device = "cpu"
    dtype: DType | None = None

    def load(self) -> dict:
        """The run's models by name (sinklib.load with its device, dtype and trust_remote_code)."""
        return load_models(self.models, device=self.device, dtype=self.dtype, trust_remote_code=self.trust_remote_code)


@dataclass(frozen=True)
class SamplingPart:
    """How each generation is sampled; None takes the family's settings for the task (LoadedModel.settings_for)."""
    steps: Count | None = None
    gen_length: Count | None = None
    block_length: Count | None = None
    seed: Index = 0

    def settings_for(self, model: Any, task: str | None = None):
        """The settings `model` (a LoadedModel) samples with in this run: its own for `task` (LoadedModel.settings_for)
        with this run's steps / gen_length / block_length laid over them. The one place a run's layout reaches a
        model: every section of every notebook asks here."""
        blocks = "block_length" in model.family.option_names()  # a run's block_length is for the models with blocks
        return model.settings_for(None if task is None else get_task(task), steps=self.steps,
                                  gen_length=self.gen_length, block_length=self.block_length if blocks else None)


@dataclass(frozen=True)
class TaskPart:
    """Which task each model answers, and how many of its samples per condition."""
    task: str = "arithmetic"
    tasks: dict[str, str] = default_copy(TASK_PER_MODEL)  # a task per model where it differs from `task`
    n_problems: Count | None = 100
    n_problems_by_task: dict[str, Count] = default_copy({})


@dataclass(frozen=True)
class OutputsPart:
    """Where figures and results tables go, and whether long steps show progress bars."""
    figures_dir: Folder = "../figures"
    results_dir: Folder = "../data/results"
    progress: Flag = True


def _check_task_limits(config) -> None:
    """task, the tasks given per model, and the keys of n_problems_by_task (and ks_by_task) name registered tasks
    only (a misspelt one would fail after the first model's traces, or silently change nothing)."""
    known = task_names()
    if config.task not in known:
        raise BadValue(f"task={config.task!r} is not allowed: task must be one of {known}"
                       f"{did_you_mean(config.task, known)}")
    wrong = {model: task for model, task in config.tasks.items() if task not in known}
    if wrong:
        raise BadValue(f"tasks={config.tasks!r} is not allowed: {wrong} name no task; tasks are {known}")
    for name in ("n_problems_by_task", "ks_by_task"):
        given = getattr(config, name, {})
        unknown = sorted(set(given) - set(task_names()))
        if unknown:
            raise BadValue(f"{name}={given!r} is not allowed: {unknown} are not tasks; tasks are {task_names()}")


def _check_models_named(config, *names: str) -> None:
    """Every model that the fields `names` mention (the keys of `tasks`, the entries of `masking_skip`) is one of the
    run's models: a misspelt one would silently change nothing (`--params {masking_skip: [tiny-lada]}` ran every
    model). The default tasks of the models a run leaves out (TASK_PER_MODEL's entries) are not a mistake."""
    for name in names:
        given = getattr(config, name)
        unknown = [model for model in given if model not in config.models
                   and not (name == "tasks" and TASK_PER_MODEL.get(model) == given[model])]
        if unknown:
            hint = did_you_mean(unknown[0], config.models)
            raise BadValue(f"{name}={given!r} is not allowed: {unknown} are not among models={config.models!r}{hint}")


def _check_consent(config) -> None:
    """A task that runs model-written code (HumanEval) needs allow_code_execution=True, and a task_path must be a file:
    both would otherwise fail only after the first model's generations."""
    for task in dict.fromkeys([config.task, *config.tasks.values()]):
        if get_task(task).executes_code and not config.allow_code_execution:
            raise BadValue(f"allow_code_execution=False is not allowed with task={task!r}: scoring it runs the "
                           "model-written code; pass allow_code_execution=True to consent (it runs isolated)")
    if config.task_path is not None and not (NOTEBOOKS / config.task_path).is_file():  # read from notebooks/
        raise BadValue(f"task_path={config.task_path!r} is not allowed: task_path must be an existing file of samples")


def _check_layout(config) -> None:
    """gen_length must split into blocks of block_length (LLaDA / MMaDA's layout), when both are given."""
    if config.gen_length is not None and config.block_length is not None and config.gen_length % config.block_length:
        raise BadValue(f"gen_length={config.gen_length!r} is not allowed: gen_length must be a multiple of "
                       f"block_length={config.block_length}")


@validated
@dataclass(frozen=True)
class TracesRun(OutputsPart, SamplingPart, ModelsPart, RunConfig):
    """Notebook 01: traces of every model on n_prompts prompts, then their score distributions."""
    NOTEBOOK = "01_attention_distributions"
    SECONDS_TO_REGENERATE = 150
    n_prompts: Count = 6

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length."""
        _check_layout(self)

    def collect(self) -> tuple[dict, dict]:
        """(loaded models by name, their traces by name): one generation per prompt with the family's settings."""
        loaded = self.load()
        traces = {name: stored_traces(model, trace_prompts(model.is_zoo, self.n_prompts), self.trace_store,
                                      seed=self.seed, progress=self.progress, settings=self.settings_for(model))
                  for name, model in loaded.items()}
        return loaded, traces

    @property
    def trace_store(self) -> Path:
        """Where this run's traces are kept, read by every notebook that asks for the same generations (and by a
        rerun): results_dir/traces (sinklib.trace_store)."""
        return Path(self.results_dir) / "traces"

    @property
    def long_trace_store(self) -> Path:
        """Where the traces that take minutes to make are kept: results_dir/long-traces (LONG_TRACES), read by
        `make figures` too and made again only by `python -m sinklib.reproduce --remake-long-runs`."""
        return Path(self.results_dir) / LONG_TRACES


@validated
@dataclass(frozen=True)
class MovingSinksRun(TracesRun):
    """Notebook 02: sink tokens, dynamics and moving sinks, with the Eq. 3 threshold eps (sum units)."""
    NOTEBOOK = "02_moving_sinks"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 60
    eps: NonNegative = 3.0  # Eq. 3 threshold, sum units
    # Fig. 7 under the paper's layout, model → {gen_length, steps, block_length}; None: every diffusion model of the
    # run with its family's paper layout (128 tokens in 128 steps, LLaDA in blocks of 32), halved until it fits
    paper_layouts: dict[str, dict[str, Count]] | None = None
    paper_layout_prompts: Count = 1
    top_k: Count = 5  # the set measure of "do sinks move": each head's top-k keys, step to step

    def check(self) -> None:
        """TracesRun's rules, and layouts that name only steps, gen_length and block_length."""
        super().check()
        allowed = {"steps", "gen_length", "block_length"}
        for name, layout in (self.paper_layouts or {}).items():
            if not layout or set(layout) - allowed:
                raise BadValue(f"paper_layouts[{name!r}]={layout!r} is not allowed: a layout is a non-empty dict of "
                               f"{sorted(allowed)}")
            if name not in self.models:
                raise BadValue(f"paper_layouts[{name!r}] is not allowed: {name!r} is not one of models={self.models!r}")

    @property
    def rule(self) -> SinkRule:
        """The sink rule (Eq. 3) with this run's eps, in sum units."""
        return SinkRule(self.eps)


    def collect_paper_layouts(self, loaded: Mapping[str, Any]) -> dict[str, list]:
        """Traces under the paper's layout, by label ("tiny-llada, 64 tokens in 64 steps, blocks of 16"): each model of
        `paper_layouts` (default: every diffusion model of `loaded`, its family's paper layout fitted by
        fitted_paper_layout) on the first paper_layout_prompts prompts of its task, kept in long_trace_store."""
        traces = {}
        for name, model in loaded.items():
            prompts = trace_prompts(model.is_zoo, self.paper_layout_prompts)
            layout = (self.paper_layouts.get(name) if self.paper_layouts is not None
                      else fitted_paper_layout(model, prompts))
            if layout is None:
                continue
            settings = model.settings_for(**layout)
            blocks = f", blocks of {layout['block_length']}" if layout.get("block_length") else ""
            label = f"{name}, {settings.gen_length} tokens in {settings.steps} steps{blocks}"
            traces[label] = stored_traces(model, prompts, self.long_trace_store, seed=self.seed,
                                          progress=self.progress, settings=settings)
        return traces


def at_eps(names: tuple[str, ...], eps: float) -> list:
    """Table 1's conditions by name with a run's Eq. 3 threshold (Condition.at: the sink conditions use it)."""
    return [CONDITIONS.get(name).at(eps) for name in names]


def fitted_paper_layout(model: Any, prompts: list[str]) -> dict[str, int] | None:
    """A diffusion model's family's paper layout (gen_length, steps and, for LLaDA / MMaDA, block_length), halved
    until the longest prompt and the canvas fit the positions the model handles; None for an autoregressive model."""
    if model.family.kind != "diffusion" or model.family.paper is None:
        return None
    paper = model.family.paper
    layout = {"gen_length": paper.gen_length, "steps": paper.steps,
              **({"block_length": paper.block_length} if getattr(paper, "block_length", None) else {})}
    longest = max(len(encode(model, prompt, chat=model.chat)) for prompt in prompts)
    while model.max_length is not None and longest + layout["gen_length"] > model.max_length and layout["gen_length"] > 1:
        layout = {key: max(1, value // 2) for key, value in layout.items()}
    return layout


@validated
@dataclass(frozen=True)
class ThresholdSweepRun(TracesRun):
    """Notebook 03: the share of tokens Eq. 3 selects at each eps."""
    NOTEBOOK = "03_threshold_sweep"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 30
    eps_values: list[NonNegative] = default_copy([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0])

    def check(self) -> None:
        """TracesRun's rules, and at least one eps value."""
        super().check()
        if not self.eps_values:
            raise BadValue("eps_values=[] is not allowed: eps_values must be a non-empty list of numbers >= 0")


@validated
@dataclass(frozen=True)
class MaskingRun(OutputsPart, TaskPart, SamplingPart, ModelsPart, RunConfig):
    """Notebook 04: Table 1, accuracy with the top-k sinks masked and a random-key control."""
    NOTEBOOK = "04_masking_ablation"
    SECONDS_TO_REGENERATE = 190
    task_path: str | None = None  # a local JSONL for the task (e.g. GSM8K on an offline node)
    n_problems_by_task: dict[str, Count] = default_copy({"arithmetic-english": 200})  # the twins' committed runs
    ks: Ks = default_copy([0, 1, 5, 10])
    random_control: Flag = True
    eps: NonNegative = 3.0
    batch_size: Count = 50
    allow_code_execution: Consent = False
    # models compared on the problems all of them solve unmasked (a table per task where two or more answer it)
    competence_matched: list[Text] = default_copy(["smollm2-135m-diffusion", "smollm2-135m-autoregressive"])

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length, tasks that exist,
        consent for a task that runs model-written code, and a task_path that exists."""
        _check_layout(self)
        _check_task_limits(self)
        _check_models_named(self, "tasks")
        _check_consent(self)

    def collect(self) -> dict[str, MaskingTable]:
        """Table 1, one table per task: each model on its own task (by_task), every (model, condition) resumable under
        results_dir/table1-<task>/."""
        conditions = at_eps(("sinks", "random keys") if self.random_control else ("sinks",), self.eps)
        return {task: masking_table(group, self.task_of(task), conditions, self.ks,
                                    {model.name: self.settings_for(model, task) for model in group},
                                    batch_size=self.batch_size, seed=self.seed,
                                    out_dir=Path(self.results_dir) / f"table1-{task}",
                                    allow_code_execution=self.allow_code_execution, progress=self.progress)
                for task, group in by_task(self.load(), self.task, self.tasks).items()}

    def evaluation_of(self, model: Any, limit: int | None = None) -> dict[str, Any]:
        """What collect() evaluates `model` (a LoadedModel) with, as keyword arguments of sinklib.evaluate: its task
        (with the run's task file where it is the run's own task; its first `limit` problems, None: the run's
        n_problems), its settings, seed, batch size and consent."""
        task = self.tasks.get(model.name, self.task)
        return dict(task=get_task(self.task_of(task), limit=limit), settings=self.settings_for(model, task),
                    seed=self.seed, batch_size=self.batch_size, allow_code_execution=self.allow_code_execution)

    def task_of(self, task: str):
        """The Task a table of `task` reads: its n_problems (n_problems_by_task, else n_problems), and the run's task
        file where it is the run's own task (a model given another task reads that task's own data)."""
        return get_task(task, path=self.task_path if task == self.task else None,
                        limit=self.n_problems_by_task.get(task, self.n_problems))


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


@validated
@dataclass(frozen=True)
class TrainingDynamicsRun(RunConfig):
    """Notebook 06: sinks over training. Reads the measured checkpoints from `measurements`; with retrain, first
    retrains the zoo models from their seeds into checkpoints_dir and measures every checkpoint there (both resume)."""
    NOTEBOOK = "06_sinks_over_training"
    recipes: list[over_training.RecipeName] = default_copy(["tiny-llada", "tiny-llada-prompt-masking", "tiny-dream",
                                                        "tiny-arm"])
    retrain: Consent = False  # a real bool: a string "false" must not start an hour of training
    checkpoint_count: Annotated[int, Ge(2)] = 8
    n_problems: Count = 300
    n_traces: Count = 30
    eps: NonNegative = 3.0
    seed: Index = 0
    measurements: Text | None = None  # None: the committed data/over_training/training_dynamics.parquet
    checkpoints_dir: Text | None = None  # None: data/checkpoints/
    figures_dir: Folder = "../figures"
    progress: Flag = True

    def check(self) -> None:
        """At least one recipe, each once, and a checkpoint_count each recipe's steps can hold."""
        if not self.recipes or len(set(self.recipes)) != len(self.recipes):
            raise BadValue(f"recipes={self.recipes!r} is not allowed: recipes must be a non-empty list of "
                           "distinct recipe names (zoo models and variants)")
        for name in self.recipes:  # a count the log-spaced steps cannot hold is refused at once (none are built)
            total = over_training.recipe(name).steps
            try:
                over_training.checkpoint_steps(total, self.checkpoint_count)
            except ValueError as error:
                raise BadValue(f"checkpoint_count={self.checkpoint_count!r} is not allowed: recipe {name} trains "
                               f"{total} steps ({error})") from None

    @property
    def measurement(self) -> over_training.Measurement:
        """How each checkpoint is measured: this run's n_problems, n_traces, eps and seed."""
        return over_training.Measurement(self.n_problems, self.n_traces, self.eps, self.seed)

    def collect(self) -> pd.DataFrame:
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
class CarryRun(TaskPart, TracesRun):
    """Notebook 07: what sinks carry (value and output norms), dose–response of masking the top-k sinks against k
    random keys and against ablating the sinks' values, and step-to-step stability of the top keys."""
    NOTEBOOK = "07_what_sinks_carry"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 260
    n_prompts: Count = 4
    masking_skip: list[Text] = default_copy([])  # models left out of the dose–response
    n_problems: Count = 20
    n_problems_by_task: dict[str, Count] = default_copy({"arithmetic-english": 10})
    ks: list[Index] = default_copy([0, 1, 2, 5, 10, 20])
    ks_by_task: dict[str, list[Index]] = default_copy({"arithmetic-english": [0, 1, 5, 20]})
    value_ablation: Literal["zero", "mean"] = "zero"
    # read by the logit lens; None: every diffusion model of the run on transformers' own code (not remote code)
    lens_models: list[Text] | None = None
    lens_traces: Count = 2  # generations per model the logit lens reads, every step and layer
    top_k: Count = 5
    eps: NonNegative = 3.0
    batch_size: Count = 20

    def check(self) -> None:
        """TracesRun's rules; ks distinct, with 0 (the unmasked baseline) among them."""
        super().check()
        _check_task_limits(self)
        _check_models_named(self, "tasks", "masking_skip")
        self.check_lens_models()
        for name, ks in {"ks": self.ks, **{f"ks_by_task[{t!r}]": k for t, k in self.ks_by_task.items()}}.items():
            if 0 not in ks or len(set(ks)) != len(ks):
                raise BadValue(f"{name}={ks!r} is not allowed: {name} must be distinct integers >= 0 and include 0 "
                               "(unmasked)")

    def check_lens_models(self) -> None:
        """The logit lens reads models this run generates with: each of lens_models must be one of models."""
        missing = [name for name in self.lens_models or () if name not in self.models]
        if missing:
            raise BadValue(f"lens_models={self.lens_models!r} is not allowed: {missing} are not in models={self.models!r}")

    def lens_names(self, loaded: Mapping[str, Any]) -> list[str]:
        """The models the logit lens reads: lens_models, or every diffusion model of `loaded` that runs on
        transformers' own code (sinklib.lens cannot read remote modelling code's hidden states)."""
        if self.lens_models is not None:
            return list(self.lens_models)
        return [name for name, model in loaded.items() if model.family.kind == "diffusion" and model.calling == "native"]

    def collect_lens_traces(self, loaded: Mapping[str, Any]) -> dict[str, list]:
        """The generations the logit lens reads, by model (lens_names): the first lens_traces of each model's traces
        (the same inputs as collect()'s), kept with their lens measurements in long_trace_store."""
        return {name: stored_traces(loaded[name], trace_prompts(loaded[name].is_zoo, self.lens_traces),
                                    self.long_trace_store, seed=self.seed, progress=self.progress,
                                    settings=self.settings_for(loaded[name]))
                for name in self.lens_names(loaded)}

    def dose_response(self, loaded: dict) -> dict:
        """Table 1 per task over this run's ks for every model not in masking_skip: the top-k sinks masked, k random
        keys, the sinks' values ablated; every (model, condition) resumable under results_dir/table1-<task>/, each row
        with its checks."""
        loaded = {name: model for name, model in loaded.items() if name not in self.masking_skip}
        if not loaded:
            raise BadValue(f"masking_skip={self.masking_skip!r} is not allowed: it leaves no model of {self.models} "
                           "for the dose-response")
        conditions = at_eps(("sinks", "random keys", f"sink values ({self.value_ablation})"), self.eps)
        return {task: masking_table(group, get_task(task, limit=self.n_problems_by_task.get(task, self.n_problems)),
                                    conditions, self.ks_by_task.get(task, self.ks),
                                    {model.name: self.settings_for(model, task) for model in group},
                                    out_dir=Path(self.results_dir) / f"table1-{task}", batch_size=self.batch_size,
                                    seed=self.seed, progress=self.progress)
                for task, group in by_task(loaded, self.task, self.tasks).items()}


@validated
@dataclass(frozen=True)
class SpeedRun(OutputsPart, ModelsPart, RunConfig):
    """Notebook 08: can sinks make a diffusion LM fast? Every model under each of its sampling policies
    (sinklib.speed: Fast-dLLM's caches and confidence threshold) on n_problems held-out problems of its task and
    n_timed of them timed side by side; then what a cached policy does to one generation's attention and sinks."""
    NOTEBOOK = "08_sinks_for_speed"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 40
    models: ModelNames = default_copy(SPEED_MODELS)
    n_problems: Count = 200
    n_timed: Count = 20
    trace_model: Text | None = None  # None: the run's first diffusion model on transformers' own code (the twin)
    trace_policy: Text = "threshold + dual cache"
    k: Count = 5
    eps: NonNegative = 3.0
    seed: Index = 0
    # Table 1's top-1 and random-1 columns and the oldest keys evicted (the paper's §5.3), on these models (None: the
    # traced diffusion model and every autoregressive one): a diffusion model under its plain sampler and
    # masking_policy, an autoregressive one with its KV cache
    masking_models: ModelNames | None = None
    masking_policy: Text = "threshold + dual cache"
    # the diffusion model's sampler for the eviction: a policy of sinklib.speed ("plain": about 90 minutes on one core
    # for the twin; the default, the fastest policy inside plain's interval, about 15)
    eviction_policy: Text = "threshold + dual cache"
    evicted: Ks = default_copy([1, 3])  # the oldest keys evicted (the twins' chat header, "<|im_start|>user\n", is 3)
    masking_batch_size: Count = 50  # as notebook 04's committed Table 1 runs, which the plain sampler's columns reuse

    def check(self) -> None:
        """trace_model one of models; trace_policy and masking_policy among sinklib.speed.POLICIES but plain,
        eviction_policy among them; masking_models among models."""
        if self.trace_model is not None and self.trace_model not in self.models:
            raise BadValue(f"trace_model={self.trace_model!r} is not allowed: it must be one of models={self.models!r}")
        for name in ("trace_policy", "masking_policy"):
            if getattr(self, name) not in speed.POLICIES or getattr(self, name) == "plain":
                raise BadValue(f"{name}={getattr(self, name)!r} is not allowed: choose one of "
                               f"{[p for p in speed.POLICIES if p != 'plain']}")
        if self.eviction_policy not in speed.POLICIES:
            raise BadValue(f"eviction_policy={self.eviction_policy!r} is not allowed: choose one of "
                           f"{list(speed.POLICIES)}")
        strangers = [name for name in self.masking_models or () if name not in self.models]
        if strangers:
            raise BadValue(f"masking_models={self.masking_models!r} is not allowed: {strangers} are not among "
                           f"models={self.models!r}")

    @property
    def speed_store(self) -> Path:
        """Where the evaluations and the timing live: results_dir/fast-sampling (FAST_SAMPLING)."""
        return Path(self.results_dir) / FAST_SAMPLING

    def collect(self) -> tuple[dict, pd.DataFrame]:
        """(loaded models, the speed–accuracy table): each (model, policy) evaluated on n_problems problems of its
        task (the held-out arithmetic) and n_timed of them timed side by side, all read from speed_store when it
        holds this run's (they resume there otherwise: an hour for the diffusion twin's plain sampler)."""
        loaded = self.load()
        task_of = {name: TRACE_TASKS[model.is_zoo] for name, model in loaded.items()}
        speed.measure(loaded, task_of, self.speed_store, self.n_problems, progress=self.progress)
        timing = speed.stored_timing(loaded, task_of, self.speed_store, self.n_timed, progress=self.progress)
        return loaded, speed.frontier(self.speed_store, timing, models=list(loaded))

    def collect_masking(self, loaded: Mapping[str, Any]) -> dict[tuple[str, str], MaskingTable]:
        """(model, sampler) → Table 1 with its top-1 sink and one random key masked, on n_problems of the model's
        task: a diffusion model under its plain sampler (notebook 04's runs in results_dir/table1-<task>) and under
        masking_policy (speed_store/table1), an autoregressive model with its KV cache. Every run resumes from its file
        (about 45 minutes a column for the diffusion twin's plain sampler on one core, 8 under the fast policy)."""
        return {(name, sampler): self._masking(loaded[name], sampler, [0, 1])
                for name in self.masked_models(loaded) for sampler in self._samplers(loaded[name], "plain",
                                                                                     self.masking_policy)}

    def collect_eviction(self, loaded: Mapping[str, Any]) -> dict[tuple[str, str], MaskingTable]:
        """(model, sampler) → Table 1 with each model's oldest `evicted` keys evicted (the paper's §5.3), on the
        models of collect_masking: a diffusion model under eviction_policy, an autoregressive one with its KV cache."""
        return {(name, sampler): self._masking(loaded[name], sampler, [0, *self.evicted], ["oldest keys"])
                for name in self.masked_models(loaded) for sampler in self._samplers(loaded[name], self.eviction_policy)}

    @staticmethod
    def _samplers(model, *policies: str) -> list[str]:
        return list(policies) if model.family.kind == "diffusion" else [speed.AUTOREGRESSIVE_POLICY]

    def _masking(self, model, sampler: str, ks: list[int], conditions: list[str] | None = None) -> MaskingTable:
        """One model's Table 1 columns `ks` of `conditions` under `sampler` (a policy of sinklib.speed: "plain" and
        an autoregressive model's KV cache run its own settings from results_dir/table1-<task>, the others from
        speed_store/table1)."""
        task = TRACE_TASKS[model.is_zoo]
        own = sampler in ("plain", speed.AUTOREGRESSIVE_POLICY)
        return masking_table([model], get_task(task, limit=self.n_problems), conditions or ("sinks", "random keys"), ks,
                             None if own else speed.policy_settings(model, sampler),
                             batch_size=self.masking_batch_size, seed=self.seed, progress=self.progress,
                             out_dir=Path(self.results_dir) / f"table1-{task}" if own else self.speed_store / "table1")

    def masked_models(self, loaded: Mapping[str, Any]) -> list[str]:
        """masking_models, else the run's first diffusion model on transformers' own code (the traced one) and every
        autoregressive model of the run."""
        if self.masking_models is not None:
            return list(self.masking_models)
        diffusion = [name for name, model in loaded.items() if model.family.kind == "diffusion" and model.calling == "native"]
        return diffusion[:1] + [name for name, model in loaded.items() if model.family.kind == "autoregressive"]

    def traced(self, loaded: Mapping[str, Any]) -> str:
        """The model the attention section traces: trace_model, else the run's first diffusion model on transformers'
        own code (a cache needs one)."""
        name = self.trace_model or next((name for name, model in loaded.items() if model.family.kind == "diffusion"
                                         and model.calling == "native"), None)
        if name is None:
            raise BadValue(f"models={self.models!r} is not allowed with trace_model=None: no model of the run is a "
                           "diffusion model on transformers' own code (a cache needs one)")
        return name

    def collect_traces(self, loaded: Mapping[str, Any]) -> dict[str, Any]:
        """trace_model's (or the run's first native diffusion model's) first traced prompt under its plain sampler
        (notebook 01's trace) and under trace_policy,
        with attention captured, from the trace store (made there if missing)."""
        model = loaded[self.traced(loaded)]
        prompt = trace_prompts(model.is_zoo, 1)
        store = Path(self.results_dir) / "traces"
        return {f"{policy}": stored_traces(model, prompt, store, seed=self.seed, progress=False,
                                           settings=speed.policy_settings(model, policy))[0]
                for policy in ("plain", self.trace_policy)}


def run_for(notebook: str | Path) -> type:
    """The run config class of a notebook (by file name or stem)."""
    return RUNS.get(Path(notebook).stem)
