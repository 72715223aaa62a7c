"""A folder that verifies itself: a manifest of the SHA-256 and size of every file a step wrote into it.

A converted named model (sinklib/named.py) is written once and read at every load; its manifest, written last by the
conversion, lets a load refuse a folder whose weights were damaged, whose config.json was edited, or which holds
another model's files, naming the file. Hashing the ~540 MB of weights costs about a third of a second; a file's
digest is kept for the rest of the process, keyed by its path and (inode, size, mtime_ns, ctime_ns) — any write
changes ctime, which no `touch` can set back — so a second load in the same process checks sizes and stat only.

The models the project ships in data/models/ (the zoo, the twins' adapters) carry a manifest of the files that make
the model (weights, configs, tokenizer), written by their training; check_shipped refuses a folder that differs.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any, Collection, NamedTuple

from sinklib.digest import file_sha256, text_digest
from sinklib.validation import BadValue

MANIFEST = "sinklib-manifest.json"
FORMAT = "sinklib-manifest 1"


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), read once per process while its stat is unchanged (sinklib.digest.file_sha256)."""
    return file_sha256(path)


def fingerprint(path: Path) -> str:
    """A weights file's fingerprint: the first 16 hex digits of its SHA-256 (which weights a measurement used)."""
    return sha256_of(path)[:16]


WEIGHT_FILES = ("*.safetensors", "*.bin")


def weights_fingerprint(folder: Path) -> str:
    """A checkpoint folder's fingerprint: its weight files' names and fingerprints, one "name fingerprint" line
    each in name order, as one fingerprint (a folder with one weights file: that file's name and SHA-256)."""
    files = sorted(file for pattern in WEIGHT_FILES for file in Path(folder).glob(pattern))
    lines = "".join(f"{file.name} {fingerprint(file)}\n" for file in files)
    return text_digest(lines)


def write_manifest(folder: Path, header: dict[str, Any], skip: Collection[str] = ()) -> dict[str, Any]:
    """Hash every file in `folder` but those named in `skip` (a flat folder: a subfolder is refused) and write the
    manifest there, beside them: `header` (what made the files) plus {"files": {name: {"size", "sha256"}}}. Returns
    the manifest written."""
    files = {}
    for entry in sorted(Path(folder).iterdir()):
        if entry.name == MANIFEST or entry.name in skip:
            continue
        if not entry.is_file():
            raise BadValue(f"{str(entry)!r} is not a file: a manifest covers a flat folder of files")
        files[entry.name] = {"size": entry.stat().st_size, "sha256": sha256_of(entry)}
    manifest = {"format": FORMAT, **header, "files": files}
    partial = Path(folder) / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(partial, Path(folder) / MANIFEST)
    return manifest


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest (None when it has none); ValueError when it cannot be read as one."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadValue(f"{MANIFEST}: unreadable ({error})") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    well_formed = isinstance(files, dict) and all(isinstance(v, dict) and {"size", "sha256"} <= v.keys() for v in files.values())
    if not well_formed or manifest.get("format") != FORMAT:
        raise BadValue(f"{MANIFEST}: not a {FORMAT!r} manifest with a size and SHA-256 per file")
    return manifest


class FileProblem(NamedTuple):
    """What is wrong with one file of a checked folder: its name and what differs (printed "file: what")."""

    file: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what}"


def folder_problems(folder: Path, manifest: dict[str, Any], skip: Collection[str] = (),
                    writer: str = "the conversion") -> list[FileProblem]:
    """What in `folder` disagrees with `manifest`, one FileProblem per file (empty: every file is as `writer` wrote
    it): a file missing or unreadable, a file the manifest does not list (but those named in `skip`), a size or a
    SHA-256 that differs. Sizes are compared first, so a truncated file costs no hashing."""
    folder = Path(folder)
    files: dict[str, dict[str, Any]] = manifest["files"]
    present = {entry.name for entry in folder.iterdir() if entry.name != MANIFEST and entry.name not in skip}
    problems = [FileProblem(name, f"not written by {writer} (the manifest does not list it)")
                for name in sorted(present - files.keys())]
    for name, recorded in sorted(files.items()):
        path = folder / name
        try:
            if name not in present or not path.is_file():
                problems.append(FileProblem(name, "missing" if name not in present else "not a file"))
            elif path.stat().st_size != recorded["size"]:
                problems.append(FileProblem(name, f"{path.stat().st_size} bytes where the manifest records {recorded['size']}"))
            elif sha256_of(path) != recorded["sha256"]:
                problems.append(FileProblem(name, f"SHA-256 {sha256_of(path)[:16]}… where the manifest records "
                                                  f"{str(recorded['sha256'])[:16]}… (damaged or edited)"))
        except OSError as error:  # a file that cannot be read is one this folder cannot vouch for
            problems.append(FileProblem(name, f"unreadable ({error.strerror or error})"))
    return problems


class FolderCheckError(ValueError):
    """A folder that fails its check against its manifest: the `folder` and the names of the offending `files` (the
    message says what to run)."""

    def __init__(self, message: str, folder: Path, files: list[str]):
        super().__init__(message)
        self.folder = folder
        self.files = files


# What a shipped model's folder holds beside the model: its card and learning curve, written (and rewritten) after
# training by the evaluation that measures it; they change nothing the model computes.
SHIPPED_DOCUMENTS = ("README.md", "card.json", "loss_curve.csv")


def write_shipped_manifest(folder: Path, name: str) -> dict[str, Any]:
    """The manifest of a shipped model (a zoo model or a twin's adapter), written by its training once the model's
    files are in `folder`: every file but SHIPPED_DOCUMENTS."""
    return write_manifest(folder, {"model": name}, skip=SHIPPED_DOCUMENTS)


def check_shipped(folder: Path, name: str, remake: str, param: str = "name_or_model") -> None:
    """Refuse a shipped model's folder unless every file that makes the model is as its training wrote it (damaged,
    edited, cut, swapped for another model's, missing, unreadable, or a file no training wrote): FolderCheckError
    naming the parameter `param` that named the model, the folder, each file and the fix (`remake`: the command that
    trains the files again), before anything is loaded. The manifest guards against accidents (a bad copy, an
    edit, a partial checkout), not against someone who rewrites it to match their files."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
        if manifest is None:
            problems = [FileProblem(MANIFEST, "missing")]
        else:
            problems = folder_problems(folder, manifest, SHIPPED_DOCUMENTS, writer="its training")
            if manifest.get("model") != name:
                problems.insert(0, FileProblem(MANIFEST, f"written for {manifest.get('model')!r}, not {name!r} "
                                                         "(another model's files?)"))
    except ValueError as error:  # read_manifest: unreadable or not a manifest
        problems = [FileProblem(MANIFEST, str(error).removeprefix(f"{MANIFEST}: "))]
    except OSError as error:  # the folder itself cannot be listed
        problems = [FileProblem(".", f"the folder cannot be read ({error.strerror or error})")]
    if problems:
        listed = "\n  ".join(map(str, problems))
        extra = [problem.file for problem in problems if problem.what.startswith("not written by")]
        remove = f", then remove the files it does not list ({', '.join(extra)})" if extra else ""
        raise FolderCheckError(
            f"{param}={name!r}: the shipped model folder {str(folder)!r} fails its check against its manifest:\n"
            f"  {listed}\nNothing was loaded. Restore the shipped files (in a checkout: git checkout -- "
            f"{shlex.quote(str(folder))}{remove}; installed: reinstall sinklib), or train them again: {remake}", folder,
            [problem.file for problem in problems])
