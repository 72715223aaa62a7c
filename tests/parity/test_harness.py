"""The lm-eval backend: the harness's own pipeline (task YAML over a local JSONL, filters, metrics, sharding)
gives the same outputs and scores as sinklib's runner on the same samples."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import sinklib  # noqa: E402
from sinklib.evaluation import evaluate  # noqa: E402
from sinklib.evaluation.extract import cut_at_stops  # noqa: E402
from sinklib.evaluation.harness import SinklibLM  # noqa: E402
from sinklib.evaluation.tasks import get_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "sinklib" / "evaluation" / "lm_eval_tasks"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def offline_from_the_repository_root(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the task YAML names data/arithmetic_test.jsonl relative to the root


def _harness(model_args: str, limit: int):
    """lm-eval's simple_evaluate on our task, its task manager indexing only our tasks' folder (lm-eval's own
    thousands of task files take it 16 s to index, each time; the command line, tested below, indexes them all)."""
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model="sinklib", model_args=model_args, tasks=["zoo_arithmetic"], limit=limit,
                                   batch_size=4, log_samples=True,
                                   task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))


def _by_doc(samples):
    return {s["doc_id"]: s["resps"][0][0] for s in samples}


@pytest.mark.parametrize("name, model_args, intervention", [
    ("tiny-arm", "pretrained=tiny-arm", None),
    ("tiny-llada", "pretrained=tiny-llada,mask_top_k=1", sinklib.MaskSinks(top_k=1)),
])
def test_simple_evaluate_matches_the_sinklib_runner(name, model_args, intervention):
    results = _harness(model_args, limit=12)
    loaded = sinklib.load(name)
    reference = evaluate(loaded, get_task("arithmetic", limit=12), batch_size=4, progress=False, intervention=intervention,
                         settings=loaded.settings_for())
    outputs = _by_doc(results["samples"]["zoo_arithmetic"])
    assert [outputs[i] for i in range(12)] == [r["output"] for r in reference.records]
    assert results["results"]["zoo_arithmetic"]["exact_match,strict-match"] == pytest.approx(reference.accuracy)


@pytest.mark.process
def test_data_parallel_under_accelerate_shards_without_loss_or_duplication(tmp_path):
    accelerate = Path(sys.executable).parent / "accelerate"
    if not accelerate.exists():
        pytest.skip("accelerate is not installed")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "-m", "sinklib.evaluation.harness", "--model", "sinklib", "--model_args", "pretrained=tiny-arm",
               "--tasks", "zoo_arithmetic", "--include_path", str(TASKS), "--limit", "10", "--batch_size", "3",
               "--output_path", str(tmp_path), "--log_samples"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "on rank 1" in run.stderr, "two processes must have shared the requests"
    samples = [json.loads(line) for f in tmp_path.rglob("samples_zoo_arithmetic_*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == list(range(10))
    arm = sinklib.load("tiny-arm")
    reference = evaluate(arm, get_task("arithmetic", limit=10), arm.settings_for(gen_length=16), progress=False)
    outputs = _by_doc(samples)
    assert [outputs[i] for i in range(10)] == [r["output"] for r in reference.records]
    summary = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    assert summary["results"]["zoo_arithmetic"]["exact_match,strict-match"] == pytest.approx(reference.accuracy)


def test_loglikelihood_tasks_and_bad_model_args_get_clear_errors():
    model = SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada"})
    with pytest.raises(NotImplementedError, match=r"generate_until tasks only"):
        model.loglikelihood([])
    with pytest.raises(ValueError, match=r"mask_top_k=-1 is not allowed"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "mask_top_k": -1})
    with pytest.raises(ValueError, match=r"mask_random_k=2 is not allowed: mask_random_k must be 0 when mask_top_k is set"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "mask_top_k": 1, "mask_random_k": 2})
    with pytest.raises(ValueError, match=r"mask_source='previous' is not allowed.*did you mean 'previous_step'"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "mask_top_k": 1, "mask_source": "previous"})


@pytest.mark.parametrize("model_args, message", [
    ("pretrained=tiny-llada,trust_remote_code=no",
     r"trust_remote_code='no' is not allowed: trust_remote_code must be True or False"),
    ("pretrained=tiny-llada,trust_remote_code=1", r"trust_remote_code=1 is not allowed"),
    ("steps=8", r"model_args pretrained= is required"),
    ("pretrained=tiny-llada,steps=abc", r"steps='abc' is not allowed: steps must be an integer"),
    ("pretrained=tiny-llada,temperature=inf", r"temperature=inf is not allowed: temperature must be a finite number"),
    ("pretrained=tiny-llada,stesp=8", r"model_args stesp= is not allowed.*did you mean 'steps'"),
    ("pretrained=tiny-llada,steps=8,steps=4", r"model_args steps= is not allowed: it is given twice"),
    # a signed integer stays an integer (older lm-eval releases made it -1.0: "must be an integer")
    ("pretrained=tiny-llada,seed=-1", r"seed=-1 is not allowed: seed must be an integer >= 0"),
    ("pretrained=tiny-llada,steps", r"model_args 'steps' is not allowed: each argument is key=value"),
    ("pretrained=tiny-llada,temperature=1e308", r"temperature=1e\+308 is not allowed: temperature must be a finite number"),
    # issue 52: a policy's settings checked against the policy, never a raw TypeError
    ("pretrained=tiny-llada,policy=mask_sinks,policy.topk=1",
     r"model_args policy.topk= is not allowed: policy 'mask_sinks' takes \['policy.top_k'.*did you mean 'policy.top_k'"),
    ("pretrained=tiny-llada,policy=mask_sinks,policy.layers=3",
     r"model_args policy.top_k= is required by policy 'mask_sinks' \(e.g. policy=mask_sinks,policy.top_k=1\)"),
    ("pretrained=tiny-llada,policy=ablate_values", r"policy='ablate_values' is not allowed: .*give mask_values=zero"),
    ("pretrained=tiny-llada,policy=mask_sinkz,policy.top_k=1", r"policy='mask_sinkz' is not allowed.*did you mean 'mask_sinks'"),
])
def test_model_args_are_checked_before_any_model_loads(model_args, message, monkeypatch):
    """Before: trust_remote_code=no ran the folder's code (any non-empty string was consent)."""
    monkeypatch.setattr("sinklib.evaluation.harness.load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        SinklibLM.create_from_arg_string(model_args, {"batch_size": 1, "device": None})


def test_model_args_as_a_mapping_refuse_an_unknown_key_by_name(monkeypatch):
    """lm-eval's Python API hands model_args over as a dict: `stepz` was a raw TypeError from __init__."""
    monkeypatch.setattr("sinklib.evaluation.harness.load", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=r"model_args stepz= is not allowed: the sinklib model takes .*did you mean 'steps'"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "stepz": 4})


def test_batch_size_in_model_args_wins_over_lm_evals_own():
    """Before: "got multiple values for keyword argument 'batch_size'"."""
    model = SinklibLM.create_from_arg_string("pretrained=tiny-arm,batch_size=4", {"batch_size": 1, "device": "cpu"})
    assert model.batch_size == 4


def test_outputs_are_cut_at_the_first_stop_string():
    assert cut_at_stops("5 + 3 = 8 #### 8 Q: next", ["Q:", "\n\n"]) == "5 + 3 = 8 #### 8 "
    assert cut_at_stops("no stop", ["Q:"]) == "no stop" and cut_at_stops("a\n\nb", ["", "\n\n"]) == "a"


def test_value_ablation_is_reachable_from_model_args_and_refused_without_a_key_policy():
    from sinklib.interventions import AblateValues, MaskSinks

    model = SinklibLM.create_from_arg_string("pretrained=tiny-llada,mask_top_k=1,mask_values=zero",
                                             {"batch_size": 1, "device": "cpu"})
    assert model.intervention == AblateValues(MaskSinks(top_k=1), "zero")
    with pytest.raises(ValueError, match=r"mask_values='half' is not allowed"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "mask_top_k": 1, "mask_values": "half"})
    with pytest.raises(ValueError, match=r"mask_values='zero' is not allowed: mask_values must be None unless"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "mask_values": "zero"})


def test_a_block_length_for_a_family_without_blocks_is_refused_not_dropped():
    """The autoregressive sampler has no blocks: block_length=4 used to be dropped without a word by the layout fit.
    Dream's has them now (Fast-dLLM's block-wise sampler) and takes it."""
    with pytest.raises(ValueError, match=r"block_length=4 is not allowed for the arm family: it applies to "
                                         r"diffusion_gemma/dream/llada/mmada/udlm only"):
        SinklibLM.create_from_arg_string("pretrained=tiny-arm,block_length=4")
    assert SinklibLM.create_from_arg_string("pretrained=tiny-dream,block_length=4").settings.block_length == 4


def test_the_docstrings_policy_example_builds_its_policy():
    model = SinklibLM.create_from_arg_string("pretrained=tiny-llada,policy=mask_keys,policy.positions=0 3")
    assert model.intervention.positions == (0, 3)


@pytest.mark.parametrize("model_args, setting, expected", [
    ("policy=mask_sinks,policy.top_k=1,policy.layers=3", "layers", (3,)),
    ("policy=mask_keys,policy.positions=0 3,policy.layers=1", "layers", (1,)),
    ("policy=mask_keys,policy.positions=5", "positions", (5,)),
])
def test_one_value_for_a_setting_that_takes_several_is_a_list_of_one(model_args, setting, expected):
    """policy.layers=3 is the list [3], as policy.layers=3 5 is [3, 5] (it raised "'int' object is not iterable")."""
    model = SinklibLM.create_from_arg_string(f"pretrained=tiny-llada,{model_args}")
    assert getattr(model.intervention, setting) == expected


def test_policy_settings_beside_policy_dot_settings_is_refused_not_overwritten():
    with pytest.raises(ValueError, match=r"policy_settings='x' is not allowed: policy_settings must be left out when "
                                         r"model_args give \['policy.top_k'\]"):
        SinklibLM.create_from_arg_string("pretrained=tiny-llada,policy=mask_sinks,policy.top_k=1,policy_settings=x")
