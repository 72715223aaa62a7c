"""Sinks over training, the measured rows: their format (KEY, COLUMNS, Measurement: how each checkpoint is measured),
read (read_rows, select: the rows notebook 06 shows) and written (_add_row, each row's digest in the parquet metadata).

One row per zoo model and checkpoint (and once on the shipped model, for comparison):
- accuracy on the first n_problems held-out problems, unmasked, with the top-1 sink masked and with one random
  key masked (Table 1's conditions, through masking_table);
- which tokens host the sinks (Table 2's detections over every step, layer and head of n_traces generations),
  grouped as mask / special / punctuation / content (dynamics.token_group);
- the main sink: the top key's score (sum units, uniform attention scores 1) averaged over steps, layers and
  heads, and for the strongest head; how often a head's greatest sink moves between steps (move rate).

The rows are in data/over_training/training_dynamics.parquet (and the twins' adaptation rows in
ADAPTATION_PATH). Retraining with checkpoints and measuring them is experiments/zoo/retrain.py, run from a
checkout (python -m experiments.zoo over-training); notebook 06's report is sinklib/lab/nb06_sinks_over_training.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal, Sequence


import pandas as pd

from sinklib import dynamics
from sinklib.digest import text_digest
from sinklib.paths import DATA_DIR
from sinklib.provenance import locked, read_metadata, record_artifacts, write_parquet
from sinklib.validation import BadValue, Count, Index, NonNegative, validated
from sinklib.zoo.recipes import ZOO, checkpoint_steps, recipe

CHECKPOINTS_DIR = DATA_DIR / "checkpoints"
RESULTS_PATH = DATA_DIR / "over_training" / "training_dynamics.parquet"  # not data/results/: no notebook writes it
ADAPTATION_PATH = DATA_DIR / "over_training" / "adaptation_dynamics.parquet"  # the twins' (experiments/zoo/adapt.py)
FORMAT_MARKERS = ("Q:", "A:", "####")  # the zoo's prompt and answer markers: structure, not content
SHIPPED = "shipped"  # the checkpoint column of the shipped model's row
RecipeName = Literal["tiny-llada", "tiny-dream", "tiny-arm", "tiny-udlm", "tiny-llada-gated",
                     "tiny-llada-prompt-masking"]  # train.ZOO and VARIANTS
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


