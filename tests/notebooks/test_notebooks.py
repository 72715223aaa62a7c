"""The figure notebooks, executed once headlessly by papermill on the tiny zoo with small parameters: every paper
figure is written as PNG and PDF, the explorer pages are what the code writes now, and a rerun on the same
machine writes the same bytes. (The tutorial runs under strict nbval: test_tutorial.py.)"""
import hashlib
from pathlib import Path

import pytest

from sinklib import agreement, reproduce

SMALL = dict(n_prompts=3, n_problems=20, ks=[0, 1], progress=False)
PAPER_FIGURES = ["fig01_token_step_*", "fig03_score_histograms", "fig04_moving_sink_*", "fig05_layer_head_*",
                 "fig06a_query_split_*", "fig06b_transient_*", "fig07_greatest_sink_positions", "fig10_threshold_sweep",
                 "table1_masking_*", "table2_sink_tokens"]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebooks")
    paths = reproduce.run(SMALL, out=root / "executed", figures_dir=root / "figures", results_dir=root / "results",
                          progress=False)
    return root, paths


def test_every_notebook_ran(executed):
    _, paths = executed
    assert [p.name[:2] for p in paths] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("stem", PAPER_FIGURES)
def test_every_paper_figure_has_png_and_pdf(executed, stem):
    root, _ = executed
    for suffix in (".png", ".pdf"):
        assert list((root / "figures").glob(stem + suffix)), f"{stem}{suffix} was not written"


def test_explorer_notebook_exports_a_page_per_diffusion_zoo_model(executed):
    root, _ = executed
    pages = sorted(p.name for p in (root / "figures").glob("explorer_*.html"))
    assert pages == ["explorer_tiny-dream.html", "explorer_tiny-llada.html"]
    assert all((root / "figures" / name).stat().st_size < 2_000_000 for name in pages)
    # notebook 05 takes none of SMALL's parameters, so these are the pages `make figures` writes: the committed
    # ones must be what the code writes now (regenerate with `make figures` after changing the explorer) — the
    # page around the data byte for byte, the data up to float rounding or a near-tie of another CPU
    committed = Path(reproduce.ROOT) / "figures"
    for name in pages:
        row = agreement.compare_page(committed / name, root / "figures" / name)
        assert row.status != agreement.DIFFERS, f"figures/{name} is stale: {row.detail}"


def _written(root: Path) -> dict[str, str]:
    """sha256 of every file a run wrote at the top of its results and figures folders (PROVENANCE.json included)."""
    return {f"{folder}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in ("results", "figures") for p in sorted((root / folder).glob("*")) if p.is_file()}


def test_a_rerun_on_the_same_machine_writes_the_same_bytes(executed, tmp_path):
    """Same machine, same threads: notebook 03 run again writes byte-identical results, figures and manifests
    (`make figures` leaves `git status` clean). Each notebook runs once in the suite; this one twice."""
    root, _ = executed
    reproduce.run(SMALL, out=tmp_path / "executed", only=["03"], figures_dir=tmp_path / "figures",
                  results_dir=tmp_path / "results", progress=False)
    again = _written(tmp_path)
    first = {name: digest for name, digest in _written(root).items() if name in again}
    assert set(again) >= {"results/fig10_threshold_sweep.parquet", "figures/fig10_threshold_sweep.png",
                          "figures/fig10_threshold_sweep.pdf"}
    differing = sorted(name for name in again if name != "results/PROVENANCE.json" and name != "figures/PROVENANCE.json"
                       and again[name] != first.get(name))
    assert differing == [], f"rewritten with other bytes: {differing}"


def test_parameters_follow_what_each_notebook_declares():
    explorer = reproduce.NOTEBOOKS / "05_explorer.ipynb"
    params = reproduce.parameters_for(explorer, {"models": ["GSAI-ML/LLaDA-8B-Instruct"], "n_prompts": 30, "dtype": "bfloat16"})
    assert params == {"models": ["GSAI-ML/LLaDA-8B-Instruct"], "dtype": "bfloat16"}
    with pytest.raises(ValueError, match=r"only=\['09'\] is not allowed"):
        reproduce.notebook_paths(["09"])


def test_paper_parameter_files_name_real_checkpoints():
    import yaml

    files = sorted((reproduce.NOTEBOOKS / "params").glob("paper-*.yaml"))
    assert [f.stem for f in files] == ["paper-dream", "paper-llada", "paper-llama", "paper-mmada"]
    for file in files:
        params = yaml.safe_load(file.read_text())
        assert params["device"] == "cuda" and params["dtype"] == "bfloat16" and params["models"]
