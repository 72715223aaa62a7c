"""The code's shape: the linter's rules hold everywhere (configured in pyproject.toml: small functions, imports
at the top, bugbear), and sinklib's modules form a straight stack — no module imports the package root and no
two modules import each other, directly or around a loop."""
import ast
import subprocess
import sys
from pathlib import Path

import sinklib

PACKAGE = Path(sinklib.__file__).parent
ROOT = PACKAGE.parent


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
        targets = set()
        for imported, _ in _imports(path):
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_no_module_inside_the_package_imports_the_package_root():
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"
                 or path.parent != PACKAGE for imported, line in _imports(path) if imported == "sinklib"]
    assert not offenders, "import the module that defines the name, not the package root:\n" + "\n".join(offenders)


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
