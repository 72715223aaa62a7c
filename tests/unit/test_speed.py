"""sinklib.speed: the policies' settings, the frontier's numbers against hand-counted records, and timing that is
never reused from other jobs."""
import json

import pandas as pd
import pytest
import torch

import sinklib
from sinklib import speed
from sinklib.dynamics import comparable_scores
from sinklib.evaluation.table1 import MaskingTable, accuracy_rows
from sinklib.stats import mcnemar_exact, wilson_interval
from tests.models import MASK_ID, diffusion_llama

# the notebooks extra (matplotlib): absent from the transformers-4.56 tier's environment, which runs none of these
nb08 = pytest.importorskip("sinklib.lab.nb08_sinks_for_speed", reason="the notebooks extra (its figures) is not installed")


@pytest.fixture(scope="module")
def models():
    return {"llada": sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID),
            "dream": sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID)}


def test_policies_lay_fast_dllm_fields_over_the_models_own_settings(models):
    llada = models["llada"]
    own = llada.settings_for()
    assert speed.policy_settings(llada, "plain") == own
    dual = speed.policy_settings(llada, "threshold + dual cache")
    assert (dual.cache, dual.threshold, dual.block_length, dual.steps) == ("dual", 0.9, own.block_length, own.steps)
    dream = speed.policy_settings(models["dream"], "threshold")
    # Dream's own sampler has no blocks: one block of the whole answer, ranked by top probability
    assert (dream.block_length, dream.alg, dream.threshold) == (dream.gen_length, "maskgit_plus", 0.9)
    assert speed.policy_settings(models["dream"], "dual cache", block_length=4).block_length == 4
    with pytest.raises(ValueError, match="policy='fast' is not allowed: policy must be one of"):
        speed.policy_settings(llada, "fast")


def test_the_prefix_cache_is_left_out_where_it_is_the_dual_cache(models):
    """With the whole answer one block, the prefix cache's window (the block and everything after) is the block."""
    assert "prefix cache" in speed.policies_for(models["llada"])  # the zoo's two blocks of 8
    assert "prefix cache" not in speed.policies_for(models["dream"])
    assert "prefix cache" in speed.policies_for(models["dream"], block_length=4)


def _write(folder, policy, rows, settings=None):
    """A run file as evaluate writes one: its sealed header (the policy's fields in its settings), then each record
    sealed with the header's key."""
    from sinklib.evaluation.records import HEADER, _sealed, config_hash

    folder.mkdir(parents=True, exist_ok=True)
    path = speed.results_path(folder.parent, folder.name, policy)
    config = {"model": {"model": folder.name}, "settings": speed.POLICIES.get(policy, {}) if settings is None else settings}
    key = config_hash(config)
    lines = [_sealed({"header": HEADER, "config_hash": key, "config": config})]
    lines += [_sealed({**r, "config_hash": key}) for r in rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_frontier_counts_accuracy_intervals_and_the_paired_test_by_hand(tmp_path):
    plain = [{"id": i, "correct": i < 6, "forwards": 28, "tokens": 28, "seconds": 1.0} for i in range(10)]
    # the cached policy loses problems 0 and 1 and gains 8: 5 right of 10
    fast = [{"id": i, "correct": (2 <= i < 6) or i == 8, "forwards": 4, "tokens": 28, "seconds": 0.2} for i in range(10)]
    _write(tmp_path / "m", "plain", plain)
    _write(tmp_path / "m", "threshold + dual cache", fast)
    timing = pd.DataFrame([{"model": "m", "policy": p, "id": i, "seconds": s, "forwards": f, "tokens": 28,
                            "settings": "{}"} for i in range(3) for p, s, f in (("plain", 2.0 + i, 28),
                                                                                  ("threshold + dual cache", 0.5, 4))])
    table = speed.frontier(tmp_path, timing).set_index("policy")
    assert list(table.index) == ["plain", "threshold + dual cache"]
    row = table.loc["threshold + dual cache"]
    assert (row["n"], row["accuracy"], row["lost"], row["gained"]) == (10, 0.5, 2, 1)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(wilson_interval(5, 10))
    assert row["mcnemar_p"] == pytest.approx(mcnemar_exact(2, 1))
    assert row["forwards_per_answer"] == 4
    assert row["seconds_per_answer"] == 0.5 and row["speedup"] == pytest.approx(3.0 / 0.5)  # medians: 3.0 vs 0.5
    assert row["tokens_per_second"] == pytest.approx(28 * 3 / 1.5)


def test_frontier_reads_a_run_file_with_its_header_as_one_run(tmp_path):
    """A run file of records format 4 starts with its header (evaluation.runner): not a problem of the frontier."""
    tiny = sinklib.load("tiny-llada")
    path = speed.results_path(tmp_path, "tiny-llada", "plain")
    sinklib.evaluate(tiny, sinklib.get_task("arithmetic", limit=3), speed.policy_settings(tiny, "plain"), batch_size=1,
                     out=path, progress=False)
    assert json.loads(path.read_text().splitlines()[0])["header"]
    row = speed.frontier(tmp_path).iloc[0]
    assert (row["model"], row["policy"], row["n"]) == ("tiny-llada", "plain", 3)


def test_the_committed_speed_runs_are_one_file_each_read_whole():
    """data/results/fast-sampling: every (model, policy) run is one file (its header, then its 200 records)."""
    from sinklib.evaluation.records import read_run
    from sinklib.paths import DATA_DIR

    store = DATA_DIR / "results" / "fast-sampling"
    table = speed.frontier(store)
    assert len(table) and set(table["n"]) == {200}
    assert not list(store.rglob("*.provenance.json")) and not list(store.rglob("*.checks.json"))
    assert all(read_run(path)[0] is not None for path in store.rglob("*.jsonl"))


def test_timing_made_for_other_jobs_is_refused_never_reused(tmp_path):
    tiny = {"tiny-llada": sinklib.load("tiny-llada")}
    task_of = {"tiny-llada": "arithmetic"}
    speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
    first = (tmp_path / speed.TIMING_FILE).read_text()
    again = speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
    assert (tmp_path / speed.TIMING_FILE).read_text() == first and len(again) == len(speed.policies_for(tiny["tiny-llada"]))
    with pytest.raises(ValueError, match="timing.csv was timed for other jobs, settings or problems"):
        speed.stored_timing(tiny, task_of, tmp_path, 2, progress=False)  # another problem count
    with pytest.raises(ValueError, match="tiny-llada / dual cache"):
        speed.stored_timing(tiny, task_of, tmp_path, 1, block_length=4, progress=False)
    assert (tmp_path / speed.TIMING_FILE).read_text() == first


def test_a_cached_steps_scores_are_put_on_the_full_steps_scale(models):
    """A cached window's scores sum over its rows only: comparable_scores rescales them to mean 1 over the keys,
    like a full step's, so sinks are found by one rule on every step."""
    llada = models["llada"]
    trace = sinklib.generate(llada, [5, 9, 2, 33], llada.settings_for(steps=4, gen_length=8, block_length=4, cache="dual"),
                             progress=False)
    means = comparable_scores(trace).nanmean(-1)
    torch.testing.assert_close(means, torch.ones_like(means), rtol=1e-4, atol=1e-4)
    assert trace.scores[1].nansum(-1).mean() == pytest.approx(4.0, rel=1e-4)  # a window of 4 query rows


def _table(model: str, runs: dict[tuple[str, int], list[bool]]) -> MaskingTable:
    items = pd.DataFrame([{"model": model, "condition": condition, "k": k, "id": f"p{i}", "correct": right,
                           "output": "", "margin": float("inf")}
                          for (condition, k), answers in runs.items() for i, right in enumerate(answers)])
    return MaskingTable(accuracy_rows(items), "arithmetic-english", items)


def test_the_sampler_and_eviction_analyses_count_changes_by_hand():
    """Notebook 08's picks and reports of Table 1 by sampler and of the eviction, on hand-made runs of 10 problems:
    each change is the masked run's accuracy minus the same sampler's unmasked one, and each difference of changes is
    computed by hand."""
    right, sinks_cost_2, sinks_cost_6 = [True] * 10, [False] * 2 + [True] * 8, [False] * 6 + [True] * 4
    plain = _table("dlm", {("sinks", 0): right, ("sinks", 1): sinks_cost_2, ("random keys", 1): right,
                           ("oldest keys", 1): right, ("oldest keys", 3): sinks_cost_2})
    fast = _table("dlm", {("sinks", 0): right, ("sinks", 1): sinks_cost_6, ("random keys", 1): right,
                          ("oldest keys", 1): right, ("oldest keys", 3): right})
    arm = _table("arm", {("sinks", 0): right, ("sinks", 1): [False] * 10, ("random keys", 1): right,
                         ("oldest keys", 1): [False] * 10, ("oldest keys", 3): [False] * 10})
    tables = {("dlm", "plain"): plain, ("dlm", "fast"): fast, ("arm", "KV cache"): arm}

    by_sampler = nb08.pick_columns_by_sampler(tables)
    reliance = nb08.report_sink_reliance_by_sampler(by_sampler, nb08.pick_sampler_differences(tables), None)
    rows = reliance.tables["masked_by_sampler"].set_index(["model", "sampler", "column"])
    assert rows.loc[("dlm", "plain", "top-1"), "change"] == pytest.approx(-0.2)
    assert rows.loc[("dlm", "fast", "top-1"), "change"] == pytest.approx(-0.6)
    difference = reliance.tables["masked_by_sampler_differences"].set_index(["model", "sampler", "column"])
    assert difference.loc[("dlm", "fast", "top-1"), "difference"] == pytest.approx(-0.4)  # 4 more lost under fast
    assert difference.loc[("dlm", "fast", "top-1"), "p"] == pytest.approx(2 / 16)  # 4 problems moved, all one way
    assert difference.loc[("dlm", "fast", "random-1"), "difference"] == 0
    assert "dlm, with its top-1 sink masked: plain 0.800" in reliance.shown.findings[0]

    columns = nb08.eviction_columns([1, 3])
    evicted = nb08.report_oldest_context_evicted(nb08.pick_columns_by_sampler(tables, columns),
                                                     nb08.pick_eviction_differences(tables, [1, 3]), None)
    rows = evicted.tables["oldest_context_evicted"].set_index(["model", "sampler", "column"])
    assert set(rows.index.get_level_values("column")) == {"unmasked", "oldest-1", "oldest-3"}  # no top-1 here
    assert rows.loc[("arm", "KV cache", "oldest-1"), "change"] == pytest.approx(-1.0)
    differences = evicted.tables["oldest_context_evicted_differences"].set_index(["model", "sampler", "column"])
    assert differences.loc[("dlm", "plain", "oldest-3"), "difference"] == pytest.approx(-0.2 - -1.0)
    assert differences.loc[("dlm", "fast", "oldest-1"), "difference"] == pytest.approx(1.0)
    assert len(differences) == 4  # two diffusion settings × two columns, each against the one autoregressive model


# --- issue 69: sinklib.speed trusts none of its inputs ---------------------------------------------------------------
ARITHMETIC = {"llada": "arithmetic", "dream": "arithmetic"}


@pytest.mark.parametrize("call, message", [
    (lambda m, out: speed.measure(m, ARITHMETIC, out, 1, policies=["dual-cache"]),
     "policies='dual-cache' is not allowed: policies must be one of ['plain', 'prefix cache', 'dual cache', "),
    (lambda m, out: speed.measure(m, ARITHMETIC, out, 1, policies=["dual-cache"]), "(did you mean 'dual cache'?)"),
    (lambda m, out: speed.measure(m, ARITHMETIC, out, 1, policies="dual cache"),
     "policies='dual cache' is not allowed: policies must be a list"),
    (lambda m, out: speed.measure(m, ARITHMETIC, out, 1, policies=["plain", "plain"]),
     "policies=['plain', 'plain'] is not allowed: policies must be a non-empty list of distinct policy names"),
    (lambda m, out: speed.time_policies(m, ARITHMETIC, 1, policies=["KV cache"]),
     "policies=['KV cache'] is not allowed: ['KV cache'] is run by none of these models; policies must name policies "
     "they run: {'llada': ['plain', "),
    (lambda m, out: speed.time_policies({"dream": m["dream"]}, ARITHMETIC, 1, policies=["prefix cache"]),
     "policies=['prefix cache'] is not allowed: ['prefix cache'] is run by none of these models"),
    (lambda m, out: speed.time_policies({}, ARITHMETIC, 1),
     "models={} is not allowed: models must be a non-empty mapping of model names to loaded models"),
    (lambda m, out: speed.time_policies(m, {"llada": "arithmetic"}, 1),
     "task_of={'llada': 'arithmetic'} is not allowed: task_of must be a mapping naming a task for every model (none "
     "for ['dream'])"),
    (lambda m, out: speed.time_policies(m, ARITHMETIC, 10**6),
     "problems=1000000 is not allowed: problems must be an integer from 1 to 600: the task 'arithmetic' of llada has "
     "600 problems"),
    (lambda m, out: speed.time_policies(m, ARITHMETIC, 0), "problems=0 is not allowed: problems must be an integer >= 1"),
    (lambda m, out: speed.stored_timing(m, ARITHMETIC, out, 1, block_length=0),
     "block_length=0 is not allowed: block_length must be an integer >= 1"),
])
def test_a_selection_that_would_run_nothing_or_crash_is_refused_before_any_generation(models, tmp_path, monkeypatch,
                                                                                      call, message):
    """A typo'd policy ran nothing and said nothing, a string was matched by substring, no matching policy ended in
    ZeroDivisionError and more problems than the task has in an IndexError: each is refused, naming the value and
    what is allowed, before anything is generated."""
    monkeypatch.setattr(speed, "generate", lambda *a, **k: pytest.fail("generated before refusing"))
    monkeypatch.setattr(speed, "evaluate", lambda *a, **k: pytest.fail("evaluated before refusing"))
    with pytest.raises(sinklib.BadValue) as caught:
        call(models, tmp_path)
    assert message in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def _runs(tmp_path):
    rows = [{"id": i, "correct": i < 2, "forwards": 4, "tokens": 4, "seconds": 0.1} for i in range(3)]
    plain = _write(tmp_path / "m", "plain", rows)
    dual = _write(tmp_path / "m", "dual cache", rows)
    return plain, dual


def _edit(path, change):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    change(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("damage, message", [
    (lambda plain, dual: dual.write_text(plain.read_text()),
     "m/dual-cache.jsonl was not run under 'dual cache' (its settings have {'cache': None}, the policy {'cache': "
     "'dual'})"),
    (lambda plain, dual: dual.write_text(dual.read_text() + dual.read_text().splitlines()[1] + "\n"),
     "m/dual-cache.jsonl: sample 0 is written twice (lines 2 and 5)"),
    (lambda plain, dual: _edit(dual, lambda lines: lines[1].update(correct=False)),
     "m/dual-cache.jsonl: line 2 was edited after it was written"),
    (lambda plain, dual: dual.write_text("".join(line + "\n" for line in dual.read_text().splitlines()[1:])),
     "m/dual-cache.jsonl: its first line is no run header"),
    (lambda plain, dual: dual.write_text(dual.read_text().splitlines()[0] + "\n"),
     "m/dual-cache.jsonl: it holds a run header and no record"),
    (lambda plain, dual: dual.with_name("dual-cashe.jsonl").write_text(dual.read_text()),
     "m/ holds ['dual-cashe.jsonl'], files of no policy"),
])
def test_the_frontier_reads_only_sealed_runs_of_their_own_policy(tmp_path, damage, message):
    """frontier read records without their digest: another policy's file, a record written twice or edited, a file
    without its header, were counted as real."""
    plain, dual = _runs(tmp_path)
    assert list(speed.frontier(tmp_path)["policy"]) == ["plain", "dual cache"]
    damage(plain, dual)
    with pytest.raises(sinklib.BadValue) as caught:
        speed.frontier(tmp_path)
    assert f"out={str(tmp_path)!r} is not allowed" in str(caught.value) or "is not allowed" in str(caught.value)
    assert message in str(caught.value)


def _timing(seconds=(2.0, 0.5)):
    return pd.DataFrame([{"model": "m", "policy": p, "id": 0, "seconds": s, "forwards": 4, "tokens": 4, "settings": "{}"}
                         for p, s in zip(("plain", "dual cache"), seconds)])


@pytest.mark.parametrize("timing, message", [
    (_timing((2.0, 0.0)), "timing.seconds=0.0 is not allowed: timing.seconds must be a finite number > 0 (a time "
                          "taken) in every row; rows that are not: 1 (m / dual cache / 0 first)"),
    (_timing((2.0, -0.5)), "timing.seconds=-0.5 is not allowed"),
    (_timing((float("nan"), 0.5)), "timing.seconds=nan is not allowed"),
    (_timing().assign(tokens=[4, -1]), "timing.tokens=-1 is not allowed: timing.tokens must be a whole number >= 0"),
    (pd.concat([_timing(), _timing()]), "timing is not allowed: problem 0 is timed more than once for m / plain"),
    (_timing().drop(columns="seconds"), "timing is not allowed: it lacks the columns ['seconds']"),
    ("timing.csv", "timing='str' is not allowed: timing must be a table of time_policies' rows"),
])
def test_timings_that_are_not_times_are_refused(tmp_path, timing, message):
    """Zero or negative seconds gave an infinite or negative speed-up."""
    _runs(tmp_path)
    with pytest.raises(sinklib.BadValue) as caught:
        speed.frontier(tmp_path, timing)
    assert message in str(caught.value)


def test_a_stored_timing_is_sealed_and_an_empty_one_is_measured_again(tmp_path, monkeypatch):
    """A hand-edited timing.csv was read back, and an empty one broke every later call."""
    tiny = {"tiny-llada": sinklib.load("tiny-llada")}
    task_of = {"tiny-llada": "arithmetic"}
    jobs = speed._jobs(tiny, None, None)
    made = pd.DataFrame([{"model": m, "policy": p, "id": "arith-0000", "seconds": 1.5, "forwards": 4, "tokens": 16,
                          "settings": speed._settings_text(s)} for (m, p), s in jobs.items()])
    monkeypatch.setattr(speed, "time_policies", lambda *a, **k: made)
    (tmp_path / speed.TIMING_FILE).write_text("")  # an empty file: no run's timing, measured and written again
    timing = speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
    assert len(timing) == len(jobs) and (tmp_path / speed.TIMING_SEAL).exists()
    path = tmp_path / speed.TIMING_FILE
    path.write_text(path.read_text().replace("1.5000", "0.0100", 1))
    with pytest.raises(sinklib.BadValue, match=r"is not allowed: its timing.csv was edited after it was written \(its "
                                               r"SHA-256 is not the one in timing.csv.sha256\)"):
        speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
    (tmp_path / speed.TIMING_SEAL).unlink()  # an unsealed file (written before the seal) is still checked row by row
    path.write_text(path.read_text().replace("0.0100", "-1.0000", 1))
    with pytest.raises(sinklib.BadValue, match=r"in its timing.csv, timing.csv.seconds=-1.0 is not allowed: "
                                               r"timing.csv.seconds must be a finite number > 0"):
        speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
    path.write_text("model,policy\n\"unclosed")
    with pytest.raises(sinklib.BadValue, match=r"its timing.csv is not a table of timings|lacks the columns"):
        speed.stored_timing(tiny, task_of, tmp_path, 1, progress=False)
