"""Validation declared where a signature or a config is declared.

A parameter or a dataclass field says what it accepts in its annotation — `n_prompts: Count`, `eps: NonNegative`,
`trust_remote_code: Consent`, `ks: list[Index]` — and `@checked` (functions) or `@validated` (dataclasses) checks
every such annotation with pydantic when the call is made or the config is built: before any model loads.
Cross-field rules (gen_length a multiple of block_length) live in the dataclass's `check()`. A bad value raises
ValueError naming the parameter, the value and what is allowed:

    n_prompts=-1 is not allowed: n_prompts must be an integer >= 1

Where a bound is known only at run time (a recipe's step count, a registry's names), the same messages come from
the checks at the end of this module: check_int, check_eps, check_choice (with a "did you mean"), bad_value.

Numbers come in every form users pass — Python or numpy scalars — and bools never count as numbers; consent
flags are real bools only (the strings "no" and "false" are refused, not read as yes). pydantic: one import
(about 0.13 s, beside torch's second) and about 1 µs per checked value; unannotated parameters cost nothing.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import numbers
import os
import reprlib
import typing
from typing import Annotated, Any, Callable, Iterable, TypeVar

from annotated_types import Ge, Gt, Le
from pydantic import AfterValidator, BeforeValidator, ConfigDict, TypeAdapter, ValidationError

T = TypeVar("T")


class Allowed(str):
    """Why a value was refused, as the end of "x must be ..." (raised inside a validator)."""


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(Allowed("an integer"))
    return int(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(Allowed("a finite number"))
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(Allowed("a finite number"))
    return number


def _consent(value: Any) -> bool:
    if type(value) is not bool:  # noqa: E721 — a real bool only: "no", 0 or numpy's bool_ are not consent
        raise ValueError(Allowed("True or False (a bool; consent is never read from text or numbers)"))
    return value


def _flag(value: Any) -> bool:
    if type(value) is not bool:  # noqa: E721 — "no" is truthy, 0 and numpy's bool_ are not switches either
        raise ValueError(Allowed("True or False (a bool)"))
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(Allowed("a non-empty str"))
    return value


def _device(value: Any) -> str:
    """A device this machine has: "cpu", "cuda" / "cuda:N" with N below torch's device count, or "mps"."""
    import torch  # noqa: PLC0415  (validation stays light until a device is checked)

    allowed = f"'cpu' or a device this machine has (CUDA devices: {torch.cuda.device_count()})"
    try:
        device = torch.device(value) if isinstance(value, str) else None
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(Allowed(allowed))
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(Allowed(allowed))
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(Allowed(allowed))
    return value


def _where(value: Any) -> Any:
    """A device as load and the configs take it: a str (as _device) or a torch.device this machine has."""
    import torch  # noqa: PLC0415

    if isinstance(value, torch.device):
        _device(str(value))
        return value
    return _device(value)


def _path(value: Any) -> Any:
    """A local path: a non-empty str or os.PathLike (kept as given)."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip():
        raise ValueError(Allowed("a non-empty path to a local file (a str or os.PathLike)"))
    return value


def _model_source(value: Any) -> Any:
    """What sinklib.load takes: a zoo name, a named model, a local folder or a hub id (a non-empty str or
    os.PathLike), or a torch module."""
    from torch import nn  # noqa: PLC0415

    if isinstance(value, nn.Module):
        return value
    try:
        return _path(value)
    except ValueError:
        raise ValueError(Allowed("a zoo name, a named model, a local folder or a hub id (a non-empty str or "
                                 "os.PathLike), or an nn.Module")) from None


def _folder(value: Any) -> str:
    """An output folder: a non-empty path that is not an existing file and lies under no file (relative paths are
    read from notebooks/, where the notebooks run)."""
    from sinklib.paths import NOTEBOOKS  # noqa: PLC0415  (paths is light, but validation imports nothing of sinklib's)

    text = _text(value)
    path = NOTEBOOKS / text
    for place in (path, *path.parents):
        if place.exists() and not place.is_dir():
            raise ValueError(Allowed(f"a folder (this is a file: {place.resolve()})"))
    return text


def _distinct(what: str) -> Callable[[list], list]:
    """An after-validator: a non-empty list without repeats, else "`what`"."""
    def check(values: list) -> list:
        if not values or len(set(values)) != len(values):
            raise ValueError(Allowed(what))
        return values
    return check


Integer = Annotated[int, BeforeValidator(_integer)]
Count = Annotated[Integer, Ge(1)]  # an integer >= 1
Index = Annotated[Integer, Ge(0)]  # an integer >= 0
Number = Annotated[float, BeforeValidator(_number)]  # finite
NonNegative = Annotated[Number, Ge(0.0)]
Positive = Annotated[Number, Gt(0.0)]
# A sampling temperature: above 100 every token is about equally likely for any logits, and upstream LLaDA's float64
# Gumbel form exp(l) / (−log u)^T overflows (near T = 200), giving empty generations rather than samples.
Temperature = Annotated[Number, Ge(0.0), Le(100.0)]
# Classifier-free guidance: un + (s + 1)(cond − un) in the logits' dtype; the papers use 0–3, and past about 1e4 the
# product of float32 logits overflows into inf and NaN (empty generations).
GuidanceScale = Annotated[Number, Ge(0.0), Le(1e4)]
# A confidence threshold for parallel decoding (Fast-dLLM's `threshold`): a probability in (0, 1]
Threshold = Annotated[Number, Gt(0.0), Le(1.0)]
# A drift in a share of attention (a fraction of each query's attention): a number in [0, 1]
Share = Annotated[Number, Ge(0.0), Le(1.0)]
Consent = Annotated[bool, BeforeValidator(_consent)]
Flag = Annotated[bool, BeforeValidator(_flag)]  # an on/off setting: a real bool, never text or a number
Text = Annotated[str, BeforeValidator(_text)]
Device = Annotated[str, BeforeValidator(_device)]  # "cpu", "cuda:0", … : one this machine has
AnyDevice = Annotated[Any, BeforeValidator(_where)]  # a Device, or a torch.device this machine has
FilePath = Annotated[Any, BeforeValidator(_path)]  # a local file: a non-empty str or os.PathLike, kept as given
ModelSource = Annotated[Any, BeforeValidator(_model_source)]  # what sinklib.load loads or wraps
Folder = Annotated[str, BeforeValidator(_folder)]  # an output folder, never an existing file
DType = typing.Literal["float32", "float16", "bfloat16", "auto"]  # as sinklib.load reads dtype
# a run's models: each named once (a name twice would load and evaluate it twice, then break every per-model view)
ModelNames = Annotated[list[Text], AfterValidator(_distinct("a non-empty list of distinct model names"))]
# Table 1's ks: each k is one column of the table
Ks = Annotated[list[Index], AfterValidator(_distinct("a non-empty list of distinct integers >= 0 (each k is one column "
                                                     "of the table)"))]

_CONFIG = ConfigDict(arbitrary_types_allowed=True)
_KINDS = {"list_type": "a list", "tuple_type": "a tuple", "string_type": "a str", "dict_type": "a mapping",
          "bool_type": "a bool", "int_type": "an integer", "float_type": "a number", "none_required": "None"}


def _allowed(detail: dict) -> str:
    kind, context = detail["type"], detail.get("ctx") or {}
    if kind == "value_error" and isinstance(context.get("error"), ValueError):
        reason = context["error"].args[0] if context["error"].args else ""
        if isinstance(reason, Allowed):
            return str(reason)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(context.values()))
        if isinstance(bound, float):  # the Number types: finite, bounds written as plain numbers
            return f"a finite number {sign} {int(bound) if bound.is_integer() else bound}"
        return f"an integer {sign} {bound}"
    if kind == "literal_error":
        return f"one of {context.get('expected')}"
    return _KINDS.get(kind, detail["msg"][0].lower() + detail["msg"][1:])


def _constrained(hint: Any) -> bool:
    """Whether an annotation carries a declared rule (Annotated metadata anywhere inside it)."""
    if typing.get_origin(hint) in (Annotated, typing.Literal):
        return True
    return any(_constrained(arg) for arg in typing.get_args(hint))


@functools.lru_cache(maxsize=None)
def _adapter(hint: Any) -> TypeAdapter:
    return TypeAdapter(hint, config=_CONFIG)


def check_value(value: Any, hint: Any, name: str) -> Any:
    """`value` checked against the annotation `hint` (and normalised: numpy scalars become Python numbers)."""
    try:
        return _adapter(hint).validate_python(value)
    except ValidationError as error:
        raise _named(error, name) from None


_SHOWN = reprlib.Repr()  # its limits set one by one (the keyword form is Python 3.12's)
for _limit, _value in (("maxlevel", 3), ("maxtuple", 12), ("maxlist", 12), ("maxarray", 12), ("maxdict", 12),
                       ("maxset", 12), ("maxfrozenset", 12), ("maxdeque", 12), ("maxstring", 240), ("maxlong", 120),
                       ("maxother", 240)):
    setattr(_SHOWN, _limit, _value)
SHOWN_LENGTH = 400  # the most of a value a message shows


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut where it is long or deep (a YAML alias bomb of a few hundred bytes
    expands to a list whose full repr is megabytes; the message shows its start)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= SHOWN_LENGTH else f"{text[:SHOWN_LENGTH]}… (cut)"


def _named(error: ValidationError, name: str) -> ValueError:
    first = error.errors(include_url=False)[0]
    return BadValue(f"{name}={shown(first.get('input'))} is not allowed: {name} must be {_allowed(first)}")


def checked(function: Callable[..., T]) -> Callable[..., T]:
    """Check, at every call, each parameter whose annotation declares a rule (see the module docstring)."""
    signature = inspect.signature(function)

    @functools.cache
    def declared_rules() -> dict[str, Any]:
        # resolved at the first call, not at import: an annotation may name a class whose module is slow to import
        # (a function returning a transformers model class: 2 s), which a process that never calls the function skips
        hints = typing.get_type_hints(function, include_extras=True)
        return {name: hints[name] for name in signature.parameters if name in hints and _constrained(hints[name])}

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        rules = declared_rules()
        for name, value in bound.arguments.items():
            if name in rules:
                bound.arguments[name] = check_value(value, rules[name], name)
        return function(*bound.args, **bound.kwargs)

    wrapper.__signature__ = signature
    wrapper.declared_rules = declared_rules  # a test resolves every checked signature (a bad annotation fails there)
    return wrapper


def validated(cls: type[T]) -> type[T]:
    """For a dataclass: check each field whose annotation declares a rule when an instance is made, then the
    class's own cross-field `check()` if it has one — so a bad config fails where it is written. (The check runs
    after the dataclass's __init__, its __post_init__ included; a subclass is decorated on its own.)"""
    hints = typing.get_type_hints(cls, include_extras=True)
    rules = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name in hints and _constrained(hints[f.name])}
    made = cls.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        if type(self) is not cls:  # a subclass's own decorated __init__ checks its fields
            return
        for name, hint in rules.items():
            object.__setattr__(self, name, check_value(getattr(self, name), hint, name))
        if callable(getattr(self, "check", None)):
            self.check()

    cls.__init__ = __init__
    cls.__validated__ = cls  # is_validated: this class itself, not only a parent, checks on construction
    return cls


def is_validated(cls: type) -> bool:
    """Whether instances of the dataclass `cls` are checked when made (it is decorated with `validated` itself)."""
    return cls.__dict__.get("__validated__") is cls


# --- checks where the bound is known only at run time -------------------------------------------------------------
class BadValue(ValueError):
    """The one error sinklib raises for a value it does not allow (a ValueError: `except ValueError` keeps working).
    Its message names the parameter, the value and what is allowed: "{param}={value!r} is not allowed: …". A value of
    the wrong type altogether is a TypeError. (The HumanEval sandbox, a standard-library package its processes load by
    path, raises plain ValueErrors with the same message.)"""


def bad_value(param: str, value: Any, allowed: str) -> BadValue:
    """The BadValue every check raises (returned, not raised): "{param}={value!r} is not allowed: {param} must
    be {allowed}"."""
    return BadValue(f"{param}={shown(value)} is not allowed: {param} must be {allowed}")


def check_eps(eps: Any, param: str = "eps") -> float:
    """A finite number >= 0 (Python or numpy; never a bool) as a float."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or math.isnan(eps) or eps < 0 or math.isinf(eps):
        raise bad_value(param, eps, "a finite number >= 0")
    return float(eps)


def check_int(value: Any, param: str, low: int, high: int | None = None) -> int:
    """An integer in [low, high] (Python or numpy; never a bool) as an int."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low and \
        (high is None or value <= high)
    if not ok:
        upper = f" and <= {high}" if high is not None else ""
        raise bad_value(param, value, f"an integer >= {low}{upper}")
    return int(value)


def did_you_mean(value: Any, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, or '' when none is close: the one hint every
    "not allowed" message uses."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_choice(value: Any, param: str, choices: Iterable[str]) -> str:
    """`value` when it is one of `choices`; otherwise a ValueError listing them, with a "did you mean"."""
    choices = list(choices)
    if value not in choices:
        raise BadValue(f"{param}={shown(value)} is not allowed: {param} must be one of {choices}"
                       f"{did_you_mean(value, choices)}")
    return value
