"""A folder of traces keyed by everything that made them, so notebooks read a generation instead of making it again.

Notebooks 01, 02, 03 and 07 analyse the same generations (each model on the first prompts of its task, its own
settings, seed + i for prompt i). Each trace is kept in `store/<model>/<key>/` (Trace.save's files), where the key is
the SHA-256 of every input that shaped it: the weights' fingerprint (LoadedModel.weights), the family and every field
of its settings, the prompt, the seed, the chat template flag, the intervention, the code of every sinklib module
generation runs (generation_code: docstrings and comments left out), and the sinklib and transformers versions. A
trace is read only under its own key, so nothing made from other inputs is ever reused; a folder whose files were
changed is refused by Trace.load (each file's SHA-256 is in its meta.json), one whose recorded key differs from its
name is refused here.

The committed store (data/results/traces/) is what lets a reader who opens a notebook get its figures in seconds, and
nbval check every notebook's analysis against its committed outputs without generating; `make figures` regenerates it
(sinklib.reproduce)."""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import itertools
import json
import os
import re
import tokenize
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

import transformers
from tqdm.auto import tqdm

from sinklib._version import __version__
from sinklib.evaluation.runner import config_hash
from sinklib.families.base import record
from sinklib.generation import generate
from sinklib.interventions import identity
from sinklib.loading import LoadedModel
from sinklib.trace import Trace
from sinklib.validation import BadValue

STORE_FORMAT = 1
PACKAGE = Path(__file__).resolve().parent


@functools.cache
def generation_code() -> str:
    """A fingerprint of the code that makes a trace: the code (code_only: no docstrings, comments or blank lines) of
    every module of generation_modules(). A code change in any of them makes every stored trace another key's, so
    no trace made by other code is read; a docstring or comment edit keys nothing anew."""
    return _module_code("sinklib.generation")


def generation_modules(module: str = "sinklib.generation") -> dict[str, Path]:
    """The sinklib modules a trace's generation runs, by name: `module` and every sinklib module it imports at
    module level, followed transitively (the capture, loading, the interventions, …), and every family (registered
    by import path in families.base, so no import statement leads to them)."""
    seen: dict[str, Path] = {}
    todo = [module, *(f"sinklib.families.{path.stem}" for path in (PACKAGE / "families").glob("*.py"))]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sinklib"):
                # `from sinklib import compat` reads compat, not the package's __init__ (which imports everything)
                todo += [node.module] if node.module != "sinklib" else []
                todo += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("sinklib.")]
    return seen


def _module_file(name: str) -> Path | None:
    """The source file of a sinklib module or package (None for a name that is not one, e.g. an imported function)."""
    parts = name.split(".")[1:]
    if not parts:
        return None
    for candidate in (PACKAGE.joinpath(*parts[:-1], parts[-1] + ".py"), PACKAGE.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def trace_key(loaded: LoadedModel, prompt: str, settings: Any, seed: int, chat: bool, intervention=None) -> dict:
    """Every input a trace depends on (a JSON-able dict): what its folder's name is the hash of."""
    return {"store": STORE_FORMAT, "model": loaded.name, "weights": loaded.weights,
            "family": loaded.family.name, "settings": record(settings), "prompt": prompt, "seed": seed, "chat": chat,
            "intervention": identity(intervention) if intervention is not None else None,
            "sinklib": __version__, "code": generation_code(), "transformers": transformers.__version__}


def _canonical(key: Any) -> str:
    """`key` as key-sorted JSON (a tuple and a list of the same items are the same key, as when read back)."""
    return json.dumps(key, sort_keys=True, default=str)


def trace_folder(store: str | Path, key: dict) -> Path:
    """Where the trace of `key` lives in `store`: <model name, made a folder name>/<evaluation.runner.config_hash of the key>."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", str(key["model"]).strip("/")) or "model"
    return Path(store) / model / config_hash(key)


def stored_traces(loaded: LoadedModel, texts: Sequence[str], store: str | Path, seed: int = 0, intervention=None,
                  progress: bool = True, settings=None) -> list[Trace]:
    """One trace per prompt as sinklib.generation.collect_traces makes them (prompt i with seed + i, the model's own
    prompt style, `settings` default loaded.settings_for()), each read from `store` when a trace of the same inputs is
    there (trace_key) and otherwise generated and saved there as it finishes."""
    settings = loaded.settings_for() if settings is None else loaded.runnable(settings)
    chat = loaded.chat
    traces = []
    made = 0
    with tqdm(total=len(texts), desc=f"traces {loaded.name}", disable=not progress) as bar:
        for index, text in enumerate(texts):
            key = trace_key(loaded, text, settings, seed + index, chat, intervention)
            folder = trace_folder(store, key)
            if (folder / "meta.json").exists():
                traces.append(_read(folder, key))
            else:
                trace = generate(loaded, text, settings, seed=seed + index, chat=chat, progress=False,
                                 intervention=intervention)
                trace.meta["store_key"] = key
                trace.save(folder)
                traces.append(trace)
                made += 1
            bar.update(1)
        bar.set_postfix_str(f"{len(texts) - made} read, {made} generated")
    return traces


def _read(folder: Path, key: dict) -> Trace:
    """The stored trace, refused if the key it records is not the one its folder is named by."""
    trace = Trace.load(folder)
    if _canonical(trace.meta.get("store_key")) != _canonical(key):
        raise BadValue(f"store={str(folder.parent.parent)!r} is not allowed: {folder.relative_to(folder.parent.parent)} "
                       f"holds a trace of other inputs (its store_key is {trace.meta.get('store_key')!r}, its name "
                       f"says {key!r}); delete that folder to generate it again")
    return trace


def stored_measurement(store: str | Path | None, trace: Trace, what: str, params: dict, module: str,
                       measure: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A measurement of one stored trace that costs forwards (the logit lens: one forward and a softmax over the
    vocabulary per step and layer), kept beside the trace as measured/<what>-<key>.parquet, the key the hash of
    `params`, `what` and the code of `module` (generation_modules(module): the module computing it and everything it
    imports). Read back when it is there; otherwise `measure()` and write it. With `store` None, or a trace that is
    not from a store (no store_key in its meta), it is measured and not kept."""
    key = trace.meta.get("store_key")
    if store is None or key is None:
        return measure()
    digest = config_hash({"what": what, "params": params, "code": _module_code(module)})
    path = trace_folder(store, key) / "measured" / f"{what}-{digest}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    frame = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # written whole, then moved into place
    frame.to_parquet(partial)
    os.replace(partial, path)
    return frame


@functools.cache
def _module_code(module: str) -> str:
    digest = hashlib.sha256()
    for name, path in sorted(generation_modules(module).items()):
        digest.update(f"{name}\n{code_only(path.read_text(encoding='utf-8'))}".encode())
    return digest.hexdigest()[:16]


def code_only(source: str) -> str:
    """`source` without what cannot change what it computes: docstrings (of the module, its classes and functions),
    comments, trailing spaces and blank lines (outside a string that spans lines, whose lines are its value). So a
    docstring or comment edit leaves every key as it was, and any other edit (a constant, an operator, a name, a
    string that is not a docstring) changes it.

    Cut by the positions ast and tokenize give, not by re-joining tokens: the text of what is kept is the source's
    own, the same whichever Python tokenises it (3.12 splits f-strings into several tokens, 3.11 keeps one)."""
    source = source.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not code (and ast refuses it)
    lines = io.StringIO(source).readlines()  # lines as Python counts them: ended by a newline only, not a form feed
    starts = list(itertools.accumulate(map(len, lines), initial=0))

    def at(row: int, column: int) -> int:  # tokenize's position (1-based line, 0-based column in characters)
        return starts[row - 1] + column

    def at_byte(row: int, column: int) -> int:  # ast's position: its column counts UTF-8 bytes
        return at(row, len(lines[row - 1].encode("utf-8")[:column].decode("utf-8")))

    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    docstrings = {(at_byte(node.lineno, node.col_offset), at_byte(node.end_lineno, node.end_col_offset))
                  for node in _docstrings(ast.parse(source))}
    kept = [True] * len(source)
    for start, end in [*docstrings, *((at(*t.start), at(*t.end)) for t in tokens if t.type == tokenize.COMMENT)]:
        kept[start:end] = [False] * (end - start)
    verbatim = {row for t in tokens if t.type == tokenize.STRING and (at(*t.start), at(*t.end)) not in docstrings
                for row in range(t.start[0], t.end[0])}  # the rows a string runs on past their end
    code = ("".join(char for char, keep in zip(line, kept[starts[row]:starts[row + 1]]) if keep).rstrip("\n")
            for row, line in enumerate(lines))
    return "\n".join(text if row + 1 in verbatim else text.rstrip()
                     for row, text in enumerate(code) if row + 1 in verbatim or text.strip())


def _docstrings(tree: ast.Module) -> list[ast.expr]:
    """The docstring expressions of a module and of every class and function in it (a first statement that is a
    string constant)."""
    owners = [tree, *(node for node in ast.walk(tree)
                      if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    return [owner.body[0].value for owner in owners
            if owner.body and isinstance(owner.body[0], ast.Expr) and isinstance(owner.body[0].value, ast.Constant)
            and isinstance(owner.body[0].value.value, str)]
