"""`--check` compares a rerun with what was committed — git HEAD in a checkout — not with a working tree that a
`make figures` on this machine may have rewritten."""
import subprocess

import pytest

pytest.importorskip("papermill")

from sinklib.lab import reproduce, stores  # noqa: E402  (after the importorskip: reproduce needs the notebooks extra)


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_the_committed_side_is_git_head_not_the_working_tree(tmp_path):
    root = tmp_path / "checkout"
    (root / "data" / "results").mkdir(parents=True)
    (root / "data" / "results" / "a.parquet").write_bytes(b"committed")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results")
    (root / "data" / "results" / "a.parquet").write_bytes(b"rewritten by make figures")
    (root / "data" / "results" / "b.parquet").write_bytes(b"never committed")
    folder, what = stores.committed_version(root / "data" / "results", tmp_path / "head", root=root)
    assert (folder / "a.parquet").read_bytes() == b"committed" and not (folder / "b.parquet").exists()
    assert what.startswith("data/results at git HEAD ")


def test_outside_a_checkout_the_folder_as_shipped_is_the_committed_side(tmp_path):
    shipped = tmp_path / "site-packages" / "results"
    shipped.mkdir(parents=True)
    folder, what = stores.committed_version(shipped, tmp_path / "head", root=tmp_path / "site-packages")
    assert folder == shipped.resolve() and "not a git checkout" in what


def test_seeding_the_committed_runs_never_overwrites_a_file_already_there(tmp_path):
    committed = tmp_path / "committed"
    (committed / stores.COMMITTED_RUNS[0]).mkdir(parents=True)
    (committed / stores.COMMITTED_RUNS[0] / "run.jsonl").write_text("committed\n")
    (committed / stores.COMMITTED_RUNS[0] / "other.jsonl").write_text("committed\n")
    mine = tmp_path / "results" / stores.COMMITTED_RUNS[0]
    mine.mkdir(parents=True)
    (mine / "run.jsonl").write_text("committed\nmy own resumed rows\n")
    stores.seed_committed_runs(tmp_path / "results", committed)
    assert (mine / "run.jsonl").read_text() == "committed\nmy own resumed rows\n"
    assert (mine / "other.jsonl").read_text() == "committed\n"


def test_make_figures_remakes_the_stores_and_puts_them_back_if_a_notebook_fails(tmp_path):
    (tmp_path / "traces" / "m").mkdir(parents=True)
    (tmp_path / "traces" / "m" / "old").write_text("committed")
    with pytest.raises(RuntimeError, match="a notebook failed"):
        with stores.regenerated_stores(tmp_path, ("traces",)):
            assert not (tmp_path / "traces").exists()
            (tmp_path / "traces").mkdir()
            (tmp_path / "traces" / "half-made").write_text("partial")
            raise RuntimeError("a notebook failed")
    assert [p.name for p in (tmp_path / "traces").rglob("*") if p.is_file()] == ["old"]
    with stores.regenerated_stores(tmp_path, ("traces",)):
        (tmp_path / "traces").mkdir()
        (tmp_path / "traces" / "new").write_text("remade")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["new", "traces"]


def test_a_store_left_aside_by_a_killed_run_is_refused_not_guessed_at(tmp_path):
    (tmp_path / ".traces.previous").mkdir()
    with pytest.raises(ValueError, match=r"results_dir=.* is not allowed: \.traces\.previous is left from a run"):
        with stores.regenerated_stores(tmp_path, ("traces",)):
            pass


def test_remake_long_runs_moves_the_long_runs_aside_too_and_only_in_the_default_run(tmp_path, monkeypatch):
    """--remake-long-runs: the default run makes the twins' long runs again (they are moved aside while the
    notebooks run, like the stores); with --only, parameters or folders it is refused before anything runs."""
    long_runs = tmp_path / "results" / stores.COMMITTED_RUNS[0]
    long_runs.mkdir(parents=True)
    (long_runs / "committed.jsonl").write_text("{}\n")
    seen = []

    def execute(path, target, parameters, progress=True):  # the notebooks' run, as far as the folders see it
        seen.append(long_runs.exists())
        long_runs.mkdir(exist_ok=True)
        (long_runs / f"{path.stem}.jsonl").write_text("{}\n")
        return target

    monkeypatch.setattr(reproduce, "DATA_DIR", tmp_path)
    monkeypatch.setattr(reproduce, "execute", execute)
    for refused in (dict(only=["04"]), dict(params={"eps": 2.0}), dict(out=tmp_path / "out")):
        with pytest.raises(ValueError, match="remake_long_runs=True is not allowed here: only the default run"):
            reproduce.run(remake_long_runs=True, **refused)
    assert seen == [] and (long_runs / "committed.jsonl").exists()
    reproduce.run(remake_long_runs=True, progress=False)
    assert seen[0] is False and not (long_runs / "committed.jsonl").exists()
    reproduce.run(progress=False)  # without the flag the long runs are read, never moved aside
    assert all(seen[len(reproduce.notebook_paths()):])


def test_make_figures_removes_the_picks_and_traces_it_no_longer_read_and_nothing_else(tmp_path):
    """A key that moved leaves its old pick and trace behind; the default run of every notebook removes what no
    notebook read or made (each read touches its file), and never a file of another kind."""
    import os
    import time

    old = time.time() - 100
    kept = {tmp_path / "picks" / "pick_a-1.parquet", tmp_path / "traces" / "m" / "k1" / "meta.json",
            tmp_path / "long-traces" / "m" / "k3" / "meta.json", tmp_path / "fig.parquet"}
    stale = {tmp_path / "picks" / "pick_a-0.parquet", tmp_path / "traces" / "m" / "k0" / "meta.json"}
    for path in kept | stale | {tmp_path / "traces" / "m" / "k0" / "scores.parquet"}:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.utime(path, (old, old))
    started = time.time()
    for path in kept - {tmp_path / "fig.parquet"}:
        os.utime(path)  # read by this run
    removed = stores.remove_stale(tmp_path, started)
    assert set(removed) == {tmp_path / "picks" / "pick_a-0.parquet", tmp_path / "traces" / "m" / "k0"}
    assert all(path.exists() for path in kept) and not (tmp_path / "traces" / "m" / "k0").exists()


@pytest.mark.parametrize("only", [[], [""], "01"])
def test_only_with_no_prefix_is_refused_not_the_full_run(only):
    """`--only` with nothing after it was the full in-place run (it regenerated the stores and exited 0)."""
    with pytest.raises(ValueError, match=r"only=.* is not allowed: only must be a non-empty list of notebook prefixes"):
        reproduce.notebook_paths(only)
