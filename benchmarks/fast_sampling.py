"""Can sinks make a diffusion LM fast? The cached and threshold samplers against each model's plain sampler and the
autoregressive twin's KV cache, measured side by side in one run (sinklib.speed): accuracy on the held-out
arithmetic with 95 % intervals and paired tests, seconds and forwards per answer, tokens per second.

    OMP_NUM_THREADS=1 python benchmarks/fast_sampling.py --limit 200   # resumable; writes data/results/fast-sampling/

One torch thread per run, as every committed timing here. The results' PROVENANCE names the machine's CPU."""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from sinklib.loading import load_models
from sinklib import speed
from sinklib.evaluation.tasks import TRACE_TASKS
from sinklib.paths import DATA_DIR
from sinklib.lab.runs import FAST_SAMPLING, SPEED_MODELS

OUT = DATA_DIR / "results" / FAST_SAMPLING  # where notebook 08 reads them (sinklib.lab.nb08_sinks_for_speed.SpeedRun)


def cpu_name() -> str:
    """The CPU's name, family and model (/proc/cpuinfo) and torch's kernel capability (AVX2, AVX512, …)."""
    info = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    name = info.get("model name") or platform.processor() or platform.machine()
    return (f"{name} (family {info.get('cpu family', '?')} model {info.get('model', '?')}), torch kernels "
            f"{torch.backends.cpu.get_cpu_capability()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="held-out problems per (model, policy)")
    parser.add_argument("--models", nargs="+", default=SPEED_MODELS)
    parser.add_argument("--timed", type=int, default=20, help="problems timed side by side per (model, policy)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = load_models(args.models)
    task_of = {name: TRACE_TASKS[loaded.prompt_style] for name, loaded in models.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": cpu_name(), "torch": torch.__version__, "threads": 1, "limit": args.limit, "timed": args.timed,
               "tasks": task_of}
    (args.out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
    speed.measure(models, task_of, args.out, args.limit)
    timing = speed.stored_timing(models, task_of, args.out, args.timed)
    table = speed.frontier(args.out, timing, models=args.models)
    (args.out / "frontier.md").write_text(table.to_markdown(index=False, floatfmt=".3g") + "\n")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
