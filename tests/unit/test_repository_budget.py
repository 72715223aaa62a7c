"""The repository's budget: what a newcomer clones stays small. Read from `git ls-files` of the checkout (the files it
tracks, at the size git stores them): no tracked file over 20 MB, the tracked tree under 120 MB, nothing tracked that
.gitignore ignores, and no training checkpoint (data/checkpoints/: optimiser states that `python -m experiments.zoo adapt`
makes again, docs/reproducibility.md). Outside a git checkout (an sdist, an installed wheel) there is nothing to hold,
and the tests skip saying so."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MB = 1_000_000
FILE_LIMIT = 20 * MB
TREE_LIMIT = 120 * MB
CHECKPOINTS = "data/checkpoints/"
SUBMODULE = "160000"  # a submodule's mode: its commit is not an object of this repository


def _git(root: Path, *args: str, given: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(root), *args], input=given, capture_output=True, text=True,
                          check=True).stdout


def _paths(listing: str) -> list[str]:
    return [path for path in listing.split("\0") if path]


def tracked_sizes(root: Path) -> dict[str, int]:
    """Each tracked file (the index: what a commit now would hold) and the size git stores it at."""
    entries = [entry.split("\t", 1) for entry in _paths(_git(root, "ls-files", "-s", "-z"))]
    blobs = [(meta.split()[1], path) for meta, path in entries if meta.split()[0] != SUBMODULE]
    if not blobs:
        return {}
    sizes = _git(root, "cat-file", "--batch-check=%(objectsize)", given="".join(f"{sha}\n" for sha, _ in blobs))
    return {path: int(size) for (_, path), size in zip(blobs, sizes.split())}


def tracked_but_ignored(root: Path) -> list[str]:
    """Tracked files that a .gitignore rule (or .git/info/exclude) matches: left in the tree after the rule was added."""
    return _paths(_git(root, "ls-files", "-z", "--cached", "--ignored", "--exclude-standard"))


def tracked_under(root: Path, folder: str) -> list[str]:
    return _paths(_git(root, "ls-files", "-z", "--", folder))


def _largest(sizes: dict[str, int], count: int = 8) -> str:
    return "\n".join(f"  {size / MB:7.1f} MB  {path}" for path, size in sorted(sizes.items(), key=lambda item: -item[1])[:count])


def _listed(paths: list[str], count: int = 10) -> str:
    more = f"\n  … and {len(paths) - count} more" if len(paths) > count else ""
    return "\n".join(f"  {path}" for path in paths[:count]) + more


@pytest.fixture(scope="module")
def checkout() -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the budget is read from `git ls-files`")
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if found.returncode != 0 or Path(found.stdout.strip()).resolve() != ROOT:
        pytest.skip(f"{ROOT} is not a git checkout (an sdist or an installed copy): the repository's budget is held on "
                    "the files a clone tracks (`git ls-files`)")
    return ROOT


def test_no_tracked_file_is_over_20_mb(checkout):
    over = {path: size for path, size in tracked_sizes(checkout).items() if size > FILE_LIMIT}
    assert not over, f"{len(over)} tracked files over {FILE_LIMIT // MB} MB (a clone downloads each):\n{_largest(over)}"


def test_the_tracked_tree_is_under_120_mb(checkout):
    sizes = tracked_sizes(checkout)
    total = sum(sizes.values())
    assert total < TREE_LIMIT, (f"the tracked tree is {total / MB:.1f} MB, over the budget of {TREE_LIMIT // MB} MB; "
                                f"its largest files:\n{_largest(sizes)}")


def test_nothing_tracked_is_ignored(checkout):
    ignored = tracked_but_ignored(checkout)
    assert not ignored, (f"{len(ignored)} tracked files match a .gitignore rule (untrack them with `git rm -r --cached`, "
                         f"or drop the rule):\n{_listed(ignored)}")


def test_no_training_checkpoint_is_tracked(checkout):
    checkpoints = tracked_under(checkout, CHECKPOINTS)
    assert not checkpoints, (f"{len(checkpoints)} files tracked under {CHECKPOINTS} (optimiser states are remade, not "
                             f"shipped: docs/reproducibility.md):\n{_listed(checkpoints)}")


def test_the_checks_see_each_breach(tmp_path):
    """A repository breaking every rule: a large file, an ignored folder's file added anyway, a checkpoint."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repository"
    (root / "runs").mkdir(parents=True)
    (root / "data" / "checkpoints" / "step-1").mkdir(parents=True)
    (root / ".gitignore").write_text("runs/\n")
    (root / "runs" / "kept.txt").write_text("ignored, yet tracked\n")
    (root / "data" / "checkpoints" / "step-1" / "state.pt").write_bytes(b"\0" * 3000)
    (root / "small.txt").write_text("fine\n")
    _git(root, "init", "-q")
    _git(root, "add", ".gitignore", "small.txt", "data")
    _git(root, "add", "-f", "runs/kept.txt")
    sizes = tracked_sizes(root)
    assert sizes == {".gitignore": 6, "small.txt": 5, "runs/kept.txt": 21, "data/checkpoints/step-1/state.pt": 3000}
    assert [path for path, size in sizes.items() if size > 2000] == ["data/checkpoints/step-1/state.pt"]
    assert tracked_but_ignored(root) == ["runs/kept.txt"]
    assert tracked_under(root, CHECKPOINTS) == ["data/checkpoints/step-1/state.pt"]
    _git(root, "rm", "-q", "-r", "--cached", "runs", "data/checkpoints")
    assert tracked_but_ignored(root) == [] and tracked_under(root, CHECKPOINTS) == []
