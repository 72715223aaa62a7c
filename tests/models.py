"""Tiny random transformers models used across the tests (real architectures, tiny configs)."""
from __future__ import annotations

import copy

import torch
import transformers

VOCAB = 64


def _build(config_cls, model_cls, **kwargs):
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, attn_implementation="sdpa", **kwargs)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # larger random weights give peaked, sink-like attention patterns
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.2)
    return model


def llama(causal: bool = True):
    return _build(transformers.LlamaConfig, transformers.LlamaForCausalLM, num_key_value_heads=4, is_causal=causal)


def qwen2_gqa():
    return _build(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, num_key_value_heads=2)


def gemma_bidirectional():
    return _build(transformers.GemmaConfig, transformers.GemmaForCausalLM, num_key_value_heads=2, head_dim=8,
                  use_bidirectional_attention=True, is_causal=False)
    # transformers 5.x: use_bidirectional_attention only clears the module's is_causal flag, while the mask builder
    # reads config.is_causal; without both, sdpa runs bidirectional but eager and padded inputs run causal.


def modernbert():
    config = transformers.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                           num_attention_heads=4, global_attn_every_n_layers=2, local_attention=4,
                                           pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.ModernBertForMaskedLM(config).eval()


def qwen3_5_gated():
    """Qwen3.5's full-attention block (a sigmoid gate on each head's output, QK-norm), bidirectional, as the zoo's
    tiny-llada-gated."""
    return _build(transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM, num_key_value_heads=2, head_dim=8,
                  layer_types=["full_attention"] * 2, partial_rotary_factor=1.0, is_causal=False)


NATIVE = {"llama-causal": lambda: llama(True), "llama-bidirectional": lambda: llama(False), "qwen2-gqa": qwen2_gqa,
          "gemma-bidirectional": gemma_bidirectional, "modernbert": modernbert}
if hasattr(transformers, "Qwen3_5ForCausalLM"):  # transformers 5: not in the 4.x tier
    NATIVE["qwen3.5-gated-bidirectional"] = qwen3_5_gated


def eager_twin(model):
    twin = copy.deepcopy(model)
    twin.set_attn_implementation("eager")
    return twin


def logits_of(output):
    return output.logits if hasattr(output, "logits") else output


MASK_ID = VOCAB - 1


def diffusion_llama(family: str = "llada", seed: int = 0):
    """A bidirectional Llama that declares its sinklib family in its config, as the zoo's models do."""
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, is_causal=False,
                                      max_position_embeddings=64, attn_implementation="sdpa")
    config.sinklib_family = family
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    return model


def with_cache(model, out) -> dict:
    """The keyword argument that hands out's KV cache to model's next call, by the name this transformers uses."""
    from sinklib.compat import cache_keyword

    keyword = cache_keyword(model)
    return {keyword: getattr(out, keyword)}
