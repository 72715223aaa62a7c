"""Sinks over training: each zoo model retrained from its seed with checkpoints, every checkpoint measured alike.

At each checkpoint (and once on the shipped model, for comparison) one row of measurements:
- accuracy on the first n_problems held-out problems, unmasked, with the top-1 sink masked and with one random
  key masked (Table 1's conditions, through masking_table);
- which tokens host the sinks (Table 2's detections over every step, layer and head of n_traces generations),
  grouped as mask / special / punctuation / content (dynamics.token_group);
- the main sink: the top key's score (sum units, uniform attention scores 1) averaged over steps, layers and
  heads, and for the strongest head; how often a head's greatest sink moves between steps (move rate).

The checkpoints live in data/checkpoints/ (not committed); the rows go to data/over_training/training_dynamics.parquet,
written after every checkpoint, and a rerun measures only the checkpoints without a row.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from annotated_types import Ge

import pandas as pd
from tqdm.auto import tqdm

from sinklib import dynamics
from sinklib.cache_manifest import fingerprint
from sinklib.digest import text_digest
from sinklib.evaluation.table1 import CONDITIONS, masking_table
from sinklib.evaluation.tasks import get_task, trace_prompts
from sinklib.trace_store import collect_traces
from sinklib.loading import LoadedModel, load
from sinklib.paths import DATA_DIR, ZOO_DIR
from sinklib.provenance import describe, locked, read_metadata, record_artifacts, write_parquet
from sinklib.summary import Result, Summary
from sinklib.validation import BadValue, Count, Index, NonNegative, checked, validated
from sinklib.zoo.loop import checkpoint_folder, saved_checkpoints
from sinklib.zoo.train import TRAINING_STATE, ZOO, checked_checkpoint, checkpoint_steps, recipe, train, training_state

CHECKPOINTS_DIR = DATA_DIR / "checkpoints"
RESULTS_PATH = DATA_DIR / "over_training" / "training_dynamics.parquet"  # not data/results/: no notebook writes it
FORMAT_MARKERS = ("Q:", "A:", "####")  # the zoo's prompt and answer markers: structure, not content
SHIPPED = "shipped"  # the checkpoint column of the shipped model's row
RecipeName = Literal["tiny-llada", "tiny-dream", "tiny-arm", "tiny-llada-prompt-masking"]  # train.ZOO and VARIANTS
KEY = ["model", "checkpoint", "weights", "n_problems", "n_traces", "eps", "seed"]
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
    task = "arithmetic" if loaded.is_zoo else "arithmetic-english"  # a chat model reads the problems in plain English
    conditions = [CONDITIONS.get(name).at(how.eps) for name in ("sinks", "random keys")]
    table = masking_table([loaded], get_task(task, limit=how.n_problems), conditions, (0, 1), out_dir=scratch,
                          batch_size=50, seed=how.seed, progress=progress).frame
    accuracy = {(condition, k): (a, s) for condition, k, a, s in
                zip(table["condition"], table["k"], table["accuracy"], table["stderr"])}
    traces = collect_traces(loaded, trace_prompts(loaded.is_zoo, how.n_traces), seed=how.seed,
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
def measure_all(names: list[RecipeName], how: Measurement = Measurement(), count: Annotated[int, Ge(2)] = 8,
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


def _add_row(row: dict[str, Any], results: Path, record: dict[str, Any]) -> pd.DataFrame:
    """Add one row to `results`, replacing a row of the same checkpoint and settings measured on other weights.
    The file is read again under a lock on its folder, so that measurements of other models running at the same
    time keep their rows. Returns the rows written."""
    results.parent.mkdir(parents=True, exist_ok=True)
    with locked(results.parent):
        rows = read_rows(results)
        same = (rows[KEY[:2] + KEY[3:]] == pd.Series({k: row[k] for k in KEY[:2] + KEY[3:]})).all(axis=1)
        fresh = pd.DataFrame([row], columns=COLUMNS)
        rows = pd.concat([rows[~same], fresh], ignore_index=True) if len(rows[~same]) else fresh
        _write(rows, results, record)
    record_artifacts([results], record)  # takes the folder's lock itself
    return rows


def _checkpoints(folder: Path, name: str, count: int) -> list[Path]:
    """The checkpoint folders retrain(name, folder, count) saves, in step order; any missing is refused, and so is
    any that is not whole, not this recipe's or not of its step (train.checked_checkpoint)."""
    steps = checkpoint_steps(recipe(name).steps, count)
    paths = [checkpoint_folder(folder / name, step) for step in steps]
    missing = [path.name for path in paths if not path.exists()]
    if missing:
        raise BadValue(f"names: {name!r} lacks checkpoints {missing} in {folder / name}: retrain it first "
                       "(python -m sinklib.zoo over-training, or notebook 06 with retrain=True)")
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


def read_rows(results: Path = RESULTS_PATH) -> pd.DataFrame:
    """The measured rows (empty, with the columns, when the file does not exist yet). A file with other columns is
    refused (it is not this module's, and would be rewritten), and so is one whose rows are not those their
    measurements wrote (each row's SHA-256, kept in the file's metadata: a value edited by hand would be kept as
    measured and never measured again)."""
    if not Path(results).exists():
        return pd.DataFrame(columns=COLUMNS)
    rows = pd.read_parquet(results)
    if list(rows.columns) != COLUMNS:
        raise BadValue(f"results={str(results)!r} is not allowed: its columns {list(rows.columns)} are not "
                       f"{COLUMNS}; give a sinks-over-training results file or a new path")
    recorded, digests = read_metadata(results, ROW_DIGESTS), row_digests(rows)
    if recorded != digests:
        if recorded is None:
            which = "its rows carry no digests (written by another program?)"
        elif not isinstance(recorded, list) or len(recorded) != len(digests):
            which = "its rows are not those their measurements wrote (rows added or removed)"
        else:
            edited = [f"{model} {checkpoint}" for model, checkpoint, digest, kept
                      in zip(rows["model"], rows["checkpoint"], digests, recorded) if digest != kept]
            which = f"the rows of {edited} are not what their measurements wrote (edited since)"
        raise BadValue(f"results={str(results)!r} is not allowed: {which}; nothing is resumed from it: measure "
                       "into a new path, or restore the file (in a checkout: git checkout -- it)")
    return rows


ROW_DIGESTS = "sinklib.row_sha256"  # the parquet metadata entry: each row's digest, in row order


def row_digests(rows: pd.DataFrame) -> list[str]:
    """Each row's SHA-256 (first 16 hex digits) over its values as JSON, numbers as Python numbers and every missing
    value (None, NaN, pd.NA — parquet may give back one for another) as null, so the same row read back from parquet
    gives the same digest."""
    def plain(value: Any) -> Any:
        value = value.item() if hasattr(value, "item") else value
        return None if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) else value
    return [text_digest(json.dumps([plain(v) for v in row], default=str))
            for row in rows[COLUMNS].itertuples(index=False, name=None)]


def _ordered(rows: pd.DataFrame, names: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows by model (in `names` order, else by name), then step, the shipped model after the last checkpoint."""
    order = {name: index for index, name in enumerate(names or sorted(set(rows["model"])))}
    sort_key = {"model": lambda c: c.map(order), "checkpoint": lambda c: c == SHIPPED}
    return rows.sort_values(["model", "step", "checkpoint"] + KEY[3:], kind="stable",
                            key=lambda c: sort_key.get(c.name, lambda c: c)(c)).reset_index(drop=True)


def _write(rows: pd.DataFrame, results: Path, record: dict[str, Any]) -> None:
    """Rows in _ordered order, with the record's content part, written whole through a scratch file in the same
    folder."""
    handle, scratch = tempfile.mkstemp(dir=results.parent, prefix=f".{results.name}.", suffix=".partial")
    os.close(handle)
    try:
        ordered = _ordered(rows)
        write_parquet(ordered, scratch, record, extra={ROW_DIGESTS: row_digests(ordered)})
        os.replace(scratch, results)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


def select(rows: pd.DataFrame, how: Measurement, names: Sequence[str], count: int = 8) -> pd.DataFrame:
    """The rows of `names` measured with `how` at the `count` checkpoints retrain() saves (and the shipped
    model), in `names` order then step order; a model without all of them is refused, naming the settings the
    file does hold."""
    if isinstance(names, str) or not names:
        raise BadValue(f"names={names!r} is not allowed: names must be a non-empty list of recipe names")
    chosen = rows[(rows["n_problems"] == how.n_problems) & (rows["n_traces"] == how.n_traces)
                  & (rows["eps"] == how.eps) & (rows["seed"] == how.seed)]
    wanted = {name: {f"step-{step:05d}" for step in checkpoint_steps(recipe(name).steps, count)}
              | ({SHIPPED} if name in ZOO else set()) for name in names}
    keep = [checkpoint in wanted.get(model, ()) for model, checkpoint in zip(chosen["model"], chosen["checkpoint"])]
    chosen = chosen.loc[pd.Series(keep, index=chosen.index, dtype=bool)]
    missing = [name for name in names if set(chosen.loc[chosen["model"] == name, "checkpoint"]) != wanted[name]]
    if missing:
        held = rows[["model", *KEY[3:]]].drop_duplicates().to_dict("records")
        raise BadValue(f"{missing} lack rows measured with {dataclasses.asdict(how)} at their {count} checkpoints "
                       f"(the file holds {held}): measure them (retrain=True) or choose the settings it holds")
    return _ordered(chosen, names)


def result(rows: pd.DataFrame, name: str = "training_dynamics", figure=None) -> Result:
    """The figure, a Markdown table of every row, and a summary: per model its first and last checkpoints and the
    shipped model, with findings computed from the rows.

    Args:
        rows: the measured checkpoints (read_rows, select).
        name: the figure's and the table's file stem.
        figure: the rows drawn (plots.training_dynamics_plot, as a notebook shows the call); None draws them here.

    Returns:
        The summary.Result that a run config's `save` writes."""
    if figure is None:
        from sinklib import plots  # noqa: PLC0415  (matplotlib: the notebooks extra)

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
