"""The uniform-noise family (tiny-udlm's, issue 70 item 2): DiffusionGemma's accept-and-re-noise sampler on one
bidirectional model, against a reference loop written here from the sampler's description, token for token, one
block and two; its trace marks the positions not yet accepted, and its scores are finite wherever a key existed."""
import pytest
import torch

import sinklib
from sinklib.families.udlm import UniformNoiseSettings, sample
from tests.models import VOCAB, diffusion_llama

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too

PROMPT = [5, 9, 14, 3, 22, 7]
EOS = 11


def reference(model, prompt: list[int], settings: UniformNoiseSettings, seed: int) -> tuple[list[int], list]:
    """The sampler as its docstring says it, one row: per block, a canvas of uniform noise; per step n = N..1 a
    forward over [prompt ; blocks written ; canvas], logits / (t_min + (t_max − t_min)·n/N), a token drawn per
    position, the positions taken in rising entropy while the entropies before them sum to at most the bound
    accepted, every other one re-noised; the block written is the last step's argmax, cut after its first end
    token. → (the final tokens, per step the block's first column and its positions not yet accepted)."""
    generator = torch.Generator().manual_seed(seed)
    s, written, noised_log = settings, list(prompt), []
    per_block = s.steps // (s.gen_length // s.block_length)
    for _ in range(s.gen_length // s.block_length):
        canvas = torch.randint(0, VOCAB, (1, s.block_length), generator=generator)
        noised = [True] * s.block_length
        for n in range(per_block, 0, -1):
            noised_log.append((len(written), noised))
            with torch.no_grad():
                logits = model(input_ids=torch.cat([torch.tensor([written]), canvas], 1)).logits[:, -s.block_length:]
            logits = logits / (s.t_min + (s.t_max - s.t_min) * n / per_block)
            drawn = torch.multinomial(torch.softmax(logits, -1, dtype=torch.float32).view(-1, VOCAB), 1,
                                      generator=generator).view(1, -1)
            entropy = torch.distributions.Categorical(logits=logits).entropy()[0]
            accepted, before = [False] * s.block_length, 0.0
            for position in sorted(range(s.block_length), key=lambda p: float(entropy[p])):
                accepted[position] = before <= s.entropy_bound
                before += float(entropy[position])
            noise = torch.randint(0, VOCAB, (1, s.block_length), generator=generator)
            keep = torch.tensor([accepted])
            canvas = torch.where(keep, drawn, noise)
            noised = [not a for a in accepted]
            argmax = logits.argmax(-1)[0].tolist()
        if EOS in argmax:
            argmax = argmax[:argmax.index(EOS) + 1] + [s.pad_id] * (len(argmax) - argmax.index(EOS) - 1)
        written += argmax
        if EOS in argmax:
            break
    return written, noised_log


@pytest.fixture(scope="module")
def loaded():
    return sinklib.load(diffusion_llama("udlm", seed=2), eos_ids=(EOS,))


@pytest.mark.parametrize("layout", [dict(steps=6, gen_length=8, block_length=8), dict(steps=6, gen_length=8, block_length=4)],
                         ids=["one block", "two blocks"])
@pytest.mark.parametrize("seed", [0, 3])
def test_generates_the_tokens_of_the_reference_loop(loaded, layout, seed):
    settings = loaded.settings_for(**layout, entropy_bound=1.5)
    trace = sinklib.generate(loaded, [PROMPT], settings, seed=seed)[0]
    expected, noised = reference(loaded.model, PROMPT, settings, seed)
    assert trace.tokens[-1].tolist()[:len(expected)] == expected
    assert [trace.is_masked[step, start:start + settings.block_length].tolist()
            for step, (start, _) in enumerate(noised)] == [row for _, row in noised]
    assert loaded.family.has_mask_token is False and settings.vocab_size == VOCAB


def test_its_trace_has_finite_scores_wherever_a_key_existed(loaded):
    settings = loaded.settings_for(steps=4, gen_length=8, block_length=4, entropy_bound=1.5)
    trace = sinklib.generate(loaded, [PROMPT], settings, seed=1)[0]
    steps = trace.scores.shape[0]
    assert steps == 4
    first_block = len(PROMPT) + 4  # the first block's forwards see no key of the second block
    assert torch.isfinite(trace.scores[:2, ..., :first_block]).all()
    assert torch.isnan(trace.scores[:2, ..., first_block:]).all()
    assert torch.isfinite(trace.scores[2:]).all()


def test_without_a_vocabulary_the_sampler_refuses_before_any_forward():
    settings = UniformNoiseSettings(steps=2, gen_length=4, block_length=4)
    calls = []
    with pytest.raises(ValueError, match=r"vocab_size=None is not allowed: .*the model's vocabulary size"):
        sample(lambda *args: calls.append(args), torch.tensor([PROMPT]), None, settings)
    assert not calls
