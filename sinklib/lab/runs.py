"""The shared parts of the notebooks' run configs (sinklib.lab: one module per notebook beside them). A config
declares each parameter once, with its type, rules and default; the notebook's parameters cell shows the same
defaults to the reader, and a test holds the two equal (agreement_with_notebook). `python -m sinklib.reproduce`
checks given parameters against the configs before anything runs; each notebook builds its config from its
namespace and every artifact it writes records it. RUNS finds a notebook's config by its file name: notebook
NN_name.ipynb's is in sinklib/lab/nbNN_name.py (run_for imports it)."""
from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from sinklib.derived import derived
from sinklib.evaluation.conditions import CONDITIONS
from sinklib.evaluation.tasks import get_task, task_names
from sinklib.loading import LoadedModel, load_models
from sinklib.model_names import is_default_model
from sinklib.paths import NOTEBOOKS
from sinklib.plots import save_figure
from sinklib.provenance import describe, record_artifacts, write_parquet
from sinklib.registry import Registry
from sinklib.settings import Settings
from sinklib.summary import Result
from sinklib.trace import Trace
from sinklib.validation import BadValue, Consent, Count, DType, Device, Flag, Folder, Index, ModelNames, did_you_mean


def agreement_with_notebook(config: type, notebook: str | Path | None = None) -> list[str]:
    """How a run config and its notebook's parameters cell disagree, one line per difference ([] when they agree):
    a parameter without a field, a field without a parameter, or a default that differs. The config declares the
    defaults (so `sinklib.lab.runs` imports without the checkout's notebooks/); the cell shows them to the reader, and
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
# `make figures` reads them rather than making them again (lab.stores.COMMITTED_RUNS): notebook 02's canvases
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

    def pick(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
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

    def settings_for(self, model: LoadedModel, task: str | None = None) -> Settings:
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
    only, those of control_draws tasks or the run's models (a misspelt one would fail after the first model's
    traces, or silently change nothing)."""
    known = task_names()
    if config.task not in known:
        raise BadValue(f"task={config.task!r} is not allowed: task must be one of {known}"
                       f"{did_you_mean(config.task, known)}")
    wrong = {model: task for model, task in config.tasks.items() if task not in known}
    if wrong:
        raise BadValue(f"tasks={config.tasks!r} is not allowed: {wrong} name no task; tasks are {known}")
    for name in ("n_problems_by_task", "ks_by_task", "control_draws"):
        given = getattr(config, name, {})
        by_model = name == "control_draws"  # also a model of this run, or of the CPU default (the notebook's own entry)
        models = list(getattr(config, "models", ())) if by_model else []
        unknown = sorted(key for key in given if key not in task_names() and key not in models
                         and not (by_model and is_default_model(key)))
        if unknown:
            raise BadValue(f"{name}={given!r} is not allowed: {unknown} are not tasks" + (
                f" or models (of this run, {models}, or the default ones)" if by_model else "") + f"; tasks are {task_names()}")


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


def at_eps(names: tuple[str, ...], eps: float) -> list:
    """Table 1's conditions by name with a run's Eq. 3 threshold (Condition.at: the sink conditions use it)."""
    return [CONDITIONS.get(name).at(eps) for name in names]


def run_for(notebook: str | Path) -> type:
    """The run config class of a notebook (by file name or stem): notebook NN_name's config is in
    sinklib/lab/nbNN_name.py and registers itself when imported."""
    stem = Path(notebook).stem
    if stem not in RUNS:
        for module in sorted(Path(__file__).parent.glob("nb[0-9][0-9]_*.py")):
            importlib.import_module(f"{__package__}.{module.stem}")
    return RUNS.get(stem)


Traces = Mapping[str, Sequence[Trace]]


Models = Mapping[str, LoadedModel]


def _stem(name: str) -> str:
    return Path(name).name
