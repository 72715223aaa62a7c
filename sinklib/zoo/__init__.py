"""The tiny model zoo: models this project trains itself and ships in data/models/. The package holds what the library
and the notebooks read: the recipes (recipes.py) and the rows measured over training (over_training.py). The programs
that train the zoo and adapt the SmolLM2 twins are experiments/zoo/ (train.py, adapt.py, …), run from a checkout."""
from __future__ import annotations

from sinklib.paths import DATA_DIR, ZOO_DIR  # noqa: F401  (callers read them here too)

NAMES = ("tiny-llada", "tiny-dream", "tiny-arm", "tiny-udlm", "tiny-llada-gated")  # shipped in data/models/
