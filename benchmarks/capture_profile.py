"""Where capture's extra time goes, and the floor any exact recompute beside the model's own attention has.

    python benchmarks/capture_profile.py            # S = 256, 1024, 2048; d 256 (the capture_routes model)

For one forward of the capture_routes model (bidirectional Llama, 4 layers, 8 heads, fp32, CPU), measured in one
run with torch.profiler: the plain forward, the model's own fused attention calls in it, and capture's extra
time split into its second fused call (the transposed log-sum-exp that gives column sums; calls under
attention_math.TRANSPOSED_ROUTE_MIN_ELEMENTS pairs, e.g. S = 256 here, have none: one exp block instead) and
everything else.
Then the floor: q·kᵀ and exp over every (query, key) pair — the least any exact column sum beside the model's
attention must compute, timed as matmul + exp_ + sum on the same tensors, chunked at its fastest, in rounds
interleaved with the forwards — as a share of
the plain forward, i.e. the best capture ÷ plain ratio such a route could reach; and the floor in place: the same
work done inside a capture in place of its statistics (floor_in_place), where the model's own tensors compete
for the cache. The ratios are medians of each round's own ratio (capture_profile.paired_ratio). Writes
benchmarks/results/capture_profile.txt.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_routes import build  # noqa: E402

import sinklib  # noqa: E402
from sinklib.attention_math import AttentionStats, repeat_heads  # noqa: E402

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
ROUNDS = 15  # interleaved rounds of plain, capture and the floor's work per length


def median_ms(run, rounds: int = 7) -> float:
    """Median milliseconds of `rounds` calls of `run`, after one warm-up call."""
    run()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def flash_ms(run, rounds: int = 5) -> float:
    """ms per forward spent in the fused CPU attention kernel."""
    run()
    with profile() as prof:
        for _ in range(rounds):
            run()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == FLASH) / 1000 / rounds


def column_floor_work(layers: int, heads: int, seq: int, head_dim: int):
    """A zero-argument function doing `layers` × (q·kᵀ, exp, sum over queries) in float32 at the fastest of a few
    chunk sizes (picked here, median of 5 runs each): the floor's work, to be timed beside the forwards."""
    q, k = (torch.randn(1, heads, seq, head_dim) / math.sqrt(head_dim) for _ in range(2))
    keys_t = k.transpose(-1, -2)
    candidates = {}
    for rows in (64, 128, 256, 512):
        def one_layer(rows=rows):
            total = torch.zeros(1, heads, seq)
            for start in range(0, seq, rows):
                total += torch.matmul(q[:, :, start:start + rows], keys_t).exp_().sum(-2)
            return total
        candidates[rows] = (median_ms(one_layer, 5), one_layer)
    fastest = min(candidates, key=lambda rows: candidates[rows][0])
    one_layer = candidates[fastest][1]

    def work():
        for _ in range(layers):
            one_layer()
    work.rows = fastest  # query rows per block, for floor_in_place
    return work


@contextlib.contextmanager
def floor_in_place(rows: int):
    """Inside the block, a capture does the floor's work in place of its statistics: q·kᵀ, exp and the sum over
    queries on each call's own q and k, `rows` query rows at a time (the isolated floor's fastest), in the layer
    where the statistics would run, with everything else of the
    capture (hooks, route, the model's own call with its lse, the step store) kept. The isolated floor runs its
    work on tensors hot in cache; here the model's weights and activations compete for the cache, as they do for
    the real statistics, so this is the floor a capture could reach where it actually runs."""
    attend_module = importlib.import_module("sinklib.capturing.attend")
    statistics_of = attend_module.attention_statistics

    def floor_work(q, k, *args, **kwargs):
        batch, heads, n_queries, _ = q.shape
        keys_t = repeat_heads(k, heads).transpose(-1, -2)
        scores = torch.zeros(batch, heads, k.shape[-2])
        for start in range(0, n_queries, rows):
            scores += torch.matmul(q[:, :, start:start + rows], keys_t).exp_().sum(-2)
        return AttentionStats(scores, torch.ones(batch), torch.ones(batch, k.shape[-2], dtype=torch.bool))

    attend_module.attention_statistics = floor_work
    try:
        yield
    finally:
        attend_module.attention_statistics = statistics_of


def interleaved_times(runs: dict, rounds: int) -> dict[str, list[float]]:
    """ms of each zero-argument function in `runs`, per round, timed in `rounds` interleaved rounds (one call of
    each per round, after a warm-up), so that the machine's drift hits every one alike. Each round starts one
    function later than the last, so that no function always runs in the same place (after the same other one:
    measured here, running second moved a ratio by 2 %)."""
    times = {name: [] for name in runs}
    names = list(runs)
    for run in runs.values():
        run()
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            began = time.perf_counter()
            runs[name]()
            times[name].append(1000 * (time.perf_counter() - began))
    return times


def paired_ratio(times: dict[str, list[float]], name: str, extra: str | None = None) -> float:
    """The median over rounds of each round's (name [+ extra]) ÷ plain: a ratio taken within a round, where the
    machine's slower and faster spells (minutes long on a shared host) fall on both sides of it."""
    return statistics.median((t + (times[extra][i] if extra else 0.0)) / times["plain"][i]
                             for i, t in enumerate(times[name]))


def main() -> None:
    """Profile one forward at S = 256, 1024 and 2048, print the table and write it to
    benchmarks/results/capture_profile.txt."""
    torch.set_grad_enabled(False)
    lines = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    say(f"torch {torch.__version__}, {torch.get_num_threads()} threads; d 256, 4 layers, 8 heads (head dim 32)")
    say(f"{'S':>5} {'plain ms':>9} {'its attention':>14} {'capture ms':>11} {'2nd fused call':>15} {'other':>7} "
          f"{'capture ÷ plain':>16} {'floor ÷ plain':>14} {'floor in place ÷ plain':>23}")
    for seq in (256, 1024, 2048):
        model = build(256, seq, "sdpa")
        ids = torch.randint(0, 512, (1, seq), generator=torch.Generator().manual_seed(0))

        def plain(model=model, ids=ids):
            model(input_ids=ids)

        def captured(model=model, ids=ids):
            with sinklib.capture(model):
                model(input_ids=ids)

        floor = column_floor_work(4, 8, seq, 32)

        def floor_captured(captured=captured, rows=floor.rows):
            with floor_in_place(rows):
                captured()

        rounds = interleaved_times({"plain": plain, "capture": captured, "floor": floor,
                                    "floor in place": floor_captured}, ROUNDS)
        plain_ms, capture_ms = statistics.median(rounds["plain"]), statistics.median(rounds["capture"])
        own_attention = flash_ms(plain)
        second_call = flash_ms(captured) - own_attention
        other = capture_ms - plain_ms - second_call
        say(f"{seq:5d} {plain_ms:9.1f} {own_attention:9.1f} ({own_attention / plain_ms:3.0%}) {capture_ms:11.1f} "
              f"{second_call:15.1f} {other:7.1f} {paired_ratio(rounds, 'capture'):16.2f} "
              f"{paired_ratio(rounds, 'plain', 'floor'):14.2f} {paired_ratio(rounds, 'floor in place'):23.2f}")

    out = Path(__file__).resolve().parent / "results" / "capture_profile.txt"
    out.write_text("\n".join(lines) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
