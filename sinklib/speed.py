"""Sinks for speed: the cached and parallel samplers (families.cached) measured against each model's plain sampler
and against the autoregressive twin with its KV cache — the paper's §7 question, on the twins.

A *policy* is a named set of sampler settings laid over a model's own (LoadedModel.settings_for): "plain" (the
model's own sampler), Fast-dLLM's "prefix cache" / "dual cache", the confidence "threshold", their mixes, and the dual
cache with this project's sink-anchored refresh (families.cached). Each
(model, policy) is one resumable evaluation (sinklib.evaluation.evaluate, one problem at a time so that its seconds
are one answer's), and `frontier` turns their records into the speed–accuracy table: accuracy with its Wilson 95 %
interval, McNemar's exact test against the model's plain sampler on the same problems, seconds and forwards per
answer, answer tokens per second.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence

import pandas as pd
from pydantic import AfterValidator, BeforeValidator
from tqdm.auto import tqdm

from sinklib.digest import text_digest
from sinklib.evaluation.records import read_sealed_run
from sinklib.evaluation.runner import evaluate
from sinklib.evaluation.tasks import get_task
from sinklib.families.base import record
from sinklib.generation import generate
from sinklib.stats import paired, wilson_interval
from sinklib.validation import Allowed, BadValue, Count, ModelNames, bad_value, checked, did_you_mean

THRESHOLD = 0.9  # Fast-dLLM's default confidence threshold
# the sink-anchored refresh's bound on a share drift, chosen on the diffusion twin's held-out problems 200-202 (outside
# the first 200 every policy is evaluated on): there the most-attended key's share drifts by about 0.04-0.11 over an
# answer, so 0.1 refreshes about twice
REFRESH = 0.1

# policy → the settings it lays over a diffusion model's own
POLICIES: dict[str, dict[str, Any]] = {
    "plain": {},
    "prefix cache": {"cache": "prefix"},
    "dual cache": {"cache": "dual"},
    "threshold": {"threshold": THRESHOLD},
    "threshold + prefix cache": {"threshold": THRESHOLD, "cache": "prefix"},
    "threshold + dual cache": {"threshold": THRESHOLD, "cache": "dual"},
    "dual cache + sink refresh": {"cache": "dual", "refresh": REFRESH},
    "threshold + dual cache + sink refresh": {"threshold": THRESHOLD, "cache": "dual", "refresh": REFRESH},
}
AUTOREGRESSIVE_POLICY = "KV cache"  # what an autoregressive model always runs
# the fields a policy lays over a model's settings: a run file's header says which policy made it by them
POLICY_FIELDS = ("cache", "threshold", "refresh")


def _policy_name(value: Any) -> str:
    """A policy by its registered name (POLICIES, AUTOREGRESSIVE_POLICY), with a "did you mean" for a typo."""
    names = [*POLICIES, AUTOREGRESSIVE_POLICY]
    if not isinstance(value, str) or value not in names:
        raise ValueError(Allowed(f"one of {names}{did_you_mean(value, names)}"))
    return value


def _distinct_policies(values: list[str]) -> list[str]:
    if not values or len(set(values)) != len(values):
        raise ValueError(Allowed("a non-empty list of distinct policy names"))
    return values


Policy = Annotated[str, BeforeValidator(_policy_name)]  # a policy by its registered name
Policies = Annotated[list[Policy], AfterValidator(_distinct_policies)]  # a list: a str is not matched by substring


def policy_settings(loaded, policy: str, block_length: int | None = None):
    """The settings `loaded` samples with under `policy`: its own settings with the policy's fields laid over them.
    Every policy but "plain" runs blocks: `block_length` if given, else the model's own blocks, else (Dream's
    whole-answer sampler) one block of the whole answer, as Fast-dLLM's default block of 32 is for answers this
    short; a Dream-family threshold ranks by top probability (alg="maskgit_plus", upstream's confidence_threshold)."""
    own = loaded.settings_for()
    if not loaded.family.is_diffusion:
        if policy != AUTOREGRESSIVE_POLICY:
            raise bad_value("policy", policy, f"{AUTOREGRESSIVE_POLICY!r} for the autoregressive {loaded.name}")
        return own
    if policy not in POLICIES:
        raise bad_value("policy", policy, f"one of {sorted(POLICIES)}")
    if policy == "plain":
        return own
    changes = dict(POLICIES[policy])
    changes["block_length"] = block_length or own.block_length or own.gen_length
    if "threshold" in changes and "alg" in {f.name for f in dataclasses.fields(own)}:
        changes["alg"] = "maskgit_plus"
    return loaded.settings_for(**changes)


def policies_for(loaded, block_length: int | None = None) -> list[str]:
    """The policies a model runs: the KV cache for an autoregressive model; for a diffusion model every policy,
    without the caches on a model that runs its own code, and without the prefix cache where the answer is one block
    (its window, the block and everything after it, is then the dual cache's)."""
    if not loaded.family.is_diffusion:
        return [AUTOREGRESSIVE_POLICY]
    one_block = policy_settings(loaded, "dual cache", block_length).block_length == loaded.settings_for().gen_length
    return [p for p in POLICIES if "cache" not in POLICIES[p] or
            (loaded.calling == "native" and not (one_block and POLICIES[p]["cache"] == "prefix"))]


def results_path(out: str | Path, model: str, policy: str) -> Path:
    """Where one (model, policy) evaluation writes its records."""
    return Path(out) / model / f"{policy.replace(' + ', '+').replace(' ', '-')}.jsonl"


def _jobs(models: Mapping[str, Any], policies: Sequence[str] | None, block_length: int | None) -> dict:
    """(model, policy) → its settings, for every model's policies (policies_for, or those of them named), all
    built (and any refused) before anything runs. A model without a task, or a named policy none of the models runs
    (it would run nothing, and say nothing), is refused."""
    if not isinstance(models, Mapping) or not models:
        raise bad_value("models", models, "a non-empty mapping of model names to loaded models (sinklib.load)")
    runs = {name: policies_for(loaded, block_length) for name, loaded in models.items()}
    if policies is not None:
        unrun = [policy for policy in policies if not any(policy in own for own in runs.values())]
        if unrun:
            raise BadValue(f"policies={list(policies)!r} is not allowed: {unrun} {'is' if len(unrun) == 1 else 'are'} "
                           f"run by none of these models; policies must name policies they run: {runs}")
    return {(name, policy): policy_settings(models[name], policy, block_length) for name, own in runs.items()
            for policy in own if policies is None or policy in policies}


def _check_tasks(models: Mapping[str, Any], task_of: Mapping[str, str]) -> None:
    missing = [name for name in models if name not in task_of]
    if missing:
        raise bad_value("task_of", task_of, f"a mapping naming a task for every model (none for {missing})")


@checked
def measure(models: Mapping[str, Any], task_of: Mapping[str, str], out: str | Path, limit: Count,
            policies: Policies | None = None, block_length: Count | None = None, progress: bool = True) -> None:
    """Accuracy: evaluate every model (name → LoadedModel) under each of its policies on the first `limit` problems
    of its task (task_of[name]) into results_path(out, …), one problem at a time (sinklib.evaluation.evaluate: an
    interrupted run resumes where it stopped; records made with other settings or inputs are refused, never
    reused). Their seconds are as the machine was at the time: compare speeds with `time_policies`. `policies`: a
    list of registered policy names (default: every policy of each model), each run by at least one of the models."""
    _check_tasks(models, task_of)
    jobs = _jobs(models, policies, block_length)
    for (name, policy), settings in tqdm(jobs.items(), desc="policies", disable=not progress):
        path = results_path(out, name, policy)
        path.parent.mkdir(parents=True, exist_ok=True)
        evaluate(models[name], get_task(task_of[name], limit=limit), settings, batch_size=1, out=path,
                 progress=progress)


@checked
def time_policies(models: Mapping[str, Any], task_of: Mapping[str, str], problems: Count,
                  policies: Policies | None = None, block_length: Count | None = None,
                  progress: bool = True) -> pd.DataFrame:
    """Speed, side by side: the first `problems` problems of each model's task generated under every (model,
    policy), interleaved — problem i under all of them, in an order rotated by i, before problem i + 1 — so that
    whatever else the machine does slows every policy alike. → one row per (model, policy, problem): seconds
    (wall, generation alone), forwards, answer tokens. `problems`: at most the smallest task's problem count."""
    _check_tasks(models, task_of)
    jobs = list(_jobs(models, policies, block_length).items())
    samples = _timed_samples(models, task_of, problems)
    rows = []
    for index in tqdm(range(problems), desc="timing", disable=not progress):
        for (name, policy), settings in jobs[index % len(jobs):] + jobs[:index % len(jobs)]:
            loaded, sample = models[name], samples[name][index]
            began = time.perf_counter()
            trace = generate(loaded, sample.prompt, settings, progress=False, keep_scores=False)
            rows.append({"model": name, "policy": policy, "id": sample.id, "seconds": time.perf_counter() - began,
                         "forwards": trace.n_steps, "tokens": trace.tokens.shape[1] - trace.prompt_len,
                         "settings": _settings_text(settings)})
    return pd.DataFrame(rows)


def _timed_samples(models: Mapping[str, Any], task_of: Mapping[str, str], problems: int) -> dict[str, list]:
    """Each model's first `problems` problems of its task; more than a task has is refused naming it."""
    samples = {name: get_task(task_of[name]).samples() for name in models}
    for name, own in samples.items():
        if problems > len(own):
            raise bad_value("problems", problems, f"an integer from 1 to {len(own)}: the task {task_of[name]!r} of "
                            f"{name} has {len(own)} problems")
    return {name: own[:problems] for name, own in samples.items()}


TIMING_FILE = "timing.csv"
TIMING_SEAL = "timing.csv.sha256"  # beside timing.csv: the SHA-256 of its bytes as written (a hand edit no longer matches)
TIMING_COLUMNS = ("model", "policy", "id", "seconds", "forwards", "tokens", "settings")


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (as a message shows it)."""
    return value.item() if hasattr(value, "item") else value


def check_timing(timing: Any, param: str = "timing") -> pd.DataFrame:
    """`timing` when it is time_policies' table: its columns, each (model, policy, problem) once, seconds finite
    and > 0 (a zero or negative time would make an infinite or negative speed-up), forwards and tokens whole
    numbers >= 0; anything else is refused naming what is wrong."""
    if not isinstance(timing, pd.DataFrame):
        raise bad_value(param, type(timing).__name__, "a table of time_policies' rows (a pandas DataFrame)")
    missing = [column for column in TIMING_COLUMNS if column not in timing.columns]
    if missing:
        raise BadValue(f"{param} is not allowed: it lacks the columns {missing}; {param} must have time_policies' "
                       f"columns {list(TIMING_COLUMNS)}")
    seconds = pd.to_numeric(timing["seconds"], errors="coerce")
    bad = timing[~(seconds.apply(lambda x: math.isfinite(x) and x > 0))]
    if len(bad):
        row = bad.iloc[0]
        raise bad_value(f"{param}.seconds", _plain(row["seconds"]), f"a finite number > 0 (a time taken) in every row; "
                        f"rows that are not: {len(bad)} ({row['model']} / {row['policy']} / {_plain(row['id'])} first)")
    for column in ("forwards", "tokens"):
        values = pd.to_numeric(timing[column], errors="coerce")
        bad = timing[~values.apply(lambda x: math.isfinite(x) and x >= 0 and float(x).is_integer())]
        if len(bad):
            raise bad_value(f"{param}.{column}", _plain(bad.iloc[0][column]), "a whole number >= 0 in every row")
    twice = timing[timing.duplicated(["model", "policy", "id"])]
    if len(twice):
        row = twice.iloc[0]
        raise BadValue(f"{param} is not allowed: problem {_plain(row['id'])!r} is timed more than once for {row['model']} / "
                       f"{row['policy']}; {param} must time each (model, policy, problem) once")
    return timing


def _read_timing(out: str | Path, path: Path) -> pd.DataFrame:
    """timing.csv as written: its seal (TIMING_SEAL), when there is one, must match its bytes; its rows check_timing's."""
    data = path.read_bytes()
    seal = path.with_name(TIMING_SEAL)
    if seal.exists() and seal.read_text().strip() != text_digest(data, None):
        raise BadValue(f"out={str(out)!r} is not allowed: its {TIMING_FILE} was edited after it was written (its "
                       f"SHA-256 is not the one in {TIMING_SEAL}); time into a new folder or remove both files")
    try:
        timing = pd.read_csv(io.BytesIO(data))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise BadValue(f"out={str(out)!r} is not allowed: its {TIMING_FILE} is not a table of timings "
                       f"({type(error).__name__}); time into a new folder or remove that file") from None
    try:
        return check_timing(timing, TIMING_FILE)
    except BadValue as error:
        raise BadValue(f"out={str(out)!r} is not allowed: in its {TIMING_FILE}, {error}; time into a new folder or "
                       "remove that file") from None


def _write_timing(timing: pd.DataFrame, path: Path) -> None:
    """timing.csv and its seal, each written whole (atomically): an interrupted write leaves no half a file."""
    data = timing.to_csv(index=False, float_format="%.4f").encode()
    for target, content in ((path, data), (path.with_name(TIMING_SEAL), (text_digest(data, None) + "\n").encode())):
        descriptor, scratch = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
        os.replace(scratch, target)


def _settings_text(settings) -> str:
    return json.dumps(record(settings), sort_keys=True)


@checked
def stored_timing(models: Mapping[str, Any], task_of: Mapping[str, str], out: str | Path, problems: Count,
                  block_length: Count | None = None, progress: bool = True) -> pd.DataFrame:
    """time_policies' rows, read from out/timing.csv when it holds exactly this run's jobs — every (model, policy)
    with the same settings, on the same `problems` problems of the same tasks — else measured and written there. A
    timing.csv made from other jobs is refused naming what differs (it is another run's: never overwritten), and so
    is one edited after it was written (its seal, TIMING_SEAL, no longer matches) or whose rows are not timings
    (check_timing). An empty timing.csv holds no run's timing: it is measured and written again."""
    _check_tasks(models, task_of)
    path = Path(out) / TIMING_FILE
    wanted = {(name, policy): _settings_text(settings) for (name, policy), settings in
              _jobs(models, None, block_length).items()}
    if path.exists() and path.stat().st_size > 0:
        timing = _read_timing(out, path)
        ids = {name: [s.id for s in own] for name, own in _timed_samples(models, task_of, problems).items()}
        found = {(m, p): rows for (m, p), rows in timing.groupby(["model", "policy"], sort=False)}
        differs = sorted(f"{m} / {p}" for (m, p) in wanted.keys() | found.keys()
                         if (m, p) not in found or (m, p) not in wanted
                         or set(found[m, p]["settings"]) != {wanted[m, p]}
                         or list(found[m, p]["id"].astype(str)) != [str(i) for i in ids[m]])
        if differs:
            raise BadValue(f"out={str(out)!r} is not allowed: its {TIMING_FILE} was timed for other jobs, settings or "
                           f"problems ({', '.join(differs[:4])}); time into a new folder or remove that file")
        return timing
    timing = time_policies(models, task_of, problems, block_length=block_length, progress=progress)
    Path(out).mkdir(parents=True, exist_ok=True)
    _write_timing(timing, path)
    return _read_timing(out, path)  # as every later run reads it


def _records(out: str | Path, path: Path, policy: str) -> list[dict]:
    """The sample records of one (model, policy) evaluation's file, checked as evaluate checks it
    (records.read_sealed_run: its header, every record sealed, of the header's key and written once), and made under
    the policy its name says (the header's settings carry that policy's fields): another policy's file copied in,
    an edited or doubled record, a file without its header are refused."""
    try:
        header, records = read_sealed_run(path)
    except BadValue as error:
        reason = str(error).split(" is not allowed: ", 1)[-1]
        raise BadValue(f"out={str(out)!r} is not allowed: {path.relative_to(out)}: {reason}") from None
    settings = header["config"].get("settings") or {}
    laid = POLICIES.get(policy, {})
    differs = {field: settings.get(field) for field in POLICY_FIELDS if settings.get(field) != laid.get(field)}
    if differs:
        raise BadValue(f"out={str(out)!r} is not allowed: {path.relative_to(out)} was not run under {policy!r} (its "
                       f"settings have {differs}, the policy {({f: laid.get(f) for f in differs})}); each file must "
                       "hold its own policy's run")
    return records


def _folder_runs(out: str | Path, folder: Path) -> dict[str, list[dict]]:
    """policy → its records (_records), in POLICIES' order, for one model's folder: a file of no policy, or a folder
    without any policy's run, is refused."""
    order = [*POLICIES, AUTOREGRESSIVE_POLICY]
    found = {path.stem.replace("+", " + ").replace("-", " "): path for path in folder.glob("*.jsonl")}
    strangers = sorted(found[policy].name for policy in found if policy not in order)
    if strangers:
        raise BadValue(f"out={str(out)!r} is not allowed: {folder.name}/ holds {strangers}, files of no policy; a "
                       f"model's folder holds only its policies' runs ({[results_path('', '', p).name for p in order]})")
    runs = {policy: _records(out, found[policy], policy) for policy in order if policy in found}
    if not runs:
        raise BadValue(f"models={[folder.name]!r} is not allowed: {folder} holds no policy's run; models must name "
                       f"folders of {str(out)!r} that do")
    return runs


@checked
def frontier(out: str | Path, timing: pd.DataFrame | None = None, models: ModelNames | None = None) -> pd.DataFrame:
    """The speed–accuracy table of every evaluation under `out` (model/policy.jsonl): per (model, policy) the
    problems n, accuracy with its Wilson 95 % interval, the paired change against the model's plain sampler on the
    same problems (McNemar's exact p, lost and gained), forwards per answer; and from `timing` (time_policies, side
    by side) the problems timed, median seconds per answer, answer tokens per second (a diffusion answer decodes
    its whole slot, an autoregressive one stops at its end token) and the speed-up over the model's plain sampler
    (the ratio of median seconds). `models`: those models' folders, in that order (default: every folder holding a
    policy's records; others, such as Table 1's runs in out/table1, are not a model's)."""
    if not Path(out).is_dir():
        raise bad_value("out", str(out), "a folder of model folders holding policies' runs (measure's out)")
    rows = []
    known = {results_path("", "", policy).name for policy in [*POLICIES, AUTOREGRESSIVE_POLICY]}
    folders = sorted(p for p in Path(out).iterdir() if p.is_dir() and any(f.name in known for f in p.iterdir())) \
        if models is None else [Path(out) / m for m in models]
    for folder in folders:
        runs = _folder_runs(out, folder)
        plain = {r["id"]: r for r in runs.get("plain", [])}
        for policy, records in runs.items():
            right = sum(bool(r["correct"]) for r in records)
            low, high = wilson_interval(right, len(records))
            row = {"model": folder.name, "policy": policy, "n": len(records), "accuracy": right / len(records),
                   "ci_low": low, "ci_high": high,
                   "forwards_per_answer": sum(r["forwards"] for r in records) / len(records)}
            shared = [r for r in records if r["id"] in plain]
            if plain and policy != "plain" and shared:
                test = paired([bool(plain[r["id"]]["correct"]) for r in shared], [bool(r["correct"]) for r in shared])
                row.update(lost=test.lost, gained=test.gained, mcnemar_p=test.p)
            rows.append(row)
    table = pd.DataFrame(rows)
    if timing is None:
        return table
    check_timing(timing)
    if timing.empty:
        return table
    timing = timing[timing["model"].isin(set(table["model"]))]
    speed = timing.groupby(["model", "policy"]).agg(timed=("seconds", "size"), seconds_per_answer=("seconds", "median"),
                                                    tokens=("tokens", "sum"), total=("seconds", "sum")).reset_index()
    speed["tokens_per_second"] = speed["tokens"] / speed["total"]
    plain_seconds = speed[speed["policy"] == "plain"].set_index("model")["seconds_per_answer"]
    speed["speedup"] = plain_seconds.reindex(speed["model"]).to_numpy() / speed["seconds_per_answer"]
    return table.merge(speed.drop(columns=["tokens", "total"]), on=["model", "policy"], how="left")
