import threading
import time

import pytest
import torch

import sinklib
from sinklib import attention_math
from sinklib.capturing import CaptureError
from sinklib.layers import attention_layers
from tests.models import with_cache, NATIVE, eager_twin, logits_of, llama, qwen2_gqa
from tests.standin import StandInLM

IDS = torch.tensor([[5, 9, 2, 33, 17, 8, 41, 3, 12, 7], [6, 1, 30, 22, 9, 19, 2, 44, 10, 5]])
PADDING = torch.tensor([[1] * 10, [0, 0, 0] + [1] * 7])  # row 1 is left-padded


def eager_scores(model, ids, mask=None, query_weight=None):
    """Independent reference: transformers' eager attention probabilities, summed over (weighted) queries."""
    out = eager_twin(model)(input_ids=ids, attention_mask=mask, output_attentions=True)
    attentions = torch.stack(out.attentions)  # [L, B, H, Sq, Sk]
    if query_weight is not None:
        attentions = attentions * query_weight[None, :, None, :, None]
    return attentions.sum(-2)


@pytest.mark.parametrize("name", list(NATIVE))
def test_scores_match_eager_attention_without_padding(name):
    model = NATIVE[name]()
    with torch.no_grad(), sinklib.capture(model) as rec:
        model(input_ids=IDS)
    reference = eager_scores(model, IDS)
    assert rec.n_steps == 1 and rec.scores.shape == (1, len(reference), 2, 4, 10)
    torch.testing.assert_close(rec.scores[0], reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(NATIVE))
def test_scores_match_eager_attention_with_padding(name):
    model = NATIVE[name]()
    with torch.no_grad(), sinklib.capture(model) as rec:
        rec.query_mask = PADDING  # padded query rows are not tokens: they must not add to any score
        model(input_ids=IDS, attention_mask=PADDING)
    reference = eager_scores(model, IDS, PADDING, query_weight=PADDING.float())
    torch.testing.assert_close(rec.scores[0], reference, atol=1e-5, rtol=0)
    assert torch.all(rec.scores[0, :, 1, :, :3] == 0), "padded keys must receive nothing"
    torch.testing.assert_close(rec.query_counts[0, 0], torch.tensor([10.0, 7.0]))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_remote_code_standin_matches_hand_computed_softmax(causal, padded):
    model = StandInLM(causal=causal)
    mask = PADDING if padded else None
    with torch.no_grad(), sinklib.capture(model) as rec:
        rec.query_mask = mask
        model(IDS, attention_mask=mask)
    with torch.no_grad():
        _, attentions = model(IDS, attention_mask=mask, eager=True, return_attentions=True)
    assert rec.layer_names == ["transformer.blocks.0", "transformer.blocks.1", "transformer.blocks.2"]
    reference = torch.stack(attentions)
    if mask is not None:
        reference = reference * mask[None, :, None, :, None]
    torch.testing.assert_close(rec.step_scores(0), reference.sum(-2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(NATIVE))
def test_outputs_bit_identical_under_capture(name):
    model = NATIVE[name]()
    with torch.no_grad():
        plain = logits_of(model(input_ids=IDS, attention_mask=PADDING))
        with sinklib.capture(model, maps=[(0, 1, 2)]):
            captured = logits_of(model(input_ids=IDS, attention_mask=PADDING))
    assert torch.equal(plain, captured)


def test_standin_bit_identical_and_sdpa_restored():
    model = StandInLM()
    original = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        plain = model(IDS)
        with sinklib.capture(model):
            captured = model(IDS)
    assert torch.equal(plain, captured)
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_kv_cache_decoding_with_grouped_heads_matches_eager():
    """transformers packs one decoding query of a GQA model as [B, kv_heads, groups, D]; heads must stay heads."""
    model = qwen2_gqa()
    ids = IDS[:1, :6]
    with torch.no_grad(), sinklib.capture(model) as rec:
        out = model(input_ids=ids, use_cache=True)
        model(input_ids=ids[:, -1:] * 0 + 3, **with_cache(model, out), use_cache=True)
    twin = eager_twin(model)
    with torch.no_grad():
        ref = twin(input_ids=ids, use_cache=True, output_attentions=True)
        step = twin(input_ids=ids[:, -1:] * 0 + 3, **with_cache(twin, ref), use_cache=True, output_attentions=True)
    reference = torch.stack(step.attentions).sum(-2)  # [L, B, H, 7]
    assert rec.n_steps == 2
    torch.testing.assert_close(rec.step_scores(1), reference, atol=1e-5, rtol=0)
    assert torch.isnan(rec.scores[0, ..., 6]).all(), "the prefill step has 6 keys; the 7th is padding"


def _greedy_decoding_scores(model, steps: int = 4) -> torch.Tensor:
    """Scores of a prefill and `steps` KV-cache decoding steps of greedy generation under a capture."""
    with torch.no_grad(), sinklib.capture(model) as rec:
        out = model(input_ids=IDS[:1, :6], use_cache=True)
        for _ in range(steps):
            out = model(input_ids=out.logits[:, -1:].argmax(-1), **with_cache(model, out), use_cache=True)
    return rec.scores


def test_decoding_rows_scored_at_their_steps_end_equal_scoring_each_at_its_call(monkeypatch):
    """A decoding step's rows wait for the step's end and are scored together; the scores are the bits each row gets
    when scored at its own call (waiting switched off). Against eager attention: the GQA KV-cache test above."""
    model = qwen2_gqa()
    single_row_route = attention_math._single_row_statistics
    monkeypatch.setattr(attention_math, "_single_row_statistics", lambda *a: pytest.fail("a decoding row did not wait"))
    waited = _greedy_decoding_scores(model)
    monkeypatch.setattr(attention_math, "_single_row_statistics", single_row_route)
    monkeypatch.setattr(attention_math, "DEFERRED_ROW_MAX_KEY_ELEMENTS", 0)
    at_each_call = _greedy_decoding_scores(model)
    assert waited.shape[0] == 5 and not torch.isnan(waited[-1]).any()  # the last step sees every key
    torch.testing.assert_close(waited, at_each_call, rtol=0, atol=0, equal_nan=True)


def _eager_decoding(model, ids, mask, new_ids):
    """The eager twin's attentions [L, B, H, Sk] of one decoding step after a prefill of `ids`."""
    twin = eager_twin(model)
    with torch.no_grad():
        ref = twin(input_ids=ids, attention_mask=mask, use_cache=True, output_attentions=True)
        full = torch.cat([mask, torch.ones_like(new_ids)], -1) if mask is not None else None
        step = twin(input_ids=new_ids, attention_mask=full, **with_cache(twin, ref), use_cache=True,
                    output_attentions=True)
    return torch.stack(step.attentions)[..., 0, :]


@pytest.mark.parametrize("padded", [False, True])
def test_batched_decoding_with_and_without_left_padding_matches_eager_and_keeps_maps(padded):
    """Two prompts decoded together (left-padded: the rows carry a mask and are scored at their call; unpadded:
    they wait for the step's end), with a map asked of a decoding step: scores and the map equal eager attention."""
    model = llama()
    ids, mask = IDS[:, :6], (PADDING[:, :6] if padded else None)
    new_ids = torch.tensor([[3], [4]])
    with torch.no_grad(), sinklib.capture(model, maps=[(1, 1, 2)]) as rec:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        full = torch.cat([mask, torch.ones_like(new_ids)], -1) if mask is not None else None
        model(input_ids=new_ids, attention_mask=full, **with_cache(model, out), use_cache=True)
    reference = _eager_decoding(model, ids, mask, new_ids)
    torch.testing.assert_close(rec.step_scores(1), reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(rec.maps[(1, 1, 2)][:, 0], reference[1, :, 2], atol=1e-6, rtol=0)


class _OneQueryAttention(torch.nn.Module):
    """An attention layer as remote code writes one: its own scale, and (optionally) its key buffer reused in place
    after the call, as a cache that shares one buffer across layers or steps would."""

    def __init__(self, scale: float | None, scribble: bool) -> None:
        super().__init__()
        self.scale, self.scribble = scale, scribble

    def forward(self, q, k, v):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        if self.scribble:
            k.mul_(2.0)
        return out


class _TwoLayers(torch.nn.Module):
    def __init__(self, scale: float | None = None, scribble: bool = False) -> None:
        super().__init__()
        self.first, self.second = _OneQueryAttention(scale, scribble), _OneQueryAttention(scale, scribble)

    def forward(self, q, k, v):
        return self.second(self.first(q, k, v), k, v)


@pytest.mark.parametrize("case", ["its own scale", "keys rewritten after the call", "inference mode",
                                  "keys shared by the batch"])
def test_one_query_calls_of_remote_style_layers_match_a_hand_computed_softmax(case):
    """One-query calls as code other than transformers makes them, scored at the step's end or at the call, against
    a float64 softmax of what each call attended to."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 8, generator=g)
    k, v = (torch.randn(1 if case == "keys shared by the batch" else 2, 4, 5, 8, generator=g) for _ in range(2))
    if case == "keys shared by the batch":  # one key set, broadcast over the batch by SDPA itself
        k, v = k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)
    scale = 0.3 if case == "its own scale" else None
    model = _TwoLayers(scale, scribble=case == "keys rewritten after the call")
    with torch.no_grad():
        first_output = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    attended = [(q, k.clone()), (first_output, k.clone() * (2.0 if model.first.scribble else 1.0))]
    context = torch.inference_mode() if case == "inference mode" else torch.no_grad()
    with context, sinklib.capture(model, layer_names=["first", "second"]) as rec:
        model(q, k.clone() if model.first.scribble else k, v)
    for layer, (query, keys) in enumerate(attended):
        logits = query.double() @ keys.double().transpose(-1, -2) * (scale or 8 ** -0.5)
        torch.testing.assert_close(rec.step_scores(0)[layer].double(), logits.softmax(-1)[:, :, 0], atol=1e-6, rtol=0)


def test_a_capture_keeping_nothing_computes_no_statistics(monkeypatch):
    """keep_steps=False with no map or intervention: the calls run as the model made them and nothing is scored."""
    from sinklib.capturing import attend

    model = llama()
    with torch.no_grad():
        plain = logits_of(model(input_ids=IDS))
    with torch.no_grad(), sinklib.capture(model, maps=[(0, 1, 2)]) as kept:
        model(input_ids=IDS)
    monkeypatch.setattr(attend, "attention_statistics", lambda *a, **k: pytest.fail("scored a call nobody keeps"))
    with torch.no_grad(), sinklib.capture(model, keep_steps=False) as rec:
        kept_nothing = logits_of(model(input_ids=IDS))
    assert torch.equal(kept_nothing, plain) and rec.n_steps == 1
    monkeypatch.undo()
    with torch.no_grad(), sinklib.capture(model, keep_steps=False, maps=[(0, 1, 2)]) as only_a_map:
        model(input_ids=IDS)
    assert set(only_a_map.maps) == {(0, 1, 2)} and torch.equal(only_a_map.maps[(0, 1, 2)], kept.maps[(0, 1, 2)])


def test_maps_kept_only_for_requested_triples_and_equal_eager():
    model = llama(causal=False)
    with torch.no_grad(), sinklib.capture(model, maps=[(0, 1, 2), (1, "model.layers.0.self_attn", 0)]) as rec:
        model(input_ids=IDS)
        model(input_ids=IDS.flip(-1))
    assert set(rec.maps) == {(0, 1, 2), (1, 0, 0)}
    reference = eager_twin(model)(input_ids=IDS, output_attentions=True).attentions[1][:, 2]
    torch.testing.assert_close(rec.maps[(0, 1, 2)], reference, atol=1e-6, rtol=0)


def test_query_chunking_gives_the_same_scores():
    model = StandInLM()
    with torch.no_grad(), sinklib.capture(model, chunk_size=3) as chunked:
        model(IDS)
    with torch.no_grad(), sinklib.capture(model) as whole:
        model(IDS)
    torch.testing.assert_close(chunked.scores, whole.scores, atol=1e-6, rtol=0)


def test_layer_names_follow_module_paths():
    model = llama()
    with sinklib.capture(model) as rec:
        pass
    assert rec.layer_names == ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def test_a_later_capture_finds_the_layers_as_the_model_now_is():
    """attention_layers keeps what it found for the next capture of a model: a block removed, an attention module
    swapped or a module on the path deleted between captures is seen, and the scores follow the model as it is."""
    model = llama()
    first = attention_layers(model)
    assert attention_layers(model) == first  # kept and reused: the same layers
    swapped = llama().model.layers[0].self_attn
    swapped.config = model.config  # a module of a twin model, now reading this model's settings
    model.model.layers[0].self_attn = swapped
    assert [layer.module for layer in attention_layers(model)] == [swapped, first[1].module]
    del model.model.layers[1]
    model.config.num_hidden_layers = 1
    with torch.no_grad(), sinklib.capture(model) as rec:
        model(input_ids=IDS)
    assert rec.layer_names == ["model.layers.0.self_attn"] and rec.scores.shape[1] == 1
    torch.testing.assert_close(rec.scores[0], eager_scores(model, IDS), atol=1e-5, rtol=0)
    del model.model.layers[0].self_attn  # no attention module left in the block: the block itself is the layer
    assert attention_layers(model)[0].name == "model.layers.0"


def test_map_request_for_missing_layer_or_head_is_a_clear_error():
    model = llama()
    with pytest.raises(ValueError, match=r"layer=5 is not allowed"):
        with sinklib.capture(model, maps=[(0, 5, 0)]):
            pass
    with pytest.raises(ValueError, match=r"maps head .*=4 is not allowed"):
        with sinklib.capture(model, maps=[(0, 0, 4)]):
            pass
    with pytest.raises(ValueError, match=r"did you mean 'model.layers.1.self_attn'"):
        with sinklib.capture(model, maps=[(0, "model.layers.1.self_atn", 0)]):
            pass


def test_eager_attention_is_rejected_before_any_forward():
    model = eager_twin(llama())
    with pytest.raises(CaptureError, match=r"_attn_implementation='eager' cannot be captured"):
        with sinklib.capture(model):
            pass


def test_invisible_attention_raises_instead_of_recording_zeros():
    model = StandInLM()
    with pytest.raises(CaptureError, match="capture saw no attention call"):
        with torch.no_grad(), sinklib.capture(model):
            model(IDS, eager=True)  # explicit softmax: no SDPA call to see


def test_nested_capture_of_one_model_is_refused_and_two_models_work():
    first, second = StandInLM(seed=1), StandInLM(seed=2)
    with torch.no_grad(), sinklib.capture(first) as rec_first:
        with pytest.raises(CaptureError, match="already active"):
            with sinklib.capture(first):
                pass
        with sinklib.capture(second) as rec_second:
            first(IDS)
            second(IDS)
    assert rec_first.n_steps == 1 and rec_second.n_steps == 1
    assert not torch.equal(rec_first.scores, rec_second.scores)


def test_concurrent_captures_in_threads_each_see_only_their_model():
    models = [StandInLM(seed=s) for s in range(3)]
    expected = []
    for model in models:
        with torch.no_grad(), sinklib.capture(model) as rec:
            model(IDS)
        expected.append(rec.scores)
    results = [None] * 3

    def work(i):
        with torch.no_grad(), sinklib.capture(models[i]) as rec:
            for _ in range(5):
                models[i](IDS)
        results[i] = rec.scores

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert results[i].shape[0] == 5
        torch.testing.assert_close(results[i][4], expected[i][0], atol=0, rtol=0)


def test_capture_removes_its_hooks_even_when_the_block_raises():
    model = StandInLM()
    with pytest.raises(RuntimeError, match="boom"):
        with sinklib.capture(model):
            raise RuntimeError("boom")
    with torch.no_grad(), sinklib.capture(model) as rec:  # a second capture is allowed: nothing was left behind
        model(IDS)
    assert rec.n_steps == 1 and not model._forward_hooks and not model.transformer.blocks[0]._forward_pre_hooks


def test_fully_masked_query_rows_contribute_nothing_without_a_query_mask():
    """Causal + left padding: the padded queries of row 1 may attend to no key (an additive finfo.min mask
    softmaxes them to uniform); they must not add to any score."""
    model = StandInLM(causal=True)
    with torch.no_grad(), sinklib.capture(model) as rec:
        model(IDS, attention_mask=PADDING)
    with torch.no_grad():
        _, attentions = model(IDS, attention_mask=PADDING, eager=True, return_attentions=True)
    reference = (torch.stack(attentions) * PADDING[None, :, None, :, None]).sum(-2)
    torch.testing.assert_close(rec.step_scores(0), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.query_counts[0, 0], torch.tensor([10.0, 7.0]))


def test_capture_takes_the_loaded_model_that_load_returns():
    """Before: capture(sinklib.load(...)) failed with AttributeError: named_modules."""
    loaded = sinklib.load("tiny-llada")
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad(), sinklib.capture(loaded) as wrapped:
        loaded.logits(ids)
    with torch.no_grad(), sinklib.capture(loaded.model, layer_names=loaded.layer_names) as bare:
        loaded.logits(ids)
    assert torch.equal(wrapped.scores, bare.scores) and wrapped.layer_names == bare.layer_names


def test_a_capture_that_failed_mid_forward_leaves_no_frame_for_the_next():
    """Before: a forward that failed inside a captured layer left its route frame in the thread, and the next
    valid capture failed with "'NoneType' object is not subscriptable"."""

    from sinklib.capturing import route

    loaded = sinklib.load("tiny-llada")
    layer = attention_layers(loaded.model)[1].module
    with pytest.raises(RuntimeError, match="boom"), sinklib.capture(loaded):
        # after the capture's own hooks: the layer is entered, then its forward fails before leaving
        broken = layer.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
        try:
            loaded.logits(torch.tensor([[1, 2, 3, 4]]))
        finally:
            broken.remove()
    assert route.frames() == []
    with sinklib.capture(loaded) as closed:
        pass
    route.frames().append((closed, attention_layers(loaded.model)[0]))  # as a forward in another thread can leave one
    q = torch.randn(1, 2, 3, 8)
    plain = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with sinklib.capture(loaded) as rec:
        loaded.logits(torch.tensor([[1, 2, 3, 4]]))
        outside = torch.nn.functional.scaled_dot_product_attention(q, q, q)  # SDPA outside every captured layer
    assert torch.equal(outside, plain) and route.frames() == []
    assert rec.scores.shape[0] == 1 and not torch.isnan(rec.scores).any()


def test_two_threads_cannot_both_capture_one_model(monkeypatch):
    """Before: the "already active" check and the mark were apart (a recorder was built between them), so two
    threads could both enter. A slow recorder widens that window to make the race certain."""
    import sinklib.capturing as capture_module
    loaded = sinklib.load("tiny-llada")
    built = capture_module.Recorder

    def slow_recorder(*args, **kwargs):
        time.sleep(0.2)
        return built(*args, **kwargs)

    monkeypatch.setattr(capture_module, "Recorder", slow_recorder)
    entered, refused = threading.Barrier(2), []

    def open_capture():
        try:
            entered.wait()
            with sinklib.capture(loaded):
                time.sleep(0.3)
        except sinklib.CaptureError as error:
            refused.append(str(error))

    threads = [threading.Thread(target=open_capture) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 1 and "already active on this model" in refused[0], "exactly one of two threads is refused"


def test_a_layer_named_twice_is_refused():
    loaded = sinklib.load("tiny-llada")
    name = attention_layers(loaded.model)[0].name
    with pytest.raises(ValueError, match=r"layer_names must name each module once"):
        with sinklib.capture(loaded, layer_names=[name, name]):
            pass
