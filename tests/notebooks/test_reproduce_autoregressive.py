"""A user's real run on the autoregressive family alone (`python -m sinklib.reproduce --params <YAML>`, notebooks
01–04 on a hub-style Llama folder, without remote code), at an ε so high that no sink exists: every notebook still
writes its figures, and Table 2 is a labelled empty table, never a crash. The diffusion families' run is in
test_reproduce_checkpoints.py (a file of its own, so the two runs can take both cores)."""
import pytest

from tests.notebooks.reproduce_run import run_notebooks_01_to_04_on_hub_style_checkpoints

pytest.importorskip("papermill")


@pytest.mark.slow
def test_reproduce_runs_notebooks_01_to_04_on_the_autoregressive_family_alone(tmp_path):
    run_notebooks_01_to_04_on_hub_style_checkpoints(("llama",), tmp_path)
