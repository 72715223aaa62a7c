"""Sinks over training: each zoo model retrained from its seed with checkpoints, every checkpoint measured alike.

At each checkpoint (and once on the shipped model, for comparison) one row of measurements:
- accuracy on the first n_problems held-out problems, unmasked, with the top-1 sink masked and with one random
  key masked (Table 1's conditions, through masking_table);
- which tokens host the sinks (Table 2's detections over every step, layer and head of n_traces generations),
  grouped as mask / special / punctuation / content (dynamics.token_group);
- the main sink: the top key's score (sum units, uniform attention scores 1) averaged over steps, layers and
  heads, and for the strongest head; how often a head's greatest sink moves between steps (move rate).

The checkpoints live in data/checkpoints/ (not committed); the rows go to data/results/training_dynamics.parquet,
written after every checkpoint, and a rerun measures only the checkpoints without a row.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from annotated_types import Ge

import pandas as pd
from tqdm.auto import tqdm

from sinklib import dynamics
from sinklib.evaluation.table1 import masking_table
from sinklib.generate import collect_traces
from sinklib.loading import LoadedModel, load
from sinklib.paths import DATA_DIR, ZOO_DIR
from sinklib.provenance import describe, record_artifacts, write_parquet
from sinklib.summary import Result, Summary
from sinklib.validation import Count, Index, NonNegative, checked, validated
from sinklib.zoo.data import prompts
from sinklib.zoo.train import ZOO, checkpoint_folder, checkpoint_steps, recipe, train

CHECKPOINTS_DIR = DATA_DIR / "checkpoints"
RESULTS_PATH = DATA_DIR / "results" / "training_dynamics.parquet"
FORMAT_MARKERS = ("Q:", "A:", "####")  # the zoo's prompt and answer markers: structure, not content
SHIPPED = "shipped"  # the checkpoint column of the shipped model's row
RecipeName = Literal["tiny-llada", "tiny-dream", "tiny-arm", "tiny-llada-prompt-masking"]  # train.ZOO and VARIANTS
KEY = ["model", "checkpoint", "n_problems", "n_traces", "eps", "seed"]
COLUMNS = KEY + ["step", "train_steps", "loss", "accuracy", "accuracy_stderr", "accuracy_top1_masked",
                 "accuracy_random1_masked", *(f"share_{group}" for group in dynamics.TOKEN_GROUPS), "top_sink_token",
                 "top_sink_share", "top_key_score_mean", "top_key_score_max_head", "move_rate", "share_heads_with_sink"]


@validated
@dataclasses.dataclass(frozen=True)
class Measurement:
    """How every checkpoint is measured: held-out problems per condition, generations for the sink statistics,
    the Eq. 3 threshold (sum units) and the seed of the random-key control and of the generations."""

    n_problems: Count = 300
    n_traces: Count = 30
    eps: NonNegative = 3.0
    seed: Index = 0


@checked
def retrain(name: RecipeName, folder: Path = CHECKPOINTS_DIR, count: Annotated[int, Ge(2)] = 8, threads: int = 2,
            progress: bool = True, donors: Path = ZOO_DIR) -> list[Path]:
    """Train zoo model (or studied variant, train.VARIANTS) `name` from its seed, saving its weights at step 0
    and `count` log-spaced steps up to the last (train.checkpoint_steps) in folder/name/step-NNNNN; a rerun goes
    on from the latest checkpoint and trains nothing when all exist. A model that starts from another (tiny-dream
    from tiny-arm) starts from the shipped one in `donors`, as the shipped model did.
    Returns the checkpoint folders in step order."""
    spec = recipe(name)
    steps = checkpoint_steps(spec.steps, count)
    run_folder = folder / name
    run_folder.mkdir(parents=True, exist_ok=True)
    if not all(checkpoint_folder(run_folder, step).is_dir() for step in steps):
        train(name, donors, threads=threads, progress=progress, checkpoints=run_folder, checkpoint_at=tuple(steps),
              curve_path=run_folder / "loss_curve.csv")
    return [checkpoint_folder(run_folder, step) for step in steps]


def measure(loaded: LoadedModel, how: Measurement, scratch: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """One row of measurements of a zoo model (the module docstring lists them). `scratch` keeps Table 1's
    per-problem answers so that an interrupted measurement resumes."""
    table = masking_table([loaded], ks=(0, 1), random_control=True, eps=how.eps, limit=how.n_problems,
                          out_dir=scratch, batch_size=50, seed=how.seed, progress=progress).frame
    accuracy = {(condition, k): (a, s) for condition, k, a, s in
                zip(table["condition"], table["k"], table["accuracy"], table["stderr"])}
    traces = collect_traces(loaded, prompts(how.n_traces), seed=how.seed, progress=progress, **loaded.settings_for())
    frequency = dynamics.sink_token_frequency(traces, how.eps, top=None)
    groups = dynamics.sink_token_groups(frequency, mask_token=loaded.tokenizer.mask_token,
                                        special_tokens=set(loaded.tokenizer.all_special_tokens), markers=FORMAT_MARKERS)
    top_keys = pd.concat([dynamics.main_sink_by_layer_head(trace) for trace in traces])
    motion = dynamics.dynamics_summary(traces, how.eps)
    return {"accuracy": accuracy[("sinks", 0)][0], "accuracy_stderr": accuracy[("sinks", 0)][1],
            "accuracy_top1_masked": accuracy[("sinks", 1)][0], "accuracy_random1_masked": accuracy[("random keys", 1)][0],
            **{f"share_{group}": share for group, share in groups.items()},
            "top_sink_token": frequency["token"].iloc[0] if len(frequency) else "",
            "top_sink_share": float(frequency["share"].iloc[0]) if len(frequency) else 0.0,
            "top_key_score_mean": float(top_keys["score"].mean()),
            "top_key_score_max_head": float(top_keys.groupby(["layer", "head"])["score"].mean().max()),
            "move_rate": float(motion["move_rate"].mean()),
            "share_heads_with_sink": float(motion["share_heads_with_sink"].mean())}


@checked
def measure_all(names: list[RecipeName], how: Measurement = Measurement(), folder: Path = CHECKPOINTS_DIR,
                results: Path = RESULTS_PATH, progress: bool = True) -> pd.DataFrame:
    """Measure every checkpoint retrain() saved for `names`, and each shipped zoo model, into `results`: the file is
    rewritten after each row, and rows already there for the same measurement settings are kept, not redone.
    A model whose checkpoints are missing is refused before anything is measured. Returns the rows."""
    plan = [(name, _checkpoints(folder, name)) for name in names]
    rows = read_rows(results)
    done = {tuple(row[k] for k in KEY) for row in rows.to_dict("records")}
    jobs = [(name, path) for name, paths in plan for path in [*paths, *([ZOO_DIR / name] if name in ZOO else [])]]
    for name, path in tqdm(jobs, desc="measure checkpoints", disable=not progress):
        checkpoint = SHIPPED if path.parent == ZOO_DIR else path.name
        key = {"model": name, "checkpoint": checkpoint, **dataclasses.asdict(how)}
        if tuple(key[k] for k in KEY) in done:
            continue
        loaded = dataclasses.replace(load(str(path)), name=f"{name}@{checkpoint}")
        row = {**key, **_training_point(folder / name, name, checkpoint),
               **measure(loaded, how, scratch=folder / name / "measurements", progress=False)}
        rows = pd.concat([rows, pd.DataFrame([row], columns=COLUMNS)], ignore_index=True) if len(rows) else \
            pd.DataFrame([row], columns=COLUMNS)
        _write(rows, results, describe(dataclasses.asdict(how), what="sinks over training"))
    return read_rows(results)


def _checkpoints(folder: Path, name: str) -> list[Path]:
    """The checkpoint folders retrain() saved for `name`, in step order; none is refused."""
    found = sorted(path for path in (folder / name).glob("step-[0-9]*") if (path / "model.safetensors").exists()
                   and not path.name.endswith(".partial"))
    if not found:
        raise ValueError(f"names: {name!r} has no checkpoints in {folder / name}: retrain it first "
                         f"(python -m sinklib.zoo over-training --retrain)")
    return found


def _training_point(run_folder: Path, name: str, checkpoint: str) -> dict[str, Any]:
    """Step, the run's total steps and the training loss around the step (mean of the 50 steps before it; NaN
    at step 0) — from the retrained run's loss curve, or the shipped model's own for its row."""
    total = recipe(name).steps
    step = total if checkpoint == SHIPPED else int(checkpoint.removeprefix("step-"))
    curve_path = ZOO_DIR / name / "loss_curve.csv" if checkpoint == SHIPPED else run_folder / "loss_curve.csv"
    curve = pd.read_csv(curve_path)
    window = curve[(curve["step"] < step) & (curve["step"] >= step - 50)]["loss"]
    return {"step": step, "train_steps": total, "loss": float(window.mean()) if len(window) else float("nan")}


def read_rows(results: Path = RESULTS_PATH) -> pd.DataFrame:
    """The measured rows (empty, with the columns, when the file does not exist yet)."""
    return pd.read_parquet(results) if Path(results).exists() else pd.DataFrame(columns=COLUMNS)


def _write(rows: pd.DataFrame, results: Path, record: dict[str, Any]) -> None:
    """Rows sorted by model, step and checkpoint, written whole through a scratch file in the same folder and
    entered in the folder's PROVENANCE.json."""
    results.parent.mkdir(parents=True, exist_ok=True)
    ordered = rows.sort_values(["model", "step", "checkpoint"] + KEY[2:], kind="stable").reset_index(drop=True)
    handle, scratch = tempfile.mkstemp(dir=results.parent, prefix=f".{results.name}.", suffix=".partial")
    os.close(handle)
    try:
        write_parquet(ordered, scratch, record)
        os.replace(scratch, results)
        record_artifacts([results], record)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


def select(rows: pd.DataFrame, how: Measurement, names: Sequence[str]) -> pd.DataFrame:
    """The rows of `names` measured with `how`, in model order then step order; a model without any is refused,
    naming the settings the file does hold."""
    chosen = rows[(rows["n_problems"] == how.n_problems) & (rows["n_traces"] == how.n_traces)
                  & (rows["eps"] == how.eps) & (rows["seed"] == how.seed) & rows["model"].isin(names)]
    missing = [name for name in names if name not in set(chosen["model"])]
    if missing:
        held = rows[KEY[2:]].drop_duplicates().to_dict("records")
        raise ValueError(f"{missing} have no rows measured with {dataclasses.asdict(how)} (the file holds {held}): "
                         "measure them (retrain=True) or choose the settings it holds")
    order = {name: index for index, name in enumerate(names)}
    return chosen.sort_values(["model", "step", "checkpoint"], key=lambda c: c.map(order) if c.name == "model" else c,
                              kind="stable").reset_index(drop=True)


def result(rows: pd.DataFrame) -> Result:
    """The figure, a Markdown table of every row, and a summary: per model its first and last checkpoints and the
    shipped model, with findings computed from the rows."""
    from sinklib import plots  # noqa: PLC0415  (matplotlib: the notebooks extra)

    shown_columns = ["step", "accuracy", "accuracy_top1_masked", "accuracy_random1_masked", "share_mask",
                     "share_special", "share_punctuation", "share_content", "top_sink_token", "top_key_score_mean",
                     "move_rate"]
    table = rows.set_index(["model", "checkpoint"])[shown_columns]
    return Result(figures={"training_dynamics": plots.training_dynamics_plot(rows)},
                  texts={"training_dynamics.md": table.to_markdown(floatfmt=".3f") + "\n"},
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
    lines.append(f"{name}: masking the top-1 sink first costs over 0.2 more accuracy than masking a random key at "
                 f"step {dependent.iloc[0]['step']}." if len(dependent) else
                 f"{name}: at no checkpoint does masking the top-1 sink cost over 0.2 more than a random key.")
    for point in (first, trained.iloc[len(trained) // 2], last):
        groups = {group: point[f"share_{group}"] for group in dynamics.TOKEN_GROUPS}
        largest = max(groups, key=groups.get)
        lines.append(f"{name} step {point['step']}: sinks mostly on {largest} tokens ({groups[largest]:.0%}; top token "
                     f"{point['top_sink_token']!r} {point['top_sink_share']:.0%}); top key's score "
                     f"{point['top_key_score_mean']:.1f} (sum units); move rate "
                     + ("n/a" if pd.isna(point["move_rate"]) else f"{point['move_rate']:.2f}") + ".")
    shipped = rows[rows["checkpoint"] == SHIPPED]
    if len(shipped):
        lines.append(f"{name}: the shipped model scores {shipped.iloc[0]['accuracy']:.2f} on the same problems "
                     f"(the retrained last checkpoint {last['accuracy']:.2f}).")
    return lines
