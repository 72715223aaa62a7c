"""The tiny model zoo: models this project trains itself and ships in data/models/ (see train.py)."""
from __future__ import annotations

from sinklib.paths import DATA_DIR, ZOO_DIR  # noqa: F401  (the zoo's CLI and callers read them here too)

NAMES = ("tiny-llada", "tiny-dream", "tiny-arm")
