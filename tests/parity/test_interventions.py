import importlib
import pytest
import torch

import sinklib
from sinklib.interventions import key_normalised
from tests.models import with_cache, eager_twin, llama, qwen2_gqa
from tests.standin import StandInLM
from tests.unit.test_sinks import reference_sinks

IDS = torch.tensor([[5, 9, 2, 33, 17, 8, 41, 3, 12, 7, 11, 4], [6, 1, 30, 22, 9, 19, 2, 44, 10, 5, 8, 8]])
STEPS = [IDS, IDS.roll(1, -1), IDS.roll(2, -1), IDS.roll(3, -1)]  # a changing canvas, one forward per step


def sinky(**kwargs):
    return StandInLM(sink_strength=4.0, **kwargs)


def run(model, inputs, intervention, **kwargs):
    with torch.no_grad(), sinklib.capture(model, intervention=intervention, **kwargs) as rec:
        outputs = [model(x) for x in inputs]
    return rec, outputs


def reference_top(scores, k, eps=3.0):
    """bool mask of the top-k Eq. 3 sinks of each row, computed in Python from the definition."""
    out = torch.zeros(scores.shape, dtype=torch.bool)
    flat_scores, flat_out = scores.reshape(-1, scores.shape[-1]), out.view(-1, scores.shape[-1])
    for r, row in enumerate(flat_scores.tolist()):
        sinks = [j for j, is_sink in enumerate(reference_sinks(row, eps)) if is_sink]
        for j in sorted(sinks, key=lambda j: (-row[j], j))[:k]:
            flat_out[r, j] = True
    return out


def test_masked_keys_get_exactly_zero_and_output_equals_hand_computed_masked_attention():
    model = StandInLM()
    positions, heads = [0, 4], [1, 3]
    rec, (logits,) = run(model, [IDS], sinklib.MaskKeys(positions, heads=heads), maps=[(0, 1, 1), (0, 1, 0)])
    assert torch.all(rec.scores[0][:, :, heads][..., positions] == 0)
    assert torch.all(rec.maps[(0, 1, 1)][..., positions] == 0)
    assert torch.all(rec.maps[(0, 1, 0)][..., positions] > 0), "unlisted heads are untouched"
    bias = torch.zeros(2, 4, 12)
    bias[:, heads, :] = bias[:, heads, :].index_fill(-1, torch.tensor(positions), float("-inf"))
    with torch.no_grad():
        reference = model(IDS, eager=True, key_bias={i: bias for i in range(3)})
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    assert rec.masked_keys[0][:, :, heads][..., positions].all() and rec.masked_keys.sum() == 3 * 2 * 2 * 2


def test_masking_a_causal_models_only_key_keeps_that_row_instead_of_nan():
    model = llama(causal=True)
    with torch.no_grad(), sinklib.capture(model, intervention=sinklib.MaskKeys([0])) as rec:
        logits = model(input_ids=IDS).logits
    assert torch.isfinite(logits).all()
    assert torch.allclose(rec.scores[0, ..., 0], torch.ones(()))  # only query 0 still reads key 0
    plain = model(input_ids=IDS).logits
    assert torch.equal(logits[:, 0], plain[:, 0]) and not torch.allclose(logits[:, 1:], plain[:, 1:])


def test_paper_policy_masks_step_t_minus_1_sinks_at_step_t():
    model = sinky()
    rec, _ = run(model, STEPS, sinklib.MaskSinks(top_k=2))
    masked, scores = rec.masked_keys, rec.scores
    assert not masked[0].any(), "step 0 masks nothing"
    for t in range(1, len(STEPS)):
        expected = reference_top(scores[t - 1], 2)
        assert torch.equal(masked[t], expected)
        assert torch.all(scores[t][masked[t]] == 0)
    assert masked[1:].sum() > 0, "the stand-in must have sinks for this test to mean anything"
    assert (masked[1:].sum(-1) <= 2).all()


def test_paper_policy_alternates_because_masked_sinks_are_rarely_reselected():
    rec, _ = run(sinky(), [IDS] * 3, sinklib.MaskSinks(top_k=1))  # a still canvas
    assert rec.masked_keys[1].any()
    both = rec.masked_keys[1] & rec.masked_keys[2]
    assert both.sum() < rec.masked_keys[1].sum()


def test_clean_previous_step_uses_the_unmasked_attention_of_the_same_layer():
    model = sinky()
    rec, _ = run(model, STEPS[:2], sinklib.MaskSinks(top_k=3, source="previous_step_clean"))
    clean, _ = run(model, STEPS[:1], None)
    # Layer 0 sees the same inputs with or without masking, so its clean attention is the plain run's.
    assert torch.equal(rec.masked_keys[1, 0], reference_top(clean.scores[0, 0], 3))


def test_same_step_masks_the_sinks_of_the_clean_pass_of_the_same_call():
    model = sinky()
    rec, _ = run(model, STEPS[:1], sinklib.MaskSinks(top_k=1, source="same_step"))
    clean, _ = run(model, STEPS[:1], None)
    assert rec.masked_keys[0, 0].any()
    assert torch.equal(rec.masked_keys[0, 0], reference_top(clean.scores[0, 0], 1))
    assert torch.all(rec.scores[0, 0][rec.masked_keys[0, 0]] == 0)


def test_top_k_regardless_of_threshold_always_masks_k():
    rec, _ = run(sinky(), STEPS[:2], sinklib.MaskSinks(top_k=2, eps=1000.0, threshold=False))
    assert (rec.masked_keys[1].sum(-1) == 2).all()
    rec, _ = run(sinky(), STEPS[:2], sinklib.MaskSinks(top_k=2, eps=1000.0))
    assert not rec.masked_keys.any()


def test_arm_policy_reads_the_last_row_scaled_to_key_units():
    """Prefill, then one decoding step with a KV cache: the sinks of the prefill's last query row (× number
    of keys) are masked for the next token."""
    model = llama(causal=True)
    ids = IDS[:1]
    policy = sinklib.MaskSinks(top_k=3, rows="last", eps=0.5)
    with torch.no_grad(), sinklib.capture(model, intervention=policy) as rec:
        out = model(input_ids=ids, use_cache=True)
        model(input_ids=torch.tensor([[3]]), **with_cache(model, out), use_cache=True)
    last_rows = torch.stack(eager_twin(model)(input_ids=ids, output_attentions=True).attentions)[:, :, :, -1]
    expected = reference_top(last_rows * 12, 3, eps=0.5)
    assert expected.any()
    torch.testing.assert_close(rec.masked_keys[1, ..., :12], expected, atol=0, rtol=0)
    assert not rec.masked_keys[1, ..., 12].any() and torch.all(rec.step_scores(1)[..., :12][expected] == 0)


def test_key_normalisation_is_the_identity_for_a_square_pass():
    model = sinky()
    seen = []

    class Spy(sinklib.Intervention):
        def observe(self, call, stats):
            seen.append((stats.scores.clone(), key_normalised(stats, "all")))

    run(model, [IDS], Spy())
    for raw, normalised in seen:
        assert torch.equal(raw, normalised)


def test_random_control_masks_k_valid_keys_from_step_one_reproducibly():
    model = StandInLM()
    first, _ = run(model, STEPS[:3], sinklib.MaskRandomKeys(k=3, seed=7))
    again, _ = run(model, STEPS[:3], sinklib.MaskRandomKeys(k=3, seed=7))
    other, _ = run(model, STEPS[:3], sinklib.MaskRandomKeys(k=3, seed=8))
    assert not first.masked_keys[0].any() and (first.masked_keys[1:].sum(-1) == 3).all()
    assert torch.equal(first.masked_keys, again.masked_keys) and torch.equal(first.scores, again.scores)
    assert not torch.equal(first.masked_keys, other.masked_keys)


def test_a_problems_random_keys_are_the_same_in_any_batch():
    """Issue 69: the draw was one tensor for the whole batch, so a problem's keys changed with its batch position,
    the batch's size and its padding (the autoregressive twin kept 50 of 54 problems one way, 43 another). Now a
    function of the seed, the problem's prompt, the step and the layer: tiny-llada's three prompts, each run alone,
    in a batch of three and in another order, mask the same keys of their own (padding removed); another seed draws
    other keys."""
    model = sinklib.load("tiny-llada")
    prompts = ["Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:",
               "Q: 3 + 4 = ? A:", "Q: sam has 9 pens . sam loses 2 pens . how many pens does sam have now ? A:"]
    settings = model.settings_for(steps=8, gen_length=8, block_length=8)

    def masked(batch, seed=0):
        return [t.masked_keys for t in sinklib.generate(model, batch, settings, progress=False,
                                                         intervention=sinklib.MaskRandomKeys(k=2, seed=seed))]

    alone = [masked([p])[0] for p in prompts]
    together, reordered = masked(prompts), masked(prompts[::-1])[::-1]
    for single, *batched in zip(alone, together, reordered):
        assert all(torch.equal(other, single) for other in batched)
    assert all(keys[1:].sum(-1).eq(2).all() and not keys[0].any() for keys in alone)
    assert not torch.equal(masked(prompts[:1], seed=1)[0], alone[0])


def test_random_control_never_picks_padding():
    model = StandInLM()
    padding = torch.tensor([[1] * 12, [0] * 6 + [1] * 6])
    with torch.no_grad(), sinklib.capture(model, intervention=sinklib.MaskRandomKeys(k=5, seed=0, start_step=0)) as rec:
        model(IDS, attention_mask=padding)
    assert not rec.masked_keys[0, :, 1, :, :6].any() and (rec.masked_keys[0, :, 1, :, 6:].sum(-1) == 5).all()


@pytest.mark.parametrize("policy", [sinklib.MaskRandomKeys(k=6, start_step=0), sinklib.MaskKeys(list(range(6, 12)))])
def test_masking_every_key_of_a_row_is_refused_not_silently_skipped(policy):
    """Before: rows left without a key kept their own row, so nothing was masked while the trace said all was."""
    model = StandInLM()
    padding = torch.tensor([[1] * 12, [0] * 6 + [1] * 6])
    with pytest.raises(ValueError, match=r"intervention=Mask.*batch 1, head 0\) it masks every key"):
        with torch.no_grad(), sinklib.capture(model, intervention=policy):
            model(IDS, attention_mask=padding)


@pytest.mark.parametrize("make, message", [
    (lambda: sinklib.MaskSinks(top_k=-1), r"top_k=-1 is not allowed: top_k must be an integer >= 0"),
    (lambda: sinklib.MaskSinks(top_k=1, eps=float("nan")), r"eps=nan is not allowed"),
    (lambda: sinklib.MaskSinks(top_k=1, source="previous"), r"source='previous' is not allowed.*did you mean 'previous_step'"),
    (lambda: sinklib.MaskSinks(top_k=1, rows="first"), r"rows='first' is not allowed"),
    (lambda: sinklib.MaskRandomKeys(k=-2), r"k=-2 is not allowed"),
    (lambda: sinklib.MaskKeys([-1]), r"positions\[\]=-1 is not allowed"),
])
def test_bad_policy_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_explicit_positions_beyond_the_sequence_are_a_clear_error():
    with pytest.raises(ValueError, match=r"positions=\[12\] is not allowed: positions must be key positions < 12"):
        run(StandInLM(), [IDS], sinklib.MaskKeys([3, 12]))


def test_masking_all_heads_of_a_gqa_model_equals_a_key_padding_mask_in_eager_attention():
    """Masking keys 1 and 2 in every head for every query is what a key-padding mask does, so transformers'
    own eager attention with that padding mask is an independent reference — for the prefill (SDPA with
    enable_gqa) and for a KV-cache decoding step (transformers' packed single-query GQA call)."""
    from tests.models import qwen2_gqa

    model = qwen2_gqa()
    ids = IDS[:, :8]
    with torch.no_grad(), sinklib.capture(model, intervention=sinklib.MaskKeys([1, 2])) as rec:
        out = model(input_ids=ids, use_cache=True)
        step = model(input_ids=torch.tensor([[3], [4]]), **with_cache(model, out), use_cache=True)
    padding = torch.ones(2, 9, dtype=torch.long)
    padding[:, 1:3] = 0
    twin = eager_twin(model)
    with torch.no_grad():
        ref = twin(input_ids=ids, attention_mask=padding[:, :8], use_cache=True)
        ref_step = twin(input_ids=torch.tensor([[3], [4]]), attention_mask=padding, **with_cache(twin, ref),
                        use_cache=True, output_attentions=True)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(step.logits, ref_step.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.step_scores(1), torch.stack(ref_step.attentions).sum(-2), atol=1e-5, rtol=0)
    assert torch.all(rec.scores[:, :, :, :, 1:3] == 0)


# -- what resumable runs record for a policy ------------------------------------------------------------------
from sinklib.trace_store import collect_traces  # noqa: E402
from sinklib.interventions import identity  # noqa: E402
from sinklib.evaluation.tasks import get_task  # noqa: E402


class EveryOtherKey(sinklib.Intervention):
    """A user's policy with no __repr__ of its own: settings public, state private."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._calls = 0

    def keys_to_mask(self, call):
        self._calls += 1
        mask = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool, device=call.device)
        mask[..., self.offset::2] = True
        mask[..., 0] = False  # always leave a key
        return mask


class Opaque:
    pass


def test_a_policy_without_repr_is_recorded_by_its_settings_and_resumes(tmp_path):
    assert repr(EveryOtherKey(1)) == "EveryOtherKey(offset=1)" == identity(EveryOtherKey(1))
    assert repr(sinklib.MaskSinks(2)) == "MaskSinks(top_k=2, eps=3.0, source='previous_step', rows='all', threshold=True)"
    loaded = sinklib.load("tiny-llada")
    first = collect_traces(loaded, ["1+2="], settings=loaded.settings_for(steps=4, gen_length=4), out=tmp_path,
                           intervention=EveryOtherKey(1), progress=False)
    again = collect_traces(loaded, ["1+2="], settings=loaded.settings_for(steps=4, gen_length=4), out=tmp_path,
                           intervention=EveryOtherKey(1), progress=False)  # a new object, same settings: resumed
    torch.testing.assert_close(again[0].scores, first[0].scores, rtol=0, atol=0)
    assert again[0].folder == first[0].folder and again[0].store_key["intervention"] == "EveryOtherKey(offset=1)"
    other = collect_traces(loaded, ["1+2="], settings=loaded.settings_for(steps=4, gen_length=4), out=tmp_path,
                           intervention=EveryOtherKey(0), progress=False)  # another policy: a trace of its own
    assert other[0].folder != first[0].folder and len(list(tmp_path.glob("*/*/meta.json"))) == 2


def test_a_policy_whose_record_would_name_a_memory_address_is_refused_before_any_work(tmp_path):
    policy = EveryOtherKey(1)
    policy.helper = Opaque()  # a public attribute whose repr is an address
    with pytest.raises(ValueError, match=r"intervention=EveryOtherKey\(offset=1, helper=<.*Opaque object at 0x.*"
                                         r"is not allowed: its repr names a memory address"):
        llada = sinklib.load("tiny-llada")
        collect_traces(llada, ["1+2="], settings=llada.settings_for(steps=4, gen_length=4), out=tmp_path,
                       intervention=policy, progress=False)
    assert policy._calls == 0 and not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"its repr names a memory address"):
        sinklib.evaluate("tiny-llada", get_task("arithmetic", limit=1), intervention=policy, out=tmp_path / "e.jsonl",
                         progress=False)
    assert policy._calls == 0 and not (tmp_path / "e.jsonl").exists()


@pytest.mark.parametrize("build", [llama, qwen2_gqa], ids=["heads", "grouped-kv-heads"])
def test_a_causal_call_is_masked_without_a_full_mask_and_agrees_with_the_full_mask_route(build, monkeypatch):
    """A square causal call takes masked_causal_route (the kernel's causal pattern plus one additive key row);
    forced onto the full-mask route, the logits and scores agree."""
    attend_module = importlib.import_module("sinklib.capturing.attend")

    model = build()
    ids = torch.randint(0, model.config.vocab_size - 1, (1, 400), generator=torch.Generator().manual_seed(4))
    taken, original = [], attend_module.masked_causal_route
    monkeypatch.setattr(attend_module, "masked_causal_route", lambda *a: taken.append(1) or original(*a))
    policy = sinklib.MaskKeys([0, 7])
    with torch.no_grad(), sinklib.capture(model, intervention=policy) as fast:
        fast_logits = model(input_ids=ids).logits
    assert taken, "the large causal call took masked_causal_route"
    monkeypatch.setattr(attend_module, "_fits_masked_causal_route", lambda *a: False)
    with torch.no_grad(), sinklib.capture(model, intervention=policy) as full:
        full_logits = model(input_ids=ids).logits
    torch.testing.assert_close(fast_logits, full_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.scores, full.scores, atol=1e-5, rtol=1e-5)
    assert torch.equal(fast.masked_keys, full.masked_keys)


def test_the_forward_that_applies_a_sink_pick_records_how_close_the_pick_came_to_other_keys():
    """Each forward's noted margin (here with a sampler margin of +inf) is the closest selection margin, over layers
    and heads, of the picks it applied: those made from step t−1's attention, worked out by hand from the recorded
    scores (tests/unit/test_margins: the k-th against the (k+1)-th key, each of the top k+1 keys' Eq. 3 test);
    step 0 applies none."""
    import math

    from sinklib.ties import note_decisions, recording_decisions
    from tests.unit.test_margins import _selection_by_hand

    policy = sinklib.MaskSinks(top_k=2)
    model = sinky()
    with recording_decisions() as margins, torch.no_grad(), sinklib.capture(model, intervention=policy) as rec:
        for x in STEPS:
            model(x)
            note_decisions(torch.full((x.shape[0],), math.inf, dtype=torch.float64))
    assert margins[0].tolist() == [math.inf, math.inf]
    scores = rec.scores[0]  # [layers, batch, heads, keys]: step 0 ran unmasked, every key valid
    by_hand = [min(_selection_by_hand(scores[layer, row, head].tolist(), 2, 3.0, True)
                   for layer in range(scores.shape[0]) for head in range(scores.shape[2]))
               for row in range(scores.shape[1])]
    assert margins[1].tolist() == pytest.approx(by_hand, rel=1e-4)
    # later picks come from masked attention (its masked keys left out of the Eq. 3 mean, as the pick leaves them)
    assert all(0 < m < math.inf for t in range(2, len(STEPS)) for m in margins[t].tolist())
