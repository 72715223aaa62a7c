"""What a stored result's key holds: what shapes its numbers, and nothing else.

A trace, an evaluation record, a measurement or a notebook's pick is found again only under the digest
(sinklib.digest) of every input that shaped it:

- the model (model_identity): its name, family, the weights' fingerprint, every file that shapes its forward
  (configs, the adapter's config, tokenizer and chat template: forward_files) and the dtype it computes in;
- what was asked of it: every setting, the prompt, the seed, the chat flag, the intervention (each store adds these);
- the code that computes the numbers (numerics_code): the sampler and the families, the capture, the attention
  maths, the interventions, the sink rule and the decision margins: their definitions, each reduced to its code
  (digest.code_only), whichever numeric module holds it; of the families, only the model's own (numerics_code).

It does not hold what cannot change a number: sinklib's version, the transformers version (the lock pins it, and each
result's provenance records it: `make check` reports a difference), messages, validation, caching and loading
plumbing. A change of numbers that no key sees (a library release, a module outside NUMERIC_MODULES) is caught by the
golden test (tests/parity/test_golden.py), which makes one stored result of each kind again and compares."""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import textwrap
import types
from pathlib import Path
from typing import Any, Callable, Iterable

from sinklib import named
from sinklib.families.base import get_family
from sinklib.digest import code_digest, digest, file_sha256

PACKAGE = Path(__file__).resolve().parent

# The version of the numbers the numeric modules compute, for the results that take hours to make again (the Table 1
# and speed evaluations): bumped by hand when a change of NUMERIC_MODULES changes what they compute, so that a refactor
# there (which re-keys the traces: minutes) does not re-key hours of evaluation. The golden test
# (tests/parity/test_golden.py) makes committed records of each kind again and fails when their numbers moved while
# this did not.
NUMERICS_VERSION = 1
# The modules whose code computes a trace's or a record's numbers (a package: every module in it). A refactor of any
# other module (validation, loading, caching, the notebooks' layer) keys nothing anew.
NUMERIC_MODULES = ("sinklib.generation", "sinklib.families", "sinklib.capturing", "sinklib.attention_math",
                   "sinklib.key_masking", "sinklib.interventions", "sinklib.sinks", "sinklib.ties")

# A model folder's files that shape what it computes beside its weights: configs, the adapter's config (rank, scale,
# target modules), tokenizer and chat template. Not its card, README or manifest (the hashes of those same files).
SHAPING_SUFFIXES = (".json", ".jinja", ".model", ".txt")
NOT_SHAPING = ("card.json", "sinklib-manifest.json", "README.md", "sinklib-source.txt")
# what save_pretrained writes into a config that computes nothing: the library version that wrote it, the folder
VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path", "name_or_path")


def module_files(names: Iterable[str]) -> dict[str, Path]:
    """The source files of sinklib modules and packages by dotted name (a package: each of its modules)."""
    files: dict[str, Path] = {}
    for name in names:
        parts = name.split(".")[1:]
        package = PACKAGE.joinpath(*parts)
        if package.is_dir():
            files.update({f"{name}.{path.stem}": path for path in sorted(package.glob("*.py"))})
        elif package.with_suffix(".py").is_file():
            files[name] = package.with_suffix(".py")
        else:
            raise ValueError(f"names={list(names)!r} is not allowed: {name!r} is no sinklib module or package")
    return files


@functools.cache
def code_of(names: tuple[str, ...]) -> str:
    """The fingerprint (16 hex digits) of the code of `names` (module_files): docstrings and comments left out."""
    return code_digest((name, path.read_text(encoding="utf-8")) for name, path in module_files(names).items())


# definitions in NUMERIC_MODULES that compute nothing: the families' registry of import paths (a family added beside
# the others shapes none of their numbers)
NOT_NUMERIC = ("assign FAMILIES",)


@functools.cache
def numerics_code(family: str | None = None) -> str:
    """The fingerprint of the code that computes a trace's or a record's numbers: every definition in
    NUMERIC_MODULES (definitions), whichever of them holds it. So moving a function, class or constant from one
    numeric module to another (a module split in two, say) keys nothing anew; editing one does.

    Args:
        family: a registered family's name: of sinklib.families, only the module that defines its sampler and the
            family modules that module imports (base, cached) — another family's sampler shapes none of its numbers.
            None: every numeric module (what provenance records).
    """
    files = module_files(NUMERIC_MODULES)
    if family is not None:
        own = _family_modules(family)
        files = {name: path for name, path in files.items() if not name.startswith("sinklib.families.") or name in own}
    return code_digest(part for path in files.values() for part in definitions(path.read_text(encoding="utf-8"))
                       if part[0] not in NOT_NUMERIC)


def _family_modules(family: str) -> set[str]:
    """The sinklib.families modules a family's numbers come from: its sampler's module and, followed through their
    imports, every family module they read."""
    found, todo = set(), [get_family(family).sample.__module__]
    while todo:
        name = todo.pop()
        if name in found or not name.startswith("sinklib.families"):
            continue
        found.add(name)
        module = importlib.import_module(name)
        todo += [value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "")
                 for value in vars(module).values()]
    return found


def definitions(source: str) -> list[tuple[str, str]]:
    """A module's top-level statements as (name, source) pairs, without its imports, `__all__` and docstring: a
    function or class by `def`/`class` and its name (decorators included), an assignment by the names it binds,
    any other statement by its own text. The module that holds them is no part of a pair."""
    tree = ast.parse(source.removeprefix("\ufeff"))
    lines = source.removeprefix("\ufeff").splitlines(keepends=True)
    pairs = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_docstring(node):
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        text = "".join(lines[first - 1:node.end_lineno])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{'class' if isinstance(node, ast.ClassDef) else 'def'} {node.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = "assign " + ",".join(sorted(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)))
            if name == "assign __all__":
                continue
        else:
            name = "statement"
        pairs.append((name, text))
    return pairs


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def function_code(function: Callable) -> str:
    """The fingerprint of the code a function computes with: its own source, and, followed through the names it uses,
    every sinklib function or class it calls (by its qualified name and source, wherever it lives), every sinklib
    module it reads through (that module's whole code), and the module-level constants it reads (by value). So moving
    functions between modules keys nothing anew, and editing a helper it calls does."""
    function = inspect.unwrap(function)
    parts: dict[str, str] = {}
    _gather(function, parts)
    parts.setdefault(f"def {function.__qualname__}", _source(function))  # a user's function: its own code
    return code_digest(parts.items())


def _source(function: Callable) -> str:
    """A function's source; where Python keeps none (made by exec), its compiled code, as a literal."""
    try:
        return textwrap.dedent(inspect.getsource(function))  # a function defined inside another is indented
    except (OSError, TypeError):
        code = function.__code__
        return repr((code.co_code, code.co_names, repr(code.co_consts)))


def _gather(value: Any, parts: dict[str, str]) -> None:
    if isinstance(value, types.ModuleType):
        _gather_module(value, parts)
        return
    if inspect.isfunction(value):
        value = inspect.unwrap(value)  # a checked function: its own code, not the checking wrapper's
    if not (inspect.isfunction(value) or inspect.isclass(value)) or not value.__module__.startswith("sinklib"):
        return
    name = f"{'class' if inspect.isclass(value) else 'def'} {value.__qualname__}"
    if name in parts:
        return
    parts[name] = textwrap.dedent(inspect.getsource(value))
    functions = [member for member in vars(value).values() if inspect.isfunction(member)] if inspect.isclass(value) \
        else [value]
    for function in functions:
        for used in _names(function.__code__):
            found = function.__globals__.get(used, None)
            if _constant(found) and used.isupper():
                parts.setdefault(f"const {used}", f"{used} = {found!r}")
            else:
                _gather(found, parts)


def _gather_module(module: types.ModuleType, parts: dict[str, str]) -> None:
    """A sinklib module read through: its whole code, and what it imports from the rest of sinklib."""
    if not module.__name__.startswith("sinklib.") or module.__name__ in parts:
        return
    parts[module.__name__] = "\n".join(path.read_text(encoding="utf-8")
                                       for path in module_files((module.__name__,)).values())
    for imported in list(vars(module).values()):
        if isinstance(imported, types.ModuleType) or getattr(imported, "__module__", module.__name__) != module.__name__:
            _gather(imported, parts)


def _constant(value: Any) -> bool:
    """A module-level value a computation reads as a constant: a number, a text, or a tuple, frozenset or list of
    them (not a dict: a module's run-time caches are dicts, and their contents are no part of the code)."""
    if isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, frozenset, list)) and all(isinstance(item, (bool, int, float, str, tuple))
                                                              for item in value)


def _names(code: types.CodeType) -> set[str]:
    """The global names a code object and the code nested in it (comprehensions, lambdas) use."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _file_digest(path: Path) -> str:
    """A shaping file's digest: a JSON file by its content without VOLATILE_CONFIG_KEYS (a transformers release
    rewrites `transformers_version` into every config it saves), any other file by its bytes. Computed once per
    file version (path, modification time, size): a notebook keys dozens of traces of one model, and canonicalising
    a 2 MB tokenizer.json each time took a third of a notebook's set-up."""
    stat = path.stat()
    return _file_digest_of_version(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _file_digest_of_version(name: str, modified_ns: int, size: int) -> str:
    path = Path(name)
    if path.suffix == ".json":
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return file_sha256(path)[:16]
        if isinstance(content, dict):
            content = {key: value for key, value in content.items() if key not in VOLATILE_CONFIG_KEYS}
        return digest(content)
    return file_sha256(path)[:16]


def forward_files(folders: Iterable[Path]) -> dict[str, str]:
    """folder name/file name → digest of every file of `folders` that shapes a model's forward (SHAPING_SUFFIXES,
    not NOT_SHAPING); weights are the weights' fingerprint's."""
    return {f"{folder.name}/{path.name}": _file_digest(path)
            for folder in folders for path in sorted(Path(folder).iterdir())
            if path.is_file() and path.suffix in SHAPING_SUFFIXES and path.name not in NOT_SHAPING}


def model_folders(loaded: Any) -> list[Path]:
    """The local folders a loaded model was read from: an adapted model's adapter and its base's conversion, a
    named model's conversion, a zoo or local checkpoint's folder; [] for a hub checkpoint (its commit is its
    weights' fingerprint, which covers every file) or a model object."""
    folders = []
    if loaded.name in named.ADAPTED_MODELS:
        folders.append(named.adapter_folder(loaded.name))
        base = named.ADAPTED_MODELS[loaded.name].base
        folders.append(named.converted_folder(base))
    elif loaded.name in named.NAMED_MODELS:
        folders.append(named.converted_folder(loaded.name))
    else:
        source = str(getattr(getattr(loaded.model, "config", None), "name_or_path", "") or "")
        if source and Path(source).is_dir():
            folders.append(Path(source).resolve())
    return [folder for folder in folders if folder.is_dir()]


def model_identity(loaded: Any) -> dict[str, Any]:
    """What of a loaded model shapes its numbers: its name, family, weights' fingerprint, forward-shaping files
    (forward_files) and the dtype of its parameters."""
    parameter = next(iter(loaded.model.parameters()), None)
    return {"model": loaded.name, "family": loaded.family.name, "weights": loaded.weights,
            "files": digest(forward_files(model_folders(loaded))),
            "dtype": str(parameter.dtype).removeprefix("torch.") if parameter is not None else None}

