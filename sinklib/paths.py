"""Where the project's shipped data lives (the zoo's checkpoints, its test set, the tasks, the committed results)
and its notebooks: one home, no imports.

In a checkout (a clone, or an editable install) they are the top-level data/, notebooks/ and figures/. A wheel
carries a copy inside the package, sinklib/_shipped/ (setup.py's build step puts it there), so that a plain
`pip install` loads the zoo by name from any working directory and runs the notebooks (into a folder of the
user's: `python -m sinklib.reproduce --out DIR`). INSTALLED says which: an installed copy is read, never written.
"""
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
INSTALLED = (_PACKAGE / "_shipped").is_dir()  # a wheel's copy; a checkout has the top-level folders instead
_HOME = _PACKAGE / "_shipped" if INSTALLED else _PACKAGE.parent

DATA_DIR = _HOME / "data"
ZOO_DIR = DATA_DIR / "models"
NOTEBOOKS = _HOME / "notebooks"  # the numbered notebooks and their params/
FIGURES_DIR = _HOME / "figures"  # the committed figures and explorer pages
