"""The resumable evaluation runner: one JSONL file per run, one line per finished sample, flushed as it goes.

The file's first line is its header record (HEADER): the run's key (run_config: what shapes its records and nothing
else) and its digest, the inputs in detail (run_inputs), the provenance of the run that made the file (versions,
machine, code: sinklib.provenance, never part of the key) and, for a Table 1 run, its checks (evaluation.checks,
write_checks). One sealed record per sample follows (record_sha256). Rerunning with the same `out` skips finished
samples; a file of another key is a clear error naming what differs, never a silent mix.

Limit: the key knows a model's weights by their files (keys.model_identity) and, where torch counts an in-place edit
of a parameter since it was made (load_state_dict, an optimiser step, an in-place op under no_grad), by their
digest (edited_state). An edit through `parameter.data`, which torch does not count, keeps the model's key: give such
a run a file of its own."""
from __future__ import annotations

import fcntl
import json
import math
import os
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm.auto import tqdm

from sinklib.ties import NEAR_TIE_MARK, closest_margin, is_near_tie, smallest_margin
from sinklib.capturing import check_intervention
from sinklib.digest import canonical, digest, text_digest
from sinklib.generation import generate
from sinklib.keys import NUMERICS_VERSION, forward_files, model_folders, model_identity
from sinklib.validation import BadValue, Consent, Count, Index, checked
from sinklib.evaluation.records import CHECKS, HEADER, RECORD_FORMAT, _read_done, _sealed, config_hash, repair_tail
from sinklib.evaluation.tasks import (Task, check_scorer, get_task, qualified_name, require_code_execution_opt_in,
                                     sandbox_module, scorer_code)
from sinklib.interventions import identity
from sinklib.provenance import describe
from sinklib.families.base import record
from sinklib.loading import LoadedModel, load


@dataclass
class EvalSummary:
    """One run's result: accuracy over its n samples (strict scoring, as a fraction), its binomial standard error,
    the flexible-scoring accuracy, and the per-sample records in task order. Shown as text, a run that decided some
    step at a near-tie is labelled "<task> ≈" (sinklib.ties): another CPU may score it differently."""
    task: str
    n: int
    accuracy: float
    stderr: float
    accuracy_flexible: float | None  # None where the task has one way of scoring (HumanEval)
    records: list[dict]

    @property
    def near_tie(self) -> bool:
        """Whether some generation decided a step by a margin another CPU could decide the other way."""
        return is_near_tie(closest_margin([r.get("margin") for r in self.records]))

    def __str__(self) -> str:
        flexible = "" if self.accuracy_flexible is None else f", flexible {self.accuracy_flexible:.3f}"
        task = f"{self.task} {NEAR_TIE_MARK}" if self.near_tie else self.task
        return f"{task}: {self.accuracy:.3f} ± {self.stderr:.3f} (n={self.n}{flexible})"


def run_config(model: LoadedModel, task: Task, intervention, seed: int, batch_size: int, settings,
               samples: list | None = None) -> dict[str, Any]:
    """What shapes a run's records, and nothing else (sinklib.keys): the model's identity (name, family, weights,
    forward-shaping files, dtype; edited_state), the task's definition, the digest of its samples (`samples`; None:
    read from the task) and its scorer's code (scorer_code), the limit, seed, batch size, intervention and settings
    (the family's settings dataclass), a code task's sandbox limits and the version of the numbers the numeric
    modules compute (keys.NUMERICS_VERSION, bumped by hand and held by the golden test: a refactor of those modules
    re-keys minutes of traces, not hours of evaluations). Its config_hash is written into every record; a header
    holds it whole. No package version, no provenance."""
    samples = task.samples() if samples is None else samples
    content = [[s.id, s.prompt, s.target, dict(s.meta)] for s in samples]
    config = {"records": RECORD_FORMAT, "model": {**_identity(model), **edited_state(model)},
              "task": {"name": task.name, "chat": task.chat, "stops": list(task.stops), "gen_length": task.gen_length,
                       "executes_code": task.executes_code},
              "samples": digest(content), "scorer": scorer_code(task), "limit": task.limit, "seed": seed,
              "batch_size": batch_size, "intervention": identity(intervention), "settings": record(settings),
              "numerics": NUMERICS_VERSION}
    if task.executes_code:
        config["sandbox"] = asdict(task.sandbox or sandbox_module().SandboxLimits())
    return json.loads(canonical(config))  # as it reads back from the file: tuples are lists


_IDENTITIES: dict[tuple, dict] = {}  # what keys.model_identity reads (by stat) → its result


def _identity(model: LoadedModel) -> dict[str, Any]:
    """keys.model_identity, computed once while what it reads is unchanged (the model's name, family, weights'
    fingerprint and dtype; each file of its folders by stat): a table's keys otherwise parse each tokenizer.json
    again for every run (seconds per table)."""
    parameter = next(iter(model.model.parameters()), None)
    files = tuple((str(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
                  for folder in model_folders(model) for path in sorted(folder.iterdir()) if path.is_file()
                  for info in (path.stat(),))
    signature = (model.name, model.family.name, model.weights, str(getattr(parameter, "dtype", None)), files)
    if signature not in _IDENTITIES:
        _IDENTITIES[signature] = model_identity(model)
    return dict(_IDENTITIES[signature])


def edited_state(model: LoadedModel) -> dict[str, str]:
    """{"state": digest of the parameters} for a model some parameter of which torch counts as edited in place since
    it was made (its tensor's version: load_state_dict, an optimiser step, an in-place op under no_grad), else {}:
    a loaded model's parameters are fresh, so its key stays machine-independent (a merged adapter's weights differ
    in their last bits between CPUs). Hashing costs about 0.4 s per 135M float32 parameters, paid only when edited."""
    parameters = list(model.model.parameters())
    if not any(parameter._version for parameter in parameters):
        return {}
    return {"state": digest([text_digest(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().data)
                             for p in parameters])}


def run_inputs(model: LoadedModel, task: Task, samples: list) -> dict[str, Any]:
    """What a run's key holds by digest, in detail, for its header and for messages: the task's file and samples,
    its loader and scorer by name, each forward-shaping file of the model by its digest (keys.forward_files)."""
    return {"task_path": task.path, "samples": len(samples), "loader": qualified_name(task.load),
            "scorer": qualified_name(task.scorer), "model_files": forward_files(model_folders(model))}


def run_header(config: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """The header record a new run file starts with: the key (config) and its digest, the inputs, and the provenance
    of the run that made it (versions, machine, code: sinklib.provenance.describe), sealed like every record."""
    made = describe(config)
    return _sealed({"header": HEADER, "config_hash": config_hash(config), "config": config, "inputs": inputs,
                    "provenance": {key: made[key] for key in ("versions", "machine", "code")}})


def write_checks(out: str | Path, checks: dict[str, Any]) -> None:
    """Put a Table 1 run's checks (evaluation.checks) into its file's header, the file rewritten whole and atomically
    while it is locked (a run writing it at the same time is refused)."""
    out = Path(out)
    results = _lock(out)
    try:
        lines = out.read_text().splitlines(keepends=True)
        header = json.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("header") != HEADER:
            raise BadValue(f"out={str(out)!r} is not allowed: it has no run header to hold the checks; out must be a "
                           "run file written by sinklib.evaluate")
        body = {key: value for key, value in header.items() if key != "record_sha256"}
        lines[0] = json.dumps(_sealed({**body, CHECKS: checks})) + "\n"
        descriptor, scratch = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
        with os.fdopen(descriptor, "w") as handle:
            handle.write("".join(lines))
        os.chmod(scratch, stat.S_IMODE(os.stat(out).st_mode))
        os.replace(scratch, out)  # atomic: an interruption leaves the old file or the new one
    finally:
        _close(results)


@dataclass
class _Results:
    """The open results file: its handle (locked for the whole run), whether this run created it and how many
    sample records it wrote there."""
    handle: Any
    path: Path
    created: bool
    records: int = 0

    def append(self, line: dict, counted: bool = True) -> None:
        """Write one record (or the header: not `counted`) as a line, on disk before the next is made."""
        self.handle.write(json.dumps(line) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.records += counted


def _lock(out: Path) -> _Results:
    """Open `out` for appending and lock it for the whole run; a second process writing it is refused at once.
    Only a regular file is ever opened: a symlink, device, FIFO or directory is refused before anything is
    written (opened without following symlinks, then checked on the open descriptor, so nothing can be swapped
    in between)."""
    _check_results_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor, created = os.open(out, flags | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        try:
            descriptor, created = os.open(out, flags), False
        except OSError as error:
            raise BadValue(f"out={str(out)!r} is not allowed: out must be a regular file ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise BadValue(f"out={str(out)!r} is not allowed: out must be a regular file, not a device, FIFO or socket")
    os.set_blocking(descriptor, True)
    handle = os.fdopen(descriptor, "a")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"out={str(out)!r} is being written by another evaluation run right now; wait for it to "
                           "finish or choose another file") from None
    return _Results(handle, out, created)


def _check_results_path(out: Path) -> None:
    """Refuse, by what is at the path now, anything but a regular file or nothing (symlinks are never followed)."""
    if not str(out).strip() or out.name in ("", ".", ".."):
        raise BadValue(f"out={str(out)!r} is not allowed: out must be the path of a results file (.jsonl)")
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise BadValue(f"out={str(out)!r} is not allowed: out must be a regular file, and it is {kind}")


def _close(results: _Results | None) -> None:
    """Release the lock. A file this run created and wrote no record to (its header at most) is removed: no file
    without results — only that file: it must still be the very file this run opened."""
    if results is None:
        return
    try:
        opened, there = os.fstat(results.handle.fileno()), os.lstat(results.path)
        if results.created and not results.records and (opened.st_dev, opened.st_ino) == (there.st_dev, there.st_ino):
            results.path.unlink()  # while the lock is held: nobody else can be writing to it
    except OSError:
        pass
    results.handle.close()


def batch_seed(seed: int, index: int) -> int:
    """The generation seed of batch `index` of a run with `seed`: distinct per batch, independent of resumes."""
    return int.from_bytes(bytes.fromhex(text_digest(f"{seed}:{index}", 14)), "little")


def _checked(model, task: "str | Task", intervention, allow_code_execution: bool, out):
    """(LoadedModel, TaskSpec, samples): every argument checked, the task file read, before any model loads
    (the numbers are checked by evaluate's declared types)."""
    if out is not None:
        _check_results_path(Path(out))
    if not isinstance(model, (str, os.PathLike, LoadedModel)):
        raise TypeError(f"model={type(model).__name__} is not allowed: pass sinklib.load(...)'s result, a zoo name, "
                        "a local folder or a hub id")
    spec = get_task(task)
    check_intervention(intervention)
    require_code_execution_opt_in(spec, allow_code_execution, "evaluate")
    samples = spec.samples()
    if not spec.executes_code:  # HumanEval's scorer runs code in a sandbox: not tried on a made-up output
        for sample in samples:  # each sample: a scorer may read a field only some samples lack
            check_scorer(spec, sample)
    if isinstance(model, (str, os.PathLike)):
        model = load(model)
    return model, spec, samples


def _open_results(out_path: Path | None, config: dict, header: Callable[[], dict]):
    """(the locked file or None, the records already finished under this configuration by id, each checked to come
    from it). A new (or empty) file gets its header first: header() makes it."""
    if out_path is None:
        return None, {}
    results = _lock(out_path)
    try:
        key = config_hash(config)
        repair_tail(out_path, key)
        done = _read_done(out_path, key, config, header)  # every record this configuration's, each whole and written once
        if out_path.stat().st_size == 0:
            results.append(header(), counted=False)
        return results, done
    except BaseException:
        _close(results)
        raise


@dataclass
class _Run:
    """One evaluation's fixed parts: what a batch needs to generate and score its samples."""

    model: LoadedModel
    spec: Any
    intervention: Any
    settings: Any  # the family's settings dataclass
    key: str  # the config_hash of its run_config
    seed: int

    def batch(self, index: int, batch: list, done: dict) -> Iterator[dict]:
        """Records of the batch's samples not yet done, each as soon as it is scored (the whole batch is
        generated, so a resumed run matches an uninterrupted one)."""
        if all(s.id in done for s in batch):
            return
        began = time.perf_counter()
        traces = generate(self.model, [s.prompt for s in batch], self.settings, seed=batch_seed(self.seed, index),
                          chat=self.spec.chat, progress=False, intervention=self.intervention, keep_scores=False)
        seconds = (time.perf_counter() - began) / len(batch)
        for sample, trace in zip(batch, traces):
            if sample.id not in done:  # those finished before an interruption were regenerated only to keep the batch whole
                yield {"id": sample.id, "prompt": sample.prompt, "target": sample.target, "output": trace.text,
                       **self._scored(trace.text, sample), "margin": smallest_margin(trace),
                       "seconds": round(seconds, 4), "forwards": trace.n_steps,
                       "tokens": trace.tokens.shape[1] - trace.prompt_len, "config_hash": self.key}


    def _scored(self, output: str, sample) -> dict:
        """The task's fields for one generated output; a scorer that fails on it (it passed check_scorer's outputs)
        is named with the sample and the output, not left as a bare error from inside it."""
        if self.spec.executes_code:  # HumanEval's judge reports the program's faults itself
            return self.spec.score(output, sample)
        try:
            return self.spec.score(output, sample)
        except Exception as error:  # noqa: BLE001  (a user's scorer may raise anything: name it)
            raise BadValue(f"task={self.spec.name!r}: its scorer {qualified_name(self.spec.scorer)} failed on the generated "
                           f"output {output!r} for sample {sample.id!r} ({type(error).__name__}: {error}); the "
                           "records before it are kept and the run resumes from them") from error


def _summary(task: str, records: list[dict]) -> EvalSummary:
    accuracy = sum(r["correct"] for r in records) / len(records)
    flexible = (sum(r["correct_flexible"] for r in records) / len(records)) if "correct_flexible" in records[0] else None
    stderr = math.sqrt(accuracy * (1 - accuracy) / max(1, len(records) - 1))
    return EvalSummary(task, len(records), accuracy, stderr, flexible, records)


@checked
def evaluate(model: LoadedModel | str, task: "str | Task", settings: Any = None, *, intervention=None,
             batch_size: Count = 8, out: str | Path | None = None, seed: Index = 0,
             progress: bool = True, allow_code_execution: Consent = False) -> EvalSummary:
    """Accuracy of `model` on `task` with its own sampler.

    Args:
        model: a LoadedModel (sinklib.load), a zoo name, a local folder or a hub id.
        task: a registered task's name, or a Task: get_task(name, path=..., limit=..., sandbox=...) for a local file
            of samples, its first `limit` samples, a code task's sandbox limits.
        settings: the family's settings dataclass; None: LoadedModel.settings_for(task), the model's own settings
            resized to the task's generation length (GSM8K's 256 tokens, HumanEval's 512, as Table 1 runs them).
        intervention: a policy applied at every forward (sinklib.interventions), e.g. MaskSinks(top_k=1).
        batch_size: prompts per generation, part of the configuration.
        out: a JSONL file: its header (the run's key, inputs and provenance: run_header), then one record per sample
            as it finishes (id, prompt, output, extracted answers, correct, margin: the generation's closest
            decision, seconds, forwards, tokens, config_hash); a rerun of the same key resumes from it. Batches
            are fixed slices of the task with a seed of their own, so an interrupted and resumed run writes the
            same records as an uninterrupted one, sampled decoding and MaskRandomKeys included.
        seed: the run's seed (each batch's own seed derives from it).
        progress: a progress bar over the samples.
        allow_code_execution: HumanEval runs the model's code: only with True (a real bool), each sample in its own
            sandboxed process (sinklib.evaluation.sandbox, loaded only then).

    Returns:
        The EvalSummary: accuracy (and flexible accuracy) as mean ± standard error over the n samples, and every
        sample's record.

    Raises:
        BadValue: an unknown task, settings of another family, a code task without allow_code_execution=True.
    """
    model, spec, samples = _checked(model, task, intervention, allow_code_execution, out)
    settings = model.settings_for(spec) if settings is None else model.runnable(settings)
    config = run_config(model, spec, intervention, seed, batch_size, settings, samples)
    run = _Run(model, spec, intervention, settings, config_hash(config), seed)
    results, done = _open_results(None if out is None else Path(out), config,
                                  lambda: run_header(config, run_inputs(model, spec, samples)))
    # Batches are fixed slices of the task, each with its own seed, so a sample's output never depends on
    # which samples an interrupted run had finished: sampled decoding and random-key masking resume exactly.
    batches = [samples[start:start + batch_size] for start in range(0, len(samples), batch_size)]
    try:
        with tqdm(total=len(samples), initial=sum(s.id in done for s in samples), desc=f"{spec.name} {model.name}",
                  disable=not progress) as bar:
            for index, batch in enumerate(batches):
                for record in run.batch(index, batch, done):
                    record = _sealed(record)
                    done[record["id"]] = record
                    if results:
                        results.append(record)
                    bar.update(1)
    finally:
        _close(results)
    return _summary(spec.name, [done[s.id] for s in samples])
