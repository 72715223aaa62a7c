"""Tables derived from stored traces, kept under the key of what they were derived from.

A notebook section picks a small table from its traces (the strongest head, every moving-sink event, the share Eq. 3
selects at each eps) and draws its figure from that table. `derived(store, pick, *args)` keeps the table in `store`
as <pick>-<key>.parquet, the key the digest of the code the pick computes with (keys.function_code: its own, and
what it calls, wherever that lives) and the identity of every argument: a stored trace by its trace key, a model by
keys.model_identity, a table by its content, a number or a text by its value. Read back when it is there, so a reader
or nbval redraws every figure from committed tables in seconds without the traces' scores; made (and the scores it
reads made with it) when it is not. An argument with no identity (a trace made outside a store, a model object) makes
the pick run and keep nothing, as does a result that parquet does not give back equal. ROME's layer_stats is the
pattern: a file named by what made it, computed when absent.

Every read or write touches the file, so that `make figures` can remove what the whole run no longer reads
(stale_files)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sinklib.digest import canonical, digest
from sinklib.keys import function_code, model_identity
from sinklib.summary import Verdicts

KEY = b"sinklib.derived"  # the parquet metadata entry holding what the table was derived from
VERDICTS = b"sinklib.verdicts"  # a Verdicts' near-tie models and notes, beside its table
NOT_SHAPING = ("store", "progress")  # arguments that say where a measurement is kept or how loudly, not what it is


class _NoIdentity(Exception):
    """An argument that cannot be named by what it holds: the pick runs and nothing is kept."""


def identity(value: Any) -> Any:
    """What names `value` in a key (raises _NoIdentity for a value that cannot be named by its content)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    store_key = getattr(value, "store_key", None)
    if store_key is not None:  # a StoredTrace
        return {"trace": digest(store_key)}
    if hasattr(value, "family") and hasattr(value, "weights") and hasattr(value, "model"):  # a LoadedModel
        return {"model": model_identity(value)}
    if isinstance(value, pd.DataFrame):
        return {"frame": digest(value.to_json(orient="split", double_precision=15, default_handler=str))}
    if isinstance(value, Mapping):  # in its order: a pick's rows follow it
        return [[identity(key), identity(item)] for key, item in value.items()]
    if isinstance(value, (list, tuple)):
        return [identity(item) for item in value]
    raise _NoIdentity(type(value).__name__)


def derivation_key(function: Callable, args: tuple, kwargs: Mapping[str, Any]) -> dict | None:
    """What a derived table is the digest of; None when an argument has no identity."""
    try:
        return {"function": function.__qualname__, "code": function_code(function), "args": identity(list(args)),
                "kwargs": identity({k: v for k, v in sorted(kwargs.items()) if k not in NOT_SHAPING})}
    except _NoIdentity:
        return None


def derived(folder: str | Path | None, function: Callable, /, *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` (a DataFrame or summary.Verdicts), read from `folder` when a table derived from
    the same inputs by the same code is there, else computed and kept there (folder None: computed, not kept)."""
    key = derivation_key(function, args, kwargs) if folder is not None else None
    if key is None:
        return function(*args, **kwargs)
    path = Path(folder) / f"{function.__name__}-{digest(key)}.parquet"
    if path.is_file():
        os.utime(path)  # read by this run: not stale
        return _read(path)
    result = function(*args, **kwargs)
    return _read(path) if _keep(result, path, key) else result  # read back: a fresh run sees what a rerun will


def _frame_of(result: Any) -> tuple[pd.DataFrame, dict[bytes, bytes]] | None:
    if isinstance(result, Verdicts):
        extra = {"near_tie": sorted(result.near_tie), "notes": list(result.notes)}
        return result.table, {VERDICTS: json.dumps(extra).encode()}
    if isinstance(result, pd.DataFrame):
        return result, {}
    return None


def _keep(result: Any, path: Path, key: dict) -> bool:
    """Write `result` to `path` (whole, then moved into place) when parquet gives back its values (a column of
    Python strings may come back as pandas' string type); whether it was kept."""
    framed = _frame_of(result)
    if framed is None:
        return False
    frame, extra = framed
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        table = pa.Table.from_pandas(frame)
        metadata = {**(table.schema.metadata or {}), KEY: canonical(key).encode(), **extra}
        pq.write_table(table.replace_schema_metadata(metadata), partial)
        pd.testing.assert_frame_equal(_read(partial, frame_only=True), frame, check_dtype=False)
    except (AssertionError, TypeError, ValueError, pa.ArrowException):
        partial.unlink(missing_ok=True)  # a table parquet cannot give back as it is: computed each time
        return False
    os.replace(partial, path)
    return True


def _read(path: Path, frame_only: bool = False) -> Any:
    table = pq.read_table(path)
    frame = table.to_pandas()
    raw = (table.schema.metadata or {}).get(VERDICTS)
    if frame_only or raw is None:
        return frame
    extra = json.loads(raw)
    return Verdicts(frame, set(extra["near_tie"]), extra["notes"])


def stale_files(folder: str | Path, since: float, pattern: str = "*.parquet") -> list[Path]:
    """The files of `folder` matching `pattern` that no read or write touched since `since` (a time.time())."""
    return sorted(path for path in Path(folder).glob(pattern) if path.stat().st_mtime < since)

