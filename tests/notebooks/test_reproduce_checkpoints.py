"""A user's real run, end to end: `python -m sinklib.reproduce --params <YAML>` with `models` naming hub-style
checkpoint folders (built from our stand-ins) runs notebooks 01–04: the three diffusion families together, and the
autoregressive family alone, there with an ε so high that no sink exists; with GSM8K from a local JSONL."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sinklib import mmada_repo, reproduce
from tests import checkpoints

pytest.importorskip("papermill")
ROOT = Path(__file__).resolve().parents[2]
PER_MODEL = {"fig01_token_step_{name}.png", "fig05_layer_head_{name}.png"}
SHARED = {"fig03_score_histograms.png", "table2_sink_tokens.png", "fig10_threshold_sweep.png",
          "table1_masking_gsm8k.png", "table1_masking_gsm8k.md"}


@pytest.mark.slow
@pytest.mark.parametrize("families", [("llada", "dream", "mmada"), ("llama",)], ids=["diffusion", "llama-alone"])
def test_reproduce_runs_notebooks_01_to_04_on_hub_style_checkpoints(families, tmp_path):
    repo = checkpoints.mmada_repository(tmp_path / "MMaDA")
    folders = [tmp_path / f"standin-{family}" for family in families]
    for family, folder in zip(families, folders):
        if family == "llama":
            checkpoints.build_llama(folder)
        else:
            checkpoints.build(family, folder, repo / "models" if family == "mmada" else None)
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps({"question": f"tom has {n} apples . "
                                                                          "how many apples does tom have now ?",
                                                              "answer": f"tom has {n}.\n#### {n}"}) + "\n" for n in (5, 7)))
    autoregressive_alone = families == ("llama",)
    params = {"models": [str(folder) for folder in folders], "trust_remote_code": not autoregressive_alone,
              "device": "cpu", "n_prompts": 2, "steps": 4, "gen_length": 4, "n_problems": 2, "ks": [0, 1],
              "batch_size": 2, "task": "gsm8k", "task_path": str(tmp_path / "gsm8k.jsonl"),
              "figures_dir": str(tmp_path / "figures"), "results_dir": str(tmp_path / "results"), "progress": False,
              "eps": 1000.0 if autoregressive_alone else 3.0}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, mmada_repo.ENV: str(repo)}
    out = subprocess.run([sys.executable, "-m", "sinklib.reproduce", "--params", str(tmp_path / "params.yaml"),
                          "--only", "01", "02", "03", "04", "--out", str(tmp_path / "executed")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    written = {p.name for p in (tmp_path / "figures").iterdir()}
    assert SHARED | {f.format(name=folder.name) for folder in folders for f in PER_MODEL} <= written
    table1 = (tmp_path / "figures" / "table1_masking_gsm8k.md").read_text()
    assert "top-1" in table1 and all(folder.name in table1 for folder in folders)
    if autoregressive_alone:  # no sink at ε = 1000: a labelled empty Table 2, never a crash
        assert len(pd.read_parquet(tmp_path / "results" / "table2_sink_tokens.parquet")) == 0


def test_runs_outside_the_zoo_write_beside_the_zoo_outputs_not_over_them():
    folders = reproduce.output_folders({"models": ["/data/LLaDA-8B-Instruct/"]})
    assert folders == {"figures_dir": str(ROOT / "figures" / "LLaDA-8B-Instruct"),
                       "results_dir": str(ROOT / "data" / "results" / "LLaDA-8B-Instruct")}
    assert reproduce.output_folders({}) == {} and reproduce.output_folders({"progress": False}) == {}
    default_models = reproduce.declared_parameters(reproduce.notebook_paths())["models"]
    assert reproduce.output_folders({"models": default_models}) == {}  # the default run, named
    # the zoo with other values (a subset of models, another eps) would rewrite the committed pooled tables and
    # figures with other content: such runs write into folders of their own, named by a hash of those values
    subset, other_eps = reproduce.output_folders({"models": ["tiny-llada", "tiny-arm"]}), reproduce.output_folders({"eps": 2.0})
    for folders in (subset, other_eps):
        assert Path(folders["figures_dir"]).parent == ROOT / "figures" and Path(folders["figures_dir"]).name.startswith("custom-")
        assert Path(folders["results_dir"]).name == Path(folders["figures_dir"]).name
    assert subset != other_eps and reproduce.output_folders({"eps": 2.0}) == other_eps


@pytest.mark.parametrize("params, message", [
    ({"n_promts": 1}, "parameter 'n_promts' is not allowed: no notebook declares it (did you mean 'n_prompts'?)"),
    ({"models": "tiny-llada"}, "models='tiny-llada' is not allowed: models must be a list"),
    ({"n_prompts": "6"}, "n_prompts='6' is not allowed: n_prompts must be an integer"),
    ({"steps": -4}, "steps=-4 is not allowed: steps must be an integer >= 1"),
    ({"gen_length": 10, "block_length": 4}, "gen_length=10 is not allowed: gen_length must be a multiple of block_length=4"),
])
def test_unknown_or_mistyped_parameters_are_refused_before_anything_runs(params, message, tmp_path):
    with pytest.raises(ValueError) as error:
        reproduce.run(params, out=tmp_path)
    assert message in str(error.value)
    assert not list(tmp_path.iterdir())
