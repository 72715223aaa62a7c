"""One home for hashing: the canonical JSON of a key, its digest, a file's SHA-256 and the fingerprint of code.

Every stored result is found by a digest of what shaped it (sinklib.keys says what that is); every file a result
lists is held to its SHA-256. Both are computed here and nowhere else, so two stores never disagree on how a key is
spelled. Standard library only: the ground floor, imported by everything that stores or checks a result."""
from __future__ import annotations

import ast
import hashlib
import io
import itertools
import json
import tokenize
from pathlib import Path
from typing import Any, Iterable

_CHUNK = 1 << 20
_FILE_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}  # (path, inode, size, mtime_ns, ctime_ns) → SHA-256


def canonical(value: Any) -> str:
    """`value` as key-sorted JSON, values JSON cannot hold as their str (a tuple and a list of the same items are
    one key, as they are once read back)."""
    return json.dumps(value, sort_keys=True, default=str)


def digest(value: Any, length: int | None = 16) -> str:
    """The SHA-256 (hex) of `value`'s canonical JSON, its first `length` digits (None: all 64)."""
    return text_digest(canonical(value), length)


def text_digest(text: str | bytes, length: int | None = 16) -> str:
    """The SHA-256 (hex) of a text (UTF-8) or of bytes, its first `length` digits (None: all 64)."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:length]


def file_sha256(path: str | Path) -> str:
    """A file's SHA-256 (all 64 hex digits), read once per process while its stat is unchanged."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = (str(resolved), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _FILE_DIGESTS:
        sha = hashlib.sha256()
        with open(resolved, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                sha.update(chunk)
        _FILE_DIGESTS[key] = sha.hexdigest()
    return _FILE_DIGESTS[key]


def code_digest(sources: Iterable[tuple[str, str]], length: int | None = 16) -> str:
    """The fingerprint of code: (name, source) pairs, each source reduced to code_only, in name order. A docstring
    or comment edit leaves it as it was; any other edit changes it."""
    sha = hashlib.sha256()
    for name, source in sorted(sources):
        sha.update(f"{name}\n{code_only(source)}".encode())
    return sha.hexdigest()[:length]


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
