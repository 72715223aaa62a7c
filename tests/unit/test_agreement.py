"""Comparing a rerun with the committed results: what is identical, what is within float tolerance, what a
near-tie explains, and what differs — each on hand-built results files whose answer is known."""
import base64
import json

import numpy as np
import pandas as pd
import pytest

from sinklib import agreement
from sinklib.agreement import DIFFERS, FLOAT_TOLERANCE, IDENTICAL, NEAR, WITHIN
from sinklib.provenance import write_parquet
from sinklib.summary import EVALUATION, EVALUATION_ITEMS, Layout
from sinklib.ties import NEAR_TIE


def _generations(canvases: dict[tuple[str, int], list[list[int]]], margins: dict[tuple[str, int], list[float]]):
    rows = [{"model": m, "trace": t, "step": s, "margin": margins[(m, t)][s], "canvas": c}
            for (m, t), steps in canvases.items() for s, c in enumerate(steps)]
    return pd.DataFrame(rows)


# the layouts the producers declare (sinklib.analyses, evaluation.table1): each table carries its own
LAYOUTS = {"moving_sink_events": Layout(("model", "trace", "step", "layer", "head"), "trace"),
           "sink_dynamics": Layout(("model", "trace"), "trace"), "fig05_layer_head": Layout(("model", "layer", "head")),
           "generations": Layout(("model", "trace", "step"), "trace"), "table1_masking_arithmetic": EVALUATION,
           "table1_masking_arithmetic_items": EVALUATION_ITEMS}


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


def test_a_divergence_that_is_no_near_tie_fails_the_check(tmp_path):
    report = _folders(tmp_path, rerun_margin=0.3)
    assert not report.agrees and report.failing == ["generations", "moving_sink_events"]


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


def test_a_rerun_that_compared_nothing_does_not_agree_and_says_so(tmp_path):
    from sinklib import agreement

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
