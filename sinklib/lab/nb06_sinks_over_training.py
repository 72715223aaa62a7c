"""Notebook 06, sinks over training: its run config (TrainingDynamicsRun) and its report (report_training_dynamics,
findings). The measured rows are read by sinklib.zoo.over_training; retraining is experiments/zoo/retrain.py, run
from a checkout (retrain=True reaches it there)."""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Annotated

import pandas as pd
from annotated_types import Ge

from sinklib import dynamics, plots
from sinklib.paths import INSTALLED
from sinklib.summary import Result, Summary
from sinklib.validation import BadValue, Consent, Count, Flag, Folder, Index, NonNegative, Text, validated
from sinklib.zoo import over_training
from sinklib.zoo.over_training import SHIPPED
from sinklib.zoo.recipes import checkpoint_steps, recipe
from sinklib.lab.runs import RunConfig, default_copy

CHECKOUT = Path(__file__).resolve().parents[2]  # sinklib/lab/nb06_….py → the checkout, where experiments/ is


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
            total = recipe(name).steps
            try:
                checkpoint_steps(total, self.checkpoint_count)
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
            retraining = _retraining()
            # tiny-dream starts from the shipped tiny-arm, so the order of retraining does not matter
            for name in self.recipes:
                retraining.retrain(name, checkpoints, self.checkpoint_count, progress=self.progress)
            retraining.measure_all(list(self.recipes), self.measurement, count=self.checkpoint_count,
                                   folder=checkpoints, results=measurements, progress=self.progress)
        return over_training.select(over_training.read_rows(measurements), self.measurement, self.recipes,
                                    self.checkpoint_count)


def _retraining() -> ModuleType:
    """experiments/zoo/retrain.py, which retrains and measures: a program of the checkout, not of the package (a
    notebook's kernel runs in notebooks/, so the checkout is put on the path first)."""
    if INSTALLED:
        raise BadValue("retrain=True is not allowed from an installed sinklib: retraining is experiments/zoo/"
                       "retrain.py, run from a checkout (python -m experiments.zoo over-training)")
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    return importlib.import_module("experiments.zoo.retrain")


def report_training_dynamics(rows: pd.DataFrame, name: str = "training_dynamics", figure=None) -> Result:
    """The figure, a Markdown table of every row, and a summary: per model its first and last checkpoints and the
    shipped model, with findings computed from the rows.

    Args:
        rows: the measured checkpoints (read_rows, select).
        name: the figure's and the table's file stem.
        figure: the rows drawn (plots.training_dynamics_plot, as a notebook shows the call); None draws them here.

    Returns:
        The summary.Result that a run config's `save` writes."""
    if figure is None:
        figure = plots.training_dynamics_plot(rows)
    shown_columns = ["step", "accuracy", "accuracy_top1_masked", "accuracy_random1_masked", "share_mask",
                     "share_special", "share_punctuation", "share_content", "top_sink_token", "top_key_score_mean",
                     "move_rate"]
    table = rows.set_index(["model", "checkpoint"])[shown_columns]
    return Result(figures={name: figure},
                  texts={f"{name}.md": table.to_markdown(floatfmt=".3f") + "\n"},
                  shown=Summary(table, [finding for name in dict.fromkeys(rows["model"])
                                        for finding in findings(rows[rows["model"] == name])]))


def findings(rows: pd.DataFrame) -> list[str]:
    """What one model's rows show, in words, from the numbers: accuracy and masking at the last checkpoint, when
    masking the top-1 sink starts to cost more than masking a random key, and where the sinks sit early and late."""
    name = rows["model"].iloc[0]
    trained = rows[rows["checkpoint"] != SHIPPED]
    first, last = trained.iloc[0], trained.iloc[-1]
    lines = [f"{name}: accuracy {first['accuracy']:.2f} at step {first['step']} → {last['accuracy']:.2f} at step "
             f"{last['step']}; there, top-1 sink masked {last['accuracy_top1_masked']:.2f}, one random key masked "
             f"{last['accuracy_random1_masked']:.2f}."]
    gap = trained["accuracy_random1_masked"] - trained["accuracy_top1_masked"]
    dependent = trained[(gap > 0.2) & (trained["accuracy"] > 0.5)]
    lines.append(f"{name}: from step {dependent.iloc[0]['step']} on, masking the top-1 sink costs over 0.2 more "
                 "accuracy than masking a random key (counted where unmasked accuracy is above 0.5)."
                 if len(dependent) else f"{name}: at no checkpoint with unmasked accuracy above 0.5 does masking the "
                 "top-1 sink cost over 0.2 more than masking a random key.")
    for point in (first, trained.iloc[len(trained) // 2], last):
        lines.append(f"{name} step {point['step']}: {_where_sinks_sit(point)}; top key's score "
                     f"{point['top_key_score_mean']:.1f} (sum units); move rate "
                     + ("n/a" if pd.isna(point["move_rate"]) else f"{point['move_rate']:.2f}") + ".")
    shipped = rows[rows["checkpoint"] == SHIPPED]
    if len(shipped):
        lines.append(f"{name}: the shipped model scores {shipped.iloc[0]['accuracy']:.2f} on the same problems "
                     f"(the retrained last checkpoint {last['accuracy']:.2f}).")
    return lines


def _where_sinks_sit(point: pd.Series) -> str:
    """"sinks mostly on <group> tokens (share; top token 't' share)", or that Eq. 3 found none."""
    groups = {group: point[f"share_{group}"] for group in dynamics.TOKEN_GROUPS}
    if any(pd.isna(share) for share in groups.values()):
        return "no sinks (Eq. 3 selects no key)"
    largest = max(groups, key=groups.get)
    return (f"sinks mostly on {largest} tokens ({groups[largest]:.0%}; top token {point['top_sink_token']!r} "
            f"{point['top_sink_share']:.0%})")
