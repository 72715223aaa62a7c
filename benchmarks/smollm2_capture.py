"""Capture on the real model a laptop runs, SmolLM2-135M-Instruct (30 layers, 9 heads over 3 KV heads, head dim 64,
float32, CPU), measured side by side in one run.

    python benchmarks/smollm2_capture.py                    # S = 256, 1024, 2048; then traced generation
    python benchmarks/smollm2_capture.py --seqs 256 --rounds 3

Per length S, one forward of a prompt of S tokens, median of interleaved rounds:
- plain: the model's own forward;
- capture: under sinklib.capture (every layer's column sums);
- masking: capture with SmolLM2's sink, position 0, masked in every layer and head (MaskKeys: what a step of the
  paper's policy does once it has found the sink, here from the first forward on);
- floor: plain + the least an exact column sum beside the model's attention must compute in each of its 30 layers,
  q·kᵀ, exp and the column sum over every causal (query, key) pair (query blocks of 32–256 rows, the fastest here,
  each against the keys it may see), timed on the same shapes. capture ÷ plain cannot go below floor ÷ plain by any route that
  recomputes exactly.
Then generation: 64 new tokens, greedy, sinklib.generate traced (capture on) against the same sampler with the
capture off; the tokens must be the same.
Each round times every mode once, one after another, each round starting one mode later
(capture_profile.interleaved_times); each ratio is taken within a round (the machine's slower and faster spells,
minutes long on a shared host, fall on both sides of it), and the median over rounds is printed with the range of
the rounds' ratios.
Goals: capture ≤ 1.10× plain, masking ≤ 1.15×, traced generation ≤ 1.08× — or the floor, where it is higher.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import sinklib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_profile import interleaved_times  # noqa: E402

FLOOR_BLOCKS = (32, 64, 128, 256)  # query rows per block; the floor takes the fastest on this machine


def median_seconds(run, rounds: int) -> list[float]:
    """Seconds of each of `rounds` calls of `run` (the list; callers take its median)."""
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return times


def column_sum_floor(heads: int, seq: int, head_dim: int, block: int):
    """A zero-argument function doing q·kᵀ, exp and the column sum over the causal pairs of one layer (the work any
    exact recompute does) on random tensors of this shape."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, seq, head_dim, generator=generator) / head_dim ** 0.5
    k = torch.randn(1, heads, seq, head_dim, generator=generator)
    scores = torch.zeros(1, heads, seq)

    def run():
        scores.zero_()
        for start in range(0, seq, block):
            stop = min(start + block, seq)
            probs = torch.matmul(q[:, :, start:stop], k[:, :, :stop].transpose(-1, -2)).exp_()
            scores[..., :stop] += probs.sum(-2)
    return run


def fastest_floor(heads: int, seq: int, head_dim: int):
    """The floor's per-layer work at the block size that is fastest here (median of 5 runs each)."""
    candidates = {block: column_sum_floor(heads, seq, head_dim, block) for block in FLOOR_BLOCKS}
    timed = {block: statistics.median(median_seconds(run, 5)) for block, run in candidates.items()}
    return candidates[min(timed, key=timed.get)]


def forwards(loaded, seqs: list[int], rounds: int) -> list[dict]:
    """Time plain, capture and masking forwards and the floor at every length S, printing each; returns rows
    {S, mode, ms, x_plain}."""
    model = loaded.model
    config = model.config
    heads, layers = config.num_attention_heads, config.num_hidden_layers
    head_dim = config.hidden_size // heads
    rows = []
    for seq in seqs:
        ids = torch.randint(0, config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(seq))
        floor_layer = fastest_floor(heads, seq, head_dim)
        captures = {"capture": lambda: sinklib.capture(model),
                    "masking": lambda: sinklib.capture(model, intervention=sinklib.MaskKeys(positions=[0]))}

        def forward(ids=ids):
            model(input_ids=ids)

        def floor(floor_layer=floor_layer):
            for _ in range(layers):
                floor_layer()

        def under(mode, run, captures=captures):
            def timed():
                with captures.get(mode, _Nothing)():
                    run()
            return timed

        modes = {"plain": forward, "capture": forward, "masking": forward, "floor work": floor}
        with torch.no_grad():
            times = interleaved_times({mode: under(mode, run) for mode, run in modes.items()}, rounds)
        times["floor"] = [p + f for p, f in zip(times["plain"], times["floor work"])]
        print(f"\nS = {seq}: one forward, median of {rounds} interleaved rounds; ratios: the median of each round's own "
              "ratio (its spread over the rounds beside it)")
        for mode in ("plain", "capture", "masking", "floor"):
            t = statistics.median(times[mode])
            ratios = [m / p for m, p in zip(times[mode], times["plain"])]
            ratio = statistics.median(ratios)
            note = f"  (plain + {layers} × q·kᵀ, exp, column sum over the causal pairs)" if mode == "floor" else ""
            spread = f"  [{min(ratios):.3f}–{max(ratios):.3f}]" if mode != "plain" else ""
            print(f"  {mode:8s} {t:8.1f} ms   {ratio:.3f}× plain{spread}{note}")
            rows.append({"S": seq, "mode": mode, "ms": t, "x_plain": ratio})
    return rows


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def generation(loaded, new_tokens: int, rounds: int) -> None:
    """Time `new_tokens` tokens of greedy generation traced against keep_scores=False in interleaved rounds,
    check that both write the same tokens, and print both medians and their ratio."""
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    settings = loaded.settings_for(gen_length=new_tokens)

    def traced():
        return sinklib.generate(loaded, prompt, settings, progress=False)

    def plain():
        return sinklib.generate(loaded, prompt, settings, progress=False, keep_scores=False)

    first, bare = traced(), plain()
    assert first.tokens[-1].tolist() == bare.tokens[-1].tolist(), "the capture changed the generated tokens"
    times = {"plain": [], "traced": []}
    for round_index in range(rounds):  # alternating which runs first
        for mode in (("plain", "traced") if round_index % 2 == 0 else ("traced", "plain")):
            times[mode] += median_seconds({"plain": plain, "traced": traced}[mode], 1)
    p, t = statistics.median(times["plain"]), statistics.median(times["traced"])
    ratios = [traced / plain for traced, plain in zip(times["traced"], times["plain"])]
    print(f"\ngeneration: {new_tokens} new tokens, greedy, median of {rounds} interleaved rounds (same tokens: yes)")
    print(f"  plain   {p:7.3f} s\n  traced  {t:7.3f} s   {statistics.median(ratios):.3f}× plain  "
          f"[{min(ratios):.3f}–{max(ratios):.3f}]")


def main() -> None:
    """Load SmolLM2 and run the forward and generation measurements with the command line's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    loaded = sinklib.load("smollm2-135m-instruct")
    print(f"SmolLM2-135M-Instruct, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    forwards(loaded, args.seqs, args.rounds)
    generation(loaded, args.new_tokens, args.rounds)


if __name__ == "__main__":
    main()
