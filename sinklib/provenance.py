"""How an artifact was made, in two places.

Inside each artifact (parquet schema metadata, PNG text chunk, PDF Subject): only what defines its content —
the resolved run config, the seed and the notebook. Those bytes change only when the content does.

In one manifest per output folder, PROVENANCE.json: per artifact its sha256, that content record, the code that made
it (a hash of sinklib's sources, and keys.numerics_code) and the id of its environment — package versions and the
machine (CPU model, torch's CPU capability, thread count: floats differ in their last bits between CPUs, and on a
near-tie a generated token with them) — each environment written once under "environments". An artifact's entry is
rewritten only when its bytes change: a rerun on another machine, or after an edit of the code, that makes the same
bytes changes nothing. No timestamps anywhere.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import platform
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sinklib.digest import digest, file_sha256, text_digest
from sinklib.keys import numerics_code
from sinklib.validation import BadValue

PACKAGE = Path(__file__).resolve().parent
KEY = "sinklib"  # the metadata key in parquet schemas and PNG text chunks; the PDF Subject holds the same JSON
LAYOUT_KEY = "sinklib.layout"  # a results table's comparison layout, in its parquet schema (sinklib.lab.agreement)
MANIFEST = "PROVENANCE.json"
_CONTENT = ("config", "seed", "notebook")  # the part of a record written inside the artifact
_SOURCES = ("*.py", "*.js", "*.css", "*.yaml")
_VERSIONS = ("torch", "transformers", "numpy", "pandas", "pyarrow", "matplotlib", "seaborn")
_NOT_CONFIG = ("progress", "figures_dir", "results_dir", "retrain", "checkpoints_dir")  # where results go and how loudly,
# and whether the measured rows were made just now: not what they are


def source_hash(folder: Path) -> str:
    """sha256 (16 hex) over the relative path and bytes of every source file under `folder`."""
    files = sorted({p for pattern in _SOURCES for p in folder.rglob(pattern) if "__pycache__" not in p.parts})
    return text_digest(b"".join(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0"
                                for path in files))


@lru_cache(maxsize=1)
def code_identity() -> str:
    """The hash of sinklib's own sources (source_hash of the package folder)."""
    return source_hash(PACKAGE)


def versions() -> dict[str, str]:
    """Versions of Python and of the packages whose arithmetic or rendering shapes the artifacts."""
    found = {"python": platform.python_version()}
    for name in _VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def machine() -> dict[str, Any]:
    """The CPU that computed the floats: model name, torch's CPU capability (the vector kernels it runs: another
    capability rounds differently), the intra-op thread count (reductions split by thread) and the architecture."""
    return {"cpu": _cpu_model(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "architecture": platform.machine()}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe(config: Any = None, **extra: Any) -> dict[str, Any]:
    """The provenance record: {config, seed, **extra, versions, machine, code}; `config` a dataclass or a mapping."""
    settings = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config or {})
    settings = {k: v for k, v in settings.items() if k not in _NOT_CONFIG}
    return {"config": settings, "seed": settings.get("seed"), **extra, "versions": versions(), "machine": machine(),
            "code": {"sinklib_sources_sha256": code_identity(), "numerics": numerics_code()}}


def content_part(record: dict[str, Any]) -> dict[str, Any]:
    """The part of a record that defines an artifact's content (what is written inside the artifact)."""
    return {k: record[k] for k in _CONTENT if k in record}


def record_artifacts(paths: list[Path], record: dict[str, Any]) -> None:
    """Enter each artifact in the PROVENANCE.json of its folder: its sha256, the record's content part, the code that
    made it and its environment's id, the environment (versions, machine) under "environments". An artifact whose
    bytes are those already entered keeps its entry: it says who made these bytes, and a rerun elsewhere that made
    the same ones changes nothing. The manifest is updated under a lock and replaced atomically, its keys sorted."""
    by_folder: dict[Path, list[Path]] = {}
    for path in paths:
        by_folder.setdefault(Path(path).parent, []).append(Path(path))
    environment = {"machine": record["machine"], "versions": record["versions"]}
    environment_id = digest(environment, 12)
    entry = {k: v for k, v in record.items() if k not in ("machine", "versions")}
    for folder, files in by_folder.items():
        manifest = folder / MANIFEST
        with locked(folder):
            raw = _read_raw(folder)
            artifacts = raw.get("artifacts", {})
            for path in files:
                sha256 = file_sha256(path)
                if artifacts.get(path.name, {}).get("sha256") != sha256 or "code" not in artifacts[path.name]:
                    artifacts[path.name] = {**entry, "environment": environment_id, "sha256": sha256}
            environments = {**raw.get("environments", {}), environment_id: environment}
            used = {a["environment"] for a in artifacts.values()}
            written = {"artifacts": artifacts, "environments": {k: v for k, v in environments.items() if k in used}}
            partial = manifest.with_name(MANIFEST + ".partial")
            partial.write_text(json.dumps(written, indent=1, sort_keys=True, ensure_ascii=True, default=str) + "\n")
            os.replace(partial, manifest)


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The artifacts of a folder's PROVENANCE.json ({} when it has none), each its whole record: sha256, config,
    seed, notebook, the code that made it, its environment's versions and machine."""
    raw = _read_raw(Path(folder))
    environments = raw.get("environments", {})
    return {name: {**entry, **environments.get(entry.get("environment"), {})}
            for name, entry in raw.get("artifacts", {}).items()}


def _read_raw(folder: Path) -> dict[str, Any]:
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return {}
    raw = json.loads(manifest.read_text())
    if not isinstance(raw, dict) or set(raw) - {"artifacts", "code", "environments"} or "artifacts" not in raw:
        raise BadValue(f"{manifest} is not allowed: it is not a manifest of this sinklib (artifacts, code and "
                       "environments at its top); move it away and run again")
    return raw


@contextlib.contextmanager
def locked(folder: Path):
    """An exclusive lock on the folder itself (flock on its descriptor): no lock file to leave behind."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def as_text(record: dict[str, Any]) -> str:
    """Canonical ASCII JSON (sorted keys): the same record always gives the same bytes."""
    return json.dumps(record, sort_keys=True, ensure_ascii=True, default=str)


def write_parquet(frame: pd.DataFrame, path: str | Path, record: dict[str, Any], layout: Any = None,
                  extra: dict[str, Any] | None = None) -> Path:
    """`frame` as parquet with the record's content part in its schema metadata (read it back with read_record),
    when given the table's comparison layout (a summary.Layout; read it back with read_layout) and `extra` entries
    (name → a JSON value; read them back with read_metadata)."""
    table = pa.Table.from_pandas(frame)
    metadata = {KEY.encode(): as_text(content_part(record)).encode(),
                **{name.encode(): as_text(value).encode() for name, value in (extra or {}).items()}}
    if layout is not None:
        metadata[LAYOUT_KEY.encode()] = as_text(dataclasses.asdict(layout)).encode()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    path = Path(path)
    pq.write_table(table, path)
    return path


def read_metadata(path: str | Path, name: str) -> Any:
    """The JSON value write_parquet stored under `name` in a parquet file's metadata (None when it holds none)."""
    raw = (pq.read_schema(Path(path)).metadata or {}).get(name.encode())
    return None if raw is None else json.loads(raw)


def read_layout(path: str | Path) -> dict[str, Any] | None:
    """The comparison layout a sinklib parquet file carries (summary.Layout's fields), or None if it carries none."""
    raw = (pq.read_schema(Path(path)).metadata or {}).get(LAYOUT_KEY.encode())
    return None if raw is None else json.loads(raw)


def read_record(path: str | Path) -> dict[str, Any]:
    """The content part of the provenance record of a parquet file, PNG or PDF written by sinklib (the whole
    record is in the folder's PROVENANCE.json)."""
    path = Path(path)
    if path.suffix not in (".parquet", ".png", ".pdf"):
        raise BadValue(f"path={str(path)!r} is not allowed: records are read from .parquet, .png or .pdf files")
    try:
        return json.loads(_record_text(path))
    except (KeyError, ValueError) as error:
        reason = str(error) if isinstance(error, ValueError) else "it holds no sinklib record"
        raise BadValue(f"path={str(path)!r} is not allowed: {reason} (not written by sinklib, or damaged)") from None


def _record_text(path: Path) -> str:
    if path.suffix == ".parquet":
        return (pq.read_schema(path).metadata or {})[KEY.encode()]
    if path.suffix == ".png":
        from PIL import Image  # noqa: PLC0415  (pillow comes with matplotlib: the notebooks extra)

        with Image.open(path) as image:
            return image.text[KEY]
    return _pdf_string(path.read_bytes(), b"/Subject (")


def _pdf_string(data: bytes, opening: bytes) -> str:
    """The PDF literal string that starts right after `opening` (backslash escapes undone)."""
    start = data.find(opening)
    if start < 0:
        raise BadValue("it holds no sinklib record")
    out, i = bytearray(), start + len(opening)
    while data[i:i + 1] != b")":
        if i >= len(data):
            raise BadValue("this PDF's sinklib record is cut off (the file is truncated)")
        if data[i:i + 1] == b"\\":
            i += 1
        out += data[i:i + 1]
        i += 1
    return out.decode("ascii")
