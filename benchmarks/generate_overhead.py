"""Traced ÷ plain generation, side by side in one run (same sampler; plain = capture off).

    python benchmarks/generate_overhead.py

CPU: a small bidirectional Llama with the LLaDA sampler. GPU (if present): a random-weight
LLaDA-8B-shaped model (32 layers, d 4096, 32 heads), gen 256, block 32, bf16. Goals: ≤ 1.3× on
CPU, ≤ 1.05× on GPU. Also prints the trace's stored bytes against L·H·S·steps·4, and generate(...,
keep_scores=False) (the evaluation path: no capture, nothing stored) against plain.
"""
from __future__ import annotations

import statistics
import time

import torch
import transformers

import sinklib
from sinklib.families.llada import LLaDASettings

SHAPES = {
    "cpu": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, vocab_size=512,
                prompt=32, gen_length=64, block_length=32, steps=16, dtype=torch.float32),
    "cuda": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=32, vocab_size=126464,
                 prompt=128, gen_length=256, block_length=32, steps=64, dtype=torch.bfloat16),
}


def run(device: str, rounds: int = 3) -> None:
    """Time plain, traced and keep_scores=False generation on the `device` shape in `rounds` interleaved rounds,
    check that all three write the same tokens, and print the medians, ratios and stored bytes."""
    shape = SHAPES[device]
    loaded = sinklib.load(build(shape, device), mask_id=shape["vocab_size"] - 1)
    prompt = torch.randint(0, shape["vocab_size"] - 1, (shape["prompt"],)).tolist()
    options = dict(steps=shape["steps"], gen_length=shape["gen_length"], block_length=shape["block_length"])
    settings = LLaDASettings(mask_id=loaded.mask_id, **options)
    ids = torch.tensor([prompt], device=device)

    def plain():
        with torch.no_grad():
            return loaded.family.sample(lambda x, m=None, p=None: loaded.logits(x, m, p), ids, None, settings)

    def traced():
        return sinklib.generate(loaded, prompt, settings, progress=False)

    def untraced():
        return sinklib.generate(loaded, prompt, settings, progress=False, keep_scores=False)

    def timed(fn):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    plain(), traced(), untraced()  # warm-up
    times = {"plain": [], "traced": [], "untraced": []}
    for _ in range(rounds):
        t, canvases = timed(plain)
        times["plain"].append(t)
        t, trace = timed(traced)
        times["traced"].append(t)
        t, bare = timed(untraced)
        times["untraced"].append(t)
    assert canvases[-1][0].tolist() == trace.tokens[-1].tolist() == bare.tokens[-1].tolist(), "capture changed the tokens"
    report(device, shape, times, trace)


def build(shape: dict, device: str) -> transformers.PreTrainedModel:
    """The random-weight bidirectional Llama of `shape` (marked as LLaDA) on `device`, in eval mode."""
    config = transformers.LlamaConfig(num_key_value_heads=shape["num_attention_heads"], is_causal=False,
                                      attn_implementation="sdpa", max_position_embeddings=4096,
                                      **{k: shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                               "num_attention_heads", "vocab_size")})
    config.sinklib_family = "llada"
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config).to(shape["dtype"]).eval()


def report(device: str, shape: dict, times: dict, trace) -> None:
    """Print the median times, their ratios to plain and the trace's stored bytes against L·H·S·steps·4."""
    p, t, u = (statistics.median(times[k]) for k in ("plain", "traced", "untraced"))
    layers, heads, seq = shape["num_hidden_layers"], shape["num_attention_heads"], shape["prompt"] + shape["gen_length"]
    stored = trace.scores.numel() * 4 + (0 if trace.masked_keys is None else trace.masked_keys.numel())
    print(f"{device}: L={layers} H={heads} S={seq} steps={shape['steps']} ({shape['dtype']})")
    print(f"  plain  {p:8.3f} s   traced {t:8.3f} s   traced/plain {t / p:.3f}×  (same tokens: yes)")
    print(f"  keep_scores=False {u:8.3f} s   ÷ plain {u / p:.3f}×")
    print(f"  stored scores {stored / 2**20:.2f} MiB = "
          f"{stored / (layers * heads * seq * shape['steps'] * 4):.3f} × L·H·S·steps·4")


if __name__ == "__main__":
    run("cpu")
    if torch.cuda.is_available():
        run("cuda", rounds=2)
