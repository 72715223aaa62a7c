"""Where the daily loop's time goes: each test tier as `make test` runs it, and each notebook read from the stores (as
nbval and a reader run it) against regenerated (as `make figures` runs it), measured one after another in one run.

    python benchmarks/suite_time.py [--only tiers|notebooks] [--out benchmarks/results/suite_time.md]

Run it on a quiet machine: every number is wall time, and another process on the cores makes them all longer.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sinklib import reproduce
from sinklib.paths import NOTEBOOKS

ROOT = Path(__file__).resolve().parent.parent
PY, PY4 = ROOT / ".venv" / "bin" / "python", ROOT / ".venv-tf4" / "bin" / "python"
TIERS = {  # label → (interpreter, pytest arguments), as the Makefile runs them
    "make test-quick": (PY, ["-m", "not slow and not process"]),
    "unit": (PY, ["tests/unit"]),
    "parity": (PY, ["tests/parity"]),
    "zoo": (PY, ["tests/zoo"]),
    "notebooks": (PY, ["tests/notebooks"]),
    "install": (PY, ["tests/install"]),
    "transformers 4.56": (PY4, ["-m", "parity or transformers", "tests/unit", "tests/parity",
                                "--ignore=tests/unit/test_explorer.py"]),
}


def machine() -> str:
    """The CPU's name, its core count and torch's version and CPU capability."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}), python {platform.python_version()}")


def time_tiers() -> list[tuple[str, float, str]]:
    """(tier, seconds, pytest's last line) for each of TIERS."""
    rows = []
    for label, (python, args) in TIERS.items():
        began = time.perf_counter()
        done = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - began
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1].strip("= ")
        rows.append((label, seconds, last))
        print(f"{label:>20}  {seconds:7.1f} s  {last}", flush=True)
    return rows


def time_notebooks() -> list[tuple[str, float, float]]:
    """(notebook, seconds reading the stores, seconds regenerating them) for every numbered notebook, each run into a
    temporary folder (the checkout is not written)."""
    rows = []
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="suite-time-") as scratch:
        scratch = Path(scratch)
        for mode in ("read", "regenerated"):
            results, figures = scratch / mode / "results", scratch / mode / "figures"
            names = reproduce.COMMITTED_RUNS + (reproduce.STORED if mode == "read" else ())
            reproduce.seed_committed_runs(results, names=names)
            for path in paths:
                params = {} if path == reproduce.TUTORIAL else {"figures_dir": str(figures), "results_dir": str(results)}
                params = {k: v for k, v in params.items() if path == reproduce.TUTORIAL or
                          k in reproduce.run_for(path).parameter_names()}
                began = time.perf_counter()
                reproduce.execute(path, scratch / mode / path.name, params, progress=False)
                seconds = time.perf_counter() - began
                print(f"{path.stem:>32}  {mode:>11}  {seconds:7.1f} s", flush=True)
                rows.append((path.stem, mode, seconds))
    by_name: dict[str, dict[str, float]] = {}
    for name, mode, seconds in rows:
        by_name.setdefault(name, {})[mode] = seconds
    return [(name, times["read"], times["regenerated"]) for name, times in by_name.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["tiers", "notebooks"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"# Suite and notebook times\n\n{machine()}; wall seconds, measured one after another in one run.\n"]
    if args.only != "notebooks":
        tiers = time_tiers()
        lines += ["| tier | seconds | pytest's summary |", "|---|---:|---|"]
        lines += [f"| {label} | {seconds:.0f} | {last} |" for label, seconds, last in tiers]
        main_tiers = sum(s for label, s, _ in tiers if label not in ("make test-quick", "transformers 4.56"))
        with_tf4 = main_tiers + next(s for label, s, _ in tiers if label == "transformers 4.56")
        lines += ["", f"`make test` (every tier, then transformers 4.56): {with_tf4 / 60:.1f} min; "
                  f"`make test-quick`: {tiers[0][1]:.0f} s.", ""]
    if args.only != "tiers":
        notebooks = time_notebooks()
        lines += ["| notebook | read from the stores (nbval, a reader) | regenerated (`make figures`) |", "|---|---:|---:|"]
        lines += [f"| {name} | {read:.0f} s | {made:.0f} s |" for name, read, made in notebooks]
        lines += [f"| all | {sum(r for _, r, _ in notebooks) / 60:.1f} min | {sum(m for _, _, m in notebooks) / 60:.1f} min |"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
