"""Test tiers: tests/unit (pure logic, seconds), tests/parity (numbers against independent references and the
upstream stand-ins), tests/zoo (the shipped tiny models), tests/notebooks (papermill, nbval, the browser),
tests/install (the wheel, installed into a fresh environment).
Each test gets its tier as a marker (`pytest -m parity`); the zoo and notebook tiers are also `slow`
(`pytest -m "not slow"` is the quick loop). `make test` runs every tier."""
from pathlib import Path

import pytest

TIERS = ("unit", "parity", "zoo", "notebooks", "install")
SLOW_TIERS = ("zoo", "notebooks", "install")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        parts = Path(str(item.fspath)).relative_to(here).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if tier in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
