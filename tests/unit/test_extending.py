"""Extension points, each used from outside the package: what a newcomer adds touches only their own file and one
registry call (sinklib/ is not edited; the family's own proof is tests/unit/test_families.py with tests/toy_family.py).

- an intervention: a class with keys_to_mask, registered in sinklib.interventions.MASKING_POLICIES, then reached by name —
  by the evaluation runner (make_policy) and by the lm-eval model (model_args policy=NAME,policy.SETTING=VALUE);
- a Table 1 condition: a Condition registered in sinklib.evaluation.conditions.CONDITIONS, a column of masking_table
  by name beside the paper's;
- a task: a Task registered with register_task, evaluated and masked by name (no family needs a preset for it);
- a notebook: the .ipynb and one module holding its run config (which registers itself in sinklib.lab.runs.RUNS) and
  its section, executed by papermill from a folder outside the package.
"""
from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch

import sinklib
from sinklib.evaluation import evaluate
from sinklib.evaluation.conditions import CONDITIONS, Condition
from sinklib.evaluation.table1 import masking_table
from sinklib.evaluation.tasks import get_task
from sinklib.interventions import MASKING_POLICIES, Intervention, MaskKeys, make_policy


class MaskFirstKeys(Intervention):
    """The toy policy: every query loses the first `count` keys (the prompt's opening tokens: where a causal model's
    sink sits)."""

    def __init__(self, count: int = 1) -> None:
        self.count = count

    def keys_to_mask(self, call):
        mask = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool, device=call.device)
        mask[..., :self.count] = True
        return mask


@pytest.fixture()
def toy_policy():
    MASKING_POLICIES.register("mask_first_keys", MaskFirstKeys)
    yield "mask_first_keys"
    MASKING_POLICIES.unregister("mask_first_keys")


def test_a_policy_defined_here_runs_by_name_as_the_built_in_policy_it_equals(toy_policy):
    loaded = sinklib.load("tiny-arm")
    by_name = evaluate(loaded, get_task("arithmetic", limit=6), loaded.settings_for(gen_length=12), batch_size=3, progress=False,
                       intervention=make_policy(toy_policy, count=30))
    built_in = evaluate(loaded, get_task("arithmetic", limit=6), loaded.settings_for(gen_length=12), batch_size=3, progress=False,
                        intervention=MaskKeys(positions=tuple(range(30))))
    clean = evaluate(loaded, get_task("arithmetic", limit=6), loaded.settings_for(gen_length=12), batch_size=3, progress=False)
    assert [r["output"] for r in by_name.records] == [r["output"] for r in built_in.records]
    assert [r["output"] for r in by_name.records] != [r["output"] for r in clean.records], "the policy acts"
    assert inspect.getsourcefile(MaskFirstKeys) == __file__, "defined outside the package"


def test_the_lm_eval_model_takes_any_registered_policy_by_name(toy_policy):
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm-evaluation-harness is not installed (pip install -e '.[eval]')")
    from sinklib.evaluation.harness import SinklibLM

    model = SinklibLM.create_from_arg_string(f"pretrained=tiny-arm,policy={toy_policy},policy.count=2",
                                             {"batch_size": 1, "device": "cpu"})
    assert isinstance(model.intervention, MaskFirstKeys) and model.intervention.count == 2
    listed = SinklibLM.create_from_arg_string("pretrained=tiny-arm,policy=mask_keys,policy.positions=0 3", {})
    assert listed.intervention == MaskKeys(positions=(0, 3))
    with pytest.raises(ValueError, match=r"policy='mask_first_key' is not allowed: policy must be one of .*did you mean "
                                         r"'mask_first_keys'"):
        SinklibLM.create_from_arg_string("pretrained=tiny-arm,policy=mask_first_key", {})
    with pytest.raises(ValueError, match=r"policy='mask_keys' is not allowed: policy must be None when mask_top_k"):
        SinklibLM.create_from_arg_string("pretrained=tiny-arm,mask_top_k=1,policy=mask_keys,policy.positions=0", {})
    with pytest.raises(ValueError, match=r"policy_settings=\{'count': 2\} is not allowed: policy_settings must be empty"):
        SinklibLM.create_from_arg_string("pretrained=tiny-arm,policy.count=2", {})


def test_a_table_1_condition_defined_here_is_a_column_by_name(toy_policy):
    CONDITIONS.register("first keys", Condition("first keys", "first", "with its first {k} key{s} masked",
                                                lambda family, k, eps, seed: make_policy(toy_policy, count=k)))
    try:  # a table names its columns through the registry: read it while the condition is registered
        arm = sinklib.load("tiny-arm")
        table = masking_table([arm], task=get_task("arithmetic", limit=6), ks=[0, 30], conditions=["sinks", "first keys"],
                              batch_size=3, progress=False, settings=arm.settings_for(gen_length=12))
        columns, findings = list(table.wide().columns), table.summary().findings
    finally:
        CONDITIONS.unregister("first keys")
    assert columns == ["unmasked", "top-30", "first-30"]
    loaded = sinklib.load("tiny-arm")
    alone = evaluate(loaded, get_task("arithmetic", limit=6), loaded.settings_for(gen_length=12), batch_size=3, progress=False,
                     intervention=MaskFirstKeys(count=30))
    row = table.frame.set_index(["condition", "k"]).loc[("first keys", 30)]
    assert row["accuracy"] == alone.accuracy and row["n"] == 6
    assert "with its first 30 keys masked" in findings[0]
    with pytest.raises(ValueError, match=r"conditions='first keys' is not allowed: conditions must be one of"):
        masking_table(["tiny-arm"], ks=[0, 1], conditions=["first keys"])


def _doubling(path=None):
    """The toy task's samples: "Q: what is twice N ? A:" with the zoo's word-level vocabulary."""
    from sinklib.evaluation.tasks import Sample

    return [Sample(f"twice-{n}", f"Q: tom has {n} apples . tom gets {n} more apples . how many apples does tom have "
                   "now ? A:", str(2 * n)) for n in range(1, 7)]


def test_a_task_defined_here_is_evaluated_and_masked_by_name_with_no_family_preset():
    from sinklib.evaluation.tasks import TASKS, Task, register_task, score_final_number

    doubling = Task("doubling", _doubling, chat=False, scorer=score_final_number, gen_length=8)
    register_task(doubling)
    try:
        loaded = sinklib.load("tiny-arm")
        summary = evaluate(loaded, "doubling", batch_size=3, progress=False)
        table = masking_table([loaded], "doubling", ["sinks"], ks=[0, 1], progress=False)
    finally:
        TASKS.unregister("doubling")
    by_hand = [score_final_number(generate_answer, sample)["correct"]
               for sample, generate_answer in zip(_doubling(), _answers(loaded, doubling))]
    assert summary.n == 6 and summary.accuracy == sum(by_hand) / 6
    assert table.frame.set_index(["condition", "k"]).loc[("sinks", 0), "accuracy"] == summary.accuracy
    assert list(table.wide().columns) == ["unmasked", "top-1"]


def _answers(loaded, task):
    """Each sample answered by sinklib.generate alone, with the settings evaluate gives a zoo model (its own 16-token
    slot: the task's gen_length is for real checkpoints)."""
    from sinklib.generation import generate

    settings = loaded.settings_for(task)
    assert settings == loaded.settings_for() and settings.gen_length == 16
    return [generate(loaded, s.prompt, settings, seed=0, chat=False, progress=False).text for s in task.samples()]


TOY_MODULE = '''"""The toy notebook's one other file: its run config (registered by naming NOTEBOOK) and its section."""
from dataclasses import dataclass

import pandas as pd

from sinklib import dynamics
from sinklib.evaluation.tasks import trace_prompts
from sinklib.trace_store import collect_traces
from sinklib.lab.runs import ModelsPart, OutputsPart, RunConfig, SamplingPart, default_copy
from sinklib.summary import Layout, Result
from sinklib.validation import Count, Folder, ModelNames, validated


@validated
@dataclass(frozen=True)
class ToyRun(OutputsPart, SamplingPart, ModelsPart, RunConfig):
    NOTEBOOK = "99_toy"
    models: ModelNames = default_copy(["tiny-arm"])
    n_prompts: Count = 1
    figures_dir: Folder = "figures"  # beside the notebook, in its own folder
    results_dir: Folder = "results"

    def collect(self):
        loaded = self.load()
        return {name: collect_traces(model, trace_prompts(model.prompt_style, self.n_prompts), seed=self.seed,
                                     progress=False, settings=self.settings_for(model))
                for name, model in loaded.items()}


def strongest_heads(traces) -> Result:
    rows = [dict(zip(("layer", "head"), dynamics.strongest_head(ts[0])), model=name) for name, ts in traces.items()]
    result = Result()
    result.add_table("toy_strongest_heads", pd.DataFrame(rows), Layout(("model",)))
    result.shown = result.tables["toy_strongest_heads"]
    return result
'''


@pytest.mark.process
def test_a_notebook_defined_here_runs_under_papermill_with_one_other_file(tmp_path):
    """The notebook and one module, in a folder outside the package: its config registers itself, agrees with the
    parameters cell, and its table is written with the layout a rerun is compared by."""
    papermill = pytest.importorskip("papermill")
    import json
    import sys

    import nbformat

    from sinklib import provenance
    from sinklib.lab import runs

    (tmp_path / "toy_notebook.py").write_text(TOY_MODULE)
    parameters = nbformat.v4.new_code_cell(
        'models = ["tiny-arm"]\ntrust_remote_code = False\ndevice = "cpu"\ndtype = None\nsteps = None\n'
        'gen_length = None\nblock_length = None\nseed = 0\nfigures_dir = "figures"\nresults_dir = "results"\n'
        'progress = True\nn_prompts = 1', metadata={"tags": ["parameters"]})
    body = nbformat.v4.new_code_cell("import toy_notebook\nrun = toy_notebook.ToyRun.from_namespace(globals())\n"
                                     "traces = run.collect()\nrun.save(toy_notebook.strongest_heads(traces)).shown")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · Toy"), parameters, body],
                                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    nbformat.write(notebook, tmp_path / "99_toy.ipynb")
    made = sorted(p.name for p in tmp_path.iterdir())
    papermill.execute_notebook(str(tmp_path / "99_toy.ipynb"), str(tmp_path / "executed.ipynb"),
                               parameters={"n_prompts": 2}, cwd=str(tmp_path), progress_bar=False)
    assert made == ["99_toy.ipynb", "toy_notebook.py"]  # the two files a newcomer writes
    table = tmp_path / "results" / "toy_strongest_heads.parquet"
    assert provenance.read_layout(table) == {"keys": ["model"], "scope": "model", "index": False, "threshold": None,
                                             "outcome": None}
    assert provenance.read_record(table)["config"]["n_prompts"] == 2
    sys.path.insert(0, str(tmp_path))
    try:
        import toy_notebook

        assert runs.run_for("99_toy.ipynb") is toy_notebook.ToyRun
        assert runs.agreement_with_notebook(toy_notebook.ToyRun, tmp_path / "99_toy.ipynb") == []
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("toy_notebook", None)
        runs.RUNS.unregister("99_toy")
    assert json.loads((tmp_path / "executed.ipynb").read_text())["cells"][-1]["outputs"], "the section showed its table"
