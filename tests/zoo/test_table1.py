"""The Table 1 helper: every cell equals an independent accuracy computation (generate and a regex, by hand),
the table resumes from its files without generating again, and it renders as markdown, LaTeX and a figure."""
import re

import pytest

import sinklib
from sinklib.evaluation.table1 import masking_table
from sinklib.interventions import MaskRandomKeys, MaskSinks
from sinklib.stats import wilson_interval
from experiments.zoo.data import held_out
from sinklib.evaluation.tasks import get_task

N = 6


@pytest.fixture(scope="module")
def models():
    return [sinklib.load("tiny-llada"), sinklib.load("tiny-arm")]


def test_cells_equal_the_zoo_accuracy_under_the_same_interventions(models, tmp_path):
    table = masking_table(models, task=get_task("arithmetic", limit=N), ks=[0, 1], batch_size=N, out_dir=tmp_path, progress=False)
    frame = table.frame
    assert list(zip(frame["model"], frame["condition"], frame["k"])) == [
        ("tiny-llada", "sinks", 0), ("tiny-llada", "sinks", 1), ("tiny-llada", "random keys", 1),
        ("tiny-arm", "sinks", 0), ("tiny-arm", "sinks", 1), ("tiny-arm", "random keys", 1)]
    items = held_out()[:N]
    for row in frame.itertuples():
        loaded = models[0] if row.model == "tiny-llada" else models[1]
        rows = "last" if row.model == "tiny-arm" else "all"
        intervention = (None if row.k == 0 else MaskSinks(top_k=1, rows=rows) if row.condition == "sinks"
                        else MaskRandomKeys(k=1, seed=0))
        reference = _reference_accuracy(loaded, items, intervention)
        assert row.accuracy == pytest.approx(reference), row
        assert row.stderr == pytest.approx((row.accuracy * (1 - row.accuracy) / (N - 1)) ** 0.5) and row.n == N
        assert (row.ci_low, row.ci_high) == pytest.approx(wilson_interval(round(row.accuracy * N), N))
    wide = table.wide()
    assert list(wide.columns) == ["unmasked", "top-1", "random-1"] and list(wide.index) == ["tiny-llada", "tiny-arm"]
    first = frame.iloc[0]
    assert f"{first.accuracy:.2f} [{first.ci_low:.2f}, {first.ci_high:.2f}]" in table.to_markdown()
    assert "\\begin{tabular}" in table.to_latex()
    written = table.save(tmp_path / "figures")
    assert sorted(p.suffix for p in written) == [".md", ".pdf", ".png", ".tex"] and all(p.stat().st_size for p in written)

    calls = []
    hooks = [m.model.register_forward_hook(lambda *a: calls.append(1)) for m in models]
    try:
        again = masking_table(models, task=get_task("arithmetic", limit=N), ks=[0, 1], batch_size=N, out_dir=tmp_path,
                              progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [], "a finished table is read back from its files"
    assert again.frame.equals(frame)


def _reference_accuracy(loaded, items, intervention) -> float:
    """One batch through generate with the zoo's settings, each answer read with the strict "#### N" rule."""
    traces = sinklib.generate(loaded, [p.question for p in items], chat=False, progress=False, keep_scores=False,
                              intervention=intervention, settings=loaded.family.defaults(zoo=True))
    answers = [re.search(r"#### (-?\d+)", trace.text) for trace in traces]
    return sum(a is not None and int(a.group(1)) == p.answer for a, p in zip(answers, items)) / len(items)


def test_a_changed_configuration_starts_new_files_beside_the_old(models, tmp_path):
    first = masking_table(models[1:], task=get_task("arithmetic", limit=3), conditions=["sinks"], ks=[0], batch_size=3,
                          out_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("tiny-arm-arithmetic-unmasked-*.jsonl"))) == 1
    second = masking_table(models[1:], task=get_task("arithmetic", limit=2), conditions=["sinks"], ks=[0], batch_size=3,
                           out_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("tiny-arm-arithmetic-unmasked-*.jsonl"))) == 2
    assert first.frame["n"].tolist() == [3] and second.frame["n"].tolist() == [2]


def test_bad_input(models):
    with pytest.raises(ValueError, match=r"ks=-1 is not allowed"):
        masking_table(models, ks=[0, -1])
    with pytest.raises(ValueError, match=r"task='gsm9k' is not allowed"):
        masking_table(models, task="gsm9k")
    with pytest.raises(ValueError, match=r"allow_code_execution=False: opt in"):
        masking_table(models, task="humaneval")
    with pytest.raises(ValueError, match=r"conditions='sinks' is not allowed: conditions must be a list of condition "
                                         r"names, e.g. \['sinks'\]"):
        masking_table(models, conditions="sinks")


def test_each_row_carries_its_audits_closest_margin_and_checks_without_it_are_made_again(models, tmp_path):
    """The audit (evaluation.checks.mass_dropped) keeps its generation's closest decision margin, what a rerun
    elsewhere needs to know whether the audit may take another path: equal to the margin of the same generation made
    by hand (the task's first sample, the row's policy). Checks written before that column existed (in the run's
    header) are this run's own and are made again, with the same counts."""
    from sinklib.evaluation.records import read_run
    from sinklib.evaluation.runner import write_checks
    from sinklib.ties import smallest_margin

    llada = models[0]
    table = masking_table([llada], task=get_task("arithmetic", limit=2), conditions=["sinks"], ks=[1], batch_size=2,
                          out_dir=tmp_path, progress=False)
    row = table.frame.iloc[0]
    task = get_task("arithmetic")
    by_hand = sinklib.generate(llada, task.samples()[0].prompt, llada.settings_for(task), chat=task.chat,
                               progress=False, keep_scores=False, intervention=MaskSinks(top_k=1))
    assert row.audit_margin == smallest_margin(by_hand) and row.masked_entries > 0 and row.kept_share < 1e-6
    [run] = tmp_path.glob("*.jsonl")
    assert [p.name for p in tmp_path.iterdir()] == [run.name], "the checks are in the run's header, not beside it"
    older = dict(read_run(run)[0]["checks"])
    del older["audit_margin"]
    write_checks(run, older)
    again = masking_table([llada], task=get_task("arithmetic", limit=2), conditions=["sinks"], ks=[1], batch_size=2,
                          out_dir=tmp_path, progress=False)
    assert again.frame.equals(table.frame) and read_run(run)[0]["checks"]["audit_margin"] == row.audit_margin


def _forwards(models):
    """Count the forwards of `models` while the block runs: (calls, hooks to remove)."""
    calls = []
    return calls, [m.model.register_forward_hook(lambda *a: calls.append(1)) for m in models]


def _as_format_3(run, loaded, task, intervention, seed, batch_size, settings):
    """A run file of records format 3 made from a format-4 one, as the runner before issue 67 wrote it: its records
    under the old key, NAME.jsonl.provenance.json (config, inputs, versions, machine, code) and NAME.jsonl.checks.json."""
    import json

    from sinklib.digest import digest
    from sinklib.evaluation.records import read_run, record_digest

    migration = _migration_tool()
    header, records = read_run(run)
    config = migration.old_config(loaded, task, intervention, seed, batch_size, settings)
    key = digest(config)
    old = run.with_name(run.name.replace(header["config_hash"], key))
    lines = [{**{k: v for k, v in r.items() if k != "record_sha256"}, "config_hash": key} for r in records]
    old.write_text("".join(json.dumps({**r, "record_sha256": record_digest(r)}) + "\n" for r in lines))
    entry = {"config": config, "inputs": migration.old_inputs(loaded, task, task.samples()), "seed": seed,
             **header["provenance"]}
    old.with_name(old.name + ".provenance.json").write_text(json.dumps({key: entry}))
    old.with_name(old.name + ".checks.json").write_text(json.dumps(header["checks"]))
    run.unlink()
    return old


def _migration_tool():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "migrate_eval_records.py"
    spec = importlib.util.spec_from_file_location("migrate_eval_records", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_a_migrated_run_is_read_by_masking_table_without_generating(models, tmp_path):
    """tools/migrate_eval_records.py: a format-3 run (three files, the old key) becomes one file under the new key,
    its records and checks unchanged, its first batch re-generated and found equal; masking_table then reads it
    without a forward, and the migration removed exactly the files it replaced."""
    from sinklib.evaluation.records import read_run

    arm = models[1]
    task, settings = get_task("arithmetic", limit=4), arm.settings_for()
    first = masking_table([arm], task=task, conditions=["random keys"], ks=[1], batch_size=2, out_dir=tmp_path,
                          progress=False)
    [run] = tmp_path.glob("*.jsonl")
    made = read_run(run)
    old = _as_format_3(run, arm, task, MaskRandomKeys(k=1, seed=0), 0, 2, settings)
    (tmp_path / "unrelated.txt").write_text("not a run")
    assert _migration_tool().main([str(tmp_path), "--report", str(tmp_path / "report.jsonl")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([run.name, "unrelated.txt", "report.jsonl"])
    assert not old.exists() and read_run(run)[1] == made[1] and read_run(run)[0]["checks"] == made[0]["checks"]
    calls, hooks = _forwards([arm])
    try:
        again = masking_table([arm], task=task, conditions=["random keys"], ks=[1], batch_size=2, out_dir=tmp_path,
                              progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [] and again.frame.equals(first.frame)


def test_the_committed_tiny_zoo_runs_are_read_without_generating(models, tmp_path):
    """The committed Table 1 runs of the tiny zoo (data/results/table1-arithmetic, as notebook 07's dose-response
    makes them: n = 20, batches of 20) are found under this checkout's keys: read back, not generated again (read
    from a copy: a key that moved would otherwise write new runs into the committed store)."""
    import shutil

    from sinklib.paths import DATA_DIR

    store = shutil.copytree(DATA_DIR / "results" / "table1-arithmetic", tmp_path / "store")
    calls, hooks = _forwards(models)
    try:
        table = masking_table(models, task=get_task("arithmetic", limit=20), ks=[0, 1, 2, 5, 10, 20], batch_size=20,
                              out_dir=store, progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [], "every run and its checks are read from the committed store"
    assert set(table.frame["n"]) == {20} and len(table.frame) == 2 * 11
    assert sorted(p.name for p in store.iterdir()) == sorted(p.name for p in (DATA_DIR / "results" /
                                                                                "table1-arithmetic").iterdir())
