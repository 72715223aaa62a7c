"""The cached and threshold samplers (families.cached) against reference loops written from Fast-dLLM's rules
(docs/fast-dllm-rules.md §1–3): plain Python, one position at a time, with upstream's own cache mechanics — the
prefix cache a transformers cache cropped to the prefix and grown by each window forward, the dual cache written
in place at the block's slots (its modelling code's replace_position) — not sinklib's window cache."""
import copy

import numpy as np
import pytest
import torch

import sinklib
from sinklib.families import dream
from sinklib.families.cached import Window
from tests.models import MASK_ID, diffusion_llama, with_cache

PROMPT = [5, 9, 2, 33, 17, 8]


def _all_keys(queries: int, keys: int) -> torch.Tensor:
    return torch.ones(1, 1, queries, keys, dtype=torch.bool)


class _Upstream:
    """A model called as Fast-dLLM calls it: full forwards that keep the cache, window forwards over that cache."""

    def __init__(self, model):
        self.model = model

    def full(self, x: list[int], keep: bool = True):
        with torch.no_grad():
            # every key, said as a mask: transformers 4 makes a Llama causal when no mask is given, is_causal=False or not
            out = self.model(input_ids=torch.tensor([x]), attention_mask=_all_keys(len(x), len(x)), use_cache=keep)
        if keep:
            self.cache = with_cache(self.model, out)
        return out.logits[0]

    def prefix(self, x: list[int], start: int, attentions: bool = False):
        """Queries x[start:] after the prefix's cached keys (upstream: the cache cut to [:start], then grown);
        attentions=True (an eager model): also each layer's attention maps."""
        cache = copy.deepcopy(next(iter(self.cache.values())))
        cache.crop(start - len(x))  # this transformers crops by a negative count
        keyword = next(iter(self.cache))
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([x[start:]]), position_ids=torch.arange(start, len(x))[None],
                             attention_mask=_all_keys(len(x) - start, len(x)), use_cache=True,
                             output_attentions=attentions, **{keyword: cache})
        return (out.logits[0], out.attentions) if attentions else out.logits[0]

    def dual(self, x: list[int], start: int, end: int, attentions: bool = False):
        """Queries x[start:end]; their keys and values written in place into the full cache (upstream's
        replace_position), the rest as the block-start forward left them; attentions=True as for prefix."""
        cache = next(iter(self.cache.values()))
        for layer in cache.layers:
            def update(keys, values, *args, layer=layer, **kwargs):
                layer.keys[:, :, start:end] = keys
                layer.values[:, :, start:end] = values
                return layer.keys, layer.values
            layer.update = update
        keyword = next(iter(self.cache))
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([x[start:end]]), position_ids=torch.arange(start, end)[None],
                             attention_mask=_all_keys(end - start, len(x)), use_cache=True,
                             output_attentions=attentions, **{keyword: cache})
        for layer in cache.layers:
            del layer.update
        return (out.logits[0], out.attentions) if attentions else out.logits[0]


def _threshold_pick(candidates: list[tuple[float, int, int]], threshold: float) -> list[tuple[float, int, int]]:
    """Upstream's rule on candidates sorted by descending confidence: rank 0 always, later ranks at or above."""
    return [c for rank, c in enumerate(candidates) if rank == 0 or -c[0] >= threshold]


def reference_fast_llada(model, prompt, steps, gen_length, block_length, cache=None, threshold=None):
    """Fast-dLLM's llada/generate.py at temperature 0 (generate / generate_with_prefix_cache /
    generate_with_dual_cache, the block test before each forward as its later version has it)."""
    upstream = _Upstream(model)
    x = list(prompt) + [MASK_ID] * gen_length
    per_block = steps // (gen_length // block_length)
    forwards = 0
    for start in range(len(prompt), len(x), block_length):
        end = start + block_length
        schedule = [block_length // per_block + (1 if i < block_length % per_block else 0) for i in range(per_block)]
        step = 0
        while any(t == MASK_ID for t in x[start:end]):
            if cache is None or step == 0:
                logits, offset = upstream.full(x, keep=cache is not None), 0
            elif cache == "prefix":
                logits, offset = upstream.prefix(x, start), start
            else:
                logits, offset = upstream.dual(x, start, end), start
            forwards += 1
            candidates = []
            for j in range(start, end):
                if x[j] == MASK_ID:
                    row = logits[j - offset]
                    token = int(row.argmax())
                    candidates.append((-float(torch.softmax(row, -1)[token]), j, token))
            candidates.sort()
            chosen = _threshold_pick(candidates, threshold) if threshold is not None else candidates[:schedule[step]]
            for _, j, token in chosen:
                x[j] = token
            step += 1
    return x, forwards


def _dream_candidates(raw, offset: int, masked: list[int], alg: str) -> list[tuple[float, int, int]]:
    """(−confidence, position, token) of each masked position, sorted: output j − 1 predicts position j."""
    candidates = []
    for j in masked:
        probs = torch.softmax(raw[max(j - 1 - offset, 0)], -1)
        top = probs.sort(descending=True).values
        confidence = {"maskgit_plus": top[0], "topk_margin": top[0] - top[1],
                      "entropy": (probs * torch.log(probs + 1e-10)).sum()}[alg]
        candidates.append((-float(confidence), j, int(probs.argmax())))
    return sorted(candidates)


def reference_fast_dream(model, prompt, steps, gen_length, block_length, alg, cache=None, threshold=None, eps=1e-3):
    """Fast-dLLM's dream/model/generation_utils_block.py at temperature 0: per block a full forward writing the
    block's first position, then steps over the block by its own float32 schedule or the threshold."""
    upstream = _Upstream(model)
    x = list(prompt) + [MASK_ID] * gen_length
    per_block = steps // (gen_length // block_length)
    timesteps = np.linspace(1, eps, per_block + 1).astype(np.float32)
    forwards = 0
    for start in range(len(prompt), len(x), block_length):
        end = start + block_length
        logits = upstream.full(x)
        forwards += 1
        x[start] = int(torch.softmax(logits[start - 1], -1).argmax())
        step = 1
        while any(t == MASK_ID for t in x[start:end]):
            if cache is None:
                raw, offset = upstream.full(x), 0
            elif cache == "prefix":
                raw, offset = upstream.prefix(x, start), start
            else:
                raw, offset = upstream.dual(x, start, end), start
            forwards += 1
            masked = [j for j in range(start, end) if x[j] == MASK_ID]
            candidates = _dream_candidates(raw, offset, masked, "maskgit_plus" if threshold is not None else alg)
            if threshold is not None:
                chosen = _threshold_pick(candidates, threshold)
            else:
                count = len(masked) if step == per_block - 1 else \
                    int(np.float32(len(masked)) * (np.float32(1) - timesteps[step + 1] / timesteps[step]))
                chosen = candidates[:count]
            for _, j, token in chosen:
                x[j] = token
            step += 1
    return x, forwards


LLADA_CASES = [(cache, threshold, steps, block) for cache in (None, "prefix", "dual") for threshold in (None, 0.1)
               for steps, block in ((8, 4), (16, 8)) if cache or threshold]


@pytest.mark.parametrize("cache, threshold, steps, block_length", LLADA_CASES)
def test_llada_cached_and_threshold_samplers_match_fast_dllm_loops(cache, threshold, steps, block_length):
    model = diffusion_llama("llada")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=steps, gen_length=16, block_length=block_length,
                                                                 cache=cache, threshold=threshold), progress=False)
    tokens, forwards = reference_fast_llada(model, PROMPT, steps, 16, block_length, cache, threshold)
    assert trace.tokens[-1].tolist() == tokens
    assert trace.n_steps == forwards
    if threshold is not None:
        assert forwards < 16  # the threshold wrote several positions in some forward


DREAM_CASES = [(cache, threshold, alg) for cache in (None, "prefix", "dual")
               for threshold, alg in ((None, "entropy"), (None, "topk_margin"), (0.1, "maskgit_plus"))]


@pytest.mark.parametrize("cache, threshold, alg", DREAM_CASES)
def test_dream_block_samplers_match_fast_dllm_loops(cache, threshold, alg):
    model = diffusion_llama("dream", seed=1)
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=16, block_length=4, alg=alg, cache=cache,
                                                                 threshold=threshold), progress=False)
    tokens, forwards = reference_fast_dream(model, PROMPT, 8, 16, 4, alg, cache, threshold)
    assert trace.tokens[-1].tolist() == tokens
    assert trace.n_steps == forwards


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_window_beside_fresh_kept_keys_computes_what_the_full_forward_does(family):
    """The window cache itself: with keys kept from a forward over the same canvas, a window's logits are the full
    forward's rows (left padding and position ids included)."""
    loaded = sinklib.load(diffusion_llama(family), mask_id=MASK_ID)
    ids = torch.tensor([[0, 0, 5, 9, 2, 40, 41, 42, 43], [7, 8, 9, 10, 11, 40, 41, 42, 43]])
    key_mask = (ids != 0).long()
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full, kept = loaded.logits(ids, key_mask, positions, keep=True)
        for start, stop in ((5, 9), (5, 7), (2, 9)):
            window = loaded.logits(ids, key_mask, positions, window=Window(start, stop, kept))
            torch.testing.assert_close(window, full[:, start:stop], rtol=1e-5, atol=1e-5)


def test_a_cached_trace_records_which_positions_each_step_computed_and_saves_them(tmp_path):
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4, cache="dual"),
                             progress=False)
    answer = len(PROMPT)
    assert trace.recomputed.shape == (8, answer + 8)
    assert trace.recomputed[0].all() and trace.recomputed[4].all()  # each block's first step: a full forward
    assert trace.recomputed[1].tolist() == [False] * answer + [True] * 4 + [False] * 4
    assert trace.recomputed[5].tolist() == [False] * (answer + 4) + [True] * 4
    assert torch.equal(sinklib.Trace.load(trace.save(tmp_path / "t")).recomputed, trace.recomputed)
    plain = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4), progress=False)
    assert plain.recomputed is None


def test_the_paper_sampler_is_untouched_by_the_new_fields():
    """threshold=None and cache=None run the paper's loop: every scheduled step, zero-count steps included."""
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=4, block_length=4), progress=False)
    assert trace.n_steps == 8  # 4 masks over 8 steps: the last 4 write nothing, and still run


@pytest.mark.parametrize("options, parameter, allowed", [
    (dict(alg="entropy", threshold=0.9, block_length=4), "alg", "'maskgit_plus' with threshold=0.9"),
    (dict(threshold=0.9, alg="maskgit_plus"), "threshold", "None without block_length"),
    (dict(cache="dual"), "cache", "None without block_length"),
    (dict(block_length=4, alg="origin"), "alg", "origin writes at random"),
    (dict(block_length=4, steps=2), "steps", "at least 2 a block"),
    (dict(block_length=4, cache="full"), "cache", "prefix"),
    (dict(block_length=4, threshold=1.5, alg="maskgit_plus"), "threshold", "1"),
])
def test_dream_refuses_fast_settings_it_cannot_run(options, parameter, allowed):
    loaded = sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID)
    with pytest.raises(ValueError, match=f"{parameter}=.*{allowed}"):
        loaded.settings_for(**{"steps": 8, "gen_length": 8, **options})


@pytest.mark.parametrize("options, parameter, allowed", [
    (dict(threshold=0.9, remasking="random"), "threshold", "remasking='random'"),
    (dict(cache="dual", cfg_scale=1.0), "cache", "classifier-free guidance"),
    (dict(threshold=0.0), "threshold", "0"),
])
def test_llada_refuses_fast_settings_it_cannot_run(options, parameter, allowed):
    loaded = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    with pytest.raises(ValueError, match=f"{parameter}=.*{allowed}"):
        loaded.settings_for(**{"steps": 8, "gen_length": 8, **options})


def test_dream_block_schedule_hand_worked():
    """8 tokens in blocks of 4 with 4 steps a block: the first forward writes one, then int(3·(1 − s/t)) by the
    block's own schedule linspace(1, 1e-3, 5), the last step the rest."""
    loaded = sinklib.load(diffusion_llama("dream"), mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4, alg="maskgit_plus"),
                             progress=False)
    written = (trace.is_masked.sum(1)[:-1] - trace.is_masked.sum(1)[1:]).tolist() + [int(trace.is_masked[-1].sum())]
    # int(3 · (1 − 0.50025/0.75)) = 0 (a forward that writes nothing, as upstream), int(3 · (1 − 0.2505/0.50025)) = 1
    assert written == [1, 0, 1, 2, 1, 0, 1, 2]
    assert dream.DreamSettings(steps=8, gen_length=8, block_length=4).block_length == 4


@pytest.mark.parametrize("family, options", [
    ("llada", dict(threshold=0.9)), ("llada", dict(cache="dual")), ("llada", dict(threshold=0.9, cache="prefix")),
    ("dream", dict(threshold=0.9, alg="maskgit_plus")), ("dream", dict(cache="dual", alg="entropy"))])
def test_a_model_that_predicts_the_mask_id_ends_each_block_where_upstream_would_loop_for_ever(family, options):
    """Writing the mask id leaves the position masked; upstream's loops run until a block has no masks (for ever,
    here). sinklib stops a block after its length (threshold) or its schedule's steps."""
    model = diffusion_llama(family)
    model.lm_head.register_forward_hook(lambda module, args, out: out.index_fill(-1, torch.tensor([MASK_ID]), 1e4))
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4, **options),
                             progress=False)
    assert bool((trace.tokens[-1, len(PROMPT):] == MASK_ID).all())
    assert trace.n_steps == 8


def test_remote_modelling_code_takes_the_threshold_and_refuses_a_cache_by_name():
    """Upstream LLaDA's own code keeps no KV cache sinklib can reuse: cache is refused before any forward, naming the
    model; the threshold runs through the remote calling convention and equals the reference loop."""
    from tests.standin import StandInLLaDA

    standin = StandInLLaDA(vocab_size=64)
    loaded = sinklib.load(standin, family="llada", mask_id=MASK_ID)
    assert loaded.calling == "remote"
    with pytest.raises(ValueError, match=r"cache='dual' is not allowed: cache must be None for .*runs its own modelling code"):
        sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4, cache="dual"), progress=False)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=8, block_length=4, threshold=0.1),
                             progress=False)

    class Native(torch.nn.Module):
        def forward(self, input_ids, attention_mask, use_cache=False):
            assert not use_cache and bool(attention_mask.all())  # the threshold needs no cache; every key is seen
            return standin(input_ids)

    assert trace.tokens[-1].tolist() == reference_fast_llada(Native(), PROMPT, 8, 8, 4, None, 0.1)[0]


def test_the_lm_eval_model_takes_threshold_and_cache_by_name_and_keeps_them_for_every_task_length():
    pytest.importorskip("lm_eval")
    from sinklib.evaluation.harness import SinklibLM

    lm = SinklibLM.create_from_arg_obj({"pretrained": "tiny-dream", "block_length": 8, "threshold": 0.9, "alg": "maskgit_plus",
                                        "cache": "dual", "refresh": 0.1})
    assert (lm.settings.block_length, lm.settings.threshold, lm.settings.cache, lm.settings.refresh) == \
        (8, 0.9, "dual", 0.1)
    longer = lm.settings_for(32)
    assert (longer.gen_length, longer.block_length, longer.threshold, longer.cache, longer.refresh) == \
        (32, 8, 0.9, "dual", 0.1)
    with pytest.raises(ValueError, match="refresh=0.1 is not allowed: refresh must be None without a cache"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-llada", "refresh": 0.1})
    with pytest.raises(ValueError, match="alg='entropy' is not allowed"):
        SinklibLM.create_from_arg_obj({"pretrained": "tiny-dream", "block_length": 8, "threshold": 0.9})
