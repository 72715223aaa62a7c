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
import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from sinklib.evaluation.runner import evaluate, read_run
from sinklib.evaluation.tasks import get_task
from sinklib.families.base import record
from sinklib.generation import generate
from sinklib.stats import paired, wilson_interval
from sinklib.validation import BadValue, bad_value

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
    built (and any refused) before anything runs."""
    return {(name, policy): policy_settings(loaded, policy, block_length) for name, loaded in models.items()
            for policy in policies_for(loaded, block_length) if policies is None or policy in policies}


def measure(models: Mapping[str, Any], task_of: Mapping[str, str], out: str | Path, limit: int,
            policies: Sequence[str] | None = None, block_length: int | None = None, progress: bool = True) -> None:
    """Accuracy: evaluate every model (name → LoadedModel) under each of its policies on the first `limit` problems
    of its task (task_of[name]) into results_path(out, …), one problem at a time (sinklib.evaluation.evaluate: an
    interrupted run resumes where it stopped; records made with other settings or inputs are refused, never
    reused). Their seconds are as the machine was at the time: compare speeds with `time_policies`."""
    jobs = _jobs(models, policies, block_length)
    for (name, policy), settings in tqdm(jobs.items(), desc="policies", disable=not progress):
        path = results_path(out, name, policy)
        path.parent.mkdir(parents=True, exist_ok=True)
        evaluate(models[name], get_task(task_of[name], limit=limit), settings, batch_size=1, out=path,
                 progress=progress)


def time_policies(models: Mapping[str, Any], task_of: Mapping[str, str], problems: int,
                  policies: Sequence[str] | None = None, block_length: int | None = None,
                  progress: bool = True) -> pd.DataFrame:
    """Speed, side by side: the first `problems` problems of each model's task generated under every (model,
    policy), interleaved — problem i under all of them, in an order rotated by i, before problem i + 1 — so that
    whatever else the machine does slows every policy alike. → one row per (model, policy, problem): seconds
    (wall, generation alone), forwards, answer tokens."""
    jobs = list(_jobs(models, policies, block_length).items())
    samples = {name: get_task(task).samples()[:problems] for name, task in task_of.items() if name in models}
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


TIMING_FILE = "timing.csv"


def _settings_text(settings) -> str:
    return json.dumps(record(settings), sort_keys=True)


def stored_timing(models: Mapping[str, Any], task_of: Mapping[str, str], out: str | Path, problems: int,
                  block_length: int | None = None, progress: bool = True) -> pd.DataFrame:
    """time_policies' rows, read from out/timing.csv when it holds exactly this run's jobs — every (model, policy)
    with the same settings, on the same `problems` problems of the same tasks — else measured and written there. A
    timing.csv made from other jobs is refused naming what differs (it is another run's: never overwritten)."""
    path = Path(out) / TIMING_FILE
    wanted = {(name, policy): _settings_text(settings) for (name, policy), settings in
              _jobs(models, None, block_length).items()}
    if path.exists():
        timing = pd.read_csv(path)
        ids = {name: [s.id for s in get_task(task_of[name]).samples()[:problems]] for name in models}
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
    timing.to_csv(path, index=False, float_format="%.4f")
    return pd.read_csv(path)  # as every later run reads it


def _records(path: Path) -> list[dict]:
    """The sample records of one evaluation's file (its header, when it has one, left out: runner.read_run)."""
    return read_run(path)[1]


def frontier(out: str | Path, timing: pd.DataFrame | None = None, models: Sequence[str] | None = None) -> pd.DataFrame:
    """The speed–accuracy table of every evaluation under `out` (model/policy.jsonl): per (model, policy) the
    problems n, accuracy with its Wilson 95 % interval, the paired change against the model's plain sampler on the
    same problems (McNemar's exact p, lost and gained), forwards per answer; and from `timing` (time_policies, side
    by side) the problems timed, median seconds per answer, answer tokens per second (a diffusion answer decodes
    its whole slot, an autoregressive one stops at its end token) and the speed-up over the model's plain sampler
    (the ratio of median seconds). `models`: those models' folders, in that order (default: every folder holding a
    policy's records; others, such as Table 1's runs in out/table1, are not a model's)."""
    rows = []
    known = {results_path("", "", policy).name for policy in [*POLICIES, AUTOREGRESSIVE_POLICY]}
    folders = sorted(p for p in Path(out).iterdir() if p.is_dir() and any(f.name in known for f in p.iterdir())) \
        if models is None else [Path(out) / m for m in models]
    for folder in folders:
        order = [*POLICIES, AUTOREGRESSIVE_POLICY]
        found = {path.stem.replace("+", " + ").replace("-", " "): path for path in folder.glob("*.jsonl")}
        ranked = sorted(found, key=lambda p: (p not in order, order.index(p) if p in order else 0, p))
        runs = {policy: _records(found[policy]) for policy in ranked}
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
    if timing is None or timing.empty:
        return table
    timing = timing[timing["model"].isin(set(table["model"]))]
    speed = timing.groupby(["model", "policy"]).agg(timed=("seconds", "size"), seconds_per_answer=("seconds", "median"),
                                                    tokens=("tokens", "sum"), total=("seconds", "sum")).reset_index()
    speed["tokens_per_second"] = speed["tokens"] / speed["total"]
    plain_seconds = speed[speed["policy"] == "plain"].set_index("model")["seconds_per_answer"]
    speed["speedup"] = plain_seconds.reindex(speed["model"]).to_numpy() / speed["seconds_per_answer"]
    return table.merge(speed.drop(columns=["tokens", "total"]), on=["model", "policy"], how="left")
