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


def test_the_random_control_over_its_draws_says_whether_sinks_against_random_holds_at_every_draw():
    """Issue 69: one draw of the random keys decided 'sinks cost more than random keys'; over three draws the
    comparison holds only where every draw's paired interval lies below 0. By hand: sinks keep 4 of 40; one model's
    random draws keep 39, 38 and 37 (every draw: sinks cost more), another's 39, 38 and 6 (its third draw costs as
    much as the sinks: not decided at every draw). One draw alone says its spread is not measured."""
    def table(right):
        items = pd.DataFrame(_items("a", right["a"]) + _items("b", right["b"]), columns=ITEM_COLUMNS)
        return MaskingTable(accuracy_rows(items), "arithmetic", items)

    first = table({m: {("sinks", 0): 40, ("sinks", 1): 4, ("random keys", 1): 39} for m in "ab"})
    draws = [table({"a": {("random keys", 1): a}, "b": {("random keys", 1): b}}) for a, b in ((38, 38), (37, 6))]
    shown = nb04.control_spread({"arithmetic": first}, {"arithmetic": draws})
    a, b = shown.table.loc["a"], shown.table.loc["b"]
    assert (a["draws"], a["random_min"], a["random_max"]) == (3, 37 / 40, 39 / 40)
    assert a["random_mean"] == pytest.approx((39 + 38 + 37) / 120) and a["holds"] == "sinks cost more"
    assert b["holds"] == "undecided" and b["random_min"] == 6 / 40
    assert "not decided at every draw" in shown.findings[1] and "sinks cost more at every draw" in shown.findings[0]
    alone = nb04.control_spread({"arithmetic": first}, {})
    assert "at its one draw (n = 40; the spread over draws is not measured)" in alone.findings[0]


def test_a_further_draw_of_the_random_control_is_its_policy_at_the_tables_seed_plus_the_draw():
    """drawn(d): the random keys at seed + d (the sampler's seed unchanged); the sinks draw nothing, the same at every
    draw; a drawn condition is a registered one (checked_conditions takes it), a negative draw is refused."""
    import sinklib
    from sinklib.evaluation.conditions import CONDITIONS, checked_conditions
    from sinklib.families.base import get_family

    random, sinks, family = CONDITIONS.get("random keys"), CONDITIONS.get("sinks"), get_family("llada")
    assert random.drawn(2).intervention(family, 5, seed=3) == sinklib.MaskRandomKeys(k=5, seed=5)
    assert random.intervention(family, 5, seed=3) == sinklib.MaskRandomKeys(k=5, seed=3)
    assert sinks.drawn(2).intervention(family, 1, seed=3) == sinks.intervention(family, 1, seed=3)
    assert checked_conditions([random.drawn(1)]) == [random.drawn(1)]
    with pytest.raises(ValueError, match=r"draw=-1 is not allowed: draw must be an integer >= 0"):
        random.drawn(-1)
