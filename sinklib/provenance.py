"""How an artifact was made, written into the artifact: its resolved run config, seed, package versions and the
identity of the code that made it.

The code's identity is a hash of sinklib's own source files, not a commit: figures committed in commit C are
made from C's parent, so a commit id could never be reproduced by a clone of C, while these sources are
(`make figures` in a fresh clone leaves `git status` clean). No timestamps anywhere.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

PACKAGE = Path(__file__).resolve().parent
KEY = "sinklib"  # the metadata key in parquet schemas and PNG text chunks; the PDF Subject holds the same JSON
_SOURCES = ("*.py", "*.js", "*.css", "*.yaml")
_VERSIONS = ("torch", "transformers", "numpy", "pandas", "pyarrow", "matplotlib", "seaborn")
_NOT_CONFIG = ("progress", "figures_dir", "results_dir")  # where results go and how loudly, not what they are


def source_hash(folder: Path) -> str:
    """sha256 (16 hex) over the relative path and bytes of every source file under `folder`."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in _SOURCES for p in folder.rglob(pattern) if "__pycache__" not in p.parts})
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def code_identity() -> str:
    """The hash of sinklib's own sources (source_hash of the package folder)."""
    return source_hash(PACKAGE)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in _VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def describe(config: Any = None, **extra: Any) -> dict[str, Any]:
    """The provenance record: {config, seed, versions, code}; `config` a dataclass or a mapping."""
    settings = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config or {})
    settings = {k: v for k, v in settings.items() if k not in _NOT_CONFIG}
    return {"config": settings, "seed": settings.get("seed"), **extra, "versions": versions(),
            "code": {"sinklib_sources_sha256": code_identity()}}


def as_text(record: dict[str, Any]) -> str:
    """Canonical ASCII JSON (sorted keys): the same record always gives the same bytes."""
    return json.dumps(record, sort_keys=True, ensure_ascii=True, default=str)


def write_parquet(frame: pd.DataFrame, path: str | Path, record: dict[str, Any]) -> Path:
    """`frame` as parquet with the record in its schema metadata (read it back with read_record)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), KEY.encode(): as_text(record).encode()})
    path = Path(path)
    pq.write_table(table, path)
    return path


def read_record(path: str | Path) -> dict[str, Any]:
    """The provenance record of a parquet file, PNG or PDF written by sinklib."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return json.loads(pq.read_schema(path).metadata[KEY.encode()])
    if path.suffix == ".png":
        from PIL import Image

        with Image.open(path) as image:
            return json.loads(image.text[KEY])
    if path.suffix == ".pdf":
        return json.loads(_pdf_string(path.read_bytes(), b"/Subject ("))
    raise ValueError(f"path={str(path)!r} is not allowed: records are read from .parquet, .png or .pdf files")


def _pdf_string(data: bytes, opening: bytes) -> str:
    """The PDF literal string that starts right after `opening` (backslash escapes undone)."""
    start = data.find(opening)
    if start < 0:
        raise ValueError("this PDF holds no sinklib record")
    out, i = bytearray(), start + len(opening)
    while data[i:i + 1] != b")":
        if data[i:i + 1] == b"\\":
            i += 1
        out += data[i:i + 1]
        i += 1
    return out.decode("ascii")
