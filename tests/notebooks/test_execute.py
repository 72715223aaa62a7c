"""reproduce.execute replaces only the notebook it was asked to write and removes only the file it made."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("papermill")
nbformat = pytest.importorskip("nbformat")

from sinklib.lab.reproduce import execute  # noqa: E402

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]


def _notebook(path, source: str) -> None:
    cells = [nbformat.v4.new_code_cell("value = 1", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell(source)]
    metadata = {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=metadata), str(path))


def test_execute_touches_only_its_target_and_its_own_scratch_file(tmp_path):
    source, target = tmp_path / "source.ipynb", tmp_path / "target.ipynb"
    # a file bearing the name a fixed scratch file would have had: not the run's to overwrite or remove
    bystander = tmp_path / ".target.executing.ipynb"
    bystander.write_text("someone else's")
    target.write_text("previous")
    os.chmod(target, 0o640)

    _notebook(source, "raise ValueError('the run fails')")
    with pytest.raises(Exception, match="the run fails"):
        execute(source, target, {"value": 2}, progress=False)
    assert target.read_text() == "previous"  # a failed run leaves the previous notebook whole
    assert bystander.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".target.executing.ipynb", "source.ipynb", "target.ipynb"]

    _notebook(source, "print(value * 21)")
    execute(source, target, {"value": 2}, progress=False)
    executed = nbformat.read(str(target), as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "42\n"  # the parameter reached the run
    assert os.stat(target).st_mode & 0o777 == 0o640  # the notebook keeps its permissions
    assert bystander.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".target.executing.ipynb", "source.ipynb", "target.ipynb"]


def test_the_kernel_starts_in_the_notebooks_folder_and_this_process_never_changes_its_own(tmp_path, monkeypatch):
    """make figures runs two notebooks from two threads of one process: a working directory changed for one run
    (papermill's cwd=) and changed back while the other kernel started put that kernel in the checkout's root, and
    its "../data/results" outside the checkout. The kernel gets notebooks/ as its own cwd; this process's stays."""
    from sinklib.paths import NOTEBOOKS

    here, chdir = os.getcwd(), os.chdir

    def refuse(path):  # papermill's file reads and writes step into the folder they are already in: harmless
        if os.path.realpath(path) != os.path.realpath(here):
            raise AssertionError(f"os.chdir({path!r}) in the process that runs notebooks from threads")
        chdir(path)

    source, target = tmp_path / "source.ipynb", tmp_path / "target.ipynb"
    _notebook(source, "import os\nprint(os.getcwd())")
    monkeypatch.setattr(os, "chdir", refuse)
    execute(source, target, {"value": 2}, progress=False)
    executed = nbformat.read(str(target), as_version=4)
    assert executed.cells[-1].outputs[0]["text"].strip() == str(NOTEBOOKS)
