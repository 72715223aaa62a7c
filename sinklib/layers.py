"""Where a model's attention lives: one entry per transformer block, named by its module path.

Architectures are data: a block's attention is the first submodule whose class name ends in "Attention"
(Llama, Qwen2, Gemma, ModernBERT, Dream), or the block itself when attention is a method of the block
(LLaDA, MMaDA). A family can always pass the module names explicitly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import nn

from sinklib.validation import BadValue, did_you_mean

_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layers", "num_layers")
_HEAD_COUNT_KEYS = ("num_attention_heads", "n_heads", "num_heads")


@dataclass(frozen=True)
class AttentionLayer:
    """One block's attention: its index in execution order, its module path in the model, the module, and its
    number of query heads (None when neither the module nor a config states it)."""

    index: int
    name: str
    module: nn.Module
    n_heads: int | None


def _config_value(config: object, keys: Sequence[str]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _head_count(module: nn.Module, model: nn.Module) -> int | None:
    for key in _HEAD_COUNT_KEYS:
        value = getattr(module, key, None)
        if isinstance(value, int) and value > 0:
            return value
    for config in (getattr(module, "config", None), getattr(model, "config", None)):
        value = _config_value(config, _HEAD_COUNT_KEYS) if config is not None else None
        if value:
            return value
    return None


def _block_list(model: nn.Module) -> tuple[str, nn.ModuleList]:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise BadValue(f"model={type(model).__name__} has no nn.ModuleList of transformer blocks; "
                       "pass layer_names=[...] explicitly")
    n_layers = _config_value(getattr(model, "config", None), _LAYER_COUNT_KEYS)
    matching = [item for item in lists if len(item[1]) == n_layers]
    return matching[0] if matching else max(lists, key=lambda item: len(item[1]))


def _attention_in(block: nn.Module) -> tuple[str, nn.Module]:
    for name, module in block.named_modules():
        if name and type(module).__name__.lower().endswith("attention"):
            return name, module
    return "", block


def attention_layers(model: nn.Module, layer_names: Sequence[str] | None = None) -> list[AttentionLayer]:
    """The attention-bearing module of every block, in execution order."""
    if layer_names is not None:
        if isinstance(layer_names, str):
            raise BadValue(f"layer_names={layer_names!r} is not allowed: layer_names must be a list of module paths")
        repeated = sorted({name for name in layer_names if list(layer_names).count(name) > 1})
        if repeated:  # one module twice would enter one layer and leave the other empty (a layer of NaN)
            raise BadValue(f"layer_names={list(layer_names)!r} is not allowed: layer_names must name each module once "
                           f"({repeated} repeated)")
        modules = dict(model.named_modules())
        layers = []
        for index, name in enumerate(layer_names):
            if name not in modules:
                raise BadValue(f"layer_names[{index}]={name!r} is not a module of the model{did_you_mean(name, modules)}")
            layers.append(AttentionLayer(index, name, modules[name], _head_count(modules[name], model)))
        return layers
    list_name, blocks = _block_list(model)
    layers = []
    for index, block in enumerate(blocks):
        sub, module = _attention_in(block)
        name = ".".join(part for part in (list_name, str(index), sub) if part)
        layers.append(AttentionLayer(index, name, module, _head_count(module, model)))
    return layers
