"""Comparing a rerun with the committed results: what is identical, what is within float tolerance, what a
near-tie explains, and what differs — each on hand-built results files whose answer is known."""
import base64
import json

import numpy as np
import pandas as pd
import pytest

from sinklib.lab import agreement, agreement_answers, agreement_rows
from sinklib.lab.agreement_rows import DIFFERS, FLOAT_TOLERANCE, IDENTICAL, NEAR, WITHIN
from sinklib.provenance import write_parquet
from sinklib.summary import EVALUATION, EVALUATION_ITEMS, Layout
from sinklib.ties import NEAR_TIE


def _generations(canvases: dict[tuple[str, int], list[list[int]]], margins: dict[tuple[str, int], list[float]]):
    rows = [{"model": m, "trace": t, "step": s, "margin": margins[(m, t)][s], "canvas": c}
            for (m, t), steps in canvases.items() for s, c in enumerate(steps)]
    return pd.DataFrame(rows)


# the layouts the producers declare (sinklib.lab, evaluation.table1): each table carries its own
LAYOUTS = {"moving_sink_events": Layout(("model", "trace", "step", "layer", "head"), "trace"),
           "sink_dynamics": Layout(("model", "trace"), "trace"), "fig05_layer_head": Layout(("model", "layer", "head")),
           "generations": Layout(("model", "trace", "step"), "trace"), "table1_masking_arithmetic": EVALUATION,
           "table1_masking_arithmetic_items": EVALUATION_ITEMS, "table1_dose_arithmetic": EVALUATION,
           "table1_dose_arithmetic_items": EVALUATION_ITEMS,
           "transient_sinks": Layout(("model", "trace", "step", "layer", "head", "position"), "trace",
                                     threshold="threshold_gap", outcome="transient")}


def _write(folder, name, frame, layout=True):
    folder.mkdir(exist_ok=True)
    write_parquet(frame, folder / f"{name}.parquet", {}, LAYOUTS[name] if layout else None)


def _events(score_shift=0.0, position=4, models=("a", "b")):
    return pd.DataFrame({"model": list(models), "trace": [0, 0], "step": [3, 3], "layer": [1, 1], "head": [0, 0],
                         "position": [position, 4], "score": [5.0 + score_shift, 6.0]})


def test_the_first_differing_step_and_its_margins_are_found():
    canvas = [[1, 9, 9], [1, 2, 9], [1, 2, 3]]
    committed = _generations({("a", 0): canvas, ("a", 1): canvas}, {("a", 0): [0.5, 0.0, 0.2], ("a", 1): [0.5] * 3})
    rerun = _generations({("a", 0): canvas[:1] + [[1, 9, 4], [1, 5, 4]], ("a", 1): canvas},
                         {("a", 0): [0.5, 2e-4, 0.3], ("a", 1): [0.5] * 3})
    found = agreement.divergences(committed, rerun)
    assert [(d.model, d.trace, d.step) for d in found] == [("a", 0, 1)]
    assert (found[0].margin_committed, found[0].margin_rerun) == (0.0, 2e-4) and found[0].near_tie


@pytest.mark.parametrize("margins, near_tie", [((0.0, 2e-4), True), ((NEAR_TIE, 1e-9), True), ((0.0, 0.3), False),
                                               ((float("nan"), 0.0), False), ((0.2, 0.2), False), ((0.0, 0.0), False)])
def test_a_near_tie_needs_both_runs_to_have_decided_within_the_bound(margins, near_tie):
    """(0, 0): an exact tie in both runs, which a fixed order breaks the same way on every CPU, explains nothing."""
    assert agreement.Divergence("a", 0, 2, *margins).near_tie is near_tie


def test_identical_and_within_tolerance(tmp_path):
    _write(tmp_path / "c", "moving_sink_events", _events())
    _write(tmp_path / "r", "moving_sink_events", _events(score_shift=FLOAT_TOLERANCE))
    row = agreement.compare_file(tmp_path / "c" / "moving_sink_events.parquet", tmp_path / "c" / "moving_sink_events.parquet")
    assert row.status == IDENTICAL
    row = agreement.compare_file(tmp_path / "c" / "moving_sink_events.parquet", tmp_path / "r" / "moving_sink_events.parquet")
    assert row.status == WITHIN and 0 < row.largest_difference <= FLOAT_TOLERANCE


@pytest.mark.parametrize("rerun, detail", [
    (_events(score_shift=0.01), "score differs by 0.0017 of 1 + |value|"),
    (_events(position=5), "position differs in 1 rows"),
    (_events().iloc[:1], "1 rows on one side only"),
])
def test_what_differs_is_named(tmp_path, rerun, detail):
    _write(tmp_path / "c", "moving_sink_events", _events())
    _write(tmp_path / "r", "moving_sink_events", rerun)
    row = agreement.compare_file(tmp_path / "c" / "moving_sink_events.parquet", tmp_path / "r" / "moving_sink_events.parquet")
    assert row.status == DIFFERS and detail in row.detail


def test_a_table_is_compared_by_the_layout_it_carries_and_without_one_must_be_identical(tmp_path):
    """The layout travels in the parquet file (written with it by run.save): the rerun's is used, else the committed
    file's; a table that carries none agrees only when identical."""
    _write(tmp_path / "c", "moving_sink_events", _events(), layout=False)
    _write(tmp_path / "r", "moving_sink_events", _events(score_shift=FLOAT_TOLERANCE))
    pair = (tmp_path / "c" / "moving_sink_events.parquet", tmp_path / "r" / "moving_sink_events.parquet")
    assert agreement.compare_file(*pair).status == WITHIN
    _write(tmp_path / "r", "moving_sink_events", _events(score_shift=FLOAT_TOLERANCE), layout=False)
    row = agreement.compare_file(*pair)
    assert (row.status, row.detail) == (DIFFERS, "no layout for this file: only an identical frame agrees")


def _folders(tmp_path, rerun_margin: float):
    """Model a's first generation parts at step 1 in the rerun; its events moved; model b's agree."""
    canvas = [[1, 9], [1, 2]]
    margins = {("a", 0): [0.4, 0.0], ("b", 0): [0.4, 0.4]}
    _write(tmp_path / "c", "generations", _generations({("a", 0): canvas, ("b", 0): canvas}, margins))
    _write(tmp_path / "r", "generations", _generations({("a", 0): [canvas[0], [1, 3]], ("b", 0): canvas},
                                                       {**margins, ("a", 0): [0.4, rerun_margin]}))
    _write(tmp_path / "c", "moving_sink_events", _events())
    _write(tmp_path / "r", "moving_sink_events", _events(score_shift=0.3, position=7))
    return agreement.compare_folders(tmp_path / "c", tmp_path / "r")


def test_rows_after_a_near_tie_are_set_aside_and_named(tmp_path):
    report = _folders(tmp_path, rerun_margin=1e-6)
    rows = {row.artifact: row for row in report.rows}
    assert rows["generations"].status == NEAR and "a #0 parts at step 1" in rows["generations"].detail
    assert rows["moving_sink_events"].status == NEAR and "1 rows after a near-tie" in rows["moving_sink_events"].detail
    assert report.agrees and "near-tie" in report.to_text()


@pytest.mark.parametrize("from_step, agrees", [(0, False), (8, True)])
def test_a_near_tie_sets_aside_only_its_generations_rows_from_its_parting_step_on(tmp_path, from_step, agrees):
    """The committed results with one canvas token of tiny-llada's first generation changed at step 8, a near-tie in
    both runs (margin 0.001), and fig01's tiny-llada scores (that generation's) tripled from `from_step` on: the
    parting explains the rows from step 8 on, and says how many it set aside, never the rows of the steps before,
    which were computed on canvases both runs agree on."""
    import shutil

    from sinklib.paths import DATA_DIR

    for side in ("c", "r"):
        (tmp_path / side).mkdir()
        for stem in ("generations", "fig01_token_step"):
            shutil.copy2(DATA_DIR / "results" / f"{stem}.parquet", tmp_path / side / f"{stem}.parquet")
    generations = pd.read_parquet(tmp_path / "c" / "generations.parquet")
    [row] = generations.index[(generations["model"] == "tiny-llada") & (generations["trace"] == 0)
                              & (generations["step"] == 8)]
    assert 0 < generations.at[row, "margin"] <= NEAR_TIE
    generations.at[row, "canvas"] = [*generations.at[row, "canvas"][:-1], -1]
    _write(tmp_path / "c", "generations", generations)
    fig01 = pd.read_parquet(tmp_path / "c" / "fig01_token_step.parquet")
    doctored = (fig01["model"] == "tiny-llada") & (fig01["step"] >= from_step)
    fig01.loc[doctored, "score"] *= 3
    write_parquet(fig01, tmp_path / "c" / "fig01_token_step.parquet", {},
                  Layout(("model", "step", "layer", "head", "position"), "first"))
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    rows = {row.artifact: row for row in report.rows}
    assert rows["generations"].status == NEAR and "tiny-llada #0 parts at step 8" in rows["generations"].detail
    aside = int(((fig01["model"] == "tiny-llada") & (fig01["step"] >= 8)).sum())
    assert report.agrees is agrees, report.to_text()
    if agrees:
        assert f"{aside} rows after a near-tie set aside" in rows["fig01_token_step"].detail
    else:
        assert report.failing == ["fig01_token_step"] and "score differs" in rows["fig01_token_step"].detail


def test_a_divergence_that_is_no_near_tie_fails_the_check(tmp_path):
    report = _folders(tmp_path, rerun_margin=0.3)
    assert not report.agrees and report.failing == ["generations", "moving_sink_events"]


@pytest.mark.parametrize("scale, agrees", [(1 + 1e-4, True), (2.0, False), (1000.0, False)])
def test_margins_scaled_by_hand_differ_where_rounding_only_moves_them(tmp_path, scale, agrees):
    """A generations table whose margin column was multiplied (it decides which changes a near-tie excuses) differs;
    the same margins a rounding apart agree."""
    canvas = [[1, 9], [1, 2], [1, 3]]
    margins = {("a", 0): [0.4, 0.02, 0.3]}
    _write(tmp_path / "c", "generations", _generations({("a", 0): canvas}, margins))
    _write(tmp_path / "r", "generations", _generations({("a", 0): canvas}, {("a", 0): [m * scale for m in margins[("a", 0)]]}))
    row = agreement.compare_folders(tmp_path / "c", tmp_path / "r").rows[0]
    assert (row.status != DIFFERS) is agrees, row
    if not agrees:
        assert "the margins of steps whose canvases agree differ" in row.detail


@pytest.mark.parametrize("doctor, says", [
    (lambda f: f.drop(columns="margin"), "the columns differ"),
    (lambda f: f.assign(trace=f["trace"].astype(str)), "identifying columns (model, trace, step) are of other types"),
])
def test_a_generations_table_of_another_shape_differs_not_crashes(tmp_path, doctor, says):
    canvas = [[1, 9], [1, 2]]
    table = _generations({("a", 0): canvas}, {("a", 0): [0.4, 0.3]})
    _write(tmp_path / "c", "generations", table)
    _write(tmp_path / "r", "generations", doctor(table), layout=False)
    row = agreement.compare_folders(tmp_path / "c", tmp_path / "r").rows[0]
    assert row.status == DIFFERS and says in row.detail, row


@pytest.mark.parametrize("scale, agrees", [(1 + 1e-4, True), (1000.0, False)])
def test_table1_margins_scaled_by_hand_differ(tmp_path, scale, agrees):
    _table1(tmp_path, "c", True, 0.3)
    _table1(tmp_path, "r", True, 0.3)
    items = pd.read_parquet(tmp_path / "c" / "table1_masking_arithmetic_items.parquet")
    _write(tmp_path / "c", "table1_masking_arithmetic_items", items.assign(margin=items["margin"] * scale))
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.agrees is agrees, report.to_text()
    if not agrees:
        assert report.failing == ["table1_masking_arithmetic_items"]
        assert "closest margins of answers decided alike differ" in report.to_text()


def test_a_file_missing_on_either_side_differs(tmp_path):
    _write(tmp_path / "c", "sink_dynamics", pd.DataFrame({"model": ["a"], "trace": [0], "move_rate": [0.1]}))
    (tmp_path / "r").mkdir()
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.failing == ["sink_dynamics"] and report.rows[0].detail == "missing from the rerun"
    assert agreement.compare_folders(tmp_path / "c", tmp_path / "r", rerun_only=True).rows == []


def _page(path, canvas, scores, margins, around="<p>page</p>"):
    data = {"header": {"format": 1, "model": "m", "n_steps": len(canvas) - 1, "n_layers": 1, "n_heads": 1,
                       "seq": len(canvas[0]), "prompt_len": 1, "layer_names": ["l0"], "layer_ids": [0],
                       "model_layers": 1, "canvas": canvas, "margins": margins},
            "scores": base64.b64encode(np.asarray(scores, dtype="<f4").tobytes()).decode()}
    path.write_text(f'{around}<script type="application/json" id="sinklib-explorer-data">{json.dumps(data)}</script>')
    return path


@pytest.mark.parametrize("rerun, status", [
    (dict(canvas=[[1, 9], [1, 2]], scores=[1.0, 2.00001, 1.5, 0.5], margins=[0.2]), WITHIN),
    (dict(canvas=[[1, 9], [1, 3]], scores=[1.0, 2.0, 1.9, 0.1], margins=[2e-5]), NEAR),
    (dict(canvas=[[1, 9], [1, 3]], scores=[1.0, 2.0, 1.9, 0.1], margins=[1e-5], committed_margin=0.0), NEAR),
    (dict(canvas=[[1, 9], [1, 3]], scores=[1.0, 2.0, 1.9, 0.1], margins=[0.0], committed_margin=0.0), DIFFERS),
    (dict(canvas=[[1, 9], [1, 3]], scores=[1.0, 2.0, 1.9, 0.1], margins=[0.2]), DIFFERS),
    (dict(canvas=[[1, 9], [1, 2]], scores=[1.0, 2.1, 1.5, 0.5], margins=[0.2]), DIFFERS),
    (dict(canvas=[[1, 9], [1, 2]], scores=[1.0, 2.0, 1.5, 0.5], margins=[0.2], around="<p>new front end</p>"), DIFFERS),
])
def test_explorer_pages_compare_their_data_not_their_bytes(tmp_path, rerun, status):
    committed_margin = rerun.pop("committed_margin", 1e-5)
    committed = _page(tmp_path / "c.html", [[1, 9], [1, 2]], [1.0, 2.0, 1.5, 0.5], [committed_margin])
    assert agreement.compare_page(committed, _page(tmp_path / "r.html", **rerun)).status == status


def _table1(tmp_path, side: str, correct: bool, margin: float):
    """Table 1 with one run of two samples; sample "2"'s answer is `correct` with closest margin `margin`."""
    items = pd.DataFrame({"model": ["a", "a"], "condition": ["sinks", "sinks"], "k": [1, 1], "id": ["1", "2"],
                          "correct": [True, correct], "output": ["12", "7" if correct else "8"],
                          "margin": [0.4, margin]})
    table = pd.DataFrame({"model": ["a"], "condition": ["sinks"], "k": [1], "accuracy": [items["correct"].mean()],
                          "stderr": [0.1], "n": [2], "accuracy_flexible": [items["correct"].mean()]})
    _write(tmp_path / side, "table1_masking_arithmetic", table)
    _write(tmp_path / side, "table1_masking_arithmetic_items", items)


@pytest.mark.parametrize("margins, status", [((2e-4, 1e-5), NEAR), ((1e-5, 0.2), DIFFERS), ((np.nan, np.nan), DIFFERS),
                                             ((np.inf, np.inf), DIFFERS), ((0.0, 0.0), DIFFERS)])
def test_a_table1_answer_that_flipped_is_explained_only_by_a_near_tie(tmp_path, margins, status):
    """One of two answers changes output and correctness: excused (and the run's accuracy allowed to move by 1/2)
    only where that sample decided a near-tie in both runs; an exact tie (0), a sampled decision (NaN) or an
    unopposed one (inf) is no excuse."""
    _table1(tmp_path, "c", True, margins[0])
    _table1(tmp_path, "r", False, margins[1])
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert {row.artifact: row.status for row in report.rows} == {"table1_masking_arithmetic_items": status,
                                                                  "table1_masking_arithmetic": status}


def _audited(tmp_path, side: str, entries: int, score: float, audit_margin: float):
    """Table 1 with one run (the same answers on both sides) and its audit's columns."""
    _table1(tmp_path, side, True, 0.4)
    table = pd.read_parquet(tmp_path / side / "table1_masking_arithmetic.parquet").assign(
        noop_identical=True, masked_entries=entries, masked_score_before=score, masked_score_after=0.0,
        kept_share=0.0, audit_margin=audit_margin)
    _write(tmp_path / side, "table1_masking_arithmetic", table)


@pytest.mark.parametrize("rerun, margins, failing", [
    ((292, 1975.5), (3e-4, 5.7e-4), None),  # a near-tie in both audits: another path, 0.7 % more entries
    ((290, 1971.6 * (1 + 1e-6)), (0.2, 0.2), None),  # no near-tie: rounding only
    ((292, 1971.6), (0.2, 0.2), "masked_entries differs beyond rounding, its audit deciding no near-tie"),
    ((290, 1975.5), (0.2, 0.2), "masked_score_before differs beyond rounding"),
    ((290, 1971.6), (0.2, 0.3), "audit_margin differs beyond rounding"),
    ((290, 1971.6), (3e-4, 0.2), "audit_margin differs beyond rounding"),  # a near-tie in one audit only
    ((400, 1971.6), (3e-4, 5.7e-4), "masked_entries differs beyond 10% although its audit decided a near-tie"),
])
def test_a_runs_audit_may_take_another_path_only_after_a_near_tie_and_within_its_measured_shift(tmp_path, rerun,
                                                                                                  margins, failing):
    """A Table 1 row's audit columns (one audited generation): equal up to rounding unless that generation decided a
    near-tie in both runs, then within AUDIT_SHIFT (measured 1.3 %: tiny-llada's value ablation, 240 / 243 entries)."""
    _audited(tmp_path, "c", 290, 1971.6, margins[0])
    _audited(tmp_path, "r", *rerun, margins[1])
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    if failing is None:
        assert report.agrees, report.to_text()
    else:
        assert report.failing == ["table1_masking_arithmetic"] and failing in report.to_text(), report.to_text()


def _transient_rows(gaps, outcomes):
    return pd.DataFrame({"model": ["a", "a"], "trace": [1, 1], "step": [10, 12], "layer": [21, 3], "head": [0, 1],
                         "position": [60, 7], "token": ["away", "x"], "score": [6.99, 5.0], "threshold_gap": gaps,
                         "transient": outcomes})


@pytest.mark.parametrize("gap, outcome, status", [(3e-7, False, NEAR), (9e-4, False, NEAR), (3e-7, True, DIFFERS),
                                                  (0.0, True, DIFFERS), (2e-3, False, DIFFERS),
                                                  (np.nan, False, DIFFERS)])
def test_a_row_one_side_only_is_rounding_only_where_it_is_an_undecided_non_event(tmp_path, gap, outcome, status):
    """The table of one-step sinks also holds the positions a test within dynamics.THRESHOLD_BAND could make one
    (transient False), so another CPU's rerun has every row the committed table has, but one whose test crossed the
    band's edge: a row only one side has is excused where it is such a non-event, never a one-step sink the other
    run lacks — not even with a threshold_gap of 0 (issue 69: a fabricated row with threshold_gap 0.0 agreed)."""
    rows = _transient_rows([gap, 0.3], [outcome, True])
    _write(tmp_path / "c", "transient_sinks", rows)
    _write(tmp_path / "r", "transient_sinks", rows.iloc[1:])
    row = agreement.compare_folders(tmp_path / "c", tmp_path / "r").rows[0]
    assert row.status == status, row
    assert ("1 rows on one side only, each not transient" if status == NEAR else "1 rows on one side only") in row.detail


@pytest.mark.parametrize("gaps, status", [((3e-7, 2e-6), NEAR), ((FLOAT_TOLERANCE, 0.0), NEAR),
                                          ((0.0, 0.05), DIFFERS), ((5e-4, 1e-6), DIFFERS)])
def test_an_outcome_flips_only_where_both_runs_tested_within_rounding(tmp_path, gaps, status):
    """A one-step sink in one run and an undecided position in the other: another CPU's rounding only where both
    runs' closest tests were within FLOAT_TOLERANCE of the threshold. A committed row turned into a one-step sink by
    hand, its gap set to 0, is held against the rerun's own gap (0.05: differs)."""
    committed, rerun = _transient_rows([gaps[0], 0.3], [True, True]), _transient_rows([gaps[1], 0.3], [False, True])
    _write(tmp_path / "c", "transient_sinks", committed)
    _write(tmp_path / "r", "transient_sinks", rerun)
    row = agreement.compare_folders(tmp_path / "c", tmp_path / "r").rows[0]
    assert row.status == status, row
    assert ("1 rows' transient decided otherwise" if status == NEAR else "transient differs in 1 rows") in row.detail


def test_a_rerun_that_compared_nothing_does_not_agree_and_says_so(tmp_path):
    from sinklib.lab import agreement

    (tmp_path / "committed").mkdir()
    (tmp_path / "rerun").mkdir()
    report = agreement.compare_folders(tmp_path / "committed", tmp_path / "rerun", rerun_only=True)
    assert not report.agrees and "no artifact was compared" in report.to_text()


def _pooled(scores):
    return pd.DataFrame({"model": ["a"] * 3 + ["b"], "layer": [0, 0, 1, 0], "head": [0, 1, 0, 0], "score": scores})


@pytest.mark.parametrize("rerun_scores, status", [
    ([2.0, 1.1, 0.5, 4.0], NEAR),           # model a moves by less than 2 · 1/6 · its largest score (2.0)
    ([6.0, 3.0, 1.5, 4.0], DIFFERS),        # a's scores tripled: one parted generation of six cannot do that
    ([2.0, 1.0, 0.5, 4.1], DIFFERS),        # b parted nowhere: its rows must agree within float tolerance
])
def test_a_pooled_table_moves_only_as_far_as_its_parted_generations_allow(tmp_path, rerun_scores, status):
    canvases = {("a", t): [[1, 2]] for t in range(6)} | {("b", 0): [[1, 2]]}
    committed = _generations(canvases, {key: [0.5] for key in canvases})
    rerun = _generations(canvases | {("a", 0): [[1, 3]]}, {key: [0.5] for key in canvases} | {("a", 0): [2e-5]})
    committed.loc[(committed["model"] == "a") & (committed["trace"] == 0), "margin"] = 1e-5
    _write(tmp_path / "c", "generations", committed)
    _write(tmp_path / "r", "generations", rerun)
    _write(tmp_path / "c", "fig05_layer_head", _pooled([2.0, 1.0, 0.5, 4.0]))
    _write(tmp_path / "r", "fig05_layer_head", _pooled(rerun_scores))
    rows = {row.artifact: row for row in agreement.compare_folders(tmp_path / "c", tmp_path / "r").rows}
    assert rows["generations"].status == NEAR
    assert rows["fig05_layer_head"].status == status, rows["fig05_layer_head"].detail


def test_a_deleted_row_of_a_parted_model_counts_as_zero_and_fails_when_large(tmp_path):
    canvases = {("a", t): [[1, 2]] for t in range(6)}
    margins = {key: [1e-5] for key in canvases}
    _write(tmp_path / "c", "generations", _generations(canvases, margins))
    _write(tmp_path / "r", "generations", _generations(canvases | {("a", 0): [[1, 3]]}, margins))
    _write(tmp_path / "c", "fig05_layer_head", _pooled([2.0, 1.0, 0.5, 4.0]).iloc[:3])
    _write(tmp_path / "r", "fig05_layer_head", _pooled([2.0, 1.0, 0.5, 4.0]).iloc[:2])
    row = agreement.compare_file(tmp_path / "c" / "fig05_layer_head.parquet", tmp_path / "r" / "fig05_layer_head.parquet",
                                 {("trace", "a", 0), ("generations", "a", 6)})
    assert row.status == NEAR  # the deleted 0.5 is within 2 · 1/6 · 2.0
    _write(tmp_path / "r", "fig05_layer_head", _pooled([2.0, 1.0, 0.5, 4.0]).iloc[1:3])
    row = agreement.compare_file(tmp_path / "c" / "fig05_layer_head.parquet", tmp_path / "r" / "fig05_layer_head.parquet",
                                 {("trace", "a", 0), ("generations", "a", 6)})
    assert row.status == DIFFERS and "score differs beyond its bound" in row.detail


def test_other_run_parameters_make_every_artifact_of_that_run_differ(tmp_path):
    frame = _events()
    for side, eps in (("c", 3.0), ("r", 2.0)):
        _write(tmp_path / side, "moving_sink_events", frame)
        (tmp_path / side / "PROVENANCE.json").write_text(json.dumps(
            {"artifacts": {"moving_sink_events.parquet": {"config": {"eps": eps, "models": ["a", "b"]}}}}))
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert not report.agrees and report.failing == ["moving_sink_events"]
    assert "run parameters differ: eps 3.0 → 2.0" in report.rows[0].detail


def _scaled(column, factor, model="tiny-llada"):
    return lambda f: f.assign(**{column: np.where(f["model"] == model, f[column] * factor, f[column])})


DOCTORED = {  # artifact → how an attacker changes it (the committed side); the rerun is the honest committed copy
    "table1_masking_arithmetic": lambda f: f.assign(accuracy=np.where(f["model"] == "tiny-llada", 0.0, f["accuracy"])),
    "fig05_layer_head": _scaled("score", 3.0),
    "fig10_threshold_sweep": _scaled("share", 0.1),
    "table2_sink_tokens": lambda f: f[f["model"] != "tiny-llada"],
    "step_stability": _scaled("move_rate", 2.0, "smollm2-135m-diffusion"),
    # every tiny-llada answer marked wrong, the outputs left alone (its generations are near-ties throughout)
    "table1_masking_arithmetic_items": lambda f: f.assign(correct=np.where(f["model"] == "tiny-llada", False, f["correct"])),
}
# a doctored items table also leaves its runs' accuracies no longer the share of their items answered correctly
ALSO_FAILING = {"table1_masking_arithmetic_items": ["table1_masking_arithmetic"]}


@pytest.mark.parametrize("artifact", sorted(DOCTORED))
def test_a_doctored_committed_result_fails_the_check_naming_it(tmp_path, artifact):
    """The committed results, one artifact doctored, against an honest rerun in which one tiny-llada generation
    parted at a near-tie (the attack's setting: that used to set every tiny-llada row of the pooled tables aside)."""
    import shutil

    from sinklib.paths import DATA_DIR

    for side in ("c", "r"):
        shutil.copytree(DATA_DIR / "results", tmp_path / side, ignore=shutil.ignore_patterns("table1-*", "PROVENANCE.json"))
    for side in ("c", "r"):  # the last step of tiny-llada's first generation decided by 1e-5, and so parted
        generations = pd.read_parquet(tmp_path / side / "generations.parquet")
        last = generations.index[(generations["model"] == "tiny-llada") & (generations["trace"] == 0)][-1]
        generations.at[last, "margin"] = 1e-5
        if side == "r":
            generations.at[last, "canvas"] = [*generations.at[last, "canvas"][:-1], -1]
        generations.to_parquet(tmp_path / side / "generations.parquet")
    honest = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert honest.agrees, honest.to_text()
    path = tmp_path / "c" / f"{artifact}.parquet"
    pd.read_parquet(path).pipe(DOCTORED[artifact]).to_parquet(path)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert not report.agrees and sorted(report.failing) == sorted([artifact, *ALSO_FAILING.get(artifact, [])]), \
        report.to_text()


def test_the_same_output_scored_otherwise_is_never_a_near_tie(tmp_path):
    """Correctness is a function of the output: flipped on an unchanged output, it differs whatever the margins."""
    _table1(tmp_path, "c", True, 1e-5)
    _table1(tmp_path, "r", True, 1e-5)
    items = pd.read_parquet(tmp_path / "r" / "table1_masking_arithmetic_items.parquet")
    items.loc[1, "correct"] = False
    items.to_parquet(tmp_path / "r" / "table1_masking_arithmetic_items.parquet")
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    rows = {row.artifact: row for row in report.rows}
    assert rows["table1_masking_arithmetic_items"].status == DIFFERS
    assert "1 answers scored differently on the same output" in rows["table1_masking_arithmetic_items"].detail
    assert rows["table1_masking_arithmetic"].status == DIFFERS
    assert "is not the share of its items answered correctly" in rows["table1_masking_arithmetic"].detail


def test_a_run_accuracy_moves_only_as_far_as_its_parted_answers(tmp_path):
    """One answer of two parted at a near-tie: the run's accuracy may move by 1/2, and a committed accuracy that
    moved further (doctored to agree with nothing) differs."""
    _table1(tmp_path, "c", True, 1e-5)
    _table1(tmp_path, "r", False, 1e-5)
    assert agreement.compare_folders(tmp_path / "c", tmp_path / "r").agrees
    for side in ("c", "r"):  # both sides' accuracies doctored alike, beyond what one parted answer allows
        table = pd.read_parquet(tmp_path / side / "table1_masking_arithmetic.parquet")
        table.loc[0, "accuracy"] = 1.0 if side == "c" else 0.0
        _write(tmp_path / side, "table1_masking_arithmetic", table)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.failing == ["table1_masking_arithmetic"]


@pytest.fixture(autouse=True)
def _model_a_measured_to_change_answers(monkeypatch):
    """The hand-built tables' model "a" measured as changing one answer of two between kernels: the bound lets one
    answer of a two-sample run part at a near-tie (tiny-llada's measured 0 of 200 would not)."""
    monkeypatch.setitem(agreement_answers.CROSS_KERNEL_ANSWERS, "a", {(agreement_rows.UNMASKED, 0): (1, 2)})


def _many_answers(tmp_path, side, rewritten: int, model="tiny-llada", n=100):
    """One run of n samples, every closest margin a near-tie; on the committed side the first `rewritten` answers are
    other outputs scored otherwise, with the run's accuracy kept the share of its items (a consistent forgery)."""
    correct = [not (side == "c" and i < rewritten) for i in range(n)]
    items = pd.DataFrame({"model": model, "condition": "sinks", "k": 1, "id": [str(i) for i in range(n)],
                          "correct": correct, "output": ["12" if ok else "13" for ok in correct], "margin": 1e-5})
    table = pd.DataFrame({"model": [model], "condition": ["sinks"], "k": [1], "accuracy": [float(np.mean(correct))],
                          "stderr": [0.0], "n": [n], "accuracy_flexible": [float(np.mean(correct))]})
    _write(tmp_path / side, "table1_masking_arithmetic", table)
    _write(tmp_path / side, "table1_masking_arithmetic_items", items)


@pytest.mark.parametrize("rewritten, agrees", [(0, True), (2, True), (3, False), (10, False), (47, False)])
def test_answers_changed_at_near_ties_are_bounded_by_what_another_cpu_measurably_changes(tmp_path, rewritten, agrees):
    """tiny-llada with its top-1 sink masked: 4 of 600 final canvases changed between kernels, so at most the 99.9 %
    upper bound (2.44 %) of a 100-answer run may part at near-ties: 3, 10 or 47 rewritten, accuracy row kept
    consistent, no longer agree."""
    assert agreement_answers.answers_allowed("tiny-llada", {("sinks", 1): 100}) == 2
    _many_answers(tmp_path, "c", rewritten)
    _many_answers(tmp_path, "r", 0)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.agrees is agrees, report.to_text()
    if not agrees:
        assert "table1_masking_arithmetic_items" in report.failing
        detail = {row.artifact: row.detail for row in report.rows}["table1_masking_arithmetic_items"]
        assert (f"tiny-llada changed {rewritten} of its 100 answers at near-ties, more than another CPU changes (at "
                "most 2: generations of tiny-llada changed between kernels: sinks k=1 4 of 600)") in detail


# tiny-llada's answers that a rerun elsewhere may change in each committed table (every one of its items a near-tie):
# the sum over its runs of n × the 99.9 % upper bound measured for the run's condition and k
ZOO_ANSWERS_ALLOWED = {"table1_masking_arithmetic": 35, "table1_dose_arithmetic": 19}


@pytest.mark.parametrize("name", sorted(ZOO_ANSWERS_ALLOWED))
@pytest.mark.parametrize("beyond, agrees", [(0, True), (1, False)])
def test_rewritten_answers_of_the_committed_zoo_tables_agree_only_as_far_as_another_cpu_changes(tmp_path, name, beyond,
                                                                                                agrees):
    """The audit's case on the real committed tables of notebooks 04 and 07: tiny-llada's answers rewritten, each
    run's accuracy kept consistent with its items. As many as another CPU changes under those runs' conditions
    cannot be told from its rerun; one more is refused."""
    import shutil

    from sinklib.evaluation.table1 import interval_columns
    from sinklib.paths import DATA_DIR

    for side in ("c", "r"):
        (tmp_path / side).mkdir()
        for stem in (name, f"{name}_items"):
            shutil.copy2(DATA_DIR / "results" / f"{stem}.parquet", tmp_path / side / f"{stem}.parquet")
    items = pd.read_parquet(tmp_path / "c" / f"{name}_items.parquet")
    table = pd.read_parquet(tmp_path / "c" / f"{name}.parquet")
    ours = items[items["model"] == "tiny-llada"]
    runs = {(c, int(k)): int(n) for (c, k), n in ours.groupby(["condition", "k"]).size().items()}
    allowed = agreement_answers.answers_allowed("tiny-llada", runs)
    assert allowed == ZOO_ANSWERS_ALLOWED[name]
    rewritten = allowed + beyond
    chosen = ours.index[:rewritten]
    items.loc[chosen, "output"] = items.loc[chosen, "output"] + " 7"
    items.loc[chosen, "correct"] = ~items.loc[chosen, "correct"]
    for condition, k in items.loc[chosen, ["condition", "k"]].drop_duplicates().itertuples(index=False):
        run_items = items[(items["model"] == "tiny-llada") & (items["condition"] == condition) & (items["k"] == k)]
        row = (table["model"] == "tiny-llada") & (table["condition"] == condition) & (table["k"] == k)
        for column, value in interval_columns(int(run_items["correct"].sum()), len(run_items)).items():
            table.loc[row, column] = value
    _write(tmp_path / "c", f"{name}_items", items)
    _write(tmp_path / "c", name, table)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.agrees is agrees, report.to_text()
    if not agrees:
        assert f"{name}_items" in report.failing
        assert f"tiny-llada changed {rewritten} of its {len(ours)} answers at near-ties" in report.to_text()


def test_the_measured_cross_kernel_counts_are_the_benchmarks():
    """CROSS_KERNEL_ANSWERS quotes benchmarks/results/cpu_rounding_bound.md: per model, condition and k, final
    canvases that differed, summed over the kernels compared, of the generations compared (a row against another
    thread count of this CPU's kernels is not another CPU's)."""
    from pathlib import Path

    rows = [line.split("|")[1:-1] for line in (Path(__file__).parents[2] / "benchmarks" / "results" /
                                               "cpu_rounding_bound.md").read_text().splitlines()
            if line.startswith("| tiny-") or line.startswith("| smollm2")]
    measured: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
    for cells in rows:
        model, against, condition, k, generations, differed = (cells[i].strip() for i in (0, 1, 2, 3, 4, 7))
        if against.startswith("threads="):
            continue
        key = agreement_answers.run_key(condition, int(k))
        before = measured.setdefault(model, {}).get(key, (0, 0))
        measured[model][key] = (before[0] + int(differed), before[1] + int(generations))
    assert measured == {model: runs for model, runs in agreement_answers.CROSS_KERNEL_ANSWERS.items() if model != "a"}


def test_a_run_not_measured_takes_its_models_pooled_count_and_a_model_never_measured_every_models(monkeypatch):
    monkeypatch.delitem(agreement_answers.CROSS_KERNEL_ANSWERS, "a")  # the hand-built model: not a measurement
    monkeypatch.setitem(agreement_answers.CROSS_KERNEL_ANSWERS, "m",
                        {(agreement_rows.UNMASKED, 0): (0, 300), ("sinks", 1): (3, 100)})
    pooled = agreement_answers.upper_bound(3, 400)
    assert agreement_answers.answers_allowed("m", {("sinks", 7): 1000}) == int(pooled * 1000)
    assert agreement_answers.answers_allowed("m", {("sinks", 0): 1000, ("random keys", 0): 1000}) == \
        int(agreement_answers.upper_bound(0, 300) * 2000)  # k = 0 is the unmasked run, whatever its condition's name
    every = [counts for runs in agreement_answers.CROSS_KERNEL_ANSWERS.values() for counts in runs.values()]
    assert agreement_answers.answers_allowed("never-measured", {("sinks", 1): 1000}) == int(
        agreement_answers.upper_bound(sum(c for c, _ in every), sum(n for _, n in every)) * 1000)


def _layer_head(**columns):
    frame = pd.DataFrame({"model": ["a", "a"], "layer": [0, 1], "head": [0, 0], "score": [5.0, 6.0]})
    return frame.assign(**columns)


@pytest.mark.parametrize("doctor, detail", [
    (lambda f: f.rename(columns={"score": "score2"}), "the columns differ (only committed: ['score2'], only rerun: ['score'])"),
    (lambda f: f.drop(columns="score"), "the columns differ (only committed: [], only rerun: ['score'])"),
    (lambda f: f.assign(extra=1.0), "the columns differ (only committed: ['extra'], only rerun: [])"),
    (lambda f: pd.concat([f, f.iloc[[0]]], ignore_index=True), "the committed table repeats 1 rows' identity"),
    (lambda f: f[["model", "score", "layer", "head"]], "the columns are in another order"),
])
def test_a_table_of_another_shape_differs_naming_its_columns_or_rows_never_a_traceback(tmp_path, doctor, detail):
    _write(tmp_path / "c", "fig05_layer_head", doctor(_layer_head()))
    _write(tmp_path / "r", "fig05_layer_head", _layer_head())
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    assert report.failing == ["fig05_layer_head"] and detail in report.rows[0].detail


def test_a_damaged_committed_file_is_a_finding_with_its_name(tmp_path):
    _write(tmp_path / "c", "fig05_layer_head", _layer_head())
    _write(tmp_path / "r", "fig05_layer_head", _layer_head())
    (tmp_path / "c" / "fig05_layer_head.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "c" / "PROVENANCE.json").write_text('{"artifacts": {')
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r")
    rows = {row.artifact: row for row in report.rows}
    assert "the committed file is not a readable table" in rows["fig05_layer_head"].detail
    assert rows["c/PROVENANCE.json"].status == DIFFERS and "not readable" in rows["c/PROVENANCE.json"].detail
    assert sorted(report.failing) == ["c/PROVENANCE.json", "fig05_layer_head"]


def _figure(path, values, size=(4, 3)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(exist_ok=True)
    figure, axes = plt.subplots(figsize=size, dpi=50)
    axes.plot(values)
    for suffix in (".png", ".pdf"):
        figure.savefig(path.with_suffix(suffix), metadata={"Software": None} if suffix == ".png" else {"CreationDate": None})
    plt.close(figure)


@pytest.mark.parametrize("rerun_values, size, status", [
    ([1, 2, 3, 4], (4, 3), IDENTICAL),
    ([1, 2, 3, 4.0000001], (4, 3), IDENTICAL),  # values within float tolerance draw the same pixels
    ([4, 1, 3, 2], (4, 3), DIFFERS),            # another plot
    ([1, 2, 3, 4], (5, 3), DIFFERS),            # another size
])
def test_a_figure_agrees_when_drawn_alike_and_another_plot_differs(tmp_path, rerun_values, size, status):
    _figure(tmp_path / "cf" / "fig10_threshold_sweep.png", [1, 2, 3, 4])
    _figure(tmp_path / "rf" / "fig10_threshold_sweep.png", rerun_values, size)
    (tmp_path / "c").mkdir(), (tmp_path / "r").mkdir()
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r", pages=(tmp_path / "cf", tmp_path / "rf"))
    assert [(row.artifact, row.status) for row in report.rows] == [("fig10_threshold_sweep.png", status)], report.to_text()


def test_a_figure_whose_pdf_is_missing_differs(tmp_path):
    _figure(tmp_path / "cf" / "fig10.png", [1, 2])
    _figure(tmp_path / "rf" / "fig10.png", [1, 2])
    (tmp_path / "rf" / "fig10.pdf").unlink()
    (tmp_path / "c").mkdir(), (tmp_path / "r").mkdir()
    row = agreement.compare_folders(tmp_path / "c", tmp_path / "r", pages=(tmp_path / "cf", tmp_path / "rf")).rows[0]
    assert row.status == DIFFERS and row.detail == "fig10.pdf missing from the rerun"


@pytest.mark.parametrize("rerun_margin, status", [(1e-5, NEAR), (0.3, DIFFERS)])
def test_an_edited_text_table_differs_unless_the_table_it_renders_parted_at_a_near_tie(tmp_path, rerun_margin, status):
    """figures/table1_masking_arithmetic.md renders data/results/table1_masking_arithmetic.parquet: an edited text
    agrees only where that table itself agrees up to a near-tie."""
    _table1(tmp_path, "c", True, 1e-5)
    _table1(tmp_path, "r", False, rerun_margin)
    for side, text in (("cf", "| a | 1.00 |\n"), ("rf", "| a | 0.50 |\n")):
        (tmp_path / side).mkdir()
        (tmp_path / side / "table1_masking_arithmetic.md").write_text(text)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r", pages=(tmp_path / "cf", tmp_path / "rf"))
    assert {row.artifact: row.status for row in report.rows}["table1_masking_arithmetic.md"] == status


def test_an_edited_text_table_whose_table_agrees_exactly_differs(tmp_path):
    _table1(tmp_path, "c", True, 0.4)
    _table1(tmp_path, "r", True, 0.4)
    for side, text in (("cf", "| a | 1.00 |\n"), ("rf", "| a | 0.99 |\n")):
        (tmp_path / side).mkdir()
        (tmp_path / side / "table1_masking_arithmetic.md").write_text(text)
    report = agreement.compare_folders(tmp_path / "c", tmp_path / "r", pages=(tmp_path / "cf", tmp_path / "rf"))
    assert report.failing == ["table1_masking_arithmetic.md"]
    assert "the text differs from the committed one (its table agrees exactly)" in report.rows[-1].detail


def test_a_check_tells_which_provenance_differs_naming_the_artifacts():
    """make check reports provenance that differs (versions, CPU, code) without judging it: the numbers are judged."""
    made = {"versions": {"transformers": "5.24.0", "torch": "2.13.0"}, "machine": {"cpu": "AMD EPYC"},
            "code": {"numerics": "a"}}
    old = {f"t{i}.parquet": made for i in range(5)}
    new = {name: {**made, "versions": {"transformers": "5.25.0", "torch": "2.13.0"}} for name in old}
    [line] = agreement.provenance_differences(old, new)
    assert line == "versions.transformers: '5.24.0' → '5.25.0' (t0.parquet, t1.parquet, t2.parquet and 2 more)"
    assert agreement.provenance_differences(old, old) == []


def test_a_layout_record_that_is_not_a_layout_differs_naming_why(tmp_path):
    """The layout a table carries is validated (pydantic, against summary.Layout): an unknown scope is a finding."""
    for side in ("c", "r"):
        (tmp_path / side).mkdir()
        write_parquet(_events(score_shift=0.0 if side == "c" else 1e-6), tmp_path / side / "moving_sink_events.parquet",
                      {}, Layout(("model", "trace", "step", "layer", "head"), "per-sample"))
    row = agreement.compare_file(tmp_path / "c" / "moving_sink_events.parquet", tmp_path / "r" / "moving_sink_events.parquet")
    assert row.status == DIFFERS and row.detail.startswith("its layout is not readable") and "scope" in row.detail


def test_an_explorer_page_whose_data_is_not_explorer_data_differs_not_crashes(tmp_path):
    committed = _page(tmp_path / "c.html", [[1, 9], [1, 2]], [1.0, 2.0, 1.5, 0.5], [0.2])
    rerun = tmp_path / "r.html"
    rerun.write_text(committed.read_text().replace('"scores"', '"no_scores"'))
    row = agreement.compare_page(committed, rerun)
    assert row.status == DIFFERS and row.detail.startswith("its data is not readable") and "scores" in row.detail
    rerun.write_text("<p>no data</p>")
    assert "holds no sinklib explorer data" in agreement.compare_page(committed, rerun).detail
