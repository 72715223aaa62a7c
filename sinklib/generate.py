"""generate(): a family's own sampler under the capture → one Trace per prompt."""
from __future__ import annotations

import contextlib
import dataclasses
import platform
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from sinklib._checks import bad_value, check_int
from sinklib.capture import capture, check_intervention
from sinklib.layers import attention_layers
from sinklib.families.base import left_pad
from sinklib.loading import LoadedModel, load
from sinklib.trace import Trace

_FAMILY_ONLY = {"alg": "dream", "alg_temp": "dream", "top_p": "dream", "top_k": "dream", "eps": "dream",
                "block_length": "llada/mmada", "remasking": "llada/mmada", "cfg_scale": "llada/mmada"}


def encode(loaded: LoadedModel, prompt, chat: bool) -> list[int]:
    """Text through the chat template (when asked and available) or plain tokenisation; ids pass through."""
    if isinstance(prompt, np.ndarray):
        prompt = torch.from_numpy(prompt)
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise bad_value("prompt", f"a {prompt.dtype} tensor", "token ids as an integer tensor")
        ids = prompt.flatten().tolist()
    elif isinstance(prompt, str):
        if loaded.tokenizer is None:
            raise ValueError(f"prompt is text but {loaded.name!r} has no tokenizer: pass token ids, or load with tokenizer=")
        if not prompt.strip():
            raise bad_value("prompt", prompt, "a non-empty text or a non-empty list of token ids")
        if chat and getattr(loaded.tokenizer, "chat_template", None):
            ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                       tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = loaded.tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise bad_value("prompt", prompt, "a text, a list of token ids (ints), a 1-d tensor of ids, or a list of these")
    if not ids:
        raise bad_value("prompt", prompt, "a non-empty text or a non-empty list of token ids")
    vocab = _vocab_size(loaded)
    outside = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
    if outside:
        raise bad_value("prompt", outside[:5], f"token ids in 0..{vocab - 1 if vocab else 'vocab'} (the vocabulary of {loaded.name})")
    return list(ids)


def _vocab_size(loaded: LoadedModel) -> int | None:
    config = getattr(loaded.model, "config", None)
    size = getattr(config, "vocab_size", None) or getattr(config, "embedding_size", None)
    if isinstance(size, int):
        return size
    embeddings = loaded.model.get_input_embeddings() if hasattr(loaded.model, "get_input_embeddings") else None
    return getattr(embeddings, "num_embeddings", None)


def _settings(loaded: LoadedModel, options: dict[str, Any]):
    family = loaded.family
    for key, owner in _FAMILY_ONLY.items():
        if options.get(key) is not None and family.name not in owner.split("/"):
            raise ValueError(f"{key}={options[key]!r} is not allowed for the {family.name} family: it applies to {owner} only")
    names = {f.name for f in dataclasses.fields(family.settings)}
    given = {k: v for k, v in options.items() if k in names and v is not None}
    if "mask_id" in names:
        given["mask_id"] = loaded.mask_id
    if family.name == "arm":
        given.update(eos_ids=loaded.eos_ids, pad_id=loaded.pad_id)
    given.update({k: v for k, v in family.extra.items() if k in names and k not in given})
    return family.settings(**given).validate()


def _is_single(prompt) -> bool:
    if isinstance(prompt, str):
        return True
    if isinstance(prompt, (torch.Tensor, np.ndarray)):
        return prompt.ndim == 1
    return len(prompt) == 0 or not isinstance(prompt[0], (str, list, tuple, torch.Tensor, np.ndarray))


def generate(
    model,
    prompt,
    *,
    steps: int | None = None,
    gen_length: int,
    block_length: int | None = None,
    temperature: float = 0.0,
    remasking: str | None = None,
    cfg_scale: float | None = None,
    alg: str | None = None,
    alg_temp: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    eps: float | None = None,
    seed: int = 0,
    maps: Sequence[tuple[int, int | str, int]] | None = None,
    intervention=None,
    chat: bool = True,
    progress: bool = True,
    keep_scores: bool = True,
) -> Trace | list[Trace]:
    """Run the model's family sampler with attention capture; a list of prompts gives a list of Traces.

    prompt: text, token ids, or a list of either (batched with left padding). steps: forward passes
    (diffusion families; the autoregressive family makes one per token). gen_length: new tokens.
    Family-only options (block_length, remasking, cfg_scale for llada/mmada; alg, alg_temp, top_p, top_k,
    eps for dream) raise if given to another family. maps / intervention: as for sinklib.capture.
    keep_scores: False gives Traces without scores (Trace.scores is None; tokens, text and maps as usual) and
    stores nothing per step — for evaluation runs. Without an intervention or maps the model then runs with
    no capture at all; the tokens are the same either way.
    """
    loaded = model if isinstance(model, LoadedModel) else load(model)
    check_int(seed, "seed", 0)
    check_intervention(intervention)
    diffusion = loaded.family.kind == "diffusion"
    if diffusion and steps is None:
        raise bad_value("steps", steps, "an integer >= 1 (the number of denoising forwards)")
    settings = _settings(loaded, dict(steps=steps, gen_length=gen_length, block_length=block_length, temperature=temperature,
                                      remasking=remasking, cfg_scale=cfg_scale, alg=alg, alg_temp=alg_temp, top_p=top_p,
                                      top_k=top_k, eps=eps))
    if prompt is None or isinstance(prompt, (int, float)):
        raise bad_value("prompt", prompt, "a text, a list of token ids, or a list of texts / id lists")
    single = _is_single(prompt)
    prompts = [prompt] if single else list(prompt)
    if not prompts:
        raise bad_value("prompt", prompt, "a non-empty prompt or list of prompts")
    encoded = [encode(loaded, p, chat) for p in prompts]
    longest = max(len(ids) for ids in encoded)
    if loaded.max_length is not None and longest + gen_length > loaded.max_length:
        raise bad_value("gen_length", gen_length, f"at most {loaded.max_length - longest}: the prompt has {longest} tokens and "
                        f"{loaded.name} handles {loaded.max_length} positions")
    ids, prompt_mask = left_pad(encoded, loaded.pad_id)
    ids, prompt_mask = ids.to(loaded.device), prompt_mask.to(loaded.device)
    generator = torch.Generator(device=loaded.device).manual_seed(seed)
    total = settings.steps if diffusion else gen_length
    _check_fits_run(loaded, maps, intervention, total)
    watched = keep_scores or intervention is not None or bool(maps)
    recording = capture(loaded.model, maps=maps, intervention=intervention, layer_names=loaded.layer_names,
                        keep_steps=keep_scores) if watched else contextlib.nullcontext(None)
    with torch.no_grad(), recording as rec, tqdm(total=total, desc=f"{loaded.family.name} steps", disable=not progress, leave=False) as bar:
        def forward(x, attention_mask=None, position_ids=None):
            if rec is not None:
                rec.query_mask = attention_mask
            bar.update(1)
            return loaded.logits(x, attention_mask, position_ids)

        def forward_cached(x, attention_mask, position_ids, cache):
            if rec is not None:
                rec.query_mask = attention_mask if cache is None else None
            bar.update(1)
            return loaded.step_with_cache(x, attention_mask, position_ids, cache)

        canvases = loaded.family.sample(forward if diffusion else forward_cached, ids, prompt_mask, settings, generator)
    traces = _split(loaded, rec, canvases, encoded, settings, seed, intervention, chat, prompts, diffusion)
    return traces[0] if single else traces


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


def _split(loaded, rec, canvases, encoded, settings, seed, intervention, chat, prompts, diffusion) -> list[Trace]:
    batch = len(encoded)
    width = canvases[-1].shape[1]
    fill = loaded.mask_id if diffusion else loaded.pad_id
    tokens = torch.stack([torch.nn.functional.pad(c, (0, width - c.shape[1]), value=fill) for c in canvases]).cpu()
    lengths = torch.tensor([c.shape[1] for c in canvases])
    forwards = len(canvases) - 1
    layer_names = list(rec.layer_names) if rec is not None else \
        [layer.name for layer in attention_layers(loaded.model, loaded.layer_names)]
    if diffusion:
        is_masked = tokens[:-1] == loaded.mask_id
    else:
        is_masked = (torch.arange(width)[None, :] >= lengths[:-1, None])[:, None, :].expand(-1, batch, -1)
    scores = masked = None
    if rec is not None and rec.keep_steps:
        scores = rec.scores[:, :, :batch]  # classifier-free guidance doubles the batch: keep the conditional half
        scores = torch.nn.functional.pad(scores, (0, width - scores.shape[-1]), value=float("nan"))
        masked = rec.masked_keys
    if masked is not None:
        masked = torch.nn.functional.pad(masked[:, :, :batch], (0, width - masked.shape[-1]), value=False)
    padding = tokens.shape[-1] - settings.gen_length - torch.tensor([len(e) for e in encoded]) if diffusion else \
        canvases[0].shape[1] - torch.tensor([len(e) for e in encoded])
    meta = _meta(loaded, settings, seed, intervention, chat)
    traces = []
    for b in range(batch):
        start = int(padding[b])
        seq_tokens = tokens[:, b, start:]
        if not diffusion:
            seq_tokens, keep = _trim_finished(seq_tokens, lengths, loaded, start)
        else:
            keep = seq_tokens.shape[1]
        trace_maps = {}
        for (step, layer, head), full in (rec.maps.items() if rec is not None else ()):
            one = full[b]
            one = one[start:, start:] if one.shape[0] == one.shape[1] else one[:, start:]
            trace_maps[(step, layer, head)] = one
        n_steps = forwards if diffusion else min(forwards, keep - len(encoded[b]))
        traces.append(Trace(
            scores=None if scores is None else scores[:n_steps, :, b, :, start:start + keep].contiguous(),
            tokens=seq_tokens[:n_steps + 1, :keep].contiguous(),
            is_masked=is_masked[:n_steps, b, start:start + keep].contiguous(),
            prompt_len=len(encoded[b]),
            layer_names=layer_names,
            text=_decode(loaded, seq_tokens[n_steps, len(encoded[b]):keep]),
            masked_keys=None if masked is None else masked[:n_steps, :, b, :, start:start + keep].contiguous(),
            maps=trace_maps,
            token_strings=_token_strings(loaded, seq_tokens),
            meta={**meta, "prompt": prompts[b] if isinstance(prompts[b], str) else encoded[b]},
        ))
    return traces


def _trim_finished(seq_tokens, lengths, loaded, start):
    """An autoregressive row ends at its first end token; what the batch decoded after it is padding."""
    final = seq_tokens[-1]
    prompt_end = int(lengths[0]) - start
    keep = final.shape[0]
    for position in range(prompt_end, final.shape[0]):
        if int(final[position]) in loaded.eos_ids:
            keep = position + 1
            break
    return seq_tokens, keep


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


def _meta(loaded: LoadedModel, settings, seed: int, intervention, chat: bool) -> dict[str, Any]:
    import transformers

    import sinklib

    return {"model": loaded.name, "family": loaded.family.name, "settings": dataclasses.asdict(settings), "seed": seed,
            "intervention": repr(intervention) if intervention is not None else None, "chat": chat,
            "versions": {"sinklib": sinklib.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()}}
