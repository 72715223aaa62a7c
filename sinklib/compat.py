"""Named, minimal fixes that let remote-code checkpoints (LLaDA, Dream, MMaDA) run on transformers 5.x.

Their code was written for transformers 4.46–4.56 and runs unchanged there; nothing here is applied on
4.x. Each fix is applied only where its symptom can occur and is listed in LoadedModel.compat_fixes.

- default_rope: transformers 5 dropped ROPE_INIT_FUNCTIONS["default"], which Dream's rotary embedding
  looks up at construction (KeyError: 'default'). We register the standard RoPE frequencies under it.
- rotary_inv_freq: transformers 5 builds models on the meta device and re-initialises only what the
  model's own _init_weights covers; a remote rotary module's non-persistent `inv_freq` buffer is left as
  uninitialised memory — garbage, with no error. We recompute it after loading.
- config_use_cache: transformers 5's PretrainedConfig drops generation parameters, `use_cache` among
  them, from the keyword arguments a config passes up; LLaDA's config does exactly that and its forward
  then reads `config.use_cache` (AttributeError). We restore the value config.json holds (LLaDA: false).
- post_init: transformers 5's loader reads what `post_init()` sets (`all_tied_weights_keys`, …); LLaDA's
  and MMaDA's model classes never call it (AttributeError: 'LLaDAModelLM' object has no attribute
  'all_tied_weights_keys'). We call it at the end of such a class's __init__, as 5.x expects of a model.
- tie_weights_signature: transformers 5 calls `tie_weights(missing_keys=…, recompute_mapping=…)`; LLaDA's
  `tie_weights(self)` takes no arguments (TypeError). We accept and ignore them: LLaDA ties by assignment.
- generation_config_validate: transformers 5 calls `GenerationConfig.validate(user_set_attributes=…)`;
  Dream's DreamGenerationConfig overrides `validate(self, is_init=False)` (TypeError inside Dream's own
  from_pretrained). We let it accept and ignore the new keyword.
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import torch
import transformers
from torch import nn
from transformers import GenerationConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def is_native(model_or_config: Any) -> bool:
    """Whether a model (or config) is one of transformers' own classes, not a checkpoint's remote code."""
    return type(model_or_config).__module__.startswith("transformers.models.")


def transformers_major() -> int:
    """The installed transformers' major version (4 or 5)."""
    return int(transformers.__version__.split(".")[0])


def needs_fixes() -> bool:
    """Whether the fixes apply: transformers 5 or later (nothing is applied on 4.x)."""
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
    if "default" in ROPE_INIT_FUNCTIONS:
        return False
    ROPE_INIT_FUNCTIONS["default"] = default_rope_parameters
    return True


def uses_default_rope(model: nn.Module) -> bool:
    """Whether any module of the model took its RoPE frequencies from the `default_rope` fix."""
    return any(getattr(module, "rope_init_fn", None) is default_rope_parameters for module in model.modules())


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
    """Whether a config declares bidirectional attention (is_causal=False or use_bidirectional_attention=True)."""
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


def restore_use_cache(config, raw: dict[str, Any] | None) -> bool:
    """Fix `config_use_cache`; returns whether anything was changed."""
    if config is None or "use_cache" in vars(config):
        return False
    config.use_cache = bool((raw or {}).get("use_cache", False))
    return True


def cache_keyword(model: nn.Module) -> str:
    """The name model.forward takes its KV cache by, and its output returns it by: "cache" from transformers 5.24
    (where the old name still works but warns on every call), "past_key_values" before."""
    return _cache_keyword_of(type(model))


@functools.lru_cache(maxsize=None)
def _cache_keyword_of(model_class: type) -> str:  # once per class: it is asked at every decoding step
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _accepts(function, keyword: str) -> bool:
    parameters = inspect.signature(function).parameters
    return keyword in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _remote_classes(cls: type) -> list[type]:
    """cls and its bases that are not transformers' own (the remote code's classes)."""
    return [c for c in cls.__mro__ if c.__module__ and not c.__module__.startswith(("transformers.", "torch.", "builtins"))
            and c is not object]


def _fix_post_init(klass: type) -> bool:
    init = klass.__dict__.get("__init__")
    if init is not None and not getattr(init, "_sinklib_post_init", False) and not _calls_post_init(init):
        klass.__init__ = _with_post_init(init)
    return getattr(klass.__dict__.get("__init__"), "_sinklib_post_init", False)


def _fix_tie_weights_signature(klass: type) -> bool:
    tie = klass.__dict__.get("tie_weights")
    if tie is not None and not _accepts(tie, "missing_keys"):
        klass.tie_weights = _ignoring_keywords(tie)
    return getattr(klass.__dict__.get("tie_weights"), "_sinklib_ignores", False)


def _fix_generation_config_validate(klass: type) -> bool:
    fixed = False
    for config_class in _generation_config_classes(sys.modules.get(klass.__module__)):
        if not _accepts(config_class.validate, "user_set_attributes"):
            config_class.validate = _ignoring_keywords(config_class.validate, keep=("is_init",))
        fixed = fixed or getattr(config_class.validate, "_sinklib_ignores", False)
    return fixed


CLASS_FIXES = {"post_init": _fix_post_init, "tie_weights_signature": _fix_tie_weights_signature,
               "generation_config_validate": _fix_generation_config_validate}


def prepare_remote_class(cls: type) -> list[str]:
    """Apply the class fixes (CLASS_FIXES) to a remote model class and its remote bases before transformers 5
    loads it; returns the names of those that apply to it (also when an earlier load applied them)."""
    return sorted({name for klass in _remote_classes(cls) for name, fix in CLASS_FIXES.items() if fix(klass)})


def _calls_post_init(init) -> bool:
    try:
        return "post_init()" in inspect.getsource(init)
    except (OSError, TypeError):
        return False


def _with_post_init(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not hasattr(self, "all_tied_weights_keys"):  # the outermost wrapped __init__ does it once
            self.post_init()

    __init__._sinklib_post_init = True
    return __init__


def _ignoring_keywords(method, keep: tuple[str, ...] = ()):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return method(self, *args, **{k: v for k, v in kwargs.items() if k in keep})

    wrapper._sinklib_ignores = True
    return wrapper


def _generation_config_classes(module) -> list[type]:
    found = []
    for value in vars(module).values() if module is not None else ():
        if isinstance(value, type) and issubclass(value, GenerationConfig) and value is not GenerationConfig \
                and not value.__module__.startswith("transformers."):
            found.append(value)
    return found
