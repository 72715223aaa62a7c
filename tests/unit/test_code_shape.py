"""The code's shape (STYLE.md): small readable functions, and no import circle between sinklib's modules."""
import ast
from pathlib import Path

import sinklib

PACKAGE = Path(sinklib.__file__).parent
LIMIT = 40
# Functions still over the limit would be listed here (none are): so that no new long function slips in.
KNOWN_LONG: set[str] = set()


def test_no_new_function_in_sinklib_is_over_40_lines():
    long, known = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                if lines > LIMIT and where in KNOWN_LONG:
                    known.add(where)
                elif lines > LIMIT:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 40 lines:\n" + "\n".join(long)
    assert known == KNOWN_LONG, f"now within {LIMIT} lines, take them off KNOWN_LONG: {sorted(KNOWN_LONG - known)}"
