"""Notebook 04's "what this run shows", written from the run's own tables (nb04.sink_reliance): each verdict
against the rule worked by hand on made-up answers, whichever way a model comes out."""
import pandas as pd
import pytest

pytest.importorskip("matplotlib")  # sinklib.lab draws the notebooks' figures (the notebooks' extra)

from sinklib.lab import nb04_masking_ablation as nb04  # noqa: E402
from sinklib.evaluation.table1 import ITEM_COLUMNS, MaskingTable, accuracy_rows  # noqa: E402


def _items(model: str, right: dict[tuple[str, int], int], n: int = 40) -> list[dict]:
    """`right[(condition, k)]` of the n problems answered right, always the first ones (so a masked column's right
    answers are a subset of the unmasked ones: lost = the difference, gained = 0)."""
    return [{"model": model, "condition": condition, "k": k, "id": str(i), "correct": i < count, "output": "",
             "margin": 1.0} for (condition, k), count in right.items() for i in range(n)]


def test_each_verdict_follows_the_paired_intervals_and_the_papers_kind():
    items = pd.DataFrame(
        _items("tiny-llada", {("sinks", 0): 36, ("sinks", 1): 35, ("random keys", 1): 36})      # holds 0
        + _items("tiny-arm", {("sinks", 0): 40, ("sinks", 1): 4, ("random keys", 1): 39})       # 40 → 4: collapses
        + _items("tiny-dream", {("sinks", 0): 40, ("sinks", 1): 28, ("random keys", 1): 28}),   # loses, as random keys
        columns=ITEM_COLUMNS)
    shown = nb04.sink_reliance({"arithmetic": MaskingTable(accuracy_rows(items), "arithmetic", items)})
    verdicts = dict(zip(["tiny-llada", "tiny-arm", "tiny-dream"], shown.findings))
    # 1 lost of 40: the paired interval holds 0 — the paper's diffusion models' answer
    assert "it barely notices (0.90 → 0.88" in verdicts["tiny-llada"]
    assert "as the paper's diffusion models" in verdicts["tiny-llada"]
    # 36 lost: 4 of 40 left is a tenth of its unmasked accuracy — the paper's Llama's answer
    assert "it collapses (1.00 → 0.10" in verdicts["tiny-arm"] and "as the paper's Llama-3.1-8B" in verdicts["tiny-arm"]
    assert "more than one random key costs it" in verdicts["tiny-arm"]
    # 12 lost: a loss whose interval excludes 0, not a collapse; one random key costs it the same
    assert "it loses 0.30 (1.00 → 0.70" in verdicts["tiny-dream"]
    assert "no more than one random key costs it (sinks − random +0.00" in verdicts["tiny-dream"]
    assert "unlike the paper's diffusion models" in verdicts["tiny-dream"]
    assert shown.table.loc["tiny-arm", "kind"] == "autoregressive"
    assert shown.table.loc["tiny-arm", "delta"] == pytest.approx(-0.9)
