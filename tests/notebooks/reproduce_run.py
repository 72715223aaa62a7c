"""The reproduce run on hub-style checkpoint folders (test_reproduce_checkpoints.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from sinklib import mmada_repo
from tests import checkpoints

ROOT = Path(__file__).resolve().parents[2]
PER_MODEL = {"fig01_token_step_{name}.png", "fig05_layer_head_{name}.png"}
SHARED = {"fig03_score_histograms.png", "table2_sink_tokens.png", "fig10_threshold_sweep.png",
          "table1_masking_gsm8k.png", "table1_masking_gsm8k.md"}


def run_notebooks_01_to_04_on_hub_style_checkpoints(families: tuple[str, ...], tmp_path: Path) -> None:
    """`python -m sinklib.reproduce --params <YAML> --only 01 02 03 04` on hub-style folders of `families` (the
    diffusion ones run their own modelling code: trust_remote_code), then what it must have written: every figure,
    and Table 1 naming each folder."""
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
    params = {"models": [str(folder) for folder in folders], "trust_remote_code": True,
              "device": "cpu", "n_prompts": 2, "steps": 4, "gen_length": 4, "n_problems": 2, "ks": [0, 1],
              "batch_size": 2, "task": "gsm8k", "task_path": str(tmp_path / "gsm8k.jsonl"),
              "figures_dir": str(tmp_path / "figures"), "results_dir": str(tmp_path / "results"), "progress": False,
              "eps": 3.0}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, mmada_repo.ENV: str(repo)}
    out = subprocess.run([sys.executable, "-m", "sinklib.reproduce", "--params", str(tmp_path / "params.yaml"),
                          "--only", "01", "02", "03", "04", "--out", str(tmp_path / "executed")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    written = {p.name for p in (tmp_path / "figures").iterdir()}
    missing = (SHARED | {f.format(name=folder.name) for folder in folders for f in PER_MODEL}) - written
    assert not missing, f"not written: {sorted(missing)}; written: {sorted(written)}"
    table1 = (tmp_path / "figures" / "table1_masking_gsm8k.md").read_text()
    assert "top-1" in table1 and all(folder.name in table1 for folder in folders)
    sink_tokens = pd.read_parquet(tmp_path / "results" / "table2_sink_tokens.parquet")
    assert {Path(model).name for model in sink_tokens["model"]} <= {folder.name for folder in folders}, \
        sink_tokens["model"].unique()
