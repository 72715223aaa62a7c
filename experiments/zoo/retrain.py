"""Sinks over training, the retraining (run from a checkout: python -m experiments.zoo over-training): each zoo
model retrained from its seed with checkpoints (retrain), every checkpoint measured alike (measure,
measure_all) into the rows sinklib.zoo.over_training reads and writes."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from annotated_types import Ge
from tqdm.auto import tqdm

from sinklib import dynamics
from sinklib.cache_manifest import fingerprint
from sinklib.evaluation.conditions import CONDITIONS
from sinklib.evaluation.table1 import masking_table
from sinklib.evaluation.tasks import TRACE_TASKS, get_task, trace_prompts
from sinklib.trace_store import collect_traces
from sinklib.loading import LoadedModel, load
from sinklib.paths import ZOO_DIR
from sinklib.provenance import describe
from sinklib.validation import BadValue, Count, checked
from sinklib.zoo.over_training import (CHECKPOINTS_DIR, FORMAT_MARKERS, RESULTS_PATH, SHIPPED, KEY, Measurement,
                                       RecipeName, _add_row, read_rows)
from sinklib.zoo.recipes import ZOO, checkpoint_steps, recipe
from experiments.zoo.loop import checkpoint_folder, saved_checkpoints
from experiments.zoo.train import TRAINING_STATE, checked_checkpoint, train, training_state


@checked
def retrain(name: RecipeName, folder: Path = CHECKPOINTS_DIR, count: Annotated[int, Ge(2)] = 8,
            threads: Count = 2, progress: bool = True, donors: Path = ZOO_DIR) -> list[Path]:
    """Train zoo model (or studied variant, train.VARIANTS) `name` from its seed, saving its weights at step 0
    and `count` log-spaced steps up to the last (train.checkpoint_steps) in folder/name/step-NNNNN. A rerun goes
    on from the latest checkpoint before the first missing one, with the same thread count, and trains nothing
    when all exist; checkpoints of another recipe are refused, and so is a folder/name that holds a model of its
    own (a shipped model's folder is never written into). A model that starts from another (tiny-dream from
    tiny-arm) starts from the shipped one in `donors`, as the shipped model did. Returns the checkpoint folders
    in step order."""
    spec = recipe(name)
    steps = checkpoint_steps(spec.steps, count)
    run_folder = Path(folder) / name
    if Path(folder).resolve().is_relative_to(ZOO_DIR.resolve()) or \
            any((run_folder / own).exists() for own in ("config.json", "model.safetensors", "card.json")):
        raise BadValue(f"folder={str(folder)!r} is not allowed: it is (or is inside) a shipped model's folder; give "
                       "a folder for checkpoints (data/checkpoints/)")
    for path in saved_checkpoints(run_folder, TRAINING_STATE).values():
        training_state(path, spec)  # refuses another recipe's checkpoints before any work
    present = [step for step in steps if checkpoint_folder(run_folder, step).exists()]
    for step in present:  # a present checkpoint must be whole, this recipe's and of its step, or nothing is "done"
        checked_checkpoint(checkpoint_folder(run_folder, step), name, step)
    if len(present) < len(steps):
        train(name, donors, threads=threads, progress=progress, checkpoints=run_folder, checkpoint_at=tuple(steps),
              curve_path=run_folder / "loss_curve.csv")
    return [checkpoint_folder(run_folder, step) for step in steps]


def measure(loaded: LoadedModel, how: Measurement, scratch: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """One row of measurements of a zoo model (the module docstring lists them). `scratch` keeps Table 1's
    per-problem answers so that an interrupted measurement resumes. A model without any sink gets NaN token
    shares and an empty top token."""
    task = TRACE_TASKS[loaded.prompt_style]  # a chat model reads the problems in plain English
    conditions = [CONDITIONS.get(name).at(how.eps) for name in ("sinks", "random keys")]
    table = masking_table([loaded], get_task(task, limit=how.n_problems), conditions, (0, 1), out_dir=scratch,
                          batch_size=50, seed=how.seed, progress=progress).frame
    accuracy = {(condition, k): (a, s) for condition, k, a, s in
                zip(table["condition"], table["k"], table["accuracy"], table["stderr"])}
    traces = collect_traces(loaded, trace_prompts(loaded.prompt_style, how.n_traces), seed=how.seed,
                            progress=progress)
    frequency = dynamics.sink_token_frequency(traces, how.eps, top=None)
    mask_token = loaded.tokenizer.convert_ids_to_tokens(loaded.mask_id) if loaded.mask_id is not None else None
    groups = dynamics.sink_token_groups(frequency, mask_token=mask_token,
                                        special_tokens=set(loaded.tokenizer.all_special_tokens), markers=FORMAT_MARKERS)
    top_keys = pd.concat([dynamics.main_sink_by_layer_head(trace) for trace in traces])
    motion = dynamics.dynamics_summary(traces, how.eps)
    return {"accuracy": accuracy[("sinks", 0)][0], "accuracy_stderr": accuracy[("sinks", 0)][1],
            "accuracy_top1_masked": accuracy[("sinks", 1)][0], "accuracy_random1_masked": accuracy[("random keys", 1)][0],
            **{f"share_{group}": share if len(frequency) else float("nan") for group, share in groups.items()},
            "top_sink_token": frequency["token"].iloc[0] if len(frequency) else "",
            "top_sink_share": float(frequency["share"].iloc[0]) if len(frequency) else float("nan"),
            "top_key_score_mean": float(top_keys["score"].mean()),
            "top_key_score_max_head": float(top_keys.groupby(["layer", "head"])["score"].mean().max()),
            "move_rate": float(motion["move_rate"].mean()),
            "share_heads_with_sink": float(motion["share_heads_with_sink"].mean())}


@checked
def measure_all(names: list[RecipeName], how: Measurement = Measurement(), count: Annotated[int, Ge(2)] = 8,  # noqa: B008
                folder: Path = CHECKPOINTS_DIR, results: Path = RESULTS_PATH, progress: bool = True) -> pd.DataFrame:
    """Measure the checkpoints retrain(name, folder, count) saved for each of `names`, and each shipped zoo model,
    into `results`. The file is rewritten after each row; a row already there for the same checkpoint weights
    (their sha256) and measurement settings is kept, not redone, and one for weights that have since been
    retrained is replaced. Missing checkpoints are refused before anything is measured. Returns every row."""
    if len(set(names)) != len(names):
        raise BadValue(f"names={names!r} is not allowed: names must be distinct")
    jobs = [(name, path) for name in names
            for path in [*_checkpoints(Path(folder), name, count), *([ZOO_DIR / name] if name in ZOO else [])]]
    rows = read_rows(results)
    for name, path in tqdm(jobs, desc="measure checkpoints", disable=not progress):
        checkpoint = SHIPPED if path.parent == ZOO_DIR else path.name
        key = {"model": name, "checkpoint": checkpoint, "weights": fingerprint(path / "model.safetensors"),
               **dataclasses.asdict(how)}
        same = (rows[KEY[:2] + KEY[3:]] == pd.Series({k: key[k] for k in KEY[:2] + KEY[3:]})).all(axis=1)
        if (same & (rows["weights"] == key["weights"])).any():
            continue
        loaded = dataclasses.replace(load(str(path)), name=f"{name}@{checkpoint}")
        row = {**key, **_training_point(path, name, checkpoint),
               **measure(loaded, how, scratch=Path(folder) / name / "measurements", progress=False)}
        rows = _add_row(row, Path(results), describe(dataclasses.asdict(how), what="sinks over training"))
    return read_rows(results)


def _checkpoints(folder: Path, name: str, count: int) -> list[Path]:
    """The checkpoint folders retrain(name, folder, count) saves, in step order; any missing is refused, and so is
    any that is not whole, not this recipe's or not of its step (train.checked_checkpoint)."""
    steps = checkpoint_steps(recipe(name).steps, count)
    paths = [checkpoint_folder(folder / name, step) for step in steps]
    missing = [path.name for path in paths if not path.exists()]
    if missing:
        raise BadValue(f"names: {name!r} lacks checkpoints {missing} in {folder / name}: retrain it first "
                       "(python -m experiments.zoo over-training, or notebook 06 with retrain=True)")
    for path, step in zip(paths, steps):
        checked_checkpoint(path, name, step)
    return paths


def _training_point(path: Path, name: str, checkpoint: str) -> dict[str, Any]:
    """Step, the run's total steps and the training loss before the step (the mean of the 50 steps before it;
    NaN at step 0): from the checkpoint's own saved state, or the shipped model's card and loss curve."""
    if checkpoint == SHIPPED:
        step = total = recipe(name).steps
        curve = pd.read_csv(path / "loss_curve.csv")
    else:
        saved = training_state(path)
        step, total = saved["step"], saved["spec"]["steps"]
        curve = pd.DataFrame(saved["curve"], columns=["step", "loss"])
    window = curve[(curve["step"] < step) & (curve["step"] >= step - 50)]["loss"]
    return {"step": step, "train_steps": total, "loss": float(window.mean()) if len(window) else float("nan")}
