"""Evaluation samples per second on the tiny zoo, with and without masking, side by side in one run.

    python benchmarks/eval_throughput.py [--limit 100] [--batch-size 50] [--rounds 3]

For each zoo model: the evaluation runner on the held-out arithmetic, unmasked, with the top-1 sinks masked
(the paper's policy, previous step), with the clean-identification variant (an extra unmasked pass per
step), and with one random key masked. Rounds alternate the conditions; the median is reported, with the
ratio to the unmasked run of the same model.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import sinklib
from sinklib.evaluation import evaluate, get_task
from sinklib.evaluation.conditions import paper_masking


def conditions(family) -> dict:
    """label → intervention for a model of `family`: none, the paper's top-1 sink masking (previous step, as it
    ran or clean) and one random key."""
    return {"unmasked": None, "top-1 sinks": paper_masking(family, 1),
            "top-1 sinks, clean": paper_masking(family, 1, source="previous_step_clean"),
            "1 random key": sinklib.MaskRandomKeys(k=1, seed=0)}


def main() -> None:
    """For every zoo model, evaluate the held-out arithmetic under each condition, rounds alternating, and print
    samples per second, the ratio to unmasked and the accuracy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.limit} problems, batch {args.batch_size}")
    print(f"{'model':<11} {'condition':<20} {'samples/s':>10} {'÷ unmasked':>11} {'accuracy':>9}")
    for name in ("tiny-llada", "tiny-dream", "tiny-arm"):
        loaded = sinklib.load(name)
        settings = loaded.settings_for(get_task("arithmetic"))
        runs = conditions(loaded.family)
        seconds: dict[str, list[float]] = {label: [] for label in runs}
        accuracy = {}
        evaluate(loaded, get_task("arithmetic", limit=args.batch_size), batch_size=args.batch_size, progress=False,
                 settings=settings)  # warm-up
        for _ in range(args.rounds):
            for label, intervention in runs.items():
                began = time.perf_counter()
                summary = evaluate(loaded, get_task("arithmetic", limit=args.limit), intervention=intervention,
                                   batch_size=args.batch_size, progress=False, settings=settings)
                seconds[label].append(time.perf_counter() - began)
                accuracy[label] = summary.accuracy
        base = args.limit / statistics.median(seconds["unmasked"])
        for label in runs:
            rate = args.limit / statistics.median(seconds[label])
            print(f"{name:<11} {label:<20} {rate:>10.1f} {rate / base:>10.2f}× {accuracy[label]:>9.3f}")


if __name__ == "__main__":
    main()
