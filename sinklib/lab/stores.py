"""The stores `make figures` and `make check` read, keep or make again: the committed long runs
(COMMITTED_RUNS), the regenerated stores (STORED), what no notebook read any more (remove_stale), and the
committed version of a folder (committed_version)."""
from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

from sinklib import derived
from sinklib.paths import DATA_DIR
from sinklib.validation import BadValue
from sinklib.lab.runs import FAST_SAMPLING, LONG_TRACES, PICKS

ROOT = Path(__file__).resolve().parents[2]  # the checkout: sinklib/lab/stores.py → ../../


def remove_stale(results_dir: Path, since: float) -> list[Path]:
    """After a run of every notebook: remove the picks, traces and long traces of `results_dir` that it neither read
    nor made (each read touches its file: sinklib.derived, sinklib.trace_store), so that a key that moved leaves
    nothing behind twice. Only files of those stores, which runs made, are removed. Returns what was removed."""
    since -= STALE_SLACK
    removed = derived.stale_files(results_dir / PICKS, since)
    for store in (results_dir / "traces", results_dir / LONG_TRACES):
        removed += [meta.parent for meta in sorted(store.glob("*/*/meta.json")) if meta.stat().st_mtime < since]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


# Long runs, read (resumed) wherever the notebooks run and recomputed only when their configuration changes (a run
# whose configuration changed writes a file of its own beside them, so nothing stale is read): the SmolLM2 twins'
# Table 1 at n = 200 and dose-response (the diffusion twin makes 28 forwards of its whole canvas per answer: about
# 7 s a problem on one core, hours per model), and the long traces (runs.LONG_TRACES: the paper-layout canvases and
# the logit lens, about 4 minutes), and notebook 08's speed–accuracy evaluations (runs.FAST_SAMPLING: about an hour).
COMMITTED_RUNS = ("table1-arithmetic-english", LONG_TRACES, FAST_SAMPLING)


# What the notebooks analyse, kept under the keys of what made them and read by every run: the traces' light records
# (sinklib.trace_store: their scores are a cache), the picks drawn from them (sinklib.derived), the tiny zoo's and
# SmolLM2's Table 1 runs. So nbval and a reader opening a notebook redraw every figure in seconds.
STORED = ("traces", PICKS, "table1-arithmetic", "table1-capitals")


STALE_SLACK = 2.0  # seconds: a file system may round a touched file's time down


def seed_committed_runs(results_dir: Path, committed: Path = DATA_DIR / "results",
                        names: tuple[str, ...] = COMMITTED_RUNS + STORED) -> None:
    """Copy the committed runs and stores `names` (default: COMMITTED_RUNS and STORED) into a results folder, where
    the notebooks read and resume them. A file already there is left as it is: it may be the user's own run, resumed
    further (never overwritten)."""
    for name in names:
        source = committed / name
        for path in sorted(source.rglob("*")) if source.is_dir() else []:
            target = Path(results_dir) / name / path.relative_to(source)
            if path.is_file() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


@contextlib.contextmanager
def regenerated_stores(results_dir: Path, names: tuple[str, ...] = STORED) -> Iterator[None]:
    """Make the stores `names` of results_dir again: each is moved aside (to .<name>.previous) while the notebooks
    run, deleted once they all succeeded and moved back if one failed (what the failed run wrote in its place is
    removed: it made it). A .previous folder left by a run that was killed is refused, naming it, rather than
    guessed at."""
    results_dir = Path(results_dir)
    moved = []
    for name in names:
        store, previous = results_dir / name, results_dir / f".{name}.previous"
        if previous.exists():
            raise BadValue(f"results_dir={str(results_dir)!r} is not allowed: {previous.name} is left from a run that "
                           f"was stopped; move it back to {name} (or delete it) and run again")
        if store.exists():
            store.rename(previous)
            moved.append((store, previous))
    try:
        yield
    except BaseException:
        for store, previous in moved:
            shutil.rmtree(store, ignore_errors=True)
            previous.rename(store)
        raise
    for _, previous in moved:
        shutil.rmtree(previous)


def committed_version(folder: Path, into: Path, root: Path = ROOT) -> tuple[Path, str]:
    """(where the committed version of `folder` is, what it is): in a git checkout that tracks files under it,
    those files as git HEAD holds them, exported into `into` — not the working tree, which a `make figures` on
    this machine may have rewritten; anywhere else (an installed package, a tarball) the folder as shipped."""
    folder = Path(folder).resolve()
    try:
        relative = folder.relative_to(root.resolve())
        tracked = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", str(relative)], capture_output=True,
                                 check=True).stdout
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (ValueError, OSError, subprocess.CalledProcessError):
        return folder, f"{folder} as shipped (not a git checkout)"
    if not tracked:
        return folder, f"{folder} as it is (git tracks nothing under it)"
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", "HEAD", "--", str(relative)],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / relative, f"{relative} at git HEAD {head}"
