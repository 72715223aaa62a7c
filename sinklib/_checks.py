"""Argument checks that fail early with the parameter, the value and what is allowed."""
from __future__ import annotations

import difflib
import math
from typing import Any, Iterable


def bad_value(param: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{param}={value!r} is not allowed: {param} must be {allowed}")


def check_eps(eps: Any, param: str = "eps") -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or math.isnan(eps) or eps < 0 or math.isinf(eps):
        raise bad_value(param, eps, "a finite number >= 0")
    return float(eps)


def check_int(value: Any, param: str, low: int, high: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        upper = f" and <= {high}" if high is not None else ""
        raise bad_value(param, value, f"an integer >= {low}{upper}")
    return value


def check_choice(value: Any, param: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    if value not in choices:
        hint = difflib.get_close_matches(str(value), choices, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(f"{param}={value!r} is not allowed: {param} must be one of {choices}{extra}")
    return value
