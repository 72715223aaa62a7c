"""Capture against the routes other tools take, across sequence lengths and widths, measured side by side.

    python benchmarks/capture_routes.py                 # CPU: S in 128..2048, d 256 and 512 (about 10 minutes)
    python benchmarks/capture_routes.py --quick         # S in 256, 1024; d 256

Routes, each one forward of a bidirectional Llama-shaped model (4 layers, 8 heads, fp32 on CPU):
  plain      the model alone (SDPA)
  capture    sinklib.capture: scores per layer, head and key, reduced at the source
  masking    sinklib.capture with MaskSinks(top_k=5, threshold=False)
  eager      eager attention with output_attentions=True, reduced to the same scores afterwards (most tools)
  hooks      eager attention with forward hooks keeping every layer's full map (the usual notebook approach)
Time: routes interleaved within each round; ratios are per round (paired), reported as median and quartiles.
Peak memory: each route in a fresh process, the growth of its peak resident set over what the process held with
the model built (Linux).
Writes benchmarks/results/capture_routes.{csv,md,png}. Goals (CPU): capture ≤ 1.25× plain and faster than eager
at every S, masking ≤ 1.3× plain.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent
ROUTES = ("plain", "capture", "masking", "eager", "hooks")


def build(width: int, seq: int, attn: str) -> transformers.PreTrainedModel:
    """The benchmark's random-weight bidirectional Llama (hidden size `width`, 4 layers, 8 heads, vocabulary 512,
    positions for at least `seq` tokens) with attention implementation `attn`, in eval mode."""
    config = transformers.LlamaConfig(hidden_size=width, intermediate_size=width * 8 // 3, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=8, vocab_size=512,
                                      max_position_embeddings=max(4096, seq), is_causal=False, attn_implementation=attn)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def route(name: str, width: int, seq: int):
    """A zero-argument function running one forward of `name` (its model built once, outside the timing)."""
    import sinklib

    model = build(width, seq, "eager" if name in ("eager", "hooks") else "sdpa")
    ids = torch.randint(0, 512, (1, seq), generator=torch.Generator().manual_seed(0))
    if name == "plain":
        return lambda: model(input_ids=ids)
    if name in ("capture", "masking"):
        policy = sinklib.MaskSinks(top_k=5, threshold=False) if name == "masking" else None

        def captured():
            with sinklib.capture(model, intervention=policy) as rec:
                model(input_ids=ids)
            return rec.scores
        return captured
    if name == "eager":
        return lambda: torch.stack([a.sum(-2) for a in model(input_ids=ids, output_attentions=True).attentions])
    kept: list[torch.Tensor] = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda module, args, out: kept.append(out[1]))

    def hooked():
        kept.clear()
        model(input_ids=ids, output_attentions=True)
        return torch.stack([m.sum(-2) for m in kept])
    return hooked


def timings(width: int, seq: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per forward of every route, one list entry per round (routes interleaved within a round)."""
    runs = {name: route(name, width, seq) for name in ROUTES}
    times: dict[str, list[float]] = {name: [] for name in ROUTES}
    with torch.no_grad():
        for name in ROUTES:
            runs[name]()  # warm-up
        for _ in range(rounds):
            for name in ROUTES:
                began = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - began)
    return times


def ratio_row(times: dict[str, list[float]], name: str) -> dict[str, float]:
    """Median time and the route ÷ plain ratio of each round (paired, so a slow spell hits both sides), as
    median and interquartile range: on a shared 2-core machine the spread is part of the result."""
    paired = sorted(a / b for a, b in zip(times[name], times["plain"]))
    quartile = lambda q: paired[min(len(paired) - 1, round(q * (len(paired) - 1)))]  # noqa: E731
    eager = statistics.median(a / b for a, b in zip(times[name], times["eager"]))
    return {"ms": round(statistics.median(times[name]) * 1000, 2), "x_plain": round(statistics.median(paired), 3),
            "x_plain_q25": round(quartile(0.25), 3), "x_plain_q75": round(quartile(0.75), 3), "x_eager": round(eager, 3)}


def peak_growth(name: str, width: int, seq: int) -> float:
    """MiB: the route's peak resident memory above what the process held before it ran, in a fresh process
    (Linux: the peak, VmHWM, is reset through /proc/self/clear_refs after the model is built)."""
    code = (f"import sys, torch; sys.path.insert(0, {str(ROOT)!r}); import capture_routes as b; "
            f"run = b.route({name!r}, {width}, {seq}); torch.set_grad_enabled(False); "
            "status = lambda key: int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]); "
            "before = status('VmRSS:'); open('/proc/self/clear_refs', 'w').write('5'); run(); "
            "print((status('VmHWM:') - before) / 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Time every route at every length and width (and, unless --no-memory, its peak memory); print the ratios
    and write the csv, markdown and png results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5, help="rounds at S = 1024; shorter forwards get more")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    import pandas as pd
    from tqdm.auto import tqdm

    lengths = (256, 1024) if args.quick else (128, 256, 512, 1024, 2048)
    widths = (256,) if args.quick else (256, 512)
    rows = []
    for width in widths:
        for seq in tqdm(lengths, desc=f"d {width}"):
            # a 15 ms forward on a shared 2-core machine needs many rounds for a stable median; a 1 s one does not
            rounds = max(5, args.rounds * 1024 // seq)
            times = timings(width, seq, rounds)
            for name in ROUTES:
                row = {"device": "cpu", "threads": torch.get_num_threads(), "width": width, "seq": seq, "route": name,
                       "rounds": rounds, **ratio_row(times, name)}
                if not args.no_memory:
                    row["peak_mib_over_model"] = round(peak_growth(name, width, seq), 1)
                rows.append(row)
    frame = pd.DataFrame(rows)
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    stem = "capture_routes_quick" if args.quick else "capture_routes"
    frame.to_csv(out / f"{stem}.csv", index=False)
    wide = frame.pivot_table(index=["width", "seq"], columns="route", values="x_plain")[list(ROUTES)]
    (out / f"{stem}.md").write_text(f"{torch.get_num_threads()} threads, torch {torch.__version__}\n\n"
                                    "time ÷ plain forward (median of per-round ratios; quartiles in the table below)\n\n"
                                    + wide.to_markdown() + "\n\n" + frame.to_markdown(index=False) + "\n")
    print(wide.to_string())
    plot(frame, widths, out / f"{stem}.png")
    print(json.dumps({"written": [str(out / f"{stem}.{ext}") for ext in ("csv", "md", "png")]}))


def plot(frame, widths, path: Path) -> None:
    """Plot time ÷ plain against S for every route but plain, one panel per width, with quartile bars, to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.6), squeeze=False)
    for ax, width in zip(axes[0], widths):
        part = frame[frame["width"] == width]
        for name in ROUTES[1:]:
            line = part[part["route"] == name]
            spread = [line["x_plain"] - line["x_plain_q25"], line["x_plain_q75"] - line["x_plain"]]
            ax.errorbar(line["seq"], line["x_plain"], yerr=spread, marker="o", capsize=3, label=name)
        ax.axhline(1.25, color="grey", linestyle=":", label="goal 1.25×")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length S")
        ax.set_ylabel("time ÷ plain forward")
        ax.set_title(f"d {width}, 4 layers, 8 heads, CPU fp32")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})


if __name__ == "__main__":
    main()
