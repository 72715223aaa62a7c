"""Capture overhead, measured side by side in one run: plain forward vs capture vs capture + masking.

    python benchmarks/capture_overhead.py            # tiny model on CPU (and the 8B shape if a GPU is there)
    python benchmarks/capture_overhead.py --gpu-only --seqs 400 1024 --out benchmarks/results/capture_gpu.md

Prints wall time per forward (median of interleaved rounds), peak memory on GPU, and the ratios. Goals:
capture ≤ 1.3× plain on CPU, ≤ 1.05× on GPU; masking ≤ 1.10× on GPU; extra peak GPU memory ≤ 5 %.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
import transformers

import sinklib

SHAPES = {
    "tiny-cpu": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, vocab_size=512, seq=256),
    "llada-8b-shape": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=32,
                           vocab_size=126464, seq=400),
}


def build(shape: dict, device: str, dtype: torch.dtype):
    """A random-weight bidirectional Llama of `shape` (its "seq" aside) with SDPA attention, in eval mode, built
    directly in `dtype` on `device`."""
    params = {k: v for k, v in shape.items() if k != "seq"}
    config = transformers.LlamaConfig(num_key_value_heads=params["num_attention_heads"], is_causal=False,
                                      attn_implementation="sdpa", **params)
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: an 8B model never exists in float32 on the device
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(before)
    return model


def timed(fn, device: str) -> float:
    """Seconds one call of `fn` takes (on CUDA, synchronised before and after)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(name: str, device: str, dtype: torch.dtype, rounds: int, steps: int, seq: int | None = None,
            model=None) -> list[dict]:
    """Rows {shape, device, seq, mode, ms, x_plain, peak_gib, peak_x_plain} for one shape at one length."""
    shape = dict(SHAPES[name], **({} if seq is None else {"seq": seq}))
    model = build(shape, device, dtype) if model is None else model
    ids = torch.randint(0, shape["vocab_size"], (1, shape["seq"]), generator=torch.Generator().manual_seed(0)).to(device)
    modes = {
        "plain": lambda: contextlib.nullcontext(),
        "capture": lambda: sinklib.capture(model),
        "masking": lambda: sinklib.capture(model, intervention=sinklib.MaskSinks(top_k=5, threshold=False)),
    }
    if device == "cuda":  # the route most tools take: eager attention, every map returned, reduced afterwards
        modes["eager"] = lambda: _eager(model)
    times = {mode: [] for mode in modes}
    peaks = {}

    def loop(mode):
        with torch.no_grad(), modes[mode]():
            for _ in range(steps):
                out = model(input_ids=ids, output_attentions=mode == "eager")
                if mode == "eager":
                    torch.stack([a.float().sum(-2) for a in out.attentions])

    for mode in modes:  # warm-up, and peak memory per mode
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        loop(mode)
        peaks[mode] = torch.cuda.max_memory_allocated() if device == "cuda" else float("nan")
    for _ in range(rounds):  # interleaved so drift hits every mode alike
        for mode in modes:
            times[mode].append(timed(lambda mode=mode: loop(mode), device) / steps)
    plain = statistics.median(times["plain"])
    print(f"\n{name} on {device} ({dtype}), seq {shape['seq']}, {steps} forwards × {rounds} rounds")
    rows = []
    for mode in modes:
        t = statistics.median(times[mode])
        mem = "" if device != "cuda" else f"  peak {peaks[mode] / 2**30:7.2f} GiB ({peaks[mode] / peaks['plain']:.3f}× plain)"
        print(f"  {mode:8s} {t * 1000:9.2f} ms/forward  {t / plain:.3f}× plain{mem}")
        rows.append({"shape": name, "seq": shape["seq"], "mode": mode, "ms": round(t * 1000, 3), "x_plain": round(t / plain, 3),
                     "peak_gib": round(peaks[mode] / 2**30, 3), "peak_x_plain": round(peaks[mode] / peaks["plain"], 4)})
    layers, heads, seq = shape["num_hidden_layers"], shape["num_attention_heads"], shape["seq"]
    print(f"  stored per forward: {layers * heads * seq * 4 / 2**20:.2f} MiB of scores (L·H·S·4 bytes)")
    return rows


@contextlib.contextmanager
def _eager(model):
    """The model switched to eager attention for the block (every layer returns its full map)."""
    model.config._attn_implementation = "eager"
    try:
        yield
    finally:
        model.config._attn_implementation = "sdpa"


def main() -> None:
    """Measure the tiny CPU shape (unless --gpu-only) and, when CUDA is available, the LLaDA-8B shape at every
    --seqs length; --out writes the GPU table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gpu-only", action="store_true")
    parser.add_argument("--seqs", type=int, nargs="+", default=[400, 1024], help="GPU sequence lengths")
    parser.add_argument("--out", type=Path, default=None, help="write the GPU table here (markdown)")
    args = parser.parse_args()
    if not args.gpu_only:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        measure("tiny-cpu", "cpu", torch.float32, args.rounds, args.steps)
    if not torch.cuda.is_available():
        if args.gpu_only:
            raise SystemExit("--gpu-only: no CUDA device is available")
        return
    model = build(SHAPES["llada-8b-shape"], "cuda", torch.bfloat16)
    rows = [row for seq in args.seqs for row in measure("llada-8b-shape", "cuda", torch.bfloat16, args.rounds,
                                                        args.steps, seq=seq, model=model)]
    if args.out is not None:
        import pandas as pd

        head = (f"{torch.cuda.get_device_name()} · torch {torch.__version__} · transformers {transformers.__version__} · "
                f"random-weight LLaDA-8B shape (32 layers, d 4096, 32 heads, bidirectional), bf16, batch 1, "
                f"median of {args.rounds} interleaved rounds of {args.steps} forwards\n\n")
        args.out.write_text(head + pd.DataFrame(rows).to_markdown(index=False) + "\n")


if __name__ == "__main__":
    main()
