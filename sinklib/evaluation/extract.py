"""Answer extraction, as lm-evaluation-harness's GSM8K task does it: a strict "#### N" match and a flexible
"last number in the text" match; for short factual answers, the answer's words in the first sentence (strict) or
anywhere (flexible)."""
from __future__ import annotations

import decimal
import re

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def normalise_number(text: str) -> str | None:
    """'1,234.' → '1234'; '$5' → '5'; '3.50' → '3.5'; '12.0' → '12'; non-numbers (NaN and infinities included) →
    None. Exact in decimal: a 20-digit answer stays its 20 digits (a float would round it)."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = decimal.Decimal(cleaned)
    except decimal.InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def strict_answer(text: str) -> str | None:
    """The normalised number after the first "#### " in `text`, or None when there is no such match."""
    match = STRICT.search(text)
    return normalise_number(match.group(1)) if match else None


def flexible_answer(text: str) -> str | None:
    """The last number in `text` that normalises (see normalise_number), or None when there is none."""
    for groups in reversed(FLEXIBLE.findall(text)):
        value = normalise_number(groups[0] or groups[1])
        if value is not None:
            return value
    return None


def cut_at_stops(text: str, stops) -> str:
    """text up to the first occurrence of any (non-empty) stop string."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:cut]


def first_sentence(text: str) -> str:
    """The text up to its first sentence end (". ", "!", "?", a full stop at the end) or line break."""
    match = re.search(r"[.!?](\s|$)|\n", text.strip())
    return text.strip()[: match.start() + 1] if match else text.strip()


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether `phrase` occurs in `text` as whole words, ignoring case."""
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, flags=re.IGNORECASE) is not None
