"""The resumable evaluation runner: one JSON line per finished sample, flushed as it goes.

Rerunning with the same `out` skips finished samples; a file written under another configuration is a
clear error, never a silent mix."""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from tqdm.auto import tqdm

from sinklib.ties import NEAR_TIE_MARK, closest_margin, is_near_tie, smallest_margin
from sinklib.capturing import check_intervention
from sinklib.generation import generate
from sinklib.validation import BadValue, Consent, Count, Index, checked
from sinklib.evaluation.tasks import Task, get_task, qualified_name, require_code_execution_opt_in, sandbox_module
from sinklib.interventions import identity
from sinklib.provenance import as_text, describe
from sinklib.cache_manifest import MANIFEST
from sinklib.families.base import record
from sinklib.loading import LoadedModel, load
from sinklib.paths import ZOO_DIR



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


def config_hash(config: dict[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of `config` as key-sorted JSON (non-JSON values as their str)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


# 2: each record carries its record_sha256. 3: a run is keyed by every field of its settings (families.base.record)
# and the weights' SHA-256 (files of older runs resume under their own hash).
RECORD_FORMAT = 3


def run_config(model: LoadedModel, task: Task, intervention, seed: int, batch_size: int, settings) -> dict[str, Any]:
    """Everything a run's records depend on (task: the Task, its file, limit and sandbox limits included; settings:
    the family's settings dataclass the run samples with); its config_hash is written into every record."""
    config = {"records": RECORD_FORMAT, "model": model.name, "weights": model.weights,
              "family": model.family.name, "task": task.name,
              "limit": task.limit, "seed": seed, "batch_size": batch_size, "intervention": identity(intervention),
              "settings": record(settings), "task_path": task.path}
    if task.executes_code:
        config["sandbox"] = asdict(task.sandbox or sandbox_module().SandboxLimits())
    return config


# A model folder's files that shape what it computes beside its weights (which the key holds): configs, the
# adapter's config (rank, scale, target modules), tokenizer and chat template. Not its card or its README, nor its
# manifest (the hashes of those same files: cache_manifest.check_shipped holds the folder to it at every load).
SHAPING_SUFFIXES = (".json", ".jinja", ".model", ".txt")
NOT_SHAPING = ("card.json", MANIFEST)


def run_inputs(model: LoadedModel, spec: Any, samples: list) -> dict[str, Any]:
    """What shaped a run's records beyond its key (config_hash names the task and the task file only by name): the
    task's definition (chat template or not, stop strings, generation length, scorer and loader), the content of the
    samples it answers, and the SHA-256 of each file that shapes the model in its shipped folder (data/models/NAME:
    the zoo's configs and tokenizer, a twin's adapter_config.json). Recorded in the results file's provenance and
    checked before anything is resumed (check_resumable)."""
    definition = {"name": spec.name, "chat": spec.chat, "stops": list(spec.stops), "gen_length": spec.gen_length,
                  "executes_code": spec.executes_code, "scorer": qualified_name(spec.scorer), "load": qualified_name(spec.load)}
    content = json.dumps([[s.id, s.prompt, s.target, dict(s.meta)] for s in samples], sort_keys=True, default=str)
    return {"task": config_hash(definition), "samples": hashlib.sha256(content.encode()).hexdigest()[:16],
            "model_files": _model_files(model)}


def _model_files(model: LoadedModel) -> dict[str, str]:
    folder = ZOO_DIR / model.name
    if not folder.is_dir():
        return {}
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in sorted(folder.iterdir())
            if path.is_file() and path.suffix in SHAPING_SUFFIXES and path.name not in NOT_SHAPING}


def check_resumable(out: Path, digest: str, config: dict, inputs: dict) -> None:
    """Before records of `out` are resumed: its provenance must say they were made by this configuration (a
    provenance edited to claim another model or settings is refused) from these inputs (run_inputs: a task
    re-registered with other stops, an edited task file, an edited adapter config). Each refusal names what changed;
    the records are never mixed with a run of other inputs."""
    path = provenance_path(out)
    try:
        entry = json.loads(path.read_text()).get(digest) if path.is_file() else None
    except (ValueError, AttributeError) as error:
        raise BadValue(f"out={str(out)!r} is not allowed: {path.name} beside it cannot be read ({error}), so nothing "
                       "says what made its records; use a new file") from None
    if not isinstance(entry, dict):
        raise BadValue(f"out={str(out)!r} is not allowed: {path.name} beside it has no entry for configuration "
                       f"{digest}, so nothing says what made its records; use a new file")
    recorded = json.loads(as_text(entry.get("config")))
    if recorded != json.loads(as_text(config)):
        changed = sorted(k for k in set(recorded) | set(config) if recorded.get(k) != json.loads(as_text(config)).get(k))
        raise BadValue(f"out={str(out)!r} is not allowed: {path.name} says its records were made with other "
                       f"{changed} than this run's (edited, or another run's); use a new file")
    made_from = entry.get("inputs")
    if made_from is None:
        raise BadValue(f"out={str(out)!r} is not allowed: its records were made before sinklib recorded a run's "
                       "inputs (the task's definition and samples, the model's files), so they cannot be checked; "
                       "use a new file")
    changed = sorted(k for k in set(made_from) | set(inputs) if made_from.get(k) != inputs.get(k))
    if changed:
        details = []
        for key in changed:
            if key == "model_files":
                files = sorted(n for n in set(made_from.get(key, {})) | set(inputs.get(key, {}))
                               if made_from.get(key, {}).get(n) != inputs.get(key, {}).get(n))
                details.append(f"the model's files {files}")
            else:
                details.append({"task": "the task's definition (chat, stops, length, scorer or loader)",
                                "samples": "the task's samples (their file was edited or replaced)"}.get(key, key))
        raise BadValue(f"out={str(out)!r} is not allowed: its records were made from other inputs: "
                       f"{'; '.join(details)} changed since; use a new file")


def provenance_path(out: Path) -> Path:
    """The provenance file beside a results file: `out`'s name with ".provenance.json" appended."""
    return out.with_name(out.name + ".provenance.json")


def write_provenance(out: Path, digest: str, config: dict[str, Any], inputs: dict[str, Any] | None = None) -> None:
    """Beside the JSONL (whose records carry only config_hash): each hash's full config with the package versions
    and the code's identity (sinklib.provenance), so a results file says how it was made. Written when a configuration
    first writes there: a rerun that resumes it (or finds it done) leaves the file as it is, whatever code runs."""
    path = provenance_path(out)
    if os.path.lexists(path) and not path.is_file() or path.is_symlink():
        raise BadValue(f"out={str(out)!r} is not allowed: {path.name} beside it must be a regular file")
    known = json.loads(path.read_text()) if path.is_file() else {}
    if digest in known:
        return
    known[digest] = {**describe(config), **({"inputs": inputs} if inputs is not None else {})}
    descriptor, temporary = tempfile.mkstemp(prefix=path.name, suffix=".partial", dir=path.parent)  # ours, new
    with os.fdopen(descriptor, "w") as handle:
        handle.write(as_text(known) + "\n")
    os.replace(temporary, path)  # atomic: an interruption leaves the old file or the new one


def _read_done(out: Path, digest: str) -> dict[str, dict]:
    """The finished records of `out` by id. A line without its newline is an interruption's cut (repair_tail
    settles it first); a record of another configuration or an id written twice is refused, never mixed."""
    done: dict[str, dict] = {}
    lines: dict[str, int] = {}
    if not out.exists():
        return done
    for number, line in enumerate(out.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BadValue(f"out={str(out)!r} is not allowed: line {number} is not a JSON record (the file was edited "
                           "or damaged); use a new file") from None
        if not isinstance(record, dict) or record.get("config_hash") != digest:
            found = record.get("config_hash") if isinstance(record, dict) else None
            raise BadValue(f"out={str(out)!r} is not allowed: line {number} was written by another configuration "
                           f"(config_hash {found} ≠ {digest}); use a new file")
        if record.get("record_sha256") != record_digest(record):
            raise BadValue(f"out={str(out)!r} is not allowed: line {number} was edited after it was written (its "
                           "record_sha256 does not match its content); use a new file")
        if record.get("id") in done:
            raise BadValue(f"out={str(out)!r} is not allowed: sample {record['id']!r} is written twice (lines "
                           f"{lines[record['id']]} and {number}), so two runs wrote it at once; use a new file")
        done[record["id"]] = record
        lines[record["id"]] = number
    return done


def record_digest(record: dict) -> str:
    """sha256 of a record's canonical JSON without its own digest: a hand-edited record (a flipped `correct`) no
    longer matches and is refused when the file is read back."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def _sealed(record: dict) -> dict:
    return {**record, "record_sha256": record_digest(record)}


def repair_tail(out: Path, digest: str) -> None:
    """Settle a last line without its newline: a complete record of this configuration keeps its place and gets
    the newline; anything else is a line cut mid-write and is removed, so that sample runs again."""
    data = out.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        record = json.loads(data[start:])
        complete = isinstance(record, dict) and record.get("config_hash") == digest and "id" in record
    except ValueError:
        complete = False
    with os.fdopen(os.open(out, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+b") as handle:
        if complete:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")
        else:
            handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass
class _Results:
    """The open results file: its handle (locked for the whole run), and whether this run created it."""
    handle: Any
    path: Path
    created: bool


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
    """Release the lock. A file this run created and never wrote to is removed (no empty results file) — only
    that file: it must still be the very file this run opened."""
    if results is None:
        return
    try:
        opened, there = os.fstat(results.handle.fileno()), os.lstat(results.path)
        if results.created and opened.st_size == 0 and (opened.st_dev, opened.st_ino) == (there.st_dev, there.st_ino):
            results.path.unlink()  # while the lock is held: nobody else can be writing to it
    except OSError:
        pass
    results.handle.close()


def batch_seed(seed: int, index: int) -> int:
    """The generation seed of batch `index` of a run with `seed`: distinct per batch, independent of resumes."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:7], "little")


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


def check_scorer(spec: Any, sample: Any) -> None:
    """A task's scorer, tried before any generation on two outputs every scorer must take (nothing, and the
    sample's own target): it must return a mapping with a bool `correct`. A scorer that fails would otherwise fail
    after the first batch was generated."""
    for output in ("", str(sample.target)):
        try:
            scored = spec.scorer(output, sample)
        except Exception as error:  # noqa: BLE001  (a user's scorer may raise anything: name it)
            raise BadValue(f"task={spec.name!r} is not allowed: its scorer {qualified_name(spec.scorer)} fails on the output "
                           f"{output!r} for sample {sample.id!r} ({type(error).__name__}: {error})") from None
        bools = ("correct", "correct_flexible") if isinstance(scored, dict) and "correct_flexible" in scored else ("correct",)
        if not isinstance(scored, dict) or not all(isinstance(scored.get(key), bool) for key in bools):
            raise BadValue(f"task={spec.name!r} is not allowed: its scorer {qualified_name(spec.scorer)} must return a dict "
                           f"with a bool 'correct' (and, if it gives one, a bool 'correct_flexible'; bool(x) converts "
                           f"numpy's); on the output {output!r} for sample {sample.id!r} it returned {scored!r}")


def _open_results(out_path: Path | None, digest: str, config: dict, inputs: dict):
    """(locked append handle or None, records already finished under this configuration by id, each checked to
    come from this configuration and these inputs)."""
    if out_path is None:
        return None, {}
    results = _lock(out_path)
    try:
        repair_tail(out_path, digest)
        done = _read_done(out_path, digest)  # every record this configuration's, each whole and written once
        if done:  # records to resume: first what made them
            check_resumable(out_path, digest, config, inputs)
        write_provenance(out_path, digest, config, inputs)
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
    digest: str
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
                       "tokens": trace.tokens.shape[1] - trace.prompt_len, "config_hash": self.digest}


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
        intervention: a policy applied at every forward (sinklib.interventions), e.g. MaskSinks(k=1).
        batch_size: prompts per generation, part of the configuration.
        out: a JSONL file written one record per sample as it finishes (id, prompt, output, extracted answers,
            correct, margin: the generation's closest decision, seconds, forwards, tokens, config_hash); a rerun
            resumes from it. Batches are fixed slices of the task with a seed of their own, so an interrupted and
            resumed run writes the same records as an uninterrupted one, sampled decoding and MaskRandomKeys included.
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
    config = run_config(model, spec, intervention, seed, batch_size, settings)
    run = _Run(model, spec, intervention, settings, config_hash(config), seed)
    out_path = Path(out) if out is not None else None
    results, done = _open_results(out_path, run.digest, config, run_inputs(model, spec, samples) if out_path else {})
    handle = results.handle if results else None
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
                    if handle:
                        handle.write(json.dumps(record) + "\n")
                        handle.flush()
                        os.fsync(handle.fileno())
                    bar.update(1)
    finally:
        _close(results)
    return _summary(spec.name, [done[s.id] for s in samples])
