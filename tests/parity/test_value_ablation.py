"""Value-path ablation and the masking audit, against references that do not go through sinklib's attention: forward
hooks that rewrite the value projection's output (what "the key keeps its attention, its value is replaced" means),
and the statistics of the same call with the mask lifted."""
import pytest
import torch

import sinklib
from sinklib import compat
from sinklib.interventions import AblateValues, Audited, Intervention, MaskKeys, MaskSinks, make_policy
from tests.models import llama, qwen2_gqa
from tests.parity.test_interventions import reference_top

IDS = torch.tensor([[5, 9, 2, 33, 17, 8, 41, 3, 12, 7, 11, 4], [6, 1, 30, 22, 9, 19, 2, 44, 10, 5, 8, 8]])


def _with_values_rewritten(model, positions, mode, heads=None):
    """Logits with the value projection's output at `positions` (in `heads`, each a value head here) replaced: zeros,
    or the mean over every position — done by a forward hook on v_proj, not through sinklib."""
    head_dim = model.config.hidden_size // model.config.num_attention_heads

    def rewrite(module, args, out):
        out = out.clone()
        chosen = range(out.shape[-1] // head_dim) if heads is None else heads
        for head in chosen:
            columns = slice(head * head_dim, (head + 1) * head_dim)
            replacement = torch.zeros_like(out[:, 0, columns]) if mode == "zero" else out[:, :, columns].mean(1)
            for position in positions:
                out[:, position, columns] = replacement
        return out

    hooks = [layer.self_attn.v_proj.register_forward_hook(rewrite) for layer in model.model.layers]
    try:
        with torch.no_grad():
            return model(input_ids=IDS).logits
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("build", [lambda: llama(causal=False), qwen2_gqa], ids=["llama", "qwen2-gqa"])
def test_ablating_values_in_every_head_equals_rewriting_the_value_projection(build, mode):
    model = build()
    with torch.no_grad(), sinklib.capture(model, intervention=AblateValues(MaskKeys([1, 4]), mode)) as rec:
        logits = model(input_ids=IDS).logits
    with torch.no_grad(), sinklib.capture(model) as clean:
        plain = model(input_ids=IDS).logits
    torch.testing.assert_close(logits, _with_values_rewritten(model, [1, 4], mode), atol=1e-5, rtol=0)
    assert not torch.allclose(logits, plain, atol=1e-3)
    # the first layer's attention is computed from the same inputs: the ablated keys keep their attention there
    assert torch.equal(rec.scores[:, 0], clean.scores[:, 0])


def test_ablating_values_in_some_heads_leaves_the_others():
    model = llama(causal=True)  # one value head per query head: a head's values are its own columns
    intervention = AblateValues(MaskKeys([0], heads=[1, 3]), "zero")
    with torch.no_grad(), sinklib.capture(model, intervention=intervention):
        logits = model(input_ids=IDS).logits
    torch.testing.assert_close(logits, _with_values_rewritten(model, [0], "zero", heads=[1, 3]), atol=1e-5, rtol=0)


class FixedKeys(Intervention):
    """Test policy: the given per-layer key masks, at step 1 only."""

    def __init__(self, masks):
        self.masks = masks

    def keys_to_mask(self, call):
        return self.masks[call.layer] if call.step == 1 else None


def test_sink_values_are_chosen_from_the_previous_steps_attention():
    """The top-2 keys of step 0 (found here from its recorded scores, by the definition), ablated at step 1, give the
    same logits as AblateValues(MaskSinks) choosing them itself."""
    model = llama(causal=False)
    steps = [IDS, IDS.roll(1, -1)]
    policy = AblateValues(MaskSinks(top_k=2, eps=0.0, threshold=False), "mean")
    with torch.no_grad(), sinklib.capture(model, intervention=policy) as rec:
        outputs = [model(input_ids=x).logits for x in steps]
    assert torch.equal(outputs[0], model(input_ids=steps[0]).logits), "step 0 ablates nothing"
    masks = {layer: reference_top(rec.scores[0, layer], 2, eps=-1e9) for layer in range(2)}
    with torch.no_grad(), sinklib.capture(model, intervention=AblateValues(FixedKeys(masks), "mean")):
        model(input_ids=steps[0])
        expected = model(input_ids=steps[1]).logits
    torch.testing.assert_close(outputs[1], expected, atol=1e-6, rtol=0)
    assert not torch.allclose(outputs[1], model(input_ids=steps[1]).logits, atol=1e-3)


def test_layer_and_step_restricted_masking_masks_only_there():
    model = llama(causal=False)
    steps = [IDS, IDS.roll(1, -1), IDS.roll(2, -1)]
    policy = MaskSinks(top_k=1, eps=0.0, threshold=False, layers=[1], steps=[2])
    with torch.no_grad(), sinklib.capture(model, intervention=policy) as rec:
        for x in steps:
            model(input_ids=x)
    masked = rec.masked_keys  # [steps, layers, batch, heads, keys]
    assert masked[2, 1].sum(-1).eq(1).all() and masked[:2].sum() == 0 and masked[2, 0].sum() == 0
    assert "layers=(1,)" in repr(policy) and repr(MaskSinks(top_k=1)) == \
        "MaskSinks(top_k=1, eps=3.0, source='previous_step', rows='all', threshold=True)"


def test_the_audit_shows_the_attention_left_masked_keys_and_stayed_on_ablated_ones():
    model = llama(causal=False)
    compat.make_bidirectional(model)  # transformers 4.x keeps each module causal unless told (a causal query 0 keeps key 0)
    steps = [IDS, IDS.roll(1, -1), IDS.roll(2, -1)]
    masked = Audited(MaskSinks(top_k=1, eps=0.0, threshold=False))
    ablated = Audited(AblateValues(MaskSinks(top_k=1, eps=0.0, threshold=False), "zero"))
    for policy in (masked, ablated):
        with torch.no_grad(), sinklib.capture(model, intervention=policy):
            for x in steps:
                model(input_ids=x)
    assert masked.ledger["masked"] == ablated.ledger["masked"] == 2 * 2 * 2 * 4  # steps 1, 2 × layers × batch × heads
    assert masked.ledger["before"] > 1.0 and masked.ledger["after"] == 0.0
    assert ablated.ledger["after"] == pytest.approx(ablated.ledger["before"])
    assert repr(masked) == repr(masked.policy)


@pytest.mark.parametrize("make, message", [
    (lambda: AblateValues(MaskSinks(top_k=1), "half"), "mode='half' is not allowed"),
    (lambda: AblateValues(None), "select=None is not allowed"),
    (lambda: MaskSinks(top_k=1, threshold="no"), "threshold='no' is not allowed"),
    (lambda: MaskSinks(top_k=1, layers=[-1]), "layers[]=-1 is not allowed"),
])
def test_bad_settings_are_refused_naming_the_parameter(make, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        make()


def test_a_layer_the_model_lacks_is_refused_before_any_forward():
    with pytest.raises(ValueError, match="layers=\\[5\\] is not allowed"):
        with sinklib.capture(llama(), intervention=MaskSinks(top_k=1, layers=[5])):
            pass


def test_value_ablation_is_registered_by_name():
    policy = make_policy("ablate_values", select=MaskSinks(top_k=2), mode="mean")
    assert policy == AblateValues(MaskSinks(top_k=2), "mean")
