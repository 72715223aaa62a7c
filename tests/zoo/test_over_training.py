"""Sinks over training, the measured rows (sinklib.zoo.over_training): the recipes' checkpoint steps, the token
groups, the rows read, selected and written under a lock with their digests (the retraining's tests are
tests/experiments/test_retrain.py)."""
import typing
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from sinklib import dynamics
from sinklib.provenance import describe
from sinklib.zoo import over_training
from sinklib.zoo.recipes import VARIANTS, ZOO, checkpoint_steps, recipe


def test_checkpoint_steps_start_at_the_initialisation_end_at_the_last_step_and_are_log_spaced():
    steps = checkpoint_steps(5000, 8)
    assert steps[0] == 0 and steps[-1] == 5000 and len(steps) == 9 and steps == sorted(set(steps))
    ratios = [later / earlier for earlier, later in zip(steps[1:], steps[2:])]
    assert max(ratios) / min(ratios) < 1.05  # evenly spaced in log(step)
    with pytest.raises(ValueError, match="count=1"):
        checkpoint_steps(100, 1)
    with pytest.raises(ValueError, match="count=4 is not allowed with total=20"):
        checkpoint_steps(20, 4)
    with pytest.raises(ValueError, match=r"count=8 is not allowed with total=30, first=25: .*count <= total - first \+ 2"):
        checkpoint_steps(30, 8)
    with pytest.raises(ValueError, match="count=7 is not allowed with total=30: .* would repeat"):
        checkpoint_steps(30, 7)


def test_every_recipe_name_is_one_the_literal_accepts():
    assert set(typing.get_args(over_training.RecipeName)) == set(ZOO) | set(VARIANTS)
    assert recipe("tiny-llada-prompt-masking").mask_prompt and not recipe("tiny-llada").mask_prompt
    with pytest.raises(ValueError, match="name='tiny-lada' is not allowed"):
        recipe("tiny-lada")


@pytest.mark.parametrize(("text", "group"), [
    ("[MASK]", "mask"), ("[EOS]", "special"), ("[BOS]", "special"), (".", "punctuation"), ("A:", "punctuation"),
    ("####", "punctuation"), ("Ċ", "punctuation"), ("ĊĊ", "punctuation"), ("Ġ", "punctuation"), ("has", "content"),
    ("12", "content"), ("Ġthe", "content"), ("<|mdm_mask|>", "mask"), ("<0x0A>", "punctuation"), ("<0x20>", "punctuation"),
    ("<0x2C>", "punctuation"), ("<0x41>", "content"), ("<0x37>", "content"), ("<0xE2>", "content"), ("▁", "punctuation"),
    ("▁the", "content")])
def test_token_groups(text, group):
    mask = "<|mdm_mask|>" if text == "<|mdm_mask|>" else "[MASK]"
    assert dynamics.token_group(text, mask_token=mask, special_tokens={"[EOS]", "[BOS]", "<|mdm_mask|>"},
                                markers=over_training.FORMAT_MARKERS) == group


def test_the_shipped_model_comes_after_the_last_checkpoint_it_shares_a_step_with():
    rows = pd.DataFrame({"model": ["tiny-arm"] * 3, "checkpoint": ["step-01200", "shipped", "step-00025"],
                         "step": [1200, 1200, 25], **{k: 0 for k in over_training.KEY[3:]}})
    assert over_training._ordered(rows)["checkpoint"].tolist() == ["step-00025", "step-01200", "shipped"]


def test_select_refuses_settings_the_file_does_not_hold(tmp_path):
    steps = checkpoint_steps(ZOO["tiny-arm"].steps, 3)
    rows = pd.DataFrame([{column: 0 for column in over_training.COLUMNS} | {
        "model": "tiny-arm", "checkpoint": checkpoint, "n_problems": 300, "n_traces": 30, "eps": 3.0, "seed": 0}
        for checkpoint in [f"step-{step:05d}" for step in steps] + ["shipped"]])
    assert len(over_training.select(rows, over_training.Measurement(), ["tiny-arm"], count=3)) == len(steps) + 1
    with pytest.raises(ValueError, match=r"\['tiny-arm'\] lack rows measured with .*'n_problems': 100"):
        over_training.select(rows, over_training.Measurement(n_problems=100), ["tiny-arm"], count=3)
    with pytest.raises(ValueError, match=r"\['tiny-arm'\] lack rows .* at their 8 checkpoints"):
        over_training.select(rows, over_training.Measurement(), ["tiny-arm"], count=8)
    with pytest.raises(ValueError, match="names='tiny-arm' is not allowed"):
        over_training.select(rows, over_training.Measurement(), "tiny-arm")
    with pytest.raises(ValueError, match="n_problems=0 is not allowed"):
        over_training.Measurement(n_problems=0)


def test_the_committed_measurements_cover_every_checkpoint_and_the_shipped_models():
    from sinklib.lab import nb06_sinks_over_training as nb06

    followed = [name for name in nb06.TrainingDynamicsRun().recipes if name in ZOO]  # the zoo models notebook 06 reads
    rows = over_training.select(over_training.read_rows(), over_training.Measurement(), followed)
    for name in followed:
        spec = ZOO[name]
        mine = rows[rows["model"] == name]
        assert mine["step"].tolist() == checkpoint_steps(spec.steps) + [spec.steps]
        assert mine["checkpoint"].iloc[-1] == "shipped"
        shares = mine[[f"share_{group}" for group in dynamics.TOKEN_GROUPS]]
        with_sinks = shares.notna().all(axis=1)
        assert ((shares[with_sinks].sum(axis=1) - 1).abs() < 1e-9).all()
        assert shares[~with_sinks].isna().all(axis=None) and (mine.loc[~with_sinks, "top_sink_token"] == "").all()


def test_the_notebook_measures_as_the_command_line_does():
    from sinklib.lab import nb06_sinks_over_training as nb06

    assert nb06.TrainingDynamicsRun().measurement == over_training.Measurement()


def test_measurements_of_two_models_running_at_once_keep_each_others_rows(tmp_path):
    """Each row is added under a lock on the results folder, reading the file again: two writers lose nothing."""
    import threading

    results = tmp_path / "rows.parquet"

    def write_rows(model: str) -> None:
        for step in range(15):
            row = {column: 0.0 for column in over_training.COLUMNS} | {
                "model": model, "checkpoint": f"step-{step:05d}", "step": step, "weights": "w", "top_sink_token": ""}
            over_training._add_row(row, results, describe({}, what="sinks over training"))

    writers = [threading.Thread(target=write_rows, args=(model,)) for model in ("tiny-arm", "tiny-dream")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    rows = over_training.read_rows(results)
    assert sorted(rows.groupby("model").size().tolist()) == [15, 15]


def _one_row_file(results: Path) -> None:
    for step in (0, 6):
        row = {column: 0.5 for column in over_training.COLUMNS} | {
            "model": "tiny-arm", "checkpoint": f"step-{step:05d}", "step": step, "weights": "w", "top_sink_token": ""}
        over_training._add_row(row, results, describe({}, what="sinks over training"))


def test_rows_edited_by_hand_are_refused_never_kept_as_measured(tmp_path):
    """Issue 52: a measurement edited by hand (its metadata kept) or rewritten by another program (pandas drops the
    metadata) was kept as measured and never measured again; each row carries the digest its measurement wrote."""
    import pyarrow.parquet as pq

    results = tmp_path / "rows.parquet"
    _one_row_file(results)
    assert over_training.read_rows(results)["accuracy"].tolist() == [0.5, 0.5]

    table = pq.read_table(results)
    edited = table.to_pandas()
    edited.loc[1, "accuracy"] = 0.99
    pq.write_table(pa.Table.from_pandas(edited).replace_schema_metadata(table.schema.metadata), results)
    with pytest.raises(ValueError, match=r"the rows of \['tiny-arm step-00006'\] are not what their measurements wrote "
                                         r"\(edited since\); nothing is resumed from it"):
        over_training.read_rows(results)

    edited.to_parquet(results)  # pandas writes its own metadata, not sinklib's
    with pytest.raises(ValueError, match=r"its rows carry no digests \(written by another program\?\)"):
        over_training.read_rows(results)


def test_the_committed_measurements_carry_the_digests_of_their_rows():
    for results in (over_training.RESULTS_PATH, over_training.RESULTS_PATH.with_name("adaptation_dynamics.parquet")):
        assert len(over_training.read_rows(results)) > 0


def test_a_missing_value_reads_back_with_the_digest_it_was_written_with(tmp_path):
    """None in a text column, NaN in a number column: parquet may give back one missing value for another; the row
    is the same row, not an edited one."""
    results = tmp_path / "rows.parquet"
    row = {column: float("nan") for column in over_training.COLUMNS} | {
        "model": "tiny-arm", "checkpoint": "step-00000", "step": 0, "weights": "w", "top_sink_token": None}
    over_training._add_row(row, results, describe({}, what="sinks over training"))
    rows = over_training.read_rows(results)
    assert len(rows) == 1 and rows["top_sink_token"].isna().all()
