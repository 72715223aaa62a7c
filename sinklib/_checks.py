"""Argument checks that fail early with the parameter, the value and what is allowed."""
from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable


def bad_value(param: str, value: Any, allowed: str) -> ValueError:
    """The ValueError every check raises (returned, not raised): "{param}={value!r} is not allowed: {param} must
    be {allowed}"."""
    return ValueError(f"{param}={value!r} is not allowed: {param} must be {allowed}")


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
        raise ValueError(f"{param}={value!r} is not allowed: {param} must be one of {choices}{did_you_mean(value, choices)}")
    return value
