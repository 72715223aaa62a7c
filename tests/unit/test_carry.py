"""What a sink carries (sinklib.carry) and how stable the top keys are (dynamics.topk_overlap), against references
computed another way: a head's output with every key but one masked is that key's value, so the output projection's
input is the value vector itself."""
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import sinklib
from sinklib import carry, compat, dynamics
from sinklib.interventions import MaskKeys
from sinklib.trace import Trace
from tests.models import diffusion_llama

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

IDS = torch.tensor([5, 9, 2, 33, 17, 8, 41, 3])


def _loaded(model):
    return SimpleNamespace(model=model, layer_names=None, device=torch.device("cpu"),
                           logits=lambda ids: model(input_ids=ids).logits)


def test_value_norms_are_the_heads_outputs_when_one_key_is_left():
    model = diffusion_llama()  # bidirectional, 4 query heads over 2 value heads
    compat.make_bidirectional(model)  # transformers 4.x keeps each module causal unless told
    raw, written = carry.value_norms(_loaded(model), IDS)
    assert raw.shape == written.shape == (2, 4, len(IDS))
    o_proj = model.model.layers[0].self_attn.o_proj
    head_dim = o_proj.in_features // 4
    seen = []
    for key in (0, 3, 7):
        seen.clear()
        hook = o_proj.register_forward_hook(lambda module, args, out: seen.append(args[0][0]))
        others = [p for p in range(len(IDS)) if p != key]
        try:
            with torch.no_grad(), sinklib.capture(model, intervention=MaskKeys(others, layers=[0])):
                model(input_ids=IDS[None])
        finally:
            hook.remove()
        heads = seen[0][0].view(4, head_dim)  # query 0's head outputs: the value of the one key left, per head
        torch.testing.assert_close(raw[0, :, key], heads.norm(dim=-1), atol=1e-5, rtol=1e-5)
        per_head = torch.stack([heads[h] @ o_proj.weight[:, h * head_dim:(h + 1) * head_dim].T for h in range(4)])
        torch.testing.assert_close(written[0, :, key], per_head.norm(dim=-1), atol=1e-5, rtol=1e-5)
    assert torch.equal(raw[0, 0], raw[0, 1]) and not torch.equal(raw[0, 1], raw[0, 2]), "heads 0, 1 share a value head"


def test_output_share_weighs_scores_by_what_each_key_writes():
    scores = torch.tensor([[3.0, 1.0, float("nan"), 0.0]])
    norms = torch.tensor([[0.1, 2.0, 5.0, 9.0]])
    share = carry.output_share(scores, norms)
    torch.testing.assert_close(share[0, [0, 1, 3]], torch.tensor([0.3 / 2.3, 2.0 / 2.3, 0.0]))
    assert torch.isnan(share[0, 2])


def _trace(scores, autoregressive=False):
    steps, layers, heads, keys = scores.shape
    return Trace(scores=scores, tokens=torch.zeros(steps + 1, keys, dtype=torch.long),
                 is_masked=torch.zeros(steps, keys, dtype=torch.bool), prompt_len=0, layer_names=["a"] * layers,
                 meta={"model": "m", "kind": "autoregressive" if autoregressive else "diffusion"})


def test_topk_overlap_is_the_jaccard_of_consecutive_top_keys():
    scores = torch.tensor([[9.0, 8.0, 1.0, 0.0], [9.0, 0.0, 8.0, 1.0], [0.0, 1.0, 8.0, 9.0]])[:, None, None, :]
    frame = dynamics.topk_overlap(_trace(scores), k=2)
    # {0,1} → {0,2}: 1 shared of 3; {0,2} → {2,3}: 1 of 3
    assert frame["jaccard"].tolist() == [1 / 3, 1 / 3] and frame["step"].tolist() == [1, 2]
    assert dynamics.topk_overlap(_trace(scores), k=4)["jaccard"].tolist() == [1.0, 1.0]


def test_stability_by_layer_counts_moves_of_the_greatest_sink():
    steps = torch.full((4, 1, 2, 6), 0.5)
    steps[:, 0, 0, 0] = 5.0  # head 0: a sink that stays
    for step, position in enumerate([1, 2, 2, 3]):  # head 1: a sink that moves, stays, moves
        steps[step, 0, 1, position] = 5.0
    frame = dynamics.stability_by_layer([_trace(steps)], k=1, eps=3.0)
    row = frame.iloc[0]
    assert row["move_rate"] == (0 + 2 / 3) / 2 and row["heads_with_pairs"] == 2
    assert isinstance(frame, pd.DataFrame) and row["jaccard_mean"] == (3 + 1) / 6
