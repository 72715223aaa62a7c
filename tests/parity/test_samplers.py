"""Samplers against straightforward reference loops written from the upstream samplers' rules, and hand-worked cases."""
import dataclasses

import numpy as np
import pytest
import torch

import sinklib
from sinklib.families import dream, llada
from tests.margins import choice_margin, relative_gap
from tests.models import MASK_ID, diffusion_llama, llama
from tests.standin import StandInLLaDA

PROMPT = [5, 9, 2, 33, 17, 8]


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def token_gap(logits_row) -> float:
    """How far the argmax token was from the runner-up, relative (the sampler's token decision margin)."""
    top = sorted((float(v) for v in logits_row), reverse=True)
    return relative_gap(top[0], top[1])


def choice_gap(candidates, k: int, kind: str, rows) -> float:
    """candidates sorted by descending confidence (as (−confidence, position, …)); rows: position → its logits.
    The margin of choosing the first k (tests.margins.choice_margin)."""
    return choice_margin([(-c[0], rows[c[1]].tolist()) for c in candidates], k, kind)


def reference_llada(model, prompt, steps, gen_length, block_length, margins=None):
    """LLaDA at temperature 0, one position at a time in plain Python; each step's decision margin is
    appended to `margins` when given."""
    x = list(prompt) + [MASK_ID] * gen_length
    blocks = gen_length // block_length
    per_block = steps // blocks
    for block in range(blocks):
        end = len(prompt) + (block + 1) * block_length
        masks = sum(1 for t in x[end - block_length:end] if t == MASK_ID)
        for i in range(per_block):
            k = masks // per_block + (1 if i < masks % per_block else 0)
            logits = logits_of(model, x)
            candidates = []
            for j in range(end):
                if x[j] == MASK_ID:
                    probs = torch.softmax(logits[j], -1)
                    token = int(logits[j].argmax())
                    candidates.append((-float(probs[token]), j, token))
            candidates = sorted(candidates)
            if margins is not None:
                rows = {j: logits[j] for _, j, _ in candidates}
                margins.append(min([choice_gap(candidates, k, "probability", rows)] +
                                   [token_gap(logits[j]) for _, j, _ in candidates[:k]]))
            for _, j, token in candidates[:k]:
                x[j] = token
    return x


def reference_dream(model, prompt, steps, gen_length, alg, eps=1e-3, margins=None, mask_id=MASK_ID):
    """Dream at temperature 0: shifted logits, float32 schedule, top confidences anywhere; each step's
    decision margin is appended to `margins` when given."""
    MASK_ID = mask_id  # noqa: N806  (the loop below reads the mask id by the module constant's name)
    x = list(prompt) + [MASK_ID] * gen_length
    timesteps = np.linspace(1, eps, steps + 1).astype(np.float32)
    for i in range(steps):
        raw = logits_of(model, x)
        masked = [j for j in range(len(x)) if x[j] == MASK_ID]
        candidates = []
        for j in masked:
            probs = torch.softmax(raw[max(j - 1, 0)], -1)  # output j−1 predicts position j
            top = probs.sort(descending=True).values
            confidence = {"maskgit_plus": top[0], "topk_margin": top[0] - top[1],
                          "entropy": (probs * torch.log(probs + 1e-10)).sum()}[alg]
            candidates.append((-float(confidence), j, int(probs.argmax())))
        if i == steps - 1:
            count = len(masked)
        else:
            count = int(np.float32(len(masked)) * (np.float32(1) - timesteps[i + 1] / timesteps[i]))
        candidates = sorted(candidates)
        if margins is not None:
            rows = {j: raw[max(j - 1, 0)] for _, j, _ in candidates}
            kind = {"maskgit_plus": "probability", "topk_margin": "probability_gap", "entropy": "entropy"}[alg]
            margins.append(min([choice_gap(candidates, count, kind, rows)] +
                               [token_gap(raw[max(j - 1, 0)]) for _, j, _ in candidates[:count]]))
        for _, j, token in candidates[:count]:
            x[j] = token
    return x


def test_transfer_counts_hand_worked():
    assert llada.transfer_counts(torch.tensor([10, 8, 3]), 4).tolist() == [[3, 3, 2, 2], [2, 2, 2, 2], [1, 1, 1, 0]]


def test_dream_shift_and_schedule_hand_worked():
    logits = torch.arange(3.0).reshape(1, 3, 1)
    assert dream.shift_right(logits).flatten().tolist() == [0.0, 0.0, 1.0]
    loaded = sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=8, alg="maskgit_plus"), progress=False)
    written = (trace.is_masked.sum(1)[:-1] - trace.is_masked.sum(1)[1:]).tolist() + [int(trace.is_masked[-1].sum())]
    assert written == [1, 2, 2, 3]  # int(8·0.24975)=1, int(7·0.33289)=2, int(5·0.49900)=2, the rest


@pytest.mark.parametrize("steps, gen_length, block_length", [(8, 8, 8), (8, 16, 4), (6, 12, 4), (4, 8, 2)])
def test_llada_sampler_matches_reference_loop(steps, gen_length, block_length):
    model = diffusion_llama("llada")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=steps, gen_length=gen_length, block_length=block_length),
                             progress=False)
    assert trace.tokens[-1].tolist() == reference_llada(model, PROMPT, steps, gen_length, block_length)
    assert trace.n_steps == steps and not (trace.tokens[-1] == MASK_ID).any()


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("steps", [4, 8])
def test_dream_sampler_matches_reference_loop(alg, steps):
    model = diffusion_llama("dream", seed=1)
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=steps, gen_length=8, alg=alg), progress=False)
    assert trace.tokens[-1].tolist() == reference_dream(model, PROMPT, steps, 8, alg)


@pytest.mark.parametrize("steps, gen_length, block_length", [(8, 8, 8), (4, 8, 2)])
def test_llada_decision_margins_match_the_reference_loop(steps, gen_length, block_length):
    """Each step's margin (the weakest written position's confidence over the best one left masked, and each
    written token's logit over the runner-up, relative) equals the plain-Python loop's."""
    model = diffusion_llama("llada")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=steps, gen_length=gen_length, block_length=block_length),
                             progress=False)
    expected = []
    reference_llada(model, PROMPT, steps, gen_length, block_length, margins=expected)
    assert trace.margins.shape == (steps,)
    assert trace.margins.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_decision_margins_match_the_reference_loop(alg):
    model = diffusion_llama("dream", seed=1)
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=8, alg=alg), progress=False)
    expected = []
    reference_dream(model, PROMPT, 4, 8, alg, margins=expected)
    assert trace.margins.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_arm_sampler_with_cache_matches_uncached_greedy_loop():
    model = llama(causal=True)
    loaded = sinklib.load(model, family="arm", eos_ids=(63,))
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(gen_length=10), progress=False)
    x, margins = list(PROMPT), []
    for _ in range(10):
        logits = logits_of(model, x)[-1]
        token = int(logits.argmax())
        margins.append(token_gap(logits))
        x.append(token)
        if token == 63:
            break
    assert trace.tokens[-1].tolist() == x
    assert trace.margins.tolist() == pytest.approx(margins, rel=1e-4, abs=1e-6)
    assert trace.n_steps == len(x) - len(PROMPT) and trace.tokens.shape[0] == trace.n_steps + 1
    assert torch.isnan(trace.scores[0, ..., len(PROMPT):]).all() and not torch.isnan(trace.scores[-1, ..., :-1]).any()


def test_llada_remote_calling_convention_standin_matches_native_reference():
    standin = StandInLLaDA(vocab_size=64)
    loaded = sinklib.load(standin, family="llada", mask_id=MASK_ID)
    assert loaded.calling == "remote"
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=4, gen_length=8, block_length=4), progress=False)

    class Native(torch.nn.Module):
        def forward(self, input_ids):
            return standin(input_ids)

    assert trace.tokens[-1].tolist() == reference_llada(Native(), PROMPT, 4, 8, 4)
    assert trace.layer_names[0] == "transformer.blocks.0"


@pytest.mark.parametrize("family, options", [("llada", dict(steps=4, block_length=4)), ("dream", dict(steps=4, alg="entropy")),
                                             ("arm", {})])
def test_batched_prompts_give_the_same_tokens_and_scores_as_one_at_a_time(family, options):
    model = llama(causal=True) if family == "arm" else diffusion_llama(family)
    loaded = sinklib.load(model, family=family, mask_id=MASK_ID if family != "arm" else None, eos_ids=(62,))
    prompts = [PROMPT, [7, 3, 11], [40, 41, 42, 43, 44, 45, 46, 47]]
    batched = sinklib.generate(loaded, prompts, loaded.settings_for(gen_length=8, **options), progress=False)
    for prompt, trace in zip(prompts, batched):
        alone = sinklib.generate(loaded, prompt, loaded.settings_for(gen_length=8, **options), progress=False)
        assert trace.tokens.tolist() == alone.tokens.tolist()
        torch.testing.assert_close(trace.scores, alone.scores, atol=1e-4, rtol=0, equal_nan=True)


def test_temperature_sampling_is_reproducible_by_seed():
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    runs = [sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, temperature=1.0), seed=s,
                             progress=False) for s in (3, 3, 4)]
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()
    assert runs[0].tokens.tolist() != runs[2].tokens.tolist()


def test_classifier_free_guidance_combines_conditional_and_unconditional_logits():
    model = diffusion_llama("llada")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=1, gen_length=2, cfg_scale=1.5), progress=False)
    cond = logits_of(model, PROMPT + [MASK_ID] * 2)
    uncond = logits_of(model, [MASK_ID] * 8)
    guided = uncond + 2.5 * (cond - uncond)
    probs = torch.softmax(guided[6:], -1)
    assert trace.tokens[-1, 6:].tolist() == probs.argmax(-1).tolist()
    assert trace.scores.shape[:3] == (1, 2, 4)  # the conditional half of the doubled batch


# -- each family's default settings: one home (Family.paper / Family.zoo), lengths owned by tasks ---------------
from sinklib.families.base import family_names, fit, get_family  # noqa: E402


@pytest.mark.parametrize("name", family_names())
def test_every_family_has_the_paper_and_zoo_settings_of_its_own_class_and_a_tasks_length_refits_them(name):
    from sinklib.evaluation import get_task
    from sinklib.zoo.recipes import GEN_LENGTH

    family = get_family(name)
    paper, zoo = family.defaults(), family.defaults(zoo=True)
    assert isinstance(paper, family.settings) and isinstance(zoo, family.settings)
    # the paper's 128 tokens; DiffusionGemma, not in the paper, keeps its release's one canvas of 256 in 48 steps
    released = name == "diffusion_gemma"
    assert (paper.gen_length, zoo.gen_length) == (256 if released else 128, GEN_LENGTH)  # zoo: the answer slot
    assert dataclasses.replace(paper) == paper and dataclasses.replace(zoo) == zoo  # each made again: checked
    assert not hasattr(family, "presets")  # no settings per task: a task owns its length
    for task, length in (("gsm8k", 256), ("humaneval", 512)):
        fitted = fit(paper, gen_length=get_task(task).gen_length)
        assert fitted.gen_length == length  # fit makes the settings again: checked
        if hasattr(fitted, "steps") and fitted.steps is not None:
            # the paper decodes one token per step at any length; DiffusionGemma 48 steps per canvas of 256
            assert fitted.steps == (48 * length // 256 if released else length)
    if not released:  # a 16-token answer is shorter than DiffusionGemma's canvas: its sampler refuses it (own tests)
        fitted = fit(paper, gen_length=get_task("capitals").gen_length)
        assert fitted.gen_length == 16 and fitted.steps in (None, 16)
