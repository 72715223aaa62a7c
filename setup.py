"""The wheel carries what a user needs without the repository: the tiny zoo and the SmolLM2 twins' adapters, the
tasks' data, the committed results and figures (what `--check` compares with) and the notebooks, copied from the
checkout's top-level folders into sinklib/_shipped/ (sinklib.paths reads them there). Everything else is in
pyproject.toml."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = {  # checkout folder → the files of it an install needs (data/checkpoints, executed notebooks: not)
    "data": ["models/*/*", "tasks/*.jsonl", "arithmetic_test.jsonl", "arithmetic_unseen_work_test.jsonl",
             "over_training/*", "results/*.parquet", "results/PROVENANCE.json", "results/table1-arithmetic-english/*"],
    "notebooks": ["[0-9][0-9]_*.ipynb", "params/*.yaml"],
    "figures": ["*.*"],
}


class BuildWithShippedData(build_py):
    """build_py, then the SHIPPED files copied into the built package's _shipped/ folder."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "sinklib" / "_shipped"
        for folder, patterns in SHIPPED.items():
            for pattern in patterns:
                for source in sorted((ROOT / folder).glob(pattern)):
                    if source.is_file():
                        destination = target / folder / source.relative_to(ROOT / folder)
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(source, destination)


setup(cmdclass={"build_py": BuildWithShippedData})
