"""What the notebooks show: numbers rounded so that another CPU's float noise cannot change them, rows of a run
with a near-tie marked, and nbval's sanitizer masking exactly those rows."""
import math
from pathlib import Path
import re
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from sinklib.ties import NEAR_TIE
from sinklib import stats
from sinklib.lab import notebook_outputs
from sinklib.evaluation.table1 import MaskingTable, accuracy_rows
from sinklib.summary import FOOTNOTE, Summary, caption, near_tie_models, significant

SANITIZE = Path(__file__).resolve().parents[1] / "notebooks" / "nbval_sanitize.cfg"


@pytest.mark.parametrize("value, shown", [(37.3249, "37.3"), (8.6381, "8.64"), (104.2, "104"), (2453.7, "2454"),
                                          (0.29249, "0.292"), (3.9e-19, "0.000"), (-0.0004, "-0.000"), (1.0, "1"),
                                          (7, "7"), (float("nan"), "nan"), ("has", "has")])
def test_numbers_are_shown_to_three_significant_digits_and_three_decimals_below_one(value, shown):
    assert significant(value) == shown


def _trace(model, margins):
    return SimpleNamespace(meta={"model": model}, margins=None if margins is None else torch.tensor(margins, dtype=torch.float64),
                           text="5 + 7 = 12")


def test_a_model_is_marked_when_any_decision_was_within_near_tie():
    traces = {"a": [_trace("a", [0.5, 0.2]), _trace("a", [0.3, NEAR_TIE])], "b": [_trace("b", [0.5, 2 * NEAR_TIE])],
              "c": [_trace("c", [float("nan")])], "d": [_trace("d", None)]}
    assert near_tie_models(traces) == {"a"}
    assert caption(traces["a"][1]) == "a ≈: 5 + 7 = 12" and caption(traces["b"][0]) == "b: 5 + 7 = 12"


def _sanitized(text: str) -> str:
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns(SANITIZE.read_text()):
        text = __import__("re").sub(regex, replace, text)
    return text


def _summary(llada_max, arm_max):
    table = pd.DataFrame({"max": [llada_max, arm_max], "count": [10, 12]}, index=["tiny-llada", "tiny-arm"])
    return Summary.by_model(table, {"tiny-llada"}, [f"tiny-llada ≈: the largest is {significant(llada_max)}.",
                                                    f"tiny-arm: the largest is {significant(arm_max)}.",
                                                    "Paper: a few scores are very large."])


def test_nbval_masks_the_numbers_of_a_marked_row_and_compares_every_other_line():
    shown = _summary(24.03, 46.62).text()
    assert "tiny-llada ≈" in shown and FOOTNOTE in shown and "tiny-arm ≈" not in shown
    assert "24" in shown and "46.6" in shown
    # a near-tie on another CPU changed tiny-llada's numbers: nbval sees the same text
    assert _sanitized(_summary(19.5, 46.62).text()) == _sanitized(shown)
    # the same change on the row decided by clear margins is caught
    assert _sanitized(_summary(24.03, 45.1).text()) != _sanitized(shown)
    # the mark itself is compared: a run whose near-tie vanished is a different output
    plain = Summary.by_model(pd.DataFrame({"max": [24.03]}, index=["tiny-llada"]), set()).text()
    assert FOOTNOTE not in plain and _sanitized(plain) == plain


def test_table1_marks_a_model_whose_samples_had_a_near_tie():
    rows = []
    for model, k, right in (("m", 0, 90), ("m", 1, 10), ("n", 0, 80), ("n", 1, 80)):
        rows += [{"model": model, "condition": "sinks", "k": k, "id": str(i), "correct": i < right, "output": "1",
                  "margin": NEAR_TIE / 2 if (model, k, i) == ("m", 1, 0) else 0.2} for i in range(100)]
    items = pd.DataFrame(rows)
    summary = MaskingTable(accuracy_rows(items), "arithmetic", items).summary()
    assert list(summary.table.index) == ["m ≈", "n"]
    low, high = stats.wilson_interval(80, 100)
    assert (f"n (n = 100): 0.80 [{low:.2f}, {high:.2f}] unmasked, 0.80 [{low:.2f}, {high:.2f}] with its top-1 sink "
            "masked (+0.00 [") in summary.findings[1]
    assert summary.findings[1].endswith("McNemar p = 1).")
    assert re.match(r"m ≈ \(n = 100\): 0\.90 \[0\.\d\d, 0\.\d\d\] unmasked, 0\.10 \[0\.\d\d, 0\.\d\d\] with its top-1 "
                    r"sink masked \(-0\.80 \[-0\.\d\d, -0\.\d\d\], McNemar p = .*\); answers whose generation passed a "
                    r"near-tie: 1 of 200", summary.findings[0])


def _widget(text):
    return {"output_type": "display_data",
            "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": text}}


def test_progress_bars_are_told_from_other_outputs():
    assert notebook_outputs.is_progress_bar(_widget("traces tiny-llada:   0%|          | 0/6 [00:00<?, ?it/s]"))
    assert notebook_outputs.is_progress_bar({"output_type": "stream", "name": "stderr",
                                             "text": "Loading weights: 100%|██████████| 38/38 [00:00<00:00, 4214.15it/s]\n"})
    assert not notebook_outputs.is_progress_bar(_widget("Explorer(tiny-llada: 16 steps, 4 layers x 4 heads, eps=3.0)"))
    assert not notebook_outputs.is_progress_bar({"output_type": "stream", "name": "stdout", "text": "50%| of 2 [done]\n"})
    assert not notebook_outputs.is_progress_bar({"output_type": "execute_result", "data": {"text/plain": "0%|  | 0/6 ["}})
    assert math.isnan(float(significant(float("nan"))))
