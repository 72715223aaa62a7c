"""Notebook 06, sinks over training: its run config (TrainingDynamicsRun). The measured rows are read by
sinklib.zoo.over_training; retraining is experiments/zoo/retrain.py, run from a checkout."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pandas as pd
from annotated_types import Ge

from sinklib.validation import BadValue, Consent, Count, Flag, Folder, Index, NonNegative, Text, validated
from sinklib.zoo import over_training
from sinklib.lab.runs import RunConfig, default_copy


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
