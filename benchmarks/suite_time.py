"""Where the daily loop's time goes: each pytest command of `make test-quick` and `make test`, read from the Makefile,
and each notebook read from the stores (as a reader opens it) against regenerated (as `make figures` runs them: two
at a time), measured one after another in one run.

    python benchmarks/suite_time.py [--only tiers|notebooks] [--out benchmarks/results/suite_time.md]
    python benchmarks/suite_time.py --fresh-clone [--out benchmarks/results/fresh_clone.md]

--fresh-clone times what a newcomer runs, in a depth-1 clone of HEAD in a temporary folder: `make setup`, then
`make figures`, then `make test` (what CI runs), one after another, and says whether `make figures` left
`git status` clean there.

Run it on a quiet machine: every number is wall time, and another process on the cores makes them all longer.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sinklib.lab import reproduce, stores
from sinklib.paths import NOTEBOOKS

ROOT = Path(__file__).resolve().parent.parent


def make_commands(target: str) -> list[str]:
    """The pytest commands `make TARGET` runs, as the Makefile spells them (make -n), so what is timed here is what
    `make test` and CI run, and stays so when the Makefile changes."""
    printed = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in printed.splitlines() if " -m pytest" in line]


def machine() -> str:
    """The CPU's name, its core count and torch's version and CPU capability."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}), python {platform.python_version()}")


def failures(output: str) -> list[str]:
    """pytest's short summary lines naming a test that failed or errored (`FAILED tests/...::name - why`), so a red
    run's table says which tests, not only pytest's last line."""
    return [line.strip() for line in output.splitlines() if re.match(r"(FAILED|ERROR) \S+::", line.strip())]


def time_tiers() -> list[tuple[str, float, str]]:
    """(command, seconds, pytest's last line) for each pytest command of `make test-quick`, then of `make test`."""
    rows = []
    for target in ("test-quick", "test"):
        for command in make_commands(target):
            began = time.perf_counter()
            done = subprocess.run(command.replace(" -m pytest", " -m pytest -p no:cacheprovider", 1), shell=True,
                                  cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - began
            last = (done.stdout.strip().splitlines() or ["(no output)"])[-1].strip("= ")
            last = "; ".join([last] + failures(done.stdout))
            label = f"make {target}: {command.split(' -m pytest', 1)[1].strip() or '(every tier)'}"
            rows.append((label, seconds, last))
            print(f"{seconds:7.1f} s  {label}  ->  {last}", flush=True)
    return rows


def time_notebooks() -> tuple[list[tuple[str, float, float]], dict[str, float]]:
    """(notebook, seconds reading the stores, seconds regenerating them) for every numbered notebook, and each mode's
    wall time, each run into a temporary folder (the checkout is not written). Read: one notebook at a time on every
    core, as a reader opens one. Regenerated: as `make figures` runs them (reproduce.execute_all: two at a time, one
    torch thread each, each after the notebooks it reads from), the long runs read."""
    timed: dict[tuple[str, str], float] = {}
    walls: dict[str, float] = {}
    original = reproduce.execute
    mode = ""

    def execute(path, target, parameters, progress=True):  # each notebook's own time, inside the schedule
        began = time.perf_counter()
        try:
            return original(path, target, parameters, progress)
        finally:
            timed[mode, path.stem] = time.perf_counter() - began
            print(f"{path.stem:>32}  {mode:>11}  {timed[mode, path.stem]:7.1f} s", flush=True)

    reproduce.execute = execute
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    try:
        with tempfile.TemporaryDirectory(prefix="suite-time-") as scratch:
            for mode in ("read", "regenerated"):
                results, figures = Path(scratch) / mode / "results", Path(scratch) / mode / "figures"
                names = stores.COMMITTED_RUNS + (stores.STORED if mode == "read" else ())
                stores.seed_committed_runs(results, names=names)
                runs = []
                for path in paths:
                    params = {} if path == reproduce.TUTORIAL else {
                        k: v for k, v in {"figures_dir": str(figures), "results_dir": str(results)}.items()
                        if k in reproduce.run_for(path).parameter_names()}
                    runs.append(reproduce.Execution.of(path, Path(scratch) / mode / path.name, params))
                began = time.perf_counter()
                reproduce.execute_all(runs, jobs=1 if mode == "read" else 2, progress=False)
                walls[mode] = time.perf_counter() - began
    finally:
        reproduce.execute = original
    rows = [(path.stem, timed["read", path.stem], timed["regenerated", path.stem]) for path in paths]
    return rows, walls


def time_fresh_clone(logs: Path) -> list[str]:
    """The README's commands in a depth-1 clone of HEAD, one after another: (command, seconds, its last line and the
    tests that failed) as table rows, and whether `make figures` changed any tracked file. Each command's whole
    output is kept in LOGS/make-TARGET.log (the clone itself is removed)."""
    logs.mkdir(parents=True, exist_ok=True)
    rows = ["| command (fresh depth-1 clone of HEAD) | seconds | minutes | last line |", "|---|---:|---:|---|"]
    with tempfile.TemporaryDirectory(prefix="fresh-clone-") as scratch:
        clone = Path(scratch) / "sinklib"
        subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)], check=True)
        for target in ("setup", "figures", "test"):
            began = time.perf_counter()
            done = subprocess.run(["make", target], cwd=clone, capture_output=True, text=True)
            seconds = time.perf_counter() - began
            (logs / f"make-{target}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
            last = ((done.stdout + done.stderr).strip().splitlines() or ["(no output)"])[-1][:120]
            last = "; ".join([last] + failures(done.stdout)).replace("|", "/")
            rows.append(f"| `make {target}` | {seconds:.0f} | {seconds / 60:.1f} | {last} (exit {done.returncode}) |")
            print(rows[-1], flush=True)
            if target == "figures":
                changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=clone,
                                         capture_output=True, text=True).stdout.splitlines()
                rows.append(f"| tracked files `make figures` changed | {len(changed)} | | "
                            f"{', '.join(line[3:] for line in changed[:5])} |")
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["tiers", "notebooks"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fresh-clone", action="store_true", help="time make setup, figures and test in a new clone")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "suite-time-logs",
                        help="where --fresh-clone keeps each command's whole output (default: %(default)s)")
    args = parser.parse_args()
    lines = [f"# Suite and notebook times\n\n{machine()}; wall seconds, measured one after another in one run.\n"]
    if args.fresh_clone:
        lines += time_fresh_clone(args.logs)
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            args.out.write_text(text)
        return
    if args.only != "notebooks":
        tiers = time_tiers()
        lines += ["| command | seconds | pytest's summary |", "|---|---:|---|"]
        lines += [f"| `{label}` | {seconds:.0f} | {last} |" for label, seconds, last in tiers]
        quick = sum(seconds for label, seconds, _ in tiers if label.startswith("make test-quick"))
        whole = sum(seconds for label, seconds, _ in tiers if label.startswith("make test:"))
        lines += ["", f"`make test` (its pytest commands, set-up excluded): {whole / 60:.1f} min; "
                  f"`make test-quick`: {quick:.0f} s.", ""]
    if args.only != "tiers":
        notebooks, walls = time_notebooks()
        lines += ["| notebook | read from the stores (a reader: one at a time, every core) | regenerated (`make figures`: "
                  "two at a time, one torch thread each) |", "|---|---:|---:|"]
        lines += [f"| {name} | {read:.0f} s | {made:.0f} s |" for name, read, made in notebooks]
        lines += [f"| sum | {sum(r for _, r, _ in notebooks) / 60:.1f} min | {sum(m for _, _, m in notebooks) / 60:.1f} min |",
                  f"| wall | {walls['read'] / 60:.1f} min | **{walls['regenerated'] / 60:.1f} min** |"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
