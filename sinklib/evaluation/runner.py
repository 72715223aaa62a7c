"""The resumable evaluation runner: one JSON line per finished sample, flushed as it goes.

Rerunning with the same `out` skips finished samples; a file written under another configuration is a
clear error, never a silent mix."""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import sinklib
from sinklib._checks import bad_value, check_int
from sinklib.evaluation.sandbox import SandboxLimits
from sinklib.evaluation.tasks import get_task, require_code_execution_opt_in
from sinklib.loading import LoadedModel


@dataclass
class EvalSummary:
    task: str
    n: int
    accuracy: float
    stderr: float
    accuracy_flexible: float | None  # None where the task has one way of scoring (HumanEval)
    records: list[dict]

    def __str__(self) -> str:
        flexible = "" if self.accuracy_flexible is None else f", flexible {self.accuracy_flexible:.3f}"
        return f"{self.task}: {self.accuracy:.3f} ± {self.stderr:.3f} (n={self.n}{flexible})"


def model_fingerprint(model: LoadedModel) -> str:
    """Identifies the weights: for a local checkpoint the size and first MiB of each weight file (so a retrained
    zoo model never reuses old records), for a hub checkpoint its commit."""
    source = getattr(getattr(model.model, "config", None), "_name_or_path", "") or ""
    folder = Path(source)
    if folder.is_dir():
        digest = hashlib.sha256()
        for file in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            digest.update(f"{file.name}:{file.stat().st_size}:".encode())
            with file.open("rb") as handle:
                digest.update(handle.read(2**20))
        return digest.hexdigest()[:16]
    return str(getattr(model.model.config, "_commit_hash", None) or source)


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_config(model: LoadedModel, task: str, intervention, limit: int | None, seed: int, batch_size: int,
               task_path: str | None, sandbox: SandboxLimits | None, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything a run's records depend on; its config_hash is written into every record."""
    config = {"model": model.name, "weights": model_fingerprint(model), "family": model.family.name, "task": task,
              "limit": limit, "seed": seed, "batch_size": batch_size, "intervention": repr(intervention),
              "settings": settings, "task_path": task_path}
    if get_task(task).executes_code:
        config["sandbox"] = asdict(sandbox or SandboxLimits())
    return config


def _read_done(out: Path, digest: str) -> dict[str, dict]:
    done: dict[str, dict] = {}
    if not out.exists():
        return done
    for number, line in enumerate(out.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption: that sample runs again
        if record.get("config_hash") != digest:
            raise ValueError(f"out={str(out)!r} is not allowed: line {number} was written by another configuration "
                             f"(config_hash {record.get('config_hash')} ≠ {digest}); use a new file")
        done[record["id"]] = record
    return done


def _drop_cut_line(out: Path) -> None:
    """A line an interruption cut short has no newline; remove it so that appending starts a fresh line."""
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        with out.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def batch_seed(seed: int, index: int) -> int:
    """The generation seed of batch `index` of a run with `seed`: distinct per batch, independent of resumes."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:7], "little")


def evaluate(model: LoadedModel, task: str, intervention=None, limit: int | None = None, batch_size: int = 8,
             out: str | Path | None = None, seed: int = 0, progress: bool = True, task_path: str | None = None,
             allow_code_execution: bool = False, sandbox: SandboxLimits | None = None, **settings) -> EvalSummary:
    """Accuracy of `model` on `task` with its own sampler (settings as for sinklib.generate).

    Writes one JSON line per sample to `out` as it finishes (id, prompt, output, extracted answers, correct,
    seconds, config_hash) and resumes from it: batches are fixed slices of the task with a seed of their own, so
    an interrupted and resumed run writes the same records as an uninterrupted one, sampled decoding (temperature
    > 0) and MaskRandomKeys included. batch_size is part of the configuration for that reason.
    Returns mean ± standard error over the samples.
    HumanEval runs the model's code: only with allow_code_execution=True, each sample in its own sandboxed
    process (sinklib.evaluation.sandbox; `sandbox` sets its limits)."""
    spec = get_task(task)
    if limit is not None:
        check_int(limit, "limit", 1)
    check_int(batch_size, "batch_size", 1)
    require_code_execution_opt_in(spec, allow_code_execution, "evaluate")
    samples = spec.load(task_path)[:limit]
    if spec.executes_code:
        sandbox = sandbox or SandboxLimits()
    config = run_config(model, task, intervention, limit, seed, batch_size, task_path, sandbox, settings)
    digest = config_hash(config)
    out_path = Path(out) if out is not None else None
    done = _read_done(out_path, digest) if out_path else {}
    # Batches are fixed slices of the task, each with its own seed, so a sample's output never depends on
    # which samples an interrupted run had finished: sampled decoding and random-key masking resume exactly.
    batches = [samples[start:start + batch_size] for start in range(0, len(samples), batch_size)]
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        if out_path.exists():
            _drop_cut_line(out_path)
    handle = out_path.open("a") if out_path else None
    try:
        with tqdm(total=len(samples), initial=sum(s.id in done for s in samples), desc=f"{task} {model.name}",
                  disable=not progress) as bar:
            for index, batch in enumerate(batches):
                missing = [s for s in batch if s.id not in done]
                if not missing:
                    continue
                began = time.perf_counter()
                traces = sinklib.generate(model, [s.prompt for s in batch], seed=batch_seed(seed, index), chat=spec.chat,
                                          progress=False, intervention=intervention, keep_scores=False, **settings)
                seconds = (time.perf_counter() - began) / len(batch)
                for sample, trace in zip(batch, traces):
                    if sample.id in done:
                        continue  # finished before an interruption; regenerated only to keep the batch whole
                    record = {"id": sample.id, "prompt": sample.prompt, "target": sample.target, "output": trace.text,
                              **spec.score(trace.text, sample, sandbox), "seconds": round(seconds, 4), "config_hash": digest}
                    done[sample.id] = record
                    if handle:
                        handle.write(json.dumps(record) + "\n")
                        handle.flush()
                        os.fsync(handle.fileno())
                bar.update(len(missing))
    finally:
        if handle:
            handle.close()
    records = [done[s.id] for s in samples]
    if not records:
        raise bad_value("limit", limit, "a number that leaves at least one sample")
    accuracy = sum(r["correct"] for r in records) / len(records)
    flexible = (sum(r["correct_flexible"] for r in records) / len(records)) if "correct_flexible" in records[0] else None
    stderr = math.sqrt(accuracy * (1 - accuracy) / max(1, len(records) - 1))
    return EvalSummary(task, len(records), accuracy, stderr, flexible, records)
