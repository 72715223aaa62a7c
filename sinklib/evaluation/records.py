"""An evaluation run's file: its format (RECORD_FORMAT), its header record (HEADER: the run's key and digest,
config_hash), each record's seal (record_digest), and reading it back — every record checked against its seal and the
header against the key asked for (read_run, read_sealed_run, the runner's resume), a torn last line repaired.

Limit: a seal tells damage and a stale file from a good one; it is no signature — whoever can write the file can
reseal an edited record with record_digest (docs/evaluation.md)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from sinklib.digest import digest
from sinklib.validation import BadValue


def config_hash(config: dict[str, Any]) -> str:
    """A run's key digest: the first 16 hex digits of the SHA-256 of `config`'s canonical JSON (sinklib.digest)."""
    return digest(config)

# 2: each record carries its record_sha256. 3: a run is keyed by every field of its settings (families.base.record)
# and the weights' SHA-256. 4: one file per run, its header first; the key holds the model's identity (dtype and
# forward-shaping files), the task's definition, samples and scorer's code, and the numerics' version; no versions
# of packages.
RECORD_FORMAT = 4

HEADER = "sinklib evaluation run"  # the header record's `header` field: what tells it from a sample's record

CHECKS = "checks"  # the header's field of a Table 1 run's checks (evaluation.checks)

def read_run(path: str | Path) -> tuple[dict | None, list[dict]]:
    """A run file's header (None: a file without one, written before records format 4 or by hand) and its sample
    records, in file order."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if lines and isinstance(lines[0], dict) and lines[0].get("header") == HEADER:
        return lines[0], lines[1:]
    return None, lines

def read_sealed_run(path: str | Path) -> tuple[dict, list[dict]]:
    """A run file's header and sample records, checked as evaluate checks a file before resuming it: the header first
    and sealed (its config_hash that of its config), then each record of that key, sealed and written once, at least
    one of them. Anything else is refused (BadValue, naming the file and the line): a file without a header, an edited
    or copied-in record, a record written twice."""
    path = Path(path)
    first_line = next((line for line in path.read_text().splitlines() if line.strip()), None)
    if first_line is None:
        raise BadValue(f"out={str(path)!r} is not allowed: it is empty (no run header, no record); out must be a run "
                       "file written by sinklib.evaluate")
    try:
        header = json.loads(first_line)
    except json.JSONDecodeError:
        header = None
    config = header.get("config") if isinstance(header, dict) else None
    key = header.get("config_hash") if isinstance(header, dict) else None
    if isinstance(header, dict) and header.get("header") == HEADER and (not isinstance(config, dict) or
                                                                       key != config_hash(config)):
        raise BadValue(f"out={str(path)!r} is not allowed: line 1's config_hash {key!r} is not the digest of its config "
                       "(the header was edited); out must be a run file written by sinklib.evaluate")
    done = _read_done(path, key, config, lambda: header)
    if not done:
        raise BadValue(f"out={str(path)!r} is not allowed: it holds a run header and no record; out must be a run "
                       "file with at least one sample's record")
    return header, list(done.values())

def _read_done(out: Path, key: str, config: dict, header: Callable[[], dict]) -> dict[str, dict]:
    """The finished records of `out` by id, after its header (_check_header). A line without its newline is an
    interruption's cut (repair_tail settles it first); a record of another configuration, an edited record or an id
    written twice is refused, never mixed."""
    done: dict[str, dict] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(out.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BadValue(f"out={str(out)!r} is not allowed: line {number} is not a JSON record (the file was edited "
                           "or damaged); use a new file") from None
        if number == 1:
            _check_header(out, record, key, config, header)
            continue
        if not isinstance(record, dict) or record.get("config_hash") != key or "id" not in record:
            found = record.get("config_hash") if isinstance(record, dict) else None
            raise BadValue(f"out={str(out)!r} is not allowed: line {number} was written by another configuration "
                           f"(config_hash {found} ≠ {key}); use a new file")
        _check_seal(out, record, number)
        if record["id"] in done:
            raise BadValue(f"out={str(out)!r} is not allowed: sample {record['id']!r} is written twice (lines "
                           f"{lines[record['id']]} and {number}), so two runs wrote it at once; use a new file")
        done[record["id"]] = record
        lines[record["id"]] = number
    return done

def _check_header(out: Path, header: Any, key: str, config: dict, ours: Callable[[], dict]) -> None:
    """A file's first line must be the header of this run's key; another key is refused naming what differs (the
    model's files by name, from the inputs of both headers: `ours` makes this run's)."""
    if not isinstance(header, dict) or header.get("header") != HEADER:
        raise BadValue(f"out={str(out)!r} is not allowed: its first line is no run header (records format "
                       f"{RECORD_FORMAT} starts each file with one), so nothing says what made its records: out must "
                       "be a new file or one this run's configuration wrote (an older file: "
                       "tools/migrate_eval_records.py)")
    _check_seal(out, header, 1)
    if header.get("config_hash") != key or header.get("config") != config:
        changed = _differences(header.get("config"), config) or [f"config_hash: {header.get('config_hash')!r} there"]
        if any(line.startswith("model.files:") for line in changed):
            there, here = (header.get("inputs") or {}).get("model_files") or {}, ours()["inputs"]["model_files"]
            changed.append(f"the model's files {sorted(n for n in set(there) | set(here) if there.get(n) != here.get(n))}")
        changed = "; ".join(changed)
        raise BadValue(f"out={str(out)!r} is not allowed: it was written by another configuration ({changed}); out "
                       f"must be a new file or one written by this configuration (config_hash {key})")

def _differences(recorded: Any, wanted: Any, path: str = "") -> list[str]:
    """"<field>: <value there> there, <value here> here" for each field of two configs that differs (nested fields
    dotted: model.dtype)."""
    if isinstance(recorded, dict) and isinstance(wanted, dict):
        return [line for name in sorted(set(recorded) | set(wanted))
                for line in _differences(recorded.get(name), wanted.get(name), f"{path}{name}.")]
    return [] if recorded == wanted else [f"{path[:-1] or 'config'}: {recorded!r} there, {wanted!r} here"]

def _check_seal(out: Path, record: dict, number: int) -> None:
    if record.get("record_sha256") != record_digest(record):
        raise BadValue(f"out={str(out)!r} is not allowed: line {number} was edited after it was written (its "
                       "record_sha256 does not match its content); use a new file")

def record_digest(record: dict) -> str:
    """SHA-256 (all 64 hex digits) of a record's canonical JSON without its own digest: a hand-edited record (a
    flipped `correct`) no longer matches and is refused when the file is read back."""
    return digest({k: v for k, v in record.items() if k != "record_sha256"}, None)

def _sealed(record: dict) -> dict:
    return {**record, "record_sha256": record_digest(record)}

def repair_tail(out: Path, key: str) -> None:
    """Settle a last line without its newline: a complete record (or header) of this configuration keeps its place
    and gets the newline; anything else is a line cut mid-write and is removed, so that sample runs again."""
    data = out.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        record = json.loads(data[start:])
        complete = isinstance(record, dict) and record.get("config_hash") == key and ("id" in record or "header" in record)
    except ValueError:
        complete = False
    with os.fdopen(os.open(out, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+b") as handle:
        if complete:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")
        else:
            handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
