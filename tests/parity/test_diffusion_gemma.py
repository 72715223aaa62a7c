"""DiffusionGemma as a family (issue 70, item 1): a tiny random-weight model built from transformers' own classes
(mixture of experts, sliding and full layers of different head sizes, self-conditioning) loads through sinklib.load,
generates the tokens of its own `generate` at a seed, and its captured attention equals the model's own eager
attention weights summed over queries."""
import pytest
import torch

pytest.importorskip("transformers.models.diffusion_gemma",
                    reason="DiffusionGemma needs transformers >= 5.25 (DiffusionGemmaForBlockDiffusion)")

import sinklib  # noqa: E402
from sinklib.families.diffusion_gemma import DiffusionGemmaSettings, encode, encoder_scores  # noqa: E402

VOCAB, CANVAS = 97, 16


def tiny_config():
    from transformers import DiffusionGemmaConfig

    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, global_head_dim=64, num_experts=4, top_k_experts=2,
                moe_intermediate_size=32, layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config()).eval()
    path = tmp_path_factory.mktemp("tiny-diffusion-gemma")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def loaded(folder):
    return sinklib.load(str(folder))


def upstream(model, ids, settings: DiffusionGemmaSettings, seed: int, attention_mask=None):
    """transformers' own generate at the same settings, its global generator seeded as sinklib seeds its own."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    blocks = settings.gen_length // settings.block_length
    extra = {} if attention_mask is None else {"attention_mask": attention_mask}
    torch.manual_seed(seed)
    return model.generate(ids, max_new_tokens=settings.gen_length, max_denoising_steps=settings.steps // blocks,
                          sampler_config=EntropyBoundSamplerConfig(entropy_bound=settings.entropy_bound),
                          t_min=settings.t_min, t_max=settings.t_max, stability_threshold=settings.stability_threshold,
                          confidence_threshold=settings.confidence_threshold,
                          eos_token_id=list(settings.eos_ids) or None, pad_token_id=settings.pad_id, **extra).sequences


def test_a_saved_tiny_diffusion_gemma_loads_as_its_family(loaded):
    assert loaded.family.name == "diffusion_gemma" and loaded.family.is_diffusion and loaded.mask_id is None
    assert type(loaded.model).__name__ == "DiffusionGemmaForBlockDiffusion"
    assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.layer_names == ["model.decoder.layers.0.self_attn", "model.decoder.layers.1.self_attn"]
    assert loaded.family.trace_meta() == {"family": "diffusion_gemma", "kind": "diffusion"}


CASES = {  # name → (settings overrides, seed)
    "two blocks, several accepted a step": (dict(gen_length=32, steps=16, entropy_bound=9.0), 3),
    "adaptive stopping ends blocks early": (dict(gen_length=32, steps=24, entropy_bound=9.0,
                                                  confidence_threshold=50.0, stability_threshold=2), 5),
    "one accepted a step, no stopping": (dict(gen_length=16, steps=6, confidence_threshold=None), 1),
    "an end token pads the rest and ends the generation": (dict(gen_length=48, steps=12, entropy_bound=9.0), 2),
}
END_TOKENS = tuple(range(3, 13))  # the last case's model ends answers at any of these (loaded with eos_ids=)


@pytest.mark.parametrize("case", list(CASES))
def test_generate_gives_upstreams_tokens_at_a_seed(folder, loaded, case):
    overrides, seed = CASES[case]
    if case.startswith("an end token"):
        loaded = sinklib.load(str(folder), eos_ids=END_TOKENS)
    settings = loaded.settings_for(block_length=CANVAS, **overrides)
    prompt = [2, 5, 7, 9, 11, 13]
    trace = sinklib.generate(loaded, prompt, settings, seed=seed, progress=False)
    expected = upstream(loaded.model, torch.tensor([prompt]), settings, seed)[0]
    assert torch.equal(trace.tokens[-1, :expected.shape[0]], expected)
    assert (trace.tokens[-1, expected.shape[0]:] == settings.pad_id).all()  # blocks never generated
    if settings.eos_ids:  # the case is one: an end token in the first block, the rest padded
        assert expected.shape[0] < len(prompt) + settings.gen_length
    scores = trace.require_scores()
    assert scores.shape[:2] == (trace.n_steps, 2) and trace.n_steps <= settings.steps
    blocks = (torch.arange(trace.tokens.shape[1]) - len(prompt)) // CANVAS
    for step in range(trace.n_steps):  # every key that exists at a step: the prompt, earlier blocks, the canvas
        current = int(blocks[trace.is_masked[step]].min())
        assert torch.isfinite(scores[step][..., blocks <= current]).all()
        assert torch.isnan(scores[step][..., blocks > current]).all()


def test_a_left_padded_batch_gives_upstreams_rows(loaded):
    settings = loaded.settings_for(block_length=CANVAS, gen_length=32, steps=16, entropy_bound=9.0)
    prompts = [[2, 5, 7, 9, 11, 13], [4, 6, 8]]
    traces = sinklib.generate(loaded, prompts, settings, seed=7, progress=False)
    ids = torch.tensor([[2, 5, 7, 9, 11, 13], [0, 0, 0, 4, 6, 8]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    expected = upstream(loaded.model, ids, settings, 7, attention_mask=mask)
    for trace, row, pad in zip(traces, expected, (0, 3)):
        assert torch.equal(trace.tokens[-1], row[pad:])


def test_a_single_block_has_finite_scores_at_every_step_and_records_what_was_not_yet_accepted(loaded):
    settings = loaded.settings_for(block_length=CANVAS, gen_length=16, steps=8, entropy_bound=9.0)
    trace = sinklib.generate(loaded, [2, 5, 7, 9], settings, seed=0, progress=False)
    assert torch.isfinite(trace.require_scores()).all()
    masked = trace.is_masked
    assert not masked[:, :4].any() and masked[0, 4:].all()  # the prompt never; the first canvas is all noise
    assert (masked[1:, 4:].sum(1) < CANVAS).all()  # every later step sees some accepted token
    for step in range(1, trace.n_steps):  # an accepted position holds what the step before drew, never noise
        accepted = ~masked[step, 4:]
        assert accepted.any()


def _decoder_reference(model, cache, canvas, conditioning):
    """The decoder's own eager attention weights [layers, heads, keys], summed over the canvas's queries."""
    model.set_attn_implementation("eager")
    try:
        out = model(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=conditioning,
                    output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    return torch.stack([a[0].sum(-2) for a in out.attentions]), out.logits


def test_captured_scores_equal_the_models_own_attention_weights(loaded):
    """Steps 0 and 1 of a generation (the second with the first's logits as self-conditioning) against the eager
    decoder's attention weights; the encoder's pass against the eager encoder's."""
    settings = loaded.settings_for(block_length=CANVAS, gen_length=16, steps=8, entropy_bound=9.0)
    prompt = [2, 5, 7, 9, 11]
    trace = sinklib.generate(loaded, prompt, settings, seed=4, progress=False)
    model, ids = loaded.model, torch.tensor([prompt])
    with torch.no_grad():
        cache = encode(model, ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(5)[None])[0]
        first, logits = _decoder_reference(model, cache, trace.tokens[0:1, 5:], None)
        temperature = settings.t_min + (settings.t_max - settings.t_min) * (torch.tensor(8, dtype=torch.int32) / 8)
        second, _ = _decoder_reference(model, cache, trace.tokens[1:2, 5:], logits / temperature)
    torch.testing.assert_close(trace.scores[0], first, atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.scores[1], second, atol=1e-5, rtol=0)
    with torch.no_grad():
        model.set_attn_implementation("eager")
        try:
            out = model.model.encoder(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation("sdpa")
        captured = encoder_scores(model, ids)
    torch.testing.assert_close(captured[:, 0], torch.stack([a[0].sum(-2) for a in out.attentions]), atol=1e-5, rtol=0)


def test_settings_refuse_a_layout_the_model_cannot_run(loaded):
    with pytest.raises(ValueError, match="gen_length"):
        DiffusionGemmaSettings(steps=4, gen_length=20, block_length=16)
    with pytest.raises(ValueError, match="t_max"):
        DiffusionGemmaSettings(steps=4, gen_length=16, block_length=16, t_min=0.8, t_max=0.4)
    with pytest.raises(ValueError, match="block_length=32 is not allowed"):
        sinklib.generate(loaded, [2, 5], loaded.settings_for(block_length=32, gen_length=32, steps=4), progress=False)


def test_the_papers_masking_policy_runs_on_the_decoder_over_prompt_and_canvas(loaded):
    """Table 1's policies on a model without a mask token: MaskSinks masks, at each denoising step t >= 1, the top
    Eq. 3 sink that step t-1 found in each layer and head of the decoder (keys over [prompt ; canvas], computed here
    from the trace's scores by the definition); a masked key
    receives exactly nothing and its share goes to the others (each step's scores still sum to the canvas's 16
    queries: the key left the softmax, it was not zeroed after); an explicit key (MaskKeys) is masked at every step."""
    from tests.parity.test_interventions import reference_top

    settings = loaded.settings_for(block_length=CANVAS, gen_length=16, steps=8, entropy_bound=9.0)
    prompt = [2, 5, 7, 9, 11]
    trace = sinklib.generate(loaded, prompt, settings, seed=4, progress=False, intervention=sinklib.MaskSinks(top_k=1))
    scores, masked = trace.require_scores(), trace.masked_keys
    assert not masked[0].any()  # step 0 has no earlier step to read sinks from
    # the decoder's pass is not square (16 canvas queries over 21 keys): the policy reads Eq. 3 in key units, the
    # scores scaled to mean 1 over the keys (interventions.key_normalised; a factor of 1 for a square pass)
    in_key_units = scores * len(prompt + [0] * CANVAS) / CANVAS
    for t in range(1, trace.n_steps):
        assert torch.equal(masked[t], reference_top(in_key_units[t - 1], 1))
        assert torch.all(scores[t][masked[t]] == 0)
    assert masked[1:].any()  # the tiny model has sinks for the policy to mask
    torch.testing.assert_close(scores.sum(-1), torch.full(scores.shape[:-1], float(CANVAS)), atol=1e-4, rtol=0)

    keyed = sinklib.generate(loaded, prompt, settings, seed=4, progress=False, intervention=sinklib.MaskKeys([1]))
    assert keyed.masked_keys[..., 1].all() and keyed.masked_keys.sum() == keyed.masked_keys[..., 1].numel()
    assert torch.all(keyed.require_scores()[..., 1] == 0)
