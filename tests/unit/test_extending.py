"""Extension points, each used from outside the package: what a newcomer adds touches only their own file and one
registry call (sinklib/ is not edited; the family's own proof is tests/unit/test_families.py with tests/toy_family.py).

- an intervention: a class with keys_to_mask, registered in sinklib.interventions.POLICIES, then reached by name —
  by the evaluation runner (make_policy) and by the lm-eval model (model_args policy=NAME,policy.SETTING=VALUE);
- a Table 1 condition: a Condition registered in sinklib.evaluation.table1.CONDITIONS, a column of masking_table
  by name beside the paper's.
"""
from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch

import sinklib
from sinklib.evaluation import evaluate
from sinklib.evaluation.table1 import CONDITIONS, Condition, masking_table
from sinklib.interventions import POLICIES, Intervention, MaskKeys, make_policy


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
    POLICIES.register("mask_first_keys", MaskFirstKeys)
    yield "mask_first_keys"
    POLICIES.unregister("mask_first_keys")


def test_a_policy_defined_here_runs_by_name_as_the_built_in_policy_it_equals(toy_policy):
    loaded = sinklib.load("tiny-arm")
    by_name = evaluate(loaded, "arithmetic", limit=6, batch_size=3, progress=False, gen_length=12,
                       intervention=make_policy(toy_policy, count=30))
    built_in = evaluate(loaded, "arithmetic", limit=6, batch_size=3, progress=False, gen_length=12,
                        intervention=MaskKeys(positions=tuple(range(30))))
    clean = evaluate(loaded, "arithmetic", limit=6, batch_size=3, progress=False, gen_length=12)
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
                                                lambda family, k, eps, source, seed: make_policy(toy_policy, count=k)))
    try:  # a table names its columns through the registry: read it while the condition is registered
        table = masking_table(["tiny-arm"], ks=[0, 30], conditions=["sinks", "first keys"], limit=6, batch_size=3,
                              progress=False, checks=False, gen_length=12)
        columns, findings = list(table.wide().columns), table.summary().findings
    finally:
        CONDITIONS.unregister("first keys")
    assert columns == ["unmasked", "top-30", "first-30"]
    loaded = sinklib.load("tiny-arm")
    alone = evaluate(loaded, "arithmetic", limit=6, batch_size=3, progress=False, gen_length=12,
                     intervention=MaskFirstKeys(count=30))
    row = table.frame.set_index(["condition", "k"]).loc[("first keys", 30)]
    assert row["accuracy"] == alone.accuracy and row["n"] == 6
    assert "with its first 30 keys masked" in findings[0]
    with pytest.raises(ValueError, match=r"conditions='first keys' is not allowed: conditions must be one of"):
        masking_table(["tiny-arm"], ks=[0, 1], conditions=["first keys"])
