"""DiffusionGemma: block diffusion over uniform noise, as transformers' own `generate` (generation_diffusion_gemma.py).

The model is an encoder and a decoder sharing their weights. A causal encoder pass over the prompt (and, block by
block, over each finished block) fills a key/value cache; the decoder then denoises a canvas of `block_length` tokens
(the model's canvas_length) attending bidirectionally to [cache ; canvas]. There is no mask token: a canvas starts as
uniformly random tokens. Each step (at most steps / blocks a block, counted down N..1): logits at the temperature
t_min + (t_max − t_min)·n/N, a token drawn per position, the lowest-entropy draws accepted while their entropies less
the largest stay within `entropy_bound`, every other position re-noised with fresh random tokens; the step's logits
feed the next step (self-conditioning). A block stops early when its argmax canvas has not changed for
`stability_threshold` steps and its mean entropy is below `confidence_threshold` (adaptive stopping); the block
written is the last argmax canvas. Generation stops after a block in which every row wrote an end token.

All draws use the sampler's generator in the order upstream draws from the global one (the canvas, then per step the
tokens and the re-noising), so a seed gives upstream's tokens. The trace's `is_masked` is "not yet accepted": a
position of the current block that holds noise when the step runs, and every position of a block not yet begun.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from sinklib.capturing import capture
from sinklib.families.base import Canvas, DiffusionFamily, FamilySettings, Forward, check_block_layout
from sinklib.validation import BadValue, Count, Index, NonNegative, Positive, bad_value, validated


@validated
@dataclass(frozen=True)
class DiffusionGemmaSettings(FamilySettings):
    """DiffusionGemma's sampler (upstream's generation config under sinklib's layout names).

    Attributes:
        steps: denoising forwards over the whole generation at most, a multiple of the number of blocks; each block
            gets steps / blocks (upstream's max_denoising_steps).
        gen_length: new tokens, a multiple of block_length (upstream's max_new_tokens).
        block_length: the canvas, in tokens: the model's canvas_length (256 in the release).
        entropy_bound: the entropy sampler's bound (> 0): more tokens are accepted a step the higher it is.
        t_min, t_max: the temperature at the last and at the first step (0 <= t_min < t_max).
        stability_threshold: steps the argmax canvas must stay the same to stop a block early (0: no stability asked).
        confidence_threshold: the mean entropy below which a stable block stops; None: no adaptive stopping.
        eos_ids: the ids that end an answer (the model's are filled in by LoadedModel).
        pad_id: what follows an end token, and fills blocks never generated.
    """
    steps: Count
    gen_length: Count
    block_length: Count = 256
    entropy_bound: Positive = 0.1
    t_min: NonNegative = 0.4
    t_max: Positive = 0.8
    stability_threshold: Index = 1
    confidence_threshold: Positive | None = 0.005
    eos_ids: tuple[Index, ...] = ()
    pad_id: Index = 0

    def check(self) -> None:
        """Refuse a layout whose gen_length is not a multiple of block_length or whose steps are not a multiple of
        the number of blocks, and t_max not above t_min (upstream's own rule)."""
        check_block_layout(self.steps, self.gen_length, self.block_length)
        if not self.t_max > self.t_min:
            raise bad_value("t_max", self.t_max, f"a number above t_min={self.t_min}")


class Canvases(list):
    """The sampler's canvases (each [B, width]), with `noised`: per forward, bool [B, width], the positions not yet
    accepted when it ran (the counterpart of a mask-token family's masked positions)."""

    def __init__(self) -> None:
        super().__init__()
        self.noised: list[torch.Tensor] = []


class _Stopping:
    """Upstream's StableAndConfidentStoppingCriteria: stable (the argmax canvas as in each of the last `threshold`
    steps) and confident (mean entropy below `confidence`), per row."""

    def __init__(self, threshold: int, confidence: float) -> None:
        self.threshold, self.confidence, self.history = threshold, confidence, None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.threshold == 0:
            stable = torch.ones(logits.shape[0], device=logits.device, dtype=torch.bool)
        else:
            if self.history is None:
                self.history = torch.full((self.threshold, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax
        entropy = torch.distributions.Categorical(logits=logits).entropy()
        return stable & (torch.mean(entropy, dim=-1) < self.confidence)


def accept(current: torch.Tensor, drawn: torch.Tensor, logits: torch.Tensor, bound: float):
    """Upstream's entropy-bound acceptance: the k lowest-entropy positions whose entropies, less their largest, sum
    to at most `bound` take the drawn token. → (accepted mask [B, C], the canvas with them written)."""
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    ordered, order = torch.sort(entropy, dim=-1, descending=False)
    chosen = torch.cumsum(ordered, dim=-1) - ordered <= bound
    accepted = torch.scatter(input=torch.zeros_like(chosen), dim=-1, index=order, src=chosen)
    return accepted, torch.where(accepted, drawn, current)


def _noise(shape, vocab: int, generator, device) -> torch.Tensor:
    return torch.randint(low=0, high=vocab, size=shape, generator=generator, device=device)


class _Sampler:
    """One generation's state: the forward, settings and generator, the full-width canvas and what it recorded."""

    def __init__(self, forward: Forward, settings: DiffusionGemmaSettings, generator, prompt_ids: torch.Tensor):
        self.forward, self.settings, self.generator = forward, settings, generator
        batch, self.prompt_len = prompt_ids.shape
        self.x = torch.full((batch, self.prompt_len + settings.gen_length), settings.pad_id, dtype=torch.long,
                            device=prompt_ids.device)
        self.x[:, :self.prompt_len] = prompt_ids
        self.canvases = Canvases()
        self.steps = settings.steps // (settings.gen_length // settings.block_length)

    def record(self, start: int, canvas: torch.Tensor, noised: torch.Tensor) -> None:
        """The canvas a forward sees, at full width: earlier blocks written, this one's noise marked, later ones
        not yet begun (pad, noised)."""
        self.x[:, start:start + canvas.shape[1]] = canvas
        self.canvases.append(self.x.clone())
        mask = torch.zeros_like(self.x, dtype=torch.bool)
        mask[:, start:] = True
        mask[:, start:start + canvas.shape[1]] = noised
        self.canvases.noised.append(mask)

    def denoise(self, start: int, vocab: int, logits_of) -> torch.Tensor:
        """One block's denoising loop (upstream's 1.b and 1.c), its canvas starting at column `start`:
        logits_of(canvas [B, C], conditioning: the previous step's logits or None) → logits [B, C, V], called after
        the canvas is recorded (self.x holds it). → its last argmax canvas [B, C]."""
        s, x = self.settings, self.x
        current = _noise((x.shape[0], s.block_length), vocab, self.generator, x.device)
        argmax, conditioning, noised = current, None, torch.ones_like(current, dtype=torch.bool)
        finished = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        stopping = None if s.confidence_threshold is None else _Stopping(s.stability_threshold, s.confidence_threshold)
        for step in reversed(range(1, self.steps + 1)):
            self.record(start, current, noised)
            logits = logits_of(current, conditioning)
            cur = torch.tensor(step, device=x.device, dtype=torch.int32)  # upstream's temperature, in its dtype
            logits = logits / (s.t_min + (s.t_max - s.t_min) * (cur / self.steps))
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            drawn = torch.multinomial(probs.view(-1, vocab), num_samples=1, generator=self.generator).view(current.shape)
            accepted, written = accept(current, drawn, logits, s.entropy_bound)
            renoised = torch.where(~accepted, _noise(current.shape, vocab, self.generator, x.device), written)
            new_argmax = torch.argmax(logits, dim=-1)
            if stopping is not None:
                keep = finished[:, None]
                new_argmax, renoised = torch.where(keep, argmax, new_argmax), torch.where(keep, current, renoised)
                accepted = torch.where(keep, ~noised, accepted)
                logits = logits if conditioning is None else torch.where(keep[..., None], conditioning, logits)
                finished = finished | stopping(new_argmax, logits)
            current, argmax, conditioning, noised = renoised, new_argmax, logits, ~accepted
            if bool(finished.all()):
                break
        return argmax

    def finish(self, start: int, argmax: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
        """Write a block (upstream's 1.d and 1.e): rows finished before get pad, a row's tokens after its first end
        token get pad; → the rows finished now."""
        s = self.settings
        block = argmax.clone()
        if not s.eos_ids:
            self.x[:, start:start + s.block_length] = block
            return finished
        eos = torch.tensor(s.eos_ids, device=block.device)
        now = finished | torch.isin(block, eos).any(dim=-1)
        if bool(now.any()):
            block[finished] = s.pad_id
            is_eos = torch.isin(block, eos)
            count = is_eos.cumsum(dim=-1)
            block[(count > 0) & ~((count == 1) & is_eos)] = s.pad_id
        self.x[:, start:start + s.block_length] = block
        return now


def sample(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None,
           settings: DiffusionGemmaSettings, generator: torch.Generator | None = None) -> Canvases:
    """forward(ids, mask, positions, stage="encode", cache=…) → (cache, canvas_length, vocabulary) after an encoder
    pass; forward(canvas, None, None, stage="denoise", cache=…, key_mask=…, positions=…, conditioning=…) → the
    decoder's logits [B, C, V] (DiffusionGemmaFamily.run). Returns the canvases [B, prompt + gen_length] before each
    forward and the final one, with `noised` (Canvases); blocks never generated hold pad_id."""
    run = _Sampler(forward, settings, generator, prompt_ids)
    batch, prompt_len = prompt_ids.shape
    device = prompt_ids.device
    key_mask = (torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask).bool()
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    cache, start, new = None, prompt_len, prompt_ids
    for _ in range(settings.gen_length // settings.block_length):
        positions = torch.arange(start - new.shape[1], start, dtype=torch.int32, device=device)[None]
        cache, canvas_length, vocab = forward(new, key_mask, positions, stage="encode", cache=cache)
        if canvas_length != settings.block_length:
            raise bad_value("block_length", settings.block_length, f"the model's canvas_length, {canvas_length}")
        key_mask = torch.nn.functional.pad(key_mask, (0, settings.block_length), value=True)
        decoder_positions = torch.arange(start, start + settings.block_length, dtype=torch.int32, device=device)[None]

        def decoder_logits(canvas, conditioning, cache=cache, key_mask=key_mask, positions=decoder_positions):
            return forward(canvas, None, None, stage="denoise", cache=cache, key_mask=key_mask, positions=positions,
                           conditioning=conditioning)
        argmax = run.denoise(start, vocab, decoder_logits)
        finished = run.finish(start, argmax, finished)
        if bool(finished.all()):
            break
        new, start = run.x[:, start:start + settings.block_length], start + settings.block_length
    run.canvases.append(run.x.clone())
    return run.canvases


class DiffusionGemmaFamily(DiffusionFamily):
    """Block diffusion over uniform noise (no mask token): the not-yet-accepted positions stand for masked ones; the
    model is transformers' DiffusionGemmaForBlockDiffusion, its decoder's attention is what the trace records."""
    has_mask_token = False
    native_class = "DiffusionGemmaForBlockDiffusion"

    def layout(self, canvases, prompt_lengths, settings, mask_id, pad_id) -> Canvas:
        """The canvases stacked; a position is masked where the sampler had not accepted it when the step ran
        (Canvases.noised)."""
        tokens = torch.stack(list(canvases)).cpu()
        padding = tokens.shape[-1] - settings.gen_length - torch.tensor(prompt_lengths)
        return Canvas(tokens, torch.stack(canvases.noised).cpu(), padding)

    def layer_names(self, model) -> list[str]:
        """The decoder's attention modules (the encoder's share their weights and run once a block, uncaptured)."""
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model.decoder
        prefix = next(name for name, module in model.named_modules() if module is decoder)
        return [f"{prefix}.layers.{index}.self_attn" for index in range(len(decoder.layers))]

    def run(self, model, ids, attention_mask, position_ids, *, stage: str, cache=None, **decoder):
        """The encoder pass (→ cache, canvas_length, vocabulary) or one decoder step (→ float32 logits), as
        upstream's generate makes them."""
        if stage == "encode":
            return encode(model, ids, attention_mask, position_ids, cache)
        if stage != "denoise":
            raise bad_value("stage", stage, "'encode' or 'denoise'")
        conditioning = decoder["conditioning"]
        if conditioning is not None:
            conditioning = conditioning.to(model.model.decoder.embed_tokens.weight.dtype)
        return model(decoder_input_ids=ids, cache=cache, self_conditioning_logits=conditioning,
                     decoder_attention_mask=decoder["key_mask"], decoder_position_ids=decoder["positions"]).logits


def encode(model, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache=None):
    """Upstream's step 1.a: the encoder over the tokens not cached yet, its causal masks built from the whole 2-d key
    mask; → (cache, canvas_length, vocabulary size)."""
    config = model.config
    if cache is None:
        cache = DynamicCache(config=config.get_text_config(decoder=True))
    if cache.get_seq_length() + ids.shape[1] >= config.get_text_config().sliding_window:
        raise BadValue(f"the prompt and the blocks before the last one ({cache.get_seq_length() + ids.shape[1]} tokens) "
                       f"are longer than the sliding window ({config.get_text_config().sliding_window}): the sliding "
                       "layers' keys would no longer line up with positions; shorten the prompt or gen_length")
    dummy = torch.empty((ids.shape[0], ids.shape[1], 0), dtype=model.dtype, device=ids.device)
    masks = model.model.encoder.create_masks_for_generate(config=config, inputs_embeds=dummy,
                                                          attention_mask=attention_mask, cache=cache,
                                                          position_ids=position_ids)
    model.model.encoder(input_ids=ids.contiguous(), attention_mask=masks, cache=cache, position_ids=position_ids)
    return cache, config.canvas_length, config.get_text_config().vocab_size


def encoder_scores(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The encoder's attention over a prompt, captured once as sinklib.capture records a step: scores [layers,
    batch, heads, prompt] in sum units (Σ over the prompt's queries; causal). `model`: the
    DiffusionGemmaForBlockDiffusion (a LoadedModel's .model); ids [B, P]. The generation's trace holds the decoder's
    steps; this is its prefill, the pass every block's cache starts from."""
    encoder = model.model.encoder
    names = [f"language_model.layers.{index}.self_attn" for index in range(len(encoder.language_model.layers))]
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    positions = torch.arange(ids.shape[1], dtype=torch.int32, device=ids.device)[None]
    with torch.no_grad(), capture(encoder, layer_names=names) as recorder:
        recorder.query_mask = mask.long()
        encode(model, ids, mask, positions)
    return recorder.scores[0]


# The release's generation config: canvases of 256, 48 denoising steps each, entropy bound 0.1, temperature 0.8 → 0.4,
# adaptive stopping; the tiny zoo's 16-token slot is one canvas of 16.
PAPER = DiffusionGemmaSettings(steps=48, gen_length=256)
ZOO = DiffusionGemmaSettings(steps=16, gen_length=16, block_length=16)

DIFFUSION_GEMMA = DiffusionGemmaFamily(
    "diffusion_gemma", sample, DiffusionGemmaSettings,
    description="DiffusionGemma-26B-A4B: block diffusion over uniform noise, entropy-bound acceptance",
    paper=PAPER, zoo=ZOO, model_types=("diffusion_gemma", "diffusiongemma"))
