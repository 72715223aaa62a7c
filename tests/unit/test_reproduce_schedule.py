"""`make figures` runs the notebooks two at a time (sinklib.lab.reproduce.execute_all): each after the notebooks whose stores
it reads, the slowest ready one first, every kernel on one torch thread. These run real papermill kernels on
notebooks of a few lines that log when they ran and with which environment."""
import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebooks extra (the transformers-4.56 tier has none)
papermill = pytest.importorskip("papermill")

from sinklib.lab import reproduce  # noqa: E402  (needs the notebooks extra)
from sinklib.lab.reproduce import Execution, execute_all, waits_for  # noqa: E402

pytestmark = pytest.mark.process  # they start Jupyter kernels


def notebook(folder: Path, name: str, seconds: float = 0.0, fail: bool = False) -> Path:
    """A notebook that logs its name, its start and end times and the thread settings its kernel got, sleeping
    `seconds` in between (or raising, with `fail`)."""
    code = f"""import json, os, time
began = time.time()
time.sleep({seconds})
{"raise RuntimeError('this notebook fails')" if fail else ""}
import torch
with open({str(folder / "log.jsonl")!r}, "a") as log:
    log.write(json.dumps({{"name": {name!r}, "began": began, "ended": time.time(), "torch_threads": torch.get_num_threads(),
                          "omp": os.environ.get("OMP_NUM_THREADS")}}) + "\\n")"""
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(book, str(path))
    return path


def log(folder: Path) -> dict[str, dict]:
    return {row["name"]: row for row in map(json.loads, (folder / "log.jsonl").read_text().splitlines())}


def test_two_at_a_time_each_after_what_it_reads_the_slowest_ready_first_on_one_torch_thread(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    runs = [Execution(notebook(tmp_path, "01_maker", 2.0), tmp_path / "out" / "01_maker.ipynb", {}, (), 100),
            Execution(notebook(tmp_path, "02_reader"), tmp_path / "out" / "02_reader.ipynb", {}, ("01_maker",), 300),
            Execution(notebook(tmp_path, "03_quick"), tmp_path / "out" / "03_quick.ipynb", {}, (), 10),
            Execution(notebook(tmp_path, "04_slow", 1.0), tmp_path / "out" / "04_slow.ipynb", {}, (), 200)]
    executed = execute_all(runs, jobs=2, progress=False)
    assert executed == [run.target for run in runs] and all(path.is_file() for path in executed)
    ran = log(tmp_path)
    assert ran["02_reader"]["began"] >= ran["01_maker"]["ended"]  # it reads 01's store: never before 01 ends
    # 04 (200 s) and 01 (100 s) start first; 03 (10 s) waits for a free slot
    assert ran["03_quick"]["began"] >= min(ran["04_slow"]["ended"], ran["01_maker"]["ended"])
    assert ran["04_slow"]["began"] < ran["01_maker"]["ended"] and ran["01_maker"]["began"] < ran["04_slow"]["ended"]
    assert {row["torch_threads"] for row in ran.values()} == {1} and {row["omp"] for row in ran.values()} == {"1"}
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "7"  # put back after


def test_one_at_a_time_the_kernels_keep_the_machines_threads(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runs = [Execution(notebook(tmp_path, "01_a"), tmp_path / "out" / "01_a.ipynb", {}, (), 10),
            Execution(notebook(tmp_path, "02_b"), tmp_path / "out" / "02_b.ipynb", {}, (), 50)]
    execute_all(runs, jobs=1, progress=False)
    ran = log(tmp_path)
    assert ran["02_b"]["ended"] <= ran["01_a"]["began"]  # the slower first, one after the other
    assert {row["omp"] for row in ran.values()} == {None}


def test_after_a_failure_the_running_neighbour_finishes_and_nothing_more_starts(tmp_path):
    (tmp_path / "out").mkdir()
    runs = [Execution(notebook(tmp_path, "01_fails", fail=True), tmp_path / "out" / "01_fails.ipynb", {}, (), 100),
            Execution(notebook(tmp_path, "02_neighbour", 2.5), tmp_path / "out" / "02_neighbour.ipynb", {}, (), 90),
            Execution(notebook(tmp_path, "03_later"), tmp_path / "out" / "03_later.ipynb", {}, (), 10)]
    with pytest.raises(papermill.PapermillExecutionError, match="this notebook fails"):
        execute_all(runs, jobs=2, progress=False)
    assert set(log(tmp_path)) == {"02_neighbour"}
    assert not (tmp_path / "out" / "01_fails.ipynb").exists()  # a failed notebook leaves no executed copy


def test_readers_of_a_store_whose_maker_is_not_in_the_run_go_one_after_another(tmp_path):
    paths = {name: tmp_path / f"{name}.ipynb" for name in ("01_maker", "02_reader", "03_other", "07_reader")}
    runs = [Execution(paths[name], paths[name], {}, reads, 10) for name, reads in
            (("02_reader", ("01_maker",)), ("03_other", ()), ("07_reader", ("01_maker",)))]
    assert waits_for(runs) == {paths["02_reader"]: [], paths["03_other"]: [], paths["07_reader"]: [paths["02_reader"]]}
    with_maker = [Execution(paths["01_maker"], paths["01_maker"], {}, (), 10), *runs]
    assert waits_for(with_maker)[paths["07_reader"]] == [paths["01_maker"]]


def test_a_cycle_of_reads_is_refused_naming_the_notebooks(tmp_path):
    runs = [Execution(tmp_path / "01_a.ipynb", tmp_path / "01_a.ipynb", {}, ("02_b",)),
            Execution(tmp_path / "02_b.ipynb", tmp_path / "02_b.ipynb", {}, ("01_a",)),
            Execution(tmp_path / "03_c.ipynb", tmp_path / "03_c.ipynb", {}, ())]
    with pytest.raises(ValueError, match=r"READS_FROM is not allowed to form a cycle: \['01_a', '02_b'\]"):
        waits_for(runs)


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_a_bad_jobs_is_refused_before_anything_runs(jobs, tmp_path):
    with pytest.raises(ValueError, match=rf"jobs={jobs!r} is not allowed: jobs must be a whole number >= 1"):
        reproduce.run(out=tmp_path, only=["03"], jobs=jobs)
    assert list(tmp_path.iterdir()) == []


def test_the_figure_notebooks_declare_what_they_read_and_every_maker_exists():
    runs = [Execution.of(path, path, {}) for path in reproduce.notebook_paths()]
    stems = {run.path.stem for run in runs}
    assert {run.path.stem: run.reads_from for run in runs if run.reads_from} == {
        "02_moving_sinks": ("01_attention_distributions",), "03_threshold_sweep": ("01_attention_distributions",),
        "07_what_sinks_carry": ("01_attention_distributions",), "08_sinks_for_speed": ("01_attention_distributions",)}
    assert all(set(run.reads_from) <= stems for run in runs)
    assert reproduce.default_jobs({}) == 2 and reproduce.default_jobs({"device": "cuda"}) == 1
