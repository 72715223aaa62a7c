"""One vocabulary for activations (sinklib.activation_names): capture, carry and the lens choose their layers with the
same names_filter, a filter keeps the numbers of a run without one (the kept layers' slice of a full run, bit for
bit), and a filter that names nothing the model has, keeps nothing or is no filter is refused naming names_filter."""
import pytest
import torch

import sinklib
from sinklib import activation_names, carry, lens
from sinklib.validation import BadValue
from tests.models import qwen2_gqa, with_cache

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

PROMPT = "Q: 3 + 4 = ? A:"
KEPT = [1, 3]  # tiny-llada has blocks 0..3
FILTERS = {
    "callable": lambda name: name.startswith(("blocks.1.", "blocks.3.")),
    "list": [f"blocks.{layer}.{kind}" for layer in KEPT for kind in activation_names.KINDS],
}


@pytest.fixture(scope="module")
def run():
    loaded = sinklib.load("tiny-llada")
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=4), progress=False)
    ids = torch.tensor([sinklib.encode(loaded, PROMPT, chat=False)])
    return loaded, trace, ids


def _capture(loaded, ids, **options):
    with torch.no_grad(), sinklib.capture(loaded, **options) as recorder:
        loaded.model(ids)
        loaded.model(ids)
    return recorder


def test_the_vocabulary_names_every_block_of_a_loaded_model(run):
    loaded, _, _ = run
    offered = activation_names.model_names(loaded)
    assert offered[:3] == ["blocks.0.attn.scores", "blocks.0.attn.values", "blocks.0.resid"]
    assert len(offered) == 4 * len(activation_names.KINDS) and offered[-1] == "blocks.3.resid"
    assert activation_names.parse_name("blocks.12.attn.values") == (12, "attn.values")
    assert activation_names.select_layers(None, 4, "resid") == [0, 1, 2, 3]


@pytest.mark.parametrize("how", sorted(FILTERS))
def test_capture_carry_and_the_lens_keep_the_same_layers_for_one_filter(run, how):
    loaded, trace, ids = run
    names_filter = FILTERS[how]
    recorder = _capture(loaded, ids, names_filter=names_filter)
    assert recorder.layer_ids == KEPT and recorder.scores.shape[1] == len(KEPT)
    assert recorder.names == ["blocks.1.attn.scores", "blocks.3.attn.scores"]
    assert recorder.layer_names == [f"model.layers.{layer}.self_attn" for layer in KEPT]
    raw, written = carry.value_norms(loaded, ids[0], names_filter)
    assert raw.shape[0] == written.shape[0] == len(KEPT)
    assert sorted(set(carry.sink_carry(loaded, trace, steps=[0], names_filter=names_filter)["layer"])) == KEPT
    assert sorted(set(lens.logit_lens(loaded, trace, steps=[0], names_filter=names_filter)["layer"])) == KEPT
    assert [layer for layer, _ in lens.iter_layer_logits(loaded, ids[0], names_filter)] == KEPT


def test_a_filtered_capture_is_the_slice_of_a_full_one_with_or_without_an_intervention(run):
    """The filter chooses what is recorded, not what runs: with MaskSinks acting in every layer, the kept layers'
    scores, masked keys and query counts are those of the full capture, bit for bit."""
    loaded, _, ids = run
    for intervention in (None, sinklib.MaskSinks(top_k=1, threshold=False)):
        full = _capture(loaded, ids, intervention=intervention)
        kept = _capture(loaded, ids, intervention=intervention, names_filter=FILTERS["callable"])
        assert torch.equal(kept.scores, full.scores[:, KEPT])
        assert torch.equal(kept.query_counts, full.query_counts[:, KEPT])
        if intervention is not None:
            assert torch.equal(kept.masked_keys, full.masked_keys[:, KEPT]) and full.masked_keys[1].any()


def test_a_filtered_capture_of_kv_cache_decoding_is_the_slice_of_a_full_one():
    """Decoding rows (deferred and scored when the step ends) of the kept layer only."""
    model, ids = qwen2_gqa(), torch.tensor([[5, 9, 2, 33, 17, 8]])

    def decode(**options):
        with torch.no_grad(), sinklib.capture(model, **options) as recorder:
            out = model(input_ids=ids, use_cache=True)
            model(input_ids=ids[:, -1:] * 0 + 3, **with_cache(model, out), use_cache=True)
        return recorder.scores

    full, kept = decode(), decode(names_filter="blocks.1.attn.scores")
    assert kept.shape[1] == 1
    assert torch.equal(kept.nan_to_num(-1), full[:, 1:].nan_to_num(-1))


def test_maps_and_layer_indices_stay_the_models_under_a_filter(run):
    loaded, _, ids = run
    with torch.no_grad(), sinklib.capture(loaded, names_filter="blocks.3.attn.scores", maps=[(0, 0, 1)]) as recorder:
        loaded.model(ids)
    assert recorder.layer_ids == [3] and set(recorder.maps) == {(0, 0, 1)}


def test_carry_and_the_lens_under_a_filter_are_the_slices_of_full_runs(run):
    loaded, trace, ids = run
    names_filter = FILTERS["list"]
    for full, kept in zip(carry.value_norms(loaded, ids[0]), carry.value_norms(loaded, ids[0], names_filter)):
        assert torch.equal(kept, full[KEPT])
    full = carry.sink_carry(loaded, trace, steps=[0, 2])
    kept = carry.sink_carry(loaded, trace, steps=[0, 2], names_filter=names_filter)
    assert kept.reset_index(drop=True).equals(full[full["layer"].isin(KEPT)].reset_index(drop=True))
    full = lens.logit_lens(loaded, trace, steps=[1])
    kept = lens.logit_lens(loaded, trace, steps=[1], names_filter=names_filter)
    assert kept.reset_index(drop=True).equals(full[full["layer"].isin(KEPT)].reset_index(drop=True))
    assert torch.equal(lens.layer_logits(loaded, ids[0], names_filter), lens.layer_logits(loaded, ids[0])[KEPT])


BAD = {
    "no such block": ("blocks.9.attn.scores", r"names_filter='blocks.9.attn.scores' is not allowed: this model has "
                                              r"blocks 0\.\.3"),
    "no such kind": (["blocks.0.attn.score"], r"names_filter='blocks.0.attn.score' is not allowed.*did you mean "
                                              r"'blocks.0.attn.scores'"),
    "not a name": ([3], r"names_filter=3 is not allowed: activation names are"),
    "not a filter": (3, r"names_filter=3 is not allowed: names_filter must be None, an activation name"),
    "keeps nothing": (lambda name: False, r"names_filter=.* must keep at least one of this model's"),
    "empty list": ([], r"names_filter=\[\] is not allowed: names_filter must keep at least one"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_filter_is_refused_by_each_entry_point_before_any_forward(run, case):
    loaded, trace, ids = run
    names_filter, message = BAD[case]
    with pytest.raises(BadValue, match=message):
        _capture(loaded, ids, names_filter=names_filter)
    with pytest.raises(BadValue, match=message):
        carry.value_norms(loaded, ids[0], names_filter)
    with pytest.raises(BadValue, match=message):
        carry.sink_carry(loaded, trace, names_filter=names_filter)
    with pytest.raises(BadValue, match=message):
        lens.logit_lens(loaded, trace, names_filter=names_filter)
    assert not getattr(loaded.model, "_sinklib_capture_active", False), "a refused capture leaves the model free"


def test_a_name_of_another_kind_keeps_nothing_of_this_one(run):
    """A resid name is the model's, but capture records scores: a filter of resid names alone keeps none of them."""
    loaded, _, ids = run
    with pytest.raises(BadValue, match=r"must keep at least one of this model's 'blocks.\{layer\}.attn.scores' names"):
        _capture(loaded, ids, names_filter="blocks.1.resid")
