"""Confinement: the kernel's and the process table's layers around the program's process.

Each layer is applied when the platform has it (`protections()` says which; the tests check each one):
- resource limits, set between fork and exec (`_confine`): address space, CPU seconds, file size, open files, no
  core dumps;
- a bound on processes: RLIMIT_NPROC for a normal user; for root (whom the kernel exempts from RLIMIT_NPROC) a
  pids cgroup with pids.max (`_PidsCgroup`, v1 or v2 layout), which the program joins before exec;
- a bound on the total written: a private tmpfs of `max_disk_mb` mounted on the program's directory in a mount
  namespace of its own (the kernel refuses writes past it) — for root directly, for another user inside a user
  namespace of its own that maps only that user (the capabilities it holds there end at exec); where neither can
  mount, the supervisor measures the directory every 20 ms (`_tree_bytes`) and kills the program past the bound,
  which a program writing at memory speed outruns by tens of megabytes;
- Landlock (Linux ≥ 5.13), applied by the program's process to itself once its start-up imports are done
  (`confine_self`): it may read only the Python standard library and the system libraries — not site-packages (so
  not the HumanEval data and its canonical solutions), not /proc, not the user's files — write only in its
  directory, open no TCP connection (ABI ≥ 4), and signal or ptrace no process outside the sandbox (ABI ≥ 6 for
  signals);
- seccomp (Linux, x86-64 / aarch64), set between fork and exec: socket(2), io_uring_setup(2), ptrace(2),
  process_vm_readv/writev(2) and pidfd_getfd(2) fail with EPERM: no socket of any family, no reading or writing
  another process's memory; a syscall through another ABI (x32, 32-bit compat) kills the process;
- the process tree: the supervisor is a child subreaper (`_become_subreaper`), so every process the program
  starts, even a double-forked `setsid` daemon, stays its descendant, and `_kill_descendants` kills and reaps them
  all when the tests end or the clock runs out (the cgroup, where there is one, is emptied too).

Standard library only (ctypes for the system calls): the supervisor and the confined program load it by path.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import platform
import resource
import signal
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

from .limits import SandboxLimits

def protections() -> dict[str, bool | str]:
    """Which layers this machine gives (the portable ones are always on).

    Returns:
        Each layer's name → whether it is on; disk_limit says how the total a program writes is bounded: "tmpfs"
        (the kernel refuses writes past max_disk_mb) or "polled" (the directory is measured every 20 ms and the
        program killed past max_disk_mb: approximate).
    """
    abi = _landlock_abi()
    root = os.geteuid() == 0
    return {"separate_process": True, "scrubbed_environment": True, "temporary_directory": True,
            "reliability_guard": True, "resource_limits": True, "tests_outside_the_sandbox": True,
            "process_limit": (not root and _can_count_processes()) or (root and _PidsCgroup.available()),
            "landlock_filesystem": abi >= 1, "landlock_network": abi >= 4, "landlock_signals": abi >= 6,
            "no_sockets": _seccomp_arch() is not None, "no_process_memory_access": _seccomp_arch() is not None,
            "process_tree": sys.platform.startswith("linux"), "disk_limit": "tmpfs" if _can_mount() else "polled"}


def _confine(workdir: Path, limits: SandboxLimits, cgroup: "_PidsCgroup | None"):
    """The function the child runs between fork and exec (it must not start threads or import much)."""
    memory = limits.memory_mb * 2**20
    nproc = None if os.geteuid() == 0 or not _can_count_processes() else _user_processes() + limits.max_processes
    seccomp_arch = _seccomp_arch()
    libc = _libc()
    mount = _can_mount()

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


# --- the program's directory: a private tmpfs -----------------------------------------------------------
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 0x40000, 0x2, 0x4


def _private_tmpfs(libc, workdir: Path, size_mb: int) -> None:
    """In a mount namespace of this process's own, a tmpfs of size_mb on workdir (and the working directory
    moved onto it): the kernel refuses writes past the bound, and the mount ends with the process.

    A user other than root mounts it from a user namespace of its own that maps only its own uid and gid: the
    capabilities the new namespace gives are lost at exec (the uid inside is not 0), and Landlock, applied later,
    forbids unmounting."""
    if os.geteuid() == 0:
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    else:
        _own_user_namespace(libc)
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private failed")
    options = f"size={size_mb}m,mode=0700".encode()
    if libc.mount(b"tmpfs", str(workdir).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), "mounting the tmpfs failed")
    os.chdir(workdir)


def _own_user_namespace(libc) -> None:
    """Enter a new user and mount namespace mapping only this process's uid and gid to themselves."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWNS) failed")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as map_file:
            map_file.write(line)


_MOUNT_PROBE: list[bool] = []


def _can_mount() -> bool:
    """Whether a private tmpfs can be mounted here (root with mount namespaces, another user with user
    namespaces); probed once, in a child."""
    if not _MOUNT_PROBE:
        works = False
        if sys.platform.startswith("linux"):
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


# --- a bound on processes: RLIMIT_NPROC (a normal user) or a pids cgroup (root) -------------------------
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


# --- Landlock: what the program may read, write and signal once its start-up is done -----------------------
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
    read and write only its directory, no TCP, no signals or ptrace outside (each as far as the kernel's ABI
    goes; nothing where it has no Landlock).

    Args:
        confinement: {"workdir": the program's directory, "read_roots": what it may read (_read_roots)}.

    Raises:
        OSError: the kernel refused the ruleset (the program must not run unconfined: its process ends).
    """
    abi = _landlock_abi()
    if abi >= 1:
        _landlock_restrict(_libc(), abi, Path(confinement["workdir"]), confinement["read_roots"])


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
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
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


# --- the process tree -----------------------------------------------------------------------------------
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Make this process (the supervisor) a child subreaper: an orphan among its descendants is given to it, not to
    init, so that _kill_descendants finds every process the program started.

    Raises:
        OSError: prctl refused.
    """
    if _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


# --- the total written, where no tmpfs bounds it: measured by the supervisor --------------------------
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
