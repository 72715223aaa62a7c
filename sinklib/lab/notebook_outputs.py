"""What a committed notebook's outputs may hold: what a run writes that changes every time though the content does
not (papermill's times and paths, Jupyter's execution timestamps, tqdm's progress bars, widget model ids) is
stripped before a notebook is committed, and left out when nbval compares a fresh run with it.

A module of its own, importing only nbformat (when a notebook is written), so that nbval's workers, which compare
every output with is_progress_bar, do not import the notebook runner (sinklib.reproduce imports every notebook's
run configuration: about 13 s a process)."""
from __future__ import annotations

import re
from pathlib import Path

_PROGRESS_BAR = re.compile(r"\d+%\|.*\| *[\d.?]+[kMG]?/[\d.?]+[kMG]? \[")
# A line about a model whose run decided some step within float rounding ("<model> ≈", sinklib.summary): another CPU
# may take the other branch there. Its label is compared, its numbers masked (as tests/notebooks/nbval_sanitize.cfg
# masks them for nbval): the results tables they come from are compared near-tie by near-tie.
NEAR_TIE_LINE = re.compile(r"(?m)^(\S+ ≈)[: ].*$")
NEAR_TIE_MASK = r"\1 (decided at a near-tie: compared by reproduce --check)"
INJECTED = "injected-parameters"  # papermill's cell of the run's parameters: in a rerun's copy only


def is_progress_bar(output: dict) -> bool:
    """A tqdm bar's output: a live widget whose stored text is its first frame ("0%| | 0/6 [00:00<?, ?it/s]"), or
    its text on stderr. Neither says anything once the run is over."""
    if output.get("output_type") == "stream":
        return output.get("name") == "stderr" and bool(_PROGRESS_BAR.search(output.get("text", "")))
    data = output.get("data", {})
    return ("application/vnd.jupyter.widget-view+json" in data
            and bool(_PROGRESS_BAR.search(str(data.get("text/plain", "")))))


def strip_volatile(path: Path) -> None:
    """Remove what changes on every run though the content does not: papermill's times and paths, Jupyter's
    execution timestamps, progress bars, widget model ids (a widget's live view cannot be committed: its text
    stays)."""
    import nbformat  # noqa: PLC0415  (the notebooks extra: only a run that writes notebooks needs it)

    notebook = nbformat.read(str(path), as_version=4)
    for key in ("papermill", "widgets"):
        notebook.metadata.pop(key, None)
    for cell in notebook.cells:
        for key in ("papermill", "execution"):
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        cell.outputs = [output for output in cell.outputs if not is_progress_bar(output)]
        for output in cell.outputs:
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
            output.get("metadata", {}).pop("application/vnd.jupyter.widget-view+json", None)
    nbformat.write(notebook, str(path))


def text_outputs(path: Path) -> list[list[str]]:
    """Per code cell (but papermill's injected parameters), the text a reader sees: its streams and the text/plain
    of its results, progress bars left out (is_progress_bar) and every near-tie line masked (NEAR_TIE_LINE)."""
    import nbformat  # noqa: PLC0415  (the notebooks extra: only a check of notebooks reads them)

    notebook = nbformat.read(str(path), as_version=4)
    cells = [cell for cell in notebook.cells
             if cell.cell_type == "code" and INJECTED not in cell.metadata.get("tags", [])]
    texts = [[output.get("text", "") if output.get("output_type") == "stream"
              else str(output.get("data", {}).get("text/plain", "")) for output in cell.outputs
              if not is_progress_bar(output)] for cell in cells]
    return [[NEAR_TIE_LINE.sub(NEAR_TIE_MASK, text) for text in cell] for cell in texts]
