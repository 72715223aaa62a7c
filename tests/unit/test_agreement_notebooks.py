"""A rerun's notebooks against the committed ones: their printed text, numbers within tolerance, compared by
`reproduce --check` as nbval compares it — made on copies of a committed notebook, one printed number doctored."""
import shutil

import nbformat
import pytest

from sinklib.lab import agreement_notebooks
from sinklib.lab.agreement_rows import DIFFERS, IDENTICAL, WITHIN
from sinklib.lab.notebook_outputs import INJECTED
from sinklib.paths import NOTEBOOKS

SWEEP = NOTEBOOKS / "03_threshold_sweep.ipynb"  # prints the sweep's table: tiny-llada ≈ (a near-tie), tiny-arm not


def _doctored(path, old, new, inject=False):
    notebook = nbformat.read(str(SWEEP), as_version=4)
    found = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/plain")
            if text and old in text:
                output["data"]["text/plain"], found = text.replace(old, new, 1), found + 1
    assert found or old == new, f"{old!r} is not in the committed notebook"
    if inject:  # papermill's cell of the rerun's folders: in the rerun only
        notebook.cells.insert(1, nbformat.v4.new_code_cell("figures_dir = '/tmp/x'", metadata={"tags": [INJECTED]}))
    nbformat.write(notebook, str(path))
    return path


def _line(model):
    text = next(o["data"]["text/plain"] for c in nbformat.read(str(SWEEP), as_version=4).cells
                for o in c.get("outputs", []) if "tiny-arm" in o.get("data", {}).get("text/plain", ""))
    return next(line for line in text.splitlines() if line.startswith(model))


@pytest.mark.parametrize("model, change, status", [
    ("tiny-arm", lambda line: line, IDENTICAL),
    ("tiny-arm", lambda line: line.replace(line.split()[1], f"{float(line.split()[1]) + 0.3:.3f}", 1), DIFFERS),
    ("tiny-arm", lambda line: line.replace(line.split()[1], f"{float(line.split()[1]) + 0.001:.3f}", 1), WITHIN),
    ("tiny-arm", lambda line: line.replace("tiny-arm", "tiny-ARM"), DIFFERS),
    ("tiny-llada ≈", lambda line: line.replace(line.split()[2], f"{float(line.split()[2]) + 0.3:.3f}", 1), IDENTICAL),
])
def test_a_notebooks_printed_numbers_are_compared_within_tolerance(tmp_path, model, change, status):
    """A printed share moved by 0.3 differs; by one unit of its last digit it is a rounding; a near-tie's line is
    masked as nbval masks it; papermill's injected parameters are not the notebook's output."""
    line = _line(model)
    committed = _doctored(tmp_path / "committed.ipynb", line, change(line))
    rerun = _doctored(tmp_path / "rerun.ipynb", line, line, inject=True)
    row = agreement_notebooks.compare_notebook(committed, rerun)
    assert row.status == status, row


def test_check_compares_the_rerun_notebooks_printed_text(tmp_path, monkeypatch):
    """`reproduce --check`: a committed notebook whose printed number was doctored fails the check, naming it."""
    pytest.importorskip("papermill")
    from sinklib.lab import agreement, reproduce

    line = _line("tiny-arm")
    committed = tmp_path / "notebooks"
    committed.mkdir()
    _doctored(committed / SWEEP.name, line, line.replace(line.split()[1], "0.999", 1))

    def run(params, out, **_):
        out.mkdir(parents=True, exist_ok=True)
        return [shutil.copy2(SWEEP, out / SWEEP.name)]

    agreeing = agreement.Report(rows=[agreement.Row("fig10_threshold_sweep", "1 / 1", IDENTICAL)])
    monkeypatch.setattr(reproduce, "run", run)
    monkeypatch.setattr(reproduce, "seed_committed_runs", lambda *args: None)
    monkeypatch.setattr(reproduce.agreement, "compare_folders", lambda *args, **kwargs: agreeing)
    monkeypatch.setattr(reproduce, "committed_version",
                        lambda folder, into: (committed if folder == reproduce.NOTEBOOKS else folder, str(folder)))
    report = reproduce.check(only=["03"], progress=False)
    assert not report.agrees and report.failing == [SWEEP.name], report.to_text()
    assert "code cell" in report.to_text() and "0.999" in report.to_text()


def test_the_check_masks_the_near_tie_lines_nbval_masks():
    from pathlib import Path

    from sinklib.lab.notebook_outputs import NEAR_TIE_LINE, NEAR_TIE_MASK

    sanitize = (Path(__file__).parents[1] / "notebooks" / "nbval_sanitize.cfg").read_text(encoding="utf-8")
    assert f"regex: {NEAR_TIE_LINE.pattern}\n" in sanitize and f"replace: {NEAR_TIE_MASK}\n" in sanitize
