"""Where the project's shipped data lives (the zoo's checkpoints, its test set, the tasks): one home, no imports."""
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
ZOO_DIR = DATA_DIR / "models"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"  # the numbered notebooks (a checkout's, not packaged)
