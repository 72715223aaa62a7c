"""Do another CPU's kernels decide a generation differently, and does the near-tie margin name every such decision?

    python benchmarks/cpu_rounding_bound.py [--models tiny-llada tiny-dream ...] [--n 100] [--mask-top K]
        [--condition "random keys"]

Runs the same greedy generations twice in one run, side by side: with this CPU's kernels and in a child process
with ATEN_CPU_CAPABILITY=default (torch's portable kernels: another CPU's float32 arithmetic on this one). Prints,
per model, the largest difference of the first forward's logits (relative to 1 + |logit|), how many generations
parted from each other, whether each parting step was marked a near-tie (margin in (0, NEAR_TIE]) in both runs,
and how many generations carry a near-tie at all (what notebook 04 counts). ties.NEAR_TIE must stay above
every measured parting margin; sinklib/lab/agreement.py quotes this script's numbers. --mask-top K generates under
Table 1's top-K sink masking (evaluation.conditions.paper_masking), whose answers --check bounds as well, or with
--condition another of Table 1's conditions at K (evaluation.conditions.CONDITIONS: "random keys", "sink values (mean)",
…, as notebook 07's dose-response runs them). Each row names its condition and k as Table 1's items tables do
("unmasked" at k = 0), the key agreement_answers.CROSS_KERNEL_ANSWERS quotes the row under.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

import sinklib
from sinklib.lab.agreement_rows import UNMASKED
from sinklib.ties import NEAR_TIE, is_near_tie
from sinklib.ties import LANE_SHARE, LOGIT_ROUNDING
from sinklib.evaluation.conditions import CONDITIONS
from sinklib.evaluation.tasks import get_task

DEFAULT_MODELS = ("tiny-arm", "tiny-llada", "tiny-dream")
HEADER = ("| model | against | condition | k | generations | first forward's logits, max |Δ| / (1 + |logit|) | parted | "
          "final canvas differs | parting step a near-tie in both runs | largest parting margin | generations with a "
          "near-tie |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _generations(name: str, n: int, mask_top: int, threads: int = 1, condition: str = "sinks") -> dict:
    """n held-out arithmetic problems, greedy, in batches of 25 (with the top-`mask_top` sinks masked when it is
    not 0) on `threads` torch threads: every step's canvas and margin, and the first forward's logits of the first
    batch."""
    torch.set_num_threads(threads)
    loaded = sinklib.load(name)
    intervention = (CONDITIONS.get(condition).intervention(loaded.family, mask_top, eps=3.0, source="previous_step", seed=0)
                    if mask_top else None)  # as Table 1 builds it (masking_table's defaults)
    task = get_task("arithmetic-english" if name.startswith("smollm2") else "arithmetic")
    prompts = [sample.prompt for sample in task.samples()[:n]]
    rows, first_logits = [], None
    for start in range(0, n, 25):
        traces = sinklib.generate(loaded, prompts[start:start + 25], loaded.settings_for(), keep_scores=False,
                                  progress=False, chat=task.chat, intervention=intervention)
        for trace in traces:
            rows.append({"canvases": trace.tokens.tolist(),
                         "margins": trace.margins.tolist() if trace.margins is not None else None})
        if first_logits is None:
            ids = traces[0].tokens[0][None]
            first_logits = loaded.logits(ids.to(loaded.device), None, None)[0].double().tolist()
    return {"rows": rows, "logits": first_logits}


def _run(name: str, n: int, capability: str | None, mask_top: int, condition: str = "sinks") -> dict:
    """One child's generations: this CPU's kernels on one thread (capability None), another capability's kernels
    ("default", "avx2"), or this CPU's kernels on more threads ("threads=2": reductions split otherwise)."""
    threads = int(capability.split("=", 1)[1]) if capability and capability.startswith("threads=") else 1
    kernels = capability if capability and not capability.startswith("threads=") else None
    env = dict(os.environ, **({"ATEN_CPU_CAPABILITY": kernels} if kernels else {}))
    command = [sys.executable, __file__, "--child", name, "--n", str(n), "--mask-top", str(mask_top), "--threads", str(threads),
               "--condition", condition]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def compare(name: str, n: int, capability: str, mask_top: int = 0, condition: str = "sinks") -> str:
    """One line of the report: one model, this CPU's kernels against `capability`'s (under top-`mask_top` sink
    masking when it is not 0)."""
    native, portable = _run(name, n, None, mask_top, condition), _run(name, n, capability, mask_top, condition)
    logit_a, logit_b = torch.tensor(native["logits"]), torch.tensor(portable["logits"])
    logit_bound = float(((logit_a - logit_b).abs() / (1 + logit_a.abs())).max())
    parted, named, answers = 0, 0, 0
    worst = 0.0
    for a, b in zip(native["rows"], portable["rows"]):
        answers += a["canvases"][-1] != b["canvases"][-1]
        step = next((i for i, (x, y) in enumerate(zip(a["canvases"], b["canvases"])) if x != y), None)
        if step is None:
            continue
        parted += 1
        margins = (a["margins"][step - 1], b["margins"][step - 1]) if a["margins"] else (None, None)
        named += all(is_near_tie(m) for m in margins)
        worst = max([worst] + [m for m in margins if m is not None])
    flagged = sum(any(is_near_tie(m) for m in (row["margins"] or [])) for row in native["rows"])
    # the condition's name and k as Table 1's items tables write them (agreement_answers.CROSS_KERNEL_ANSWERS is keyed so)
    label = condition if mask_top else UNMASKED
    return (f"| {name} | {capability} | {label} | {mask_top} | {n} | {logit_bound:.2g} | {parted} | {answers} | "
            f"{named} of {parted} | {worst:.2g} | {flagged} ({flagged / n:.0%}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--n", type=int, default=100, help="held-out problems per model")
    parser.add_argument("--against", nargs="+", default=["default", "avx2"],
                        help="ATEN_CPU_CAPABILITY values to compare this CPU's kernels with, or threads=N (this CPU's "
                             "kernels on N threads)")
    parser.add_argument("--mask-top", type=int, default=0, help="generate with Table 1's top-K sinks masked")
    parser.add_argument("--condition", default="sinks", choices=CONDITIONS.names(),
                        help="the Table 1 condition --mask-top K builds (default: the top-K sinks masked)")
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_generations(args.child, args.n, args.mask_top, args.threads, args.condition)))
        return
    print(f"NEAR_TIE = {NEAR_TIE:g}, LOGIT_ROUNDING = {LOGIT_ROUNDING:g}, LANE_SHARE = {LANE_SHARE:g}; this CPU's kernels: "
          f"{torch.backends.cpu.get_cpu_capability()}\n")
    print(HEADER)
    for name in args.models:
        for capability in args.against:
            print(compare(name, args.n, capability, args.mask_top, args.condition), flush=True)


if __name__ == "__main__":
    main()
