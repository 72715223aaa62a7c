"""sinklib's cached and threshold samplers against Fast-dLLM's own code, token for token.

Fast-dLLM (NVlabs/Fast-dLLM) is not part of this repository and no test depends on it: fetch a checkout, then

    python benchmarks/fast_dllm_parity.py --fast-dllm /path/to/Fast-dLLM   # needs einops (pip install einops)

A tiny random LLaDA (its llada/model/modeling_llada.py) and a tiny random Dream (dream/model/modeling_dream.py) are
built from the upstream classes; their weights are copied into transformers' own Llama and Qwen2 (bidirectional),
which sinklib samples with. Upstream's llada/generate.py (generate, generate_with_prefix_cache,
generate_with_dual_cache) and dream/model/generation_utils_block.py (prefix and dual cache, confidence_threshold or
its schedule) then generate beside sinklib.generate with the same settings, and the final canvases are compared.
Prints one line per case and writes benchmarks/results/fast_dllm_parity.md."""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
import transformers

import sinklib
from sinklib import compat

VOCAB, MASK = 128, 126
PROMPT = [5, 9, 2, 33, 17, 8, 40, 41]
LAYOUTS = ((16, 16, 8), (8, 16, 4), (16, 32, 8))  # (steps, gen_length, block_length)
THRESHOLDS = (None, 0.05, 0.3, 0.6)  # None: the schedule; the others from one block a forward to one token a forward


def _randomise(model: torch.nn.Module, output: torch.nn.Linear) -> None:
    """Weights far from initialisation, so that decisions are not near-ties (norm gains near 1); the mask id's output
    row zeroed, so that the model never predicts it (upstream's loops would then run for ever: they end a block only
    when it has no masks)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
            elif "norm" in name or "ln_f" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.uniform_(-0.2, 0.2)
        output.weight[MASK] = 0.0


def _upstream_package(folder: Path) -> None:
    """Make `folder` the one importable upstream tree: llada/ and dream/ each hold a package named `model`."""
    for name in [n for n in sys.modules if n == "model" or n.startswith("model.") or n == "generate"]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not p.endswith(("/llada", "/dream"))]
    sys.path.insert(0, str(folder))


def llada_pair(root: Path):
    """(upstream LLaDAModelLM, the same weights in a native bidirectional Llama) and upstream's generate module."""
    _upstream_package(root / "llada")
    from model.configuration_llada import LLaDAConfig  # noqa: PLC0415
    from model.modeling_llada import LLaDAModelLM  # noqa: PLC0415
    import generate as upstream_generate  # noqa: PLC0415

    config = LLaDAConfig(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128, activation_type="silu",
                         block_type="llama", layer_norm_type="rms", rms_norm_eps=1e-5, rope=True, rope_theta=10000.0,
                         rope_full_precision=True, include_bias=False, include_qkv_bias=False, weight_tying=False,
                         vocab_size=VOCAB, embedding_size=VOCAB, max_sequence_length=128, mask_token_id=MASK,
                         eos_token_id=1, pad_token_id=0, attention_dropout=0.0, residual_dropout=0.0,
                         embedding_dropout=0.0, flash_attention=False, init_device="cpu")
    config.use_cache = False  # transformers 5 no longer defaults it (sinklib.compat.restore_use_cache)
    upstream = LLaDAModelLM(config, init_params=True).eval()
    _randomise(upstream, upstream.model.transformer.ff_out)
    native = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, is_causal=False, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, attn_implementation="sdpa")).eval()
    blocks = upstream.model.transformer
    with torch.no_grad():
        native.model.embed_tokens.weight.copy_(blocks.wte.weight)
        native.model.norm.weight.copy_(blocks.ln_f.weight)
        native.lm_head.weight.copy_(blocks.ff_out.weight)
        for block, layer in zip(blocks.blocks, native.model.layers):
            pairs = {"attn_norm": layer.input_layernorm, "ff_norm": layer.post_attention_layernorm,
                     "q_proj": layer.self_attn.q_proj, "k_proj": layer.self_attn.k_proj, "v_proj": layer.self_attn.v_proj,
                     "attn_out": layer.self_attn.o_proj, "ff_proj": layer.mlp.gate_proj, "up_proj": layer.mlp.up_proj,
                     "ff_out": layer.mlp.down_proj}
            for name, target in pairs.items():
                target.weight.copy_(getattr(block, name).weight)
    return upstream, native, upstream_generate


def dream_pair(root: Path):
    """(upstream DreamModel with the block-wise sampler, the same weights in a native bidirectional Qwen2) and the
    upstream generation config class."""
    _upstream_package(root / "dream")
    from model.configuration_dream import DreamConfig  # noqa: PLC0415
    from model.generation_utils_block import DreamGenerationConfig, DreamGenerationMixin  # noqa: PLC0415
    from model.modeling_dream import DreamModel  # noqa: PLC0415

    compat.apply_default_rope()  # what sinklib.load does for Dream's code on transformers 5
    compat.prepare_remote_class(DreamModel)
    compat._fix_generation_config_validate(DreamGenerationConfig)
    config = DreamConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, mask_token_id=MASK,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    upstream = DreamModel(config).eval()
    compat.recompute_rotary_inv_freq(upstream)
    _randomise(upstream, upstream.lm_head)
    upstream.diffusion_generate = types.MethodType(DreamGenerationMixin.diffusion_generate, upstream)
    upstream._sample = types.MethodType(DreamGenerationMixin._sample, upstream)  # as Fast-dLLM's dream/eval.py does
    native = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, is_causal=False, tie_word_embeddings=False,
        attn_implementation="sdpa", rms_norm_eps=1e-6, rope_theta=10000.0)).eval()
    native.load_state_dict(upstream.state_dict())
    return upstream, native, DreamGenerationConfig


def llada_cases(root: Path) -> list[str]:
    upstream, native, reference = llada_pair(root)
    native.config.sinklib_family = "llada"
    loaded = sinklib.load(native, mask_id=MASK)
    prompt = torch.tensor([PROMPT])
    lines = []
    for steps, gen_length, block in LAYOUTS:
        for threshold in THRESHOLDS:
            for cache, function in ((None, reference.generate), ("prefix", reference.generate_with_prefix_cache),
                                    ("dual", reference.generate_with_dual_cache)):
                with torch.no_grad():
                    tokens, forwards = function(upstream, prompt, steps=steps, gen_length=gen_length, block_length=block,
                                                temperature=0.0, remasking="low_confidence", mask_id=MASK,
                                                threshold=threshold)
                settings = loaded.settings_for(steps=steps, gen_length=gen_length, block_length=block,
                                               threshold=threshold, cache=cache, confidence_dtype="float64")
                ours = sinklib.generate(loaded, PROMPT, settings, progress=False)
                lines.append(f"| LLaDA | {steps} / {gen_length} / {block} | {cache} | {threshold} | "
                             f"{ours.tokens[-1].tolist() == tokens[0].tolist()} | {ours.n_steps} | {forwards} |")
    return lines


def dream_cases(root: Path) -> list[str]:
    upstream, native, generation_config = dream_pair(root)
    native.config.sinklib_family = "dream"
    loaded = sinklib.load(native, mask_id=MASK)
    prompt = torch.tensor([PROMPT])
    lines = []
    for steps, gen_length, block in (*LAYOUTS, (32, 32, 32)):
        for threshold in THRESHOLDS:
            for dual in (False, True):
                config = generation_config(max_new_tokens=gen_length, steps=steps, temperature=0.0,
                                           alg="confidence_threshold" if threshold else "entropy", mask_token_id=MASK,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
                with torch.no_grad():
                    tokens = upstream.diffusion_generate(prompt, generation_config=config, threshold=threshold,
                                                         block_length=block, dual_cache=dual)
                settings = loaded.settings_for(steps=steps, gen_length=gen_length, block_length=block,
                                               alg="maskgit_plus" if threshold else "entropy", threshold=threshold,
                                               cache="dual" if dual else "prefix")
                ours = sinklib.generate(loaded, PROMPT, settings, progress=False)
                lines.append(f"| Dream | {steps} / {gen_length} / {block} | {'dual' if dual else 'prefix'} | {threshold} | "
                             f"{ours.tokens[-1].tolist() == tokens[0].tolist()} | {ours.n_steps} | (not counted) |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast-dllm", type=Path, required=True, help="a checkout of NVlabs/Fast-dLLM")
    parser.add_argument("--revision", default="(revision not given)", help="the checkout's commit, for the record")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fast_dllm_parity.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = llada_cases(args.fast_dllm) + dream_cases(args.fast_dllm)
    equal = sum("| True |" in line for line in lines)
    text = "\n".join([
        "# sinklib against Fast-dLLM's own samplers, token for token",
        "",
        f"Made by `benchmarks/fast_dllm_parity.py` against NVlabs/Fast-dLLM {args.revision}; torch "
        f"{torch.__version__}, transformers {transformers.__version__}, one thread. Tiny random models built from the "
        "upstream classes, their weights copied into transformers' Llama / Qwen2 (bidirectional); temperature 0. "
        "Upstream's LLaDA `nfe` counts one more forward per block where a block's first forward already cleared it "
        "(its cached loops test the block after the forward; sinklib, as upstream's later generate.py, before).",
        "",
        f"**{equal} of {len(lines)} final canvases equal.**",
        "",
        "| model | steps / gen_length / block | cache | threshold | tokens equal | sinklib forwards | upstream nfe |",
        "|---|---|---|---|---|---|---|",
        *lines, ""])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
