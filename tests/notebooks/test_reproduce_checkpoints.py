"""A user's real run, end to end: `python -m sinklib.reproduce --params <YAML>` with `models` naming hub-style
checkpoint folders (built from our stand-ins) runs notebooks 01–04 on every family at once (LLaDA, Dream and MMaDA
with their own modelling code, and a Llama), with GSM8K from a local JSONL (tests/notebooks/reproduce_run.py); and
the parameters gate that refuses a bad run before anything runs. (At an ε no key reaches, Table 2 is a labelled
empty table: tests/unit/test_analyses_picks.py.)"""
from pathlib import Path

import pytest

from sinklib.lab import reproduce
from tests.notebooks.reproduce_run import ROOT, run_notebooks_01_to_04_on_hub_style_checkpoints

pytest.importorskip("papermill")


@pytest.mark.slow
def test_reproduce_runs_notebooks_01_to_04_on_every_family_together(tmp_path):
    run_notebooks_01_to_04_on_hub_style_checkpoints(("llada", "dream", "mmada", "llama"), tmp_path)


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
