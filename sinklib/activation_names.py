"""One vocabulary for the activations sinklib reads, and one way to ask for some of them: `names_filter`.

Every activation is named "blocks.{layer}.{kind}", the layer being the model's block in execution order (the same
number as a trace's layer axis, sinklib.layers):

| name                       | read by                                        | what it is                                   |
|----------------------------|------------------------------------------------|----------------------------------------------|
| `blocks.{l}.attn.scores`   | `sinklib.capture` (Recorder.scores)            | the score each key receives, Σ_i A_ij         |
| `blocks.{l}.attn.values`   | `sinklib.carry` (value_norms, sink_carry)      | each key's value norm and output norm         |
| `blocks.{l}.resid`         | `sinklib.lens` (iter_layer_logits, logit_lens) | the residual stream after block l (its lens)  |

Capture, carry and the lens each take `names_filter`, as TransformerLens's run_with_cache does: it *filters* the
names the entry point reads, it never replaces the model's layer list:

- None: every name;
- a str: that one name;
- a list (tuple, set) of str: the names it lists; each must be a name the model has (of any kind: one list may
  serve all three entry points), a name of a layer the model lacks or of an unknown kind is refused;
- a callable name → bool: the names it is true of (e.g. `lambda name: name.startswith("blocks.3.")`).

A filter that keeps none of the entry point's names is refused (BadValue, naming the parameter, the value and what
is allowed). Results keep the layers' own numbers: a capture's `recorder.layer_ids`, the `layer` column of carry's
and the lens's frames.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Union

from torch import nn

from sinklib.layers import attention_layers
from sinklib.validation import BadValue, did_you_mean

SCORES = "attn.scores"
VALUES = "attn.values"
RESID = "resid"
KINDS = (SCORES, VALUES, RESID)  # what each entry point reads: capture, carry, the lens
PARAM = "names_filter"

NamesFilter = Union[None, str, Iterable[str], Callable[[str], bool]]

_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def activation_name(layer: int, kind: str) -> str:
    """The name of block `layer`'s `kind` activation: activation_name(3, "attn.scores") == "blocks.3.attn.scores"."""
    return f"blocks.{layer}.{kind}"


def parse_name(name: str, param: str = PARAM) -> tuple[int, str]:
    """(layer, kind) of an activation name; anything else is refused naming `param`."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or match.group(2) not in KINDS:
        shapes = [activation_name("{layer}", kind) for kind in KINDS]
        raise BadValue(f"{param}={name!r} is not allowed: activation names are {shapes}"
                       f"{did_you_mean(name, [activation_name(0, kind) for kind in KINDS])}")
    return int(match.group(1)), match.group(2)


def names(n_layers: int, kinds: Iterable[str] = KINDS) -> list[str]:
    """Every name of `n_layers` blocks, block by block (each block's kinds in the order given)."""
    return [activation_name(layer, kind) for layer in range(n_layers) for kind in kinds]


def model_names(model, kinds: Iterable[str] = KINDS) -> list[str]:
    """The names a model offers: a torch module, or sinklib.load's LoadedModel (its declared layer_names honoured).
    (The lens reads transformers-native models only, carry Llama- and LLaDA-style value projections.)"""
    return names(count_layers(model), kinds)


def count_layers(model) -> int:
    """How many blocks a model (an nn.Module, or anything holding one as .model beside .layer_names) has."""
    module = model if isinstance(model, nn.Module) else getattr(model, "model", None)
    if not isinstance(module, nn.Module):
        raise BadValue(f"model={type(model).__name__} is not allowed: model must be a torch nn.Module or the "
                       "LoadedModel that sinklib.load returns")
    return len(attention_layers(module, getattr(model, "layer_names", None)))


def _as_predicate(names_filter: NamesFilter, n_layers: int, param: str) -> Callable[[str], bool]:
    """The filter as a test of one name; a listed name the model does not have, or a filter of another type, is
    refused."""
    if callable(names_filter):
        return lambda name: bool(names_filter(name))
    listed = [names_filter] if isinstance(names_filter, str) else names_filter
    if isinstance(listed, (bytes, dict)) or not isinstance(listed, Iterable):
        raise BadValue(f"{param}={names_filter!r} is not allowed: {param} must be None, an activation name (str), a "
                       "list of them or a callable name → bool")
    listed = list(listed)
    for name in listed:
        layer, _ = parse_name(name, param)
        if layer >= n_layers:
            raise BadValue(f"{param}={name!r} is not allowed: this model has blocks 0..{n_layers - 1}"
                           f"{did_you_mean(name, names(n_layers))}")
    wanted = set(listed)
    return wanted.__contains__


def select_layers(names_filter: NamesFilter, n_layers: int, kind: str, param: str = PARAM) -> list[int]:
    """The blocks (in order) whose `kind` activation `names_filter` keeps, among `n_layers`; None keeps all. A filter
    that keeps none of them, or is no filter at all, is refused naming `param`."""
    if kind not in KINDS:
        raise BadValue(f"kind={kind!r} is not allowed: kind must be one of {list(KINDS)}")
    if names_filter is None:
        return list(range(n_layers))
    keeps = _as_predicate(names_filter, n_layers, param)
    kept = [layer for layer in range(n_layers) if keeps(activation_name(layer, kind))]
    if not kept:
        raise BadValue(f"{param}={names_filter!r} is not allowed: {param} must keep at least one of this model's "
                       f"{activation_name('{layer}', kind)!r} names (layers 0..{n_layers - 1}), e.g. "
                       f"{activation_name(0, kind)!r}")
    return kept
