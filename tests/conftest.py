"""Test tiers: tests/unit (pure logic, seconds), tests/parity (numbers against independent references and the
upstream stand-ins), tests/zoo (the shipped tiny models), tests/notebooks (papermill, nbval, the browser),
tests/install (the wheel, installed into a fresh environment).
Each test gets its tier as a marker (`pytest -m parity`); the zoo and notebook tiers are also `slow`
(`pytest -m "not slow"` is the quick loop). `make test` runs every tier."""
import os
from pathlib import Path

import pytest

TIERS = ("unit", "parity", "zoo", "notebooks", "install")
SLOW_TIERS = ("zoo", "notebooks", "install")


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores (two workers on two cores: one thread
    each), so that the workers do not oversubscribe the CPU. Subprocesses (notebooks, reproduce) keep torch's own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch  # noqa: PLC0415  (only in a worker: the controller runs no test)

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        parts = Path(str(item.fspath)).relative_to(here).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if tier in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
