"""Named, minimal fixes that let remote-code checkpoints (LLaDA, Dream, MMaDA) run on transformers 5.x.

Their code was written for transformers 4.46–4.56 and runs unchanged there; nothing here is applied on
4.x. Each fix is applied only where its symptom can occur and is listed in LoadedModel.extra["compat"].

- default_rope: transformers 5 dropped ROPE_INIT_FUNCTIONS["default"], which Dream's rotary embedding
  looks up at construction (KeyError: 'default'). We register the standard RoPE frequencies under it.
- rotary_inv_freq: transformers 5 builds models on the meta device and re-initialises only what the
  model's own _init_weights covers; a remote rotary module's non-persistent `inv_freq` buffer is left as
  uninitialised memory — garbage, with no error. We recompute it after loading.
"""
from __future__ import annotations

import torch
from torch import nn


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def needs_fixes() -> bool:
    return transformers_major() >= 5


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def default_rope_parameters(config, device=None, seq_len=None, **kwargs) -> tuple[torch.Tensor, float]:
    """The standard RoPE inverse frequencies 1 / θ^(2i/d), d = head_dim × partial_rotary_factor."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (_rope_theta(config) ** exponents), 1.0


def apply_default_rope() -> bool:
    """Fix `default_rope`; returns whether anything was changed."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "default" in ROPE_INIT_FUNCTIONS:
        return False
    ROPE_INIT_FUNCTIONS["default"] = default_rope_parameters
    return True


def recompute_rotary_inv_freq(model: nn.Module) -> list[str]:
    """Fix `rotary_inv_freq`: recompute every `inv_freq` buffer from its module's config; returns the
    names of the modules fixed."""
    fixed = []
    config = getattr(model, "config", None)
    for name, module in model.named_modules():
        buffer = getattr(module, "inv_freq", None)
        if not isinstance(buffer, torch.Tensor) or "inv_freq" not in module._buffers:
            continue
        module_config = getattr(module, "config", None) or config
        init = getattr(module, "rope_init_fn", None) or default_rope_parameters
        inv_freq, _ = init(module_config, buffer.device)
        module.inv_freq = inv_freq.to(buffer.dtype)
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = inv_freq.to(buffer.dtype).clone()
        fixed.append(name)
    return fixed


def is_bidirectional(config) -> bool:
    return getattr(config, "is_causal", True) is False or bool(getattr(config, "use_bidirectional_attention", False))


def make_bidirectional(model: nn.Module) -> bool:
    """Honour a native model's declared bidirectional attention on every transformers version.

    transformers 5 reads config.is_causal when it builds masks; 4.x ignores it and keeps each attention
    module's own is_causal=True. Clearing the modules' flag and passing key-padding masks in 4D
    (bidirectional_key_mask) gives the same computation on both (bit-identical to 5.x's own path)."""
    if not is_bidirectional(getattr(model, "config", None)):
        return False
    changed = False
    for module in model.modules():
        if getattr(module, "is_causal", None) is True:
            module.is_causal = False
            changed = True
    return changed


def bidirectional_key_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] 0/1 key-padding mask → [B, 1, S, S] bool: every query may see every real key."""
    keys = attention_mask.bool()[:, None, None, :]
    return keys.expand(-1, 1, attention_mask.shape[-1], -1)
