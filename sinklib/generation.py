"""generate(): a family's own sampler under the capture → one Trace per prompt."""
from __future__ import annotations

import contextlib
import dataclasses
import platform
from typing import Any, Sequence

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm

from sinklib.validation import BadValue, Flag, Index, bad_value, checked
from sinklib._version import __version__
from sinklib.capturing import capture, check_intervention
from sinklib.digest import digest
from sinklib.layers import attention_layers
from sinklib.families.base import left_pad
from sinklib.ties import recording_decisions
from sinklib.loading import LoadedModel, load
from sinklib.settings import Settings
from sinklib.trace import Trace

def encode(loaded: LoadedModel, prompt, chat: bool) -> list[int]:
    """A prompt as the token ids the model reads: text through the chat template (when asked and the tokenizer has
    one) or plain tokenisation; token ids pass through, checked against the vocabulary.

    Args:
        loaded: the LoadedModel whose tokenizer encodes the text.
        prompt: a text, a list of token ids, or a 1-d integer tensor (or array) of them.
        chat: the text through the chat template (LoadedModel.chat is the model's own prompt style).

    Returns:
        The prompt's token ids, as generate feeds them to the sampler.

    Raises:
        BadValue: an empty prompt, a float or bool tensor, or an id outside the vocabulary.
    """
    if isinstance(prompt, np.ndarray):
        prompt = torch.from_numpy(prompt)
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise bad_value("prompt", f"a {prompt.dtype} tensor", "token ids as an integer tensor")
        ids = prompt.flatten().tolist()
    elif isinstance(prompt, str):
        ids = _tokenised(loaded, prompt, chat)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise bad_value("prompt", prompt, "a text, a list of token ids (ints), a 1-d tensor of ids, or a list of these")
    if not ids:
        raise bad_value("prompt", prompt, "a non-empty text or a non-empty list of token ids")
    vocab = _vocab_size(loaded)
    outside = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
    if outside:
        raise bad_value("prompt", outside[:5],
                        f"token ids in 0..{vocab - 1 if vocab else 'vocab'} (the vocabulary of {loaded.name})")
    return list(ids)


def _tokenised(loaded: LoadedModel, text: str, chat: bool) -> list[int]:
    """Token ids of a text prompt: through the chat template when asked and the tokenizer has one."""
    if loaded.tokenizer is None:
        raise BadValue(f"prompt is text but {loaded.name!r} has no tokenizer: pass token ids, or load with tokenizer=")
    if not text.strip():
        raise bad_value("prompt", text, "a non-empty text or a non-empty list of token ids")
    if chat and getattr(loaded.tokenizer, "chat_template", None):
        ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True)
        return ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return loaded.tokenizer(text)["input_ids"]


def _vocab_size(loaded: LoadedModel) -> int | None:
    config = getattr(loaded.model, "config", None)
    size = getattr(config, "vocab_size", None) or getattr(config, "embedding_size", None)
    if isinstance(size, int):
        return size
    embeddings = loaded.model.get_input_embeddings() if hasattr(loaded.model, "get_input_embeddings") else None
    return getattr(embeddings, "num_embeddings", None)


def _is_single(prompt) -> bool:
    if isinstance(prompt, str):
        return True
    if isinstance(prompt, (torch.Tensor, np.ndarray)):
        return prompt.ndim == 1
    return len(prompt) == 0 or not isinstance(prompt[0], (str, list, tuple, torch.Tensor, np.ndarray))


@checked
def generate(model, prompt, settings: Settings | None = None, *, seed: Index = 0,
             maps: Sequence[tuple[int, int | str, int]] | None = None, intervention=None, chat: Flag | None = None,
             progress: Flag = True, keep_scores: Flag = True) -> Trace | list[Trace]:
    """Run the model's family sampler with attention capture; a list of prompts gives a list of Traces.

    Args:
        model: a LoadedModel (sinklib.load) or a name to load.
        prompt: text, token ids, or a list of either (batched with left padding).
        settings: the family's settings dataclass (LLaDASettings, DreamSettings, ARMSettings); None: the model's own,
            LoadedModel.settings_for(). Build others with `model.settings_for(steps=..., gen_length=...)` (the
            layout kept valid) or dataclasses.replace; both are checked when made.
        seed: the sampler's random generator (temperature > 0, random remasking).
        maps: (step, layer, head) triples whose full [queries, keys] attention map is kept (Trace.maps), as for
            sinklib.capture.
        intervention: a policy applied at every forward (sinklib.interventions, e.g. MaskSinks(top_k=1)); None:
            nothing is changed.
        chat: the prompt through the chat template (a real bool); None: the model's own prompt style (the zoo reads
            plain "Q: … A:" text, every other model its chat template).
        progress: a progress bar over the sampler's steps (a real bool).
        keep_scores: a real bool; False gives Traces without scores (Trace.scores is None; tokens, text and maps as usual) and
            stores nothing per step — for evaluation runs. Without an intervention or maps the model then runs with
            no capture at all; the tokens are the same either way.

    Returns:
        One Trace for one prompt, a list of Traces (one per prompt, padding removed) for a list.

    Raises:
        BadValue: settings of another family, a prompt longer than the model's positions, maps outside the run.
    """
    loaded = model if isinstance(model, LoadedModel) else load(model)
    check_intervention(intervention)
    settings = loaded.settings_for() if settings is None else loaded.runnable(settings)
    chat = loaded.chat if chat is None else chat
    prompts, single = _prompt_list(prompt)
    encoded = [encode(loaded, p, chat) for p in prompts]
    _check_fits_model(loaded, encoded, settings.gen_length)
    total = loaded.family.n_forwards(settings)
    _check_fits_run(loaded, maps, intervention, total)
    # a sink-anchored refresh reads the attention of its window forwards from the capture
    watched = keep_scores or intervention is not None or bool(maps) or getattr(settings, "refresh", None) is not None
    recording = capture(loaded.model, maps=maps, intervention=intervention, layer_names=loaded.layer_names,
                        keep_steps=keep_scores) if watched else contextlib.nullcontext(None)
    windows: list[tuple[int, int] | None] = []
    with torch.no_grad(), recording as rec, recording_decisions() as margins:
        if rec is not None:  # a problem's own identity, whatever batch it is in (a random-key policy draws by it)
            rec.row_ids = tuple(row_identity(ids) for ids in encoded)
        canvases = _sample(loaded, rec, encoded, settings, seed, total, progress, windows)
    meta = _meta(loaded, settings, seed, intervention, chat)
    # a family whose sampler notes no margins (or not one per forward) gives traces without them
    margins = torch.stack(margins) if len(margins) == len(canvases) - 1 and margins else None
    traces = _split(loaded, rec, canvases, encoded, settings, meta, prompts, margins, windows)
    return traces[0] if single else traces


def row_identity(ids: Sequence[int]) -> int:
    """A prompt's identity for the policies that draw at random (AttentionCall.rows): 64 bits of the digest of its
    token ids, the same whichever batch, batch position or padding the prompt is run with."""
    return int(digest([int(i) for i in ids]), 16)


def _prompt_list(prompt) -> tuple[list, bool]:
    if prompt is None or isinstance(prompt, (int, float)):
        raise bad_value("prompt", prompt, "a text, a list of token ids, or a list of texts / id lists")
    single = _is_single(prompt)
    prompts = [prompt] if single else list(prompt)
    if not prompts:
        raise bad_value("prompt", prompt, "a non-empty prompt or list of prompts")
    return prompts, single


def _check_fits_model(loaded: LoadedModel, encoded: list[list[int]], gen_length: int) -> None:
    longest = max(len(ids) for ids in encoded)
    if loaded.max_length is None or longest + gen_length <= loaded.max_length:
        return
    context = f"{loaded.name}'s context is {loaded.max_length} positions, the prompt's tokens and the answer's together"
    if longest >= loaded.max_length:  # no answer fits, however short: the prompt is what must change
        raise BadValue(f"prompt is not allowed: the longest prompt has {longest} tokens and {context}, so no answer "
                       f"fits; prompt must be at most {loaded.max_length - gen_length} tokens for gen_length="
                       f"{gen_length}: shorten the prompt")
    raise bad_value("gen_length", gen_length, f"at most {loaded.max_length - longest}: the longest prompt has {longest} "
                    f"tokens and {context}; lower gen_length or shorten the prompt to {loaded.max_length - gen_length} "
                    "tokens")


def _sample(loaded: LoadedModel, rec, encoded: list[list[int]], settings: Settings, seed: int, total: int,
            progress: bool, windows: list) -> list[torch.Tensor]:
    """The family's sampler on the left-padded prompts, each forward telling the capture which queries are real;
    `windows` gets each forward's computed canvas columns ((start, stop) of a cached diffusion step, else None)."""
    ids, prompt_mask = left_pad(encoded, loaded.pad_id)
    ids, prompt_mask = ids.to(loaded.device), prompt_mask.to(loaded.device)
    generator = torch.Generator(device=loaded.device).manual_seed(seed)
    with tqdm(total=total, desc=f"{loaded.family.name} steps", disable=not progress, leave=False) as bar:
        def forward(x, attention_mask=None, position_ids=None, keep=False, window=None, watch=False, **stage):
            if stage.get("stage") == "encode":  # a family's encoder pass (Family.run): not a step of the trace
                return loaded.logits(x, attention_mask, position_ids, **stage)
            if rec is not None:  # a window's rows are answer positions: all real
                rec.query_mask = attention_mask if window is None else None
                rec.watch = watch
            windows.append(None if window is None else (window.start, window.stop))
            bar.update(1)
            logits = loaded.logits(x, attention_mask, position_ids, keep=keep, window=window, **stage)
            return (logits, rec.last_step) if watch else logits

        def forward_cached(x, attention_mask, position_ids, cache):
            if rec is not None:
                rec.query_mask = attention_mask if cache is None else None
            bar.update(1)
            return loaded.step_with_cache(x, attention_mask, position_ids, cache)

        return loaded.family.sample(forward_cached if loaded.family.uses_cache else forward, ids, prompt_mask,
                                    settings, generator)


def _check_fits_run(loaded: LoadedModel, maps, intervention, total: int) -> None:
    """Map requests and intervention settings this run can never reach are refused before it starts (an
    autoregressive run makes at most gen_length forwards; it may stop earlier at an end token)."""
    late = sorted({item[0] for item in maps or () if isinstance(item, (tuple, list)) and len(item) == 3
                   and isinstance(item[0], int) and item[0] >= total})
    if late:
        raise bad_value("maps", [m for m in maps if m[0] in late][:5], f"(step, layer, head) triples with step < {total}, "
                        "the number of forwards this run makes")
    check_fits = getattr(intervention, "check", None)
    if callable(check_fits):
        check_fits(attention_layers(loaded.model, loaded.layer_names), total)


def _recorded(rec, batch: int, width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The capture's per-step scores and masked keys [steps, layers, batch, heads, width] (keys a short canvas
    lacked: NaN / False); classifier-free guidance doubles the batch, whose conditional half is kept."""
    if rec is None or not rec.keep_steps:
        return None, None
    scores = torch.nn.functional.pad(rec.scores[:, :, :batch], (0, width - rec.scores.shape[-1]), value=float("nan"))
    masked = rec.masked_keys
    if masked is not None:
        masked = torch.nn.functional.pad(masked[:, :, :batch], (0, width - masked.shape[-1]), value=False)
    return scores, masked


def _row_maps(rec, row: int, start: int) -> dict:
    maps = {}
    for key, full in (rec.maps.items() if rec is not None else ()):
        one = full[row]
        maps[key] = one[start:, start:] if one.shape[0] == one.shape[1] else one[:, start:]
    return maps


def _recomputed(windows: list, width: int) -> torch.Tensor | None:
    """bool [forwards, width]: the canvas columns each forward computed (a cached step's window); None when every
    forward computed them all."""
    if all(w is None for w in windows):
        return None
    computed = torch.ones(len(windows), width, dtype=torch.bool)
    for step, window in enumerate(windows):
        if window is not None:
            computed[step] = False
            computed[step, window[0]:window[1]] = True
    return computed


def _split(loaded: LoadedModel, rec, canvases, encoded, settings: Settings, meta: dict, prompts,
           margins: torch.Tensor | None, windows: list | None = None) -> list[Trace]:
    """One Trace per prompt: the row's canvases without its left padding, cut where the family says it ends."""
    family = loaded.family
    canvas = family.layout(canvases, [len(e) for e in encoded], settings, loaded.mask_id, loaded.pad_id)
    scores, masked = _recorded(rec, len(encoded), canvas.tokens.shape[-1])
    recomputed = _recomputed(windows or [], canvas.tokens.shape[-1])
    layer_names = list(rec.layer_names) if rec is not None else \
        [layer.name for layer in attention_layers(loaded.model, loaded.layer_names)]
    traces = []
    for b, prompt_ids in enumerate(encoded):
        start = int(canvas.padding[b])
        row_tokens = canvas.tokens[:, b, start:]
        keep, n_steps = family.extent(row_tokens, len(prompt_ids), len(canvases) - 1, loaded.eos_ids)
        row = (slice(None, n_steps), b, slice(start, start + keep))
        traces.append(Trace(
            scores=None if scores is None else scores[:n_steps, :, b, :, start:start + keep].contiguous(),
            tokens=row_tokens[:n_steps + 1, :keep].contiguous(),
            is_masked=canvas.is_masked[row].contiguous(),
            prompt_len=len(prompt_ids),
            layer_names=layer_names,
            text=_decode(loaded, row_tokens[n_steps, len(prompt_ids):keep]),
            masked_keys=None if masked is None else masked[:n_steps, :, b, :, start:start + keep].contiguous(),
            maps=_row_maps(rec, b, start),
            margins=None if margins is None else margins[:n_steps, b].contiguous(),
            recomputed=None if recomputed is None else recomputed[:n_steps, start:start + keep].contiguous(),
            token_strings=_token_strings(loaded, row_tokens),
            meta={**meta, "prompt": prompts[b] if isinstance(prompts[b], str) else prompt_ids},
        ))
    return traces


def _decode(loaded: LoadedModel, ids: torch.Tensor) -> str:
    if loaded.tokenizer is None:
        return " ".join(str(int(i)) for i in ids)
    keep = [int(i) for i in ids if int(i) != loaded.mask_id]
    return loaded.tokenizer.decode(keep, skip_special_tokens=True)


def _token_strings(loaded: LoadedModel, tokens: torch.Tensor) -> dict[int, str]:
    ids = sorted({int(i) for i in tokens.unique()})
    if loaded.tokenizer is None:
        return {i: str(i) for i in ids}
    return dict(zip(ids, loaded.tokenizer.convert_ids_to_tokens(ids)))


def _meta(loaded: LoadedModel, settings: Settings, seed: int, intervention, chat: bool) -> dict[str, Any]:
    return {"model": loaded.name, **loaded.family.trace_meta(),
            "settings": dataclasses.asdict(settings), "seed": seed,
            "intervention": repr(intervention) if intervention is not None else None, "chat": chat,
            "versions": {"sinklib": __version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()}}


def demo_trace(loaded: LoadedModel, prompt: str, seed: int = 0, settings: Settings | None = None) -> Trace:
    """One generation of `prompt` as the explorer shows it, in the model's own prompt style and without a progress
    bar (notebook 00 and the explorer's pages make theirs so).

    Args:
        loaded: the LoadedModel to generate with.
        prompt: the prompt's text.
        seed: the sampler's seed.
        settings: the family's settings; None: the model's own (LoadedModel.settings_for()).

    Returns:
        The Trace, with its scores.
    """
    return generate(loaded, prompt, settings, seed=seed, progress=False)
