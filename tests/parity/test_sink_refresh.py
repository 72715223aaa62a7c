"""The sink-anchored refresh (a cache's `refresh` bound; families.cached.BlockCache) against a reference loop that
reads each window's attention from an eager copy of the model (its attention maps, output_attentions) rather than
sinklib's capture, and with upstream's own cache mechanics (tests/parity/test_fast_samplers._Upstream)."""
import copy

import pytest
import torch

import sinklib
from sinklib.families.cached import drifted, greatest_sinks
from tests.models import MASK_ID, diffusion_llama
from tests.parity.test_fast_samplers import PROMPT, _threshold_pick, _Upstream


def _eager(model):
    twin = copy.deepcopy(model)
    if hasattr(twin, "set_attn_implementation"):
        twin.set_attn_implementation("eager")
    else:  # transformers < 4.56
        twin.config._attn_implementation = "eager"
    return twin


def _greatest(attentions, eps: float = 3.0) -> list[tuple[int, float]]:
    """Per layer (maps [1, H, Q, K]): the most-attended key (attention averaged over heads and query rows) if Eq. 3
    holds for it on those averages times K (mean 1), written out — s_j > mean of the others + eps — else −1; and
    its attention."""
    found = []
    for maps in attentions:
        received = maps[0].mean((0, 1))
        scores, j = (received * len(received)).tolist(), int(received.argmax())
        others = (sum(scores) - scores[j]) / (len(scores) - 1)
        found.append((j if scores[j] > others + eps else -1, float(received.max())))
    return found


def _moved(anchor, now, bound: float) -> bool:
    return any(k != ka or abs(s - sa) >= bound for (k, s), (ka, sa) in zip(now, anchor))


def reference_refresh_llada(model, prompt, steps, gen_length, block_length, cache, threshold, refresh):
    """Fast-dLLM's cached LLaDA loop (reference_fast_llada) with the refresh rule: a refresh is a full forward and a
    window beside its keys that anchors each layer's greatest sink; a later window whose greatest sink is another key,
    or whose share moved by `refresh` or more, is dropped and the step refreshes. → (tokens, forwards)."""
    upstream, watcher = _Upstream(model), _Upstream(_eager(model))
    x = list(prompt) + [MASK_ID] * gen_length
    per_block = steps // (gen_length // block_length)
    forwards = 0

    def window(start, end):
        watcher.cache = upstream.cache  # the same kept keys: the eager copy computes the same keys and values
        if cache == "prefix":
            logits, offset = upstream.prefix(x, start), start
            _, maps = watcher.prefix(x, start, attentions=True)
        else:
            logits, offset = upstream.dual(x, start, end), start
            _, maps = watcher.dual(x, start, end, attentions=True)
        return logits, offset, _greatest(maps)

    for start in range(len(prompt), len(x), block_length):
        end = start + block_length
        schedule = [block_length // per_block + (1 if i < block_length % per_block else 0) for i in range(per_block)]
        step, anchor = 0, None
        while any(t == MASK_ID for t in x[start:end]):
            logits = None
            if step > 0:
                logits, offset, now = window(start, end)
                forwards += 1
                if _moved(anchor, now, refresh):
                    logits = None
            if logits is None:
                logits, offset = upstream.full(x, keep=True), 0
                _, _, anchor = window(start, end)
                forwards += 2
            _write(x, logits, offset, range(start, end), threshold, schedule[step])
            step += 1
    return x, forwards


def _write(x: list[int], logits, offset: int, block: range, threshold, count: int) -> None:
    """Fast-dLLM's choice at temperature 0: the block's masked positions by confidence, those at or above the
    threshold (at least one) or the schedule's count, each written with its argmax."""
    candidates = []
    for j in (j for j in block if x[j] == MASK_ID):
        row = logits[j - offset]
        token = int(row.argmax())
        candidates.append((-float(torch.softmax(row, -1)[token]), j, token))
    candidates.sort()
    for _, j, token in _threshold_pick(candidates, threshold) if threshold is not None else candidates[:count]:
        x[j] = token


CASES = [(cache, threshold, refresh) for cache in ("prefix", "dual") for threshold in (None, 0.1)
         for refresh in (0.0, 0.02, 0.04, 1.0)]


@pytest.mark.parametrize("cache, threshold, refresh", CASES)
def test_llada_refresh_matches_a_reference_loop_that_reads_eager_attention_maps(cache, threshold, refresh):
    model = diffusion_llama("llada")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    trace = sinklib.generate(loaded, PROMPT, loaded.settings_for(steps=8, gen_length=16, block_length=8, cache=cache,
                                                                 threshold=threshold, refresh=refresh), progress=False)
    tokens, forwards = reference_refresh_llada(model, PROMPT, 8, 16, 8, cache, threshold, refresh)
    assert trace.tokens[-1].tolist() == tokens
    assert trace.n_steps == forwards


def test_the_reference_cases_cover_dropped_windows_and_kept_ones():
    """Between the bounds the cases above see both outcomes: some windows kept, some dropped for a refresh."""
    model = diffusion_llama("llada")
    counts = {refresh: reference_refresh_llada(model, PROMPT, 8, 16, 8, "dual", None, refresh)[1]
              for refresh in (0.0, 0.02, 0.04, 1.0)}
    every_step, never_for_share = 2 * (2 + 3 * 3), 2 * (2 + 3)  # two blocks of 4 steps
    assert counts[0.0] == every_step and counts[1.0] <= counts[0.04] <= counts[0.02] <= every_step
    assert counts[1.0] >= never_for_share and len(set(counts.values())) >= 3, counts


@pytest.mark.parametrize("family, options", [
    ("llada", {}), ("llada", dict(threshold=0.1)),
    ("dream", dict(alg="maskgit_plus")), ("dream", dict(alg="entropy")), ("dream", dict(alg="maskgit_plus", threshold=0.1))])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_refresh_at_every_step_gives_the_tokens_of_the_sampler_without_a_cache(family, options, cache):
    """refresh=0: every window counts as drifted, so each step's tokens come from a full forward, as without a cache;
    the trace keeps a canvas, a margin and the computed columns of every forward."""
    loaded = sinklib.load(diffusion_llama(family), mask_id=MASK_ID)
    layout = dict(steps=8, gen_length=16, block_length=8, **options)
    plain = sinklib.generate(loaded, PROMPT, loaded.settings_for(**layout), progress=False)
    refreshed = sinklib.generate(loaded, PROMPT, loaded.settings_for(cache=cache, refresh=0.0, **layout), progress=False)
    assert refreshed.tokens[-1].tolist() == plain.tokens[-1].tolist()
    # each of the 2 blocks: its first step a refresh and its anchor, every later step a dropped window, a refresh and
    # an anchor
    assert refreshed.n_steps == 2 * 2 + 3 * (plain.n_steps - 2)
    assert refreshed.margins is not None and len(refreshed.margins) == refreshed.n_steps
    assert refreshed.recomputed.shape[0] == refreshed.n_steps
    assert refreshed.scores.shape[0] == refreshed.n_steps


def test_greatest_sinks_and_drift_on_hand_made_attention():
    # 2 layers, 1 row, 2 heads, 8 keys, 2 query rows each (column sums of rows that each sum to 1): layer 0 gives key 5
    # 0.6 of its attention (4.8 in sum units against the others' 0.46: a sink), layer 1 spreads it (no sink)
    sharp = [0.4 / 7] * 8
    sharp[5] = 0.6
    flat = [0.1, 0.1, 0.2, 0.1, 0.1, 0.2, 0.1, 0.1]
    scores = torch.tensor([[[[2 * x for x in sharp]] * 2], [[[2 * x for x in flat]] * 2]])
    key, share = greatest_sinks(scores, torch.full((2, 1), 2.0))
    assert key.tolist() == [[5], [-1]]
    torch.testing.assert_close(share, torch.tensor([[0.6], [0.2]]))
    anchor = (key, share)
    assert not drifted(anchor, (key, share + 0.04), 0.05)
    assert drifted(anchor, (key, share + 0.05), 0.05)  # a move of the bound itself refreshes
    assert drifted(anchor, (key, share), 0.0)  # bound 0: always
    assert drifted(anchor, (torch.tensor([[4], [-1]]), share), 1.0)  # the sink moved: whatever the bound
    assert drifted(anchor, (torch.tensor([[5], [2]]), share), 1.0)  # a sink appeared


@pytest.mark.parametrize("family, options, allowed", [
    ("llada", dict(refresh=0.1), "refresh=0.1 is not allowed: refresh must be None without a cache"),
    ("llada", dict(refresh=1.5, cache="dual"), "refresh=1.5 is not allowed"),
    ("llada", dict(refresh=-0.1, cache="dual"), "refresh=-0.1 is not allowed"),
    ("dream", dict(refresh=0.1, block_length=4, alg="maskgit_plus"), "refresh must be None without a cache"),
    ("dream", dict(refresh=0.1), "refresh must be None without a cache"),
])
def test_a_refresh_it_cannot_run_is_refused_by_name(family, options, allowed):
    loaded = sinklib.load(diffusion_llama(family), mask_id=MASK_ID)
    with pytest.raises(ValueError, match=allowed):
        loaded.settings_for(steps=8, gen_length=8, **options)
