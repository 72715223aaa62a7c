"""load(): a hub id, a local folder, a zoo name or a model object → a LoadedModel that knows its family.

Nothing here turns on trust_remote_code by itself: the remote-code families (LLaDA, Dream, MMaDA) load
only when the caller passes trust_remote_code=True.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from torch import nn
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from transformers.utils import cached_file

from sinklib import compat, mmada_repo, named
from sinklib.validation import AnyDevice, BadValue, Consent, Index, ModelSource, bad_value, check_choice, checked
from sinklib.families.base import LAYOUT, Family, check_options, family_names, get_family, layout_changes
from sinklib.families.cached import Window, forward_cached
from sinklib.cache_manifest import weights_fingerprint
from sinklib.model_names import (_declaring_family, _offline_hint, infer_family, infer_family_from_dict, prompt_style,
                                 resolve_name)
from sinklib.settings import Settings
from sinklib.model_names import is_default_model, model_source  # noqa: F401  (evaluation.table1 imports them from here)

CALLING = ("native", "remote")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "auto": "auto"}


@dataclass
class LoadedModel:
    """A model with what sampling and tracing need, each settled once when it loads: its family, special ids,
    tokenizer, how it is called and prompted, and which weights it holds. Made by `sinklib.load`.

    Attributes:
        model: the torch module (a transformers model, or the family's own modelling code).
        family: its sampler family (sinklib.families.base.Family): the sampler, the settings type, the defaults.
        tokenizer: its tokenizer (None for a model object loaded without one).
        mask_id: the mask token's id (a diffusion model's); None for an autoregressive model.
        eos_ids: the ids that end an answer.
        pad_id: the id left padding uses.
        name: the name it was loaded by (a zoo name, a named model, a folder or a hub id; a model object's class).
        calling: "native" (transformers' own classes) or "remote" (the family's own modelling code).
        max_length: the positions the model handles, in tokens (None: its config declares none).
        layer_names: the attention modules' paths, one per layer (None: found by sinklib.layers).
        weights: the weights' fingerprint every run and trace is keyed by: a local checkpoint's weight files
            (cache_manifest.weights_fingerprint), an adapted model's adapter, a hub checkpoint's commit.
        bidirectional: a native model made to attend both ways (a diffusion model on a causal class).
        compat_fixes: the transformers-version fixes applied to it (sinklib.compat).
    """

    model: nn.Module
    family: Family
    tokenizer: Any = None
    mask_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    name: str = ""
    calling: str = "native"  # "native" (transformers' own classes) or "remote" (the family's own modelling code)
    max_length: int | None = None  # the positions the model handles (None: not declared)
    layer_names: list[str] | None = None
    # the weights' fingerprint, what every run and trace is keyed by: a local checkpoint's weight files
    # (cache_manifest.weights_fingerprint), an adapted model's adapter, a hub checkpoint's commit
    weights: str = ""
    bidirectional: bool = False  # a native model made to attend both ways (a diffusion model on a causal class)
    compat_fixes: tuple[str, ...] = ()  # the transformers-version fixes applied to it (sinklib.compat)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.model.parameters()).device

    @property
    def prompt_style(self) -> str:
        """How this model is prompted (model_names.prompt_style): "zoo" for a model of the tiny zoo (plain "Q: … A:"
        text in its fixed answer slot), "chat" for every other (its chat template)."""
        return prompt_style(getattr(self.model, "config", None))

    @property
    def chat(self) -> bool:
        """Whether prompts go through the chat template (every model but the zoo's, prompt_style "chat"). generate's
        chat=None means this."""
        return self.prompt_style == "chat"

    def settings_for(self, task: Any = None, **overrides: Any) -> Settings:
        """The settings this model samples with, built once as its family's settings dataclass (checked when made,
        special ids filled in): a named model's own laptop settings, else the family's (the zoo's answer slot for a
        zoo model, the paper's generation for any other), resized to the generation length `task` (a Task, e.g.
        sinklib.evaluation.get_task("gsm8k")) declares, if any (not for a zoo model: its slot is fixed).

        overrides: any field of the family's settings by name (None: not given). steps / gen_length / block_length
        keep a valid layout (families.base.fit). Another family's option (block_length on an autoregressive model)
        is refused naming its owner, an unknown one with "did you mean"."""
        if task is not None and not (hasattr(task, "gen_length") and hasattr(task, "samples")):
            raise bad_value("task", task, "a Task (sinklib.evaluation.get_task(name)) or None")
        check_options(self.family, overrides)  # block_length on an autoregressive model too: refused, not dropped
        layout = {name: overrides.pop(name, None) for name in LAYOUT}
        overrides = {name: value for name, value in overrides.items() if value is not None}  # None: not given
        zoo = self.prompt_style == "zoo"  # the zoo's format comes with its fixed answer slot
        settings = self.family.defaults(zoo=zoo)
        own = dict(named.sampling(self.name) or {})
        if layout["gen_length"] is None and task is not None and not zoo:
            layout["gen_length"] = task.gen_length
        base = dataclasses.replace(settings, **own) if own else settings
        changes = {**own, **overrides, **layout_changes(base, **layout), **self._special_ids_of(settings)}
        return self.runnable(dataclasses.replace(settings, **changes))

    def runnable(self, settings: Settings) -> Settings:
        """`settings` as this model runs them: its family's settings dataclass with the model's special ids, refused
        if this model cannot run them (a KV cache on a model that runs its own remote code, which keeps none sinklib
        can reuse: upstream LLaDA's has none; the threshold works everywhere)."""
        if not isinstance(settings, self.family.settings):
            raise TypeError(f"settings={settings!r} is not allowed: the {self.family.name} family of {self.name} takes "
                            f"{self.family.settings.__name__} (LoadedModel.settings_for builds them)")
        ids = self._special_ids_of(settings)
        if any(getattr(settings, name) != value for name, value in ids.items()):
            settings = dataclasses.replace(settings, **ids)
        if getattr(settings, "cache", None) is not None and self.calling == "remote":
            raise bad_value("cache", settings.cache, f"None for {self.name}: it runs its own modelling code, which keeps "
                                                     "no cache sinklib can reuse (threshold works without one)")
        return settings

    def _special_ids_of(self, settings: Settings) -> dict[str, Any]:
        """The model's special ids (mask_id, eos_ids, pad_id) that `settings` has fields for."""
        names = {f.name for f in dataclasses.fields(settings)}
        return {name: value for name, value in self.special_ids().items() if name in names}

    def special_ids(self) -> dict[str, Any]:
        """The settings fields that come from the model, not the caller: mask_id, eos_ids, pad_id, and vocab_size
        (what a uniform-noise sampler draws its noise from)."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return {"mask_id": self.mask_id, "eos_ids": self.eos_ids, "pad_id": self.pad_id,
                "vocab_size": getattr(text, "vocab_size", None)}

    def logits(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, keep: bool = False, window: Window | None = None, **stage):
        """One forward over full sequences, called the way this model's own code expects. For the cached diffusion
        samplers (families.cached.forward_cached; native models only): keep=True also returns the keys and values
        to reuse, and a `window` computes only its rows beside the kept keys; `stage` keywords go to Family.run."""
        if keep or window is not None:
            if self.calling == "remote":
                raise TypeError(f"{self.name} runs its own modelling code: the cached samplers need a native model")
            return forward_cached(self.model, ids, attention_mask, position_ids, window, compat.cache_keyword(self.model))
        if stage:  # a family whose sampler calls its model by stages (Family.run)
            return self.family.run(self.model, ids, attention_mask, position_ids, **stage)
        if self.calling == "remote":
            return self.family.call(self.model, ids, attention_mask, position_ids)
        if attention_mask is not None and self.bidirectional:
            attention_mask = compat.bidirectional_key_mask(attention_mask)
        return self.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids).logits

    def step_with_cache(self, ids, attention_mask, position_ids, cache):
        """One autoregressive forward with a KV cache → (logits, cache)."""
        keyword = compat.cache_keyword(self.model)
        out = self.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                         **{keyword: cache})
        return out.logits, getattr(out, keyword)


def _calling_for(model: nn.Module, family: Family) -> str:
    """"native" for transformers' own classes (and every autoregressive model), else "remote": the family's code."""
    return "native" if compat.is_native(model) or family.remote_call is None else "remote"


def load_models(names: list[str], device: str | None = None, dtype: str | None = None,
                trust_remote_code: bool = False) -> dict[str, LoadedModel]:
    """{name: load(name, ...)} for each name, in order."""
    # a name given twice is loaded once (a dict keeps one entry per name anyway)
    return {name: load(name, device=device, dtype=dtype, trust_remote_code=trust_remote_code) for name in dict.fromkeys(names)}


def _check_family(given: str | None, declared: str | None, name: str) -> None:
    """family= may name a family the config does not declare only when the config declares none: LLaDA weights
    run as an autoregressive model would silently generate garbage."""
    if given is not None and declared is not None and given != declared:
        raise bad_value("family", given, f"{declared!r} or None for {name!r}, whose config declares the {declared} family")


def _load_config(path: str, trust_remote_code: bool):
    try:
        return transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ValueError as error:
        if "trust_remote_code" in str(error):
            raise BadValue(f"{path!r} ships its own modelling code: pass trust_remote_code=True to sinklib.load if you "
                           "trust it (sinklib never turns it on by itself)") from None
        if any(words in str(error) for words in ("Unrecognized model", "model_type", "model type")):
            raise BadValue(f"name_or_model={path!r} is not allowed: transformers does not know its config.json's "
                           "model_type and the folder ships no modelling code (auto_map); sinklib loads native "
                           f"transformers models and the families {family_names()}") from None
        raise
    except OSError as error:
        raise OSError(_offline_hint(path)) from error


@checked
def load(
    name_or_model: ModelSource,
    family: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: AnyDevice | None = None,
    trust_remote_code: Consent = False,
    *,
    tokenizer: Any = None,
    mask_id: Index | None = None,
    eos_ids: tuple[Index, ...] | None = None,
) -> LoadedModel:
    """Load a model by zoo name, named real model, local folder or hub id, or wrap a model object.

    Refuses a bad name (with "did you mean"), family, dtype or special id before any weights are read, and a shipped
    model whose files differ from its manifest.

    Args:
        name_or_model: a zoo name ("tiny-llada"), a named real model ("smollm2-135m-diffusion"), a local folder
            with a config.json, a hub id "org/name" (from the local cache when offline), or an nn.Module.
        family: "llada", "mmada", "dream" or "arm" (any registered family); None: inferred from the config.
        dtype: "bfloat16", "float16", "float32", "auto" (the checkpoint's own) or a torch dtype; None loads float32
            on every transformers version.
        device: where the model runs ("cpu", "cuda", a torch.device); None: where it loads (the CPU).
        trust_remote_code: run a checkpoint's own modelling code (LLaDA, Dream, MMaDA need it); a real bool,
            never turned on silently.
        tokenizer: for a model object without one.
        mask_id: the mask token's id, for a model object whose config does not declare it.
        eos_ids: the ids that end an answer, for a model object whose config does not declare them.

    Returns:
        The LoadedModel, its family, special ids, prompt style and weights' fingerprint settled.

    Raises:
        BadValue: a name, family, dtype or id that is not allowed (the message names the parameter and the value).
        OSError: a hub id that is neither cached nor reachable (offline).
    """
    if family is not None:
        check_choice(family, "family", family_names())
    if isinstance(dtype, str):
        dtype = _DTYPES[check_choice(dtype, "dtype", list(_DTYPES))]
    fixes: list[str] = []
    if isinstance(name_or_model, nn.Module):
        model, name = name_or_model, type(name_or_model).__name__
        config = getattr(model, "config", None)
    else:
        name = str(name_or_model)
        if not name:
            raise bad_value("name_or_model", name, "a hub id, a local folder, a zoo name or an nn.Module")
        model, config, tokenizer = _open_checkpoint(name, family, dtype, trust_remote_code, tokenizer, fixes)
    spec = _resolve_family(family, config, name)
    model = _placed(model, device, dtype if isinstance(name_or_model, nn.Module) else None)
    bidirectional = _bidirectional(model, config, fixes)
    resolved_mask, eos, pad = _special_ids(spec, config, tokenizer, mask_id, eos_ids, name)
    max_length = getattr(config, "max_position_embeddings", None) or getattr(config, "max_sequence_length", None)
    return LoadedModel(model=model, family=spec, tokenizer=tokenizer, mask_id=resolved_mask, eos_ids=eos, pad_id=pad,
                       name=name, calling=_calling_for(model, spec), max_length=max_length,
                       layer_names=spec.layer_names(model),
                       weights=_weights_of(name, config),
                       bidirectional=bidirectional, compat_fixes=tuple(fixes))


def _weights_of(name: str, config) -> str:
    """The fingerprint of the weights `name` loaded: an adapted model's adapter folder, else the folder its config
    was read from (config.name_or_path: a zoo or local checkpoint, a named model's conversion), else a hub
    checkpoint's commit (or, failing that, its name)."""
    if name in named.ADAPTED_MODELS:
        return weights_fingerprint(named.adapter_folder(name))
    source = str(getattr(config, "name_or_path", "") or "")
    if source and Path(source).is_dir():
        return weights_fingerprint(Path(source))
    return str(getattr(config, "_commit_hash", None) or source)


def _resolve_family(family: str | None, config, name: str):
    """The Family the caller named (checked against the config's) or the one the config declares (an adapted named
    model's: the one its adaptation trained)."""
    adapted = named.ADAPTED_MODELS.get(name)
    if adapted is not None:
        _check_family(family, adapted.family, name)
        return get_family(adapted.family)
    _check_family(family, infer_family(config) if config is not None else None, name)
    family = family or infer_family(config)
    if family is None:
        raise BadValue(f"cannot tell the family of {name!r} from its config: pass family= one of {family_names()}")
    return get_family(family)


def _placed(model: nn.Module, device, dtype) -> nn.Module:
    """The model on `device`, cast to `dtype` (a model object the caller gave; checkpoints load in theirs), in eval mode."""
    if device is not None:
        model = model.to(device)
    if dtype is not None and dtype != "auto":
        model = model.to(dtype)
    return model.eval()


def _bidirectional(model: nn.Module, config, fixes: list[str]) -> bool:
    """Whether a native transformers model is configured bidirectional, making its attention so where this
    transformers version would not (recorded in `fixes`)."""
    bidirectional = compat.is_native(model) and compat.is_bidirectional(config)
    if bidirectional and compat.make_bidirectional(model) and compat.transformers_major() < 5:
        fixes.append("bidirectional_attention")
    return bidirectional


def _open_checkpoint(name: str, family: str | None, dtype, trust_remote_code: bool, tokenizer, fixes: list[str]):
    """A zoo name, folder or hub id → (model, config, tokenizer: the given one or the checkpoint's), refusing code the
    caller did not trust and
    applying the compatibility fixes (recorded in `fixes`) that remote code needs on this transformers."""
    path = resolve_name(name)
    raw = _raw_config(path)
    _check_family(family, infer_family_from_dict(raw), name)
    declared = family or infer_family_from_dict(raw)
    mmada_without_code = declared == "mmada" and "auto_map" not in raw
    # checked here, not left to transformers: once a process has imported a model type's code (an earlier
    # trusted load), transformers would run it for any folder of that type without asking again
    if not trust_remote_code and ("auto_map" in raw or mmada_without_code):
        code = "the MMaDA repository's modelling code" if mmada_without_code else "its own modelling code"
        raise BadValue(f"{name!r} ships or needs {code}: pass trust_remote_code=True to sinklib.load if you trust it "
                       "(sinklib never turns it on by itself)")
    _check_checkpoint_files(path, raw, name)
    if mmada_without_code:
        mmada_repo.import_classes()  # registers the "mmada" config type before AutoConfig reads config.json
    if trust_remote_code and compat.needs_fixes():
        compat.apply_default_rope()
    config = _load_config(path, trust_remote_code)
    if name not in named.ADAPTED_MODELS:  # the base's config: its adaptation decides the family
        _check_family(family, infer_family(config), name)
    if compat.needs_fixes() and not type(config).__module__.startswith("transformers.") and compat.restore_use_cache(config, raw):
        fixes.append("config_use_cache")
    model = _load_model(path, config, family or infer_family(config), dtype, trust_remote_code, fixes)
    if tokenizer is None:
        tokenizer = _load_tokenizer(path, trust_remote_code)
    if name in named.ADAPTED_MODELS:
        model = named.apply_adapter(named.ADAPTED_MODELS[name], model, tokenizer)
        config = model.config
    remote = not compat.is_native(model)
    if remote and compat.needs_fixes() and compat.uses_default_rope(model):
        fixes.append("default_rope")
    if remote and compat.needs_fixes() and compat.recompute_rotary_inv_freq(model):
        fixes.append("rotary_inv_freq")
    return model, config, tokenizer


def _special_ids(spec: Family, config, tokenizer, mask_id: int | None, eos_ids, name: str):
    """(mask id, end ids, pad id): given ones first, then the config's and the tokenizer's, then the family's."""
    if mask_id is None and isinstance(getattr(config, "mask_token_id", None), int):
        mask_id = config.mask_token_id
    resolved_mask = _mask_id(spec, tokenizer, mask_id, name)
    vocab_size = getattr(config, "vocab_size", None)
    if resolved_mask is not None and isinstance(vocab_size, int) and not 0 <= resolved_mask < vocab_size:
        raise bad_value("mask_id", resolved_mask, f"a token id < {vocab_size} (the vocabulary of {name})")
    eos = tuple(eos_ids) if eos_ids is not None else _eos_ids(tokenizer, config)
    pad = getattr(tokenizer, "pad_token_id", None)
    return resolved_mask, eos, pad if pad is not None else (eos[0] if eos else 0)


def _load_model(path: str, config, family: str | None, dtype, trust_remote_code: bool, fixes: list[str]) -> nn.Module:
    # None means float32 on every transformers version: 5.x would otherwise load a checkpoint in the dtype its
    # config declares (Dream: bfloat16) where 4.x loads float32, and the same call would give other numbers.
    kwargs: dict[str, Any] = {"dtype" if compat.transformers_major() >= 5 else "torch_dtype": dtype or torch.float32}
    if compat.is_native(config):
        kwargs["attn_implementation"] = "sdpa"
        native_class = get_family(family).native_class if family in family_names() else "AutoModelForCausalLM"
        try:
            return getattr(transformers, native_class).from_pretrained(path, **kwargs)
        except OSError as error:
            raise OSError(_offline_hint(path)) from error
    model_class = _remote_class(path, config, family)
    if compat.needs_fixes():
        fixes.extend(f for f in compat.prepare_remote_class(model_class) if f not in fixes)
    try:
        return model_class.from_pretrained(path, config=config, **kwargs)
    except OSError as error:
        raise OSError(_offline_hint(path)) from error


def _remote_class(path: str, config, family: str | None) -> type:
    """The remote code's model class, resolved as AutoModel would (so that compat can prepare it first)."""
    auto_map = getattr(config, "auto_map", None) or {}
    reference = auto_map.get("AutoModel") or auto_map.get("AutoModelForCausalLM") or auto_map.get("AutoModelForMaskedLM")
    if reference is None:
        if family == "mmada":
            return mmada_repo.import_classes().model
        raise BadValue(f"{path!r} declares model_type={getattr(config, 'model_type', None)!r}, which is not a transformers "
                       "model, and its config.json has no auto_map naming the modelling code to run")
    if isinstance(reference, (list, tuple)):
        reference = reference[0]
    return get_class_from_dynamic_module(reference, path)


def _raw_config(path: str) -> dict[str, Any]:
    """config.json as written (transformers 5 drops some of its keys when it builds the config object)."""
    local = Path(path) / "config.json"
    if not local.is_file():
        try:
            found = cached_file(path, "config.json", _raise_exceptions_for_missing_entries=False)
        except OSError as error:  # not here and the hub not reachable: said now, not by a later step
            raise OSError(_offline_hint(path)) from error
        if found is None:
            return {}
        local = Path(found)
    try:
        raw = json.loads(local.read_text())
    except ValueError as error:
        raise BadValue(f"name_or_model={path!r} is not allowed: its config.json ({str(local)!r}) is not valid JSON "
                       f"({error}); the checkpoint is damaged") from None
    if not isinstance(raw, dict):
        raise BadValue(f"name_or_model={path!r} is not allowed: its config.json holds a JSON {type(raw).__name__}, "
                       "not an object (name: value); the checkpoint is damaged")
    return raw


def _check_checkpoint_files(path: str, raw: dict[str, Any], name: str) -> None:
    """Before any code is imported or weight read, a local folder's config must agree with itself and name files
    that are there: the family its model_type declares is the one its auto_map's classes declare; each auto_map
    module is in the folder (else transformers would look for it on the hub); every safetensors file is whole."""
    folder = Path(path)
    auto_map = raw.get("auto_map") or {}
    if not isinstance(auto_map, dict):
        raise BadValue(f"name_or_model={name!r} is not allowed: its config.json auto_map must be an object")
    by_type = infer_family_from_dict(raw)
    by_code = _declaring_family(" ".join(str(v) for v in auto_map.values()).lower())
    if by_type and by_code and by_type != by_code:
        raise BadValue(f"name_or_model={name!r} is not allowed: its config.json declares the {by_type} family "
                       f"(model_type / architectures) but its auto_map loads {by_code} code ({auto_map}); the "
                       "checkpoint is inconsistent")
    if not folder.is_dir():
        return
    for target in auto_map.values():
        module = str(target[0] if isinstance(target, (list, tuple)) else target).rsplit(".", 1)[0]
        if "--" not in module and not (folder / f"{module}.py").is_file():
            raise BadValue(f"name_or_model={name!r} is not allowed: its config.json auto_map names {module}.py, which "
                           "is not in the folder; copy the checkpoint's modelling files beside config.json")
    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as error:  # safetensors' own error type is not importable across its versions
            raise BadValue(f"name_or_model={name!r} is not allowed: {weights.name} is damaged or cut off "
                           f"({' '.join(str(error).split())}); download it again") from None


def _load_tokenizer(path: str, trust_remote_code: bool):
    folder = Path(path)
    if folder.is_dir() and not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None  # a checkpoint without a tokenizer: prompts must then be token ids
    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, ImportError) as error:  # its tokenizer files are there but do not load: say so now
        raise BadValue(f"name_or_model={path!r} is not allowed: its tokenizer does not load ({type(error).__name__}: "
                       f"{error}); pass tokenizer= to sinklib.load, or repair the checkpoint's tokenizer files") from error


def _mask_id(spec: Family, tokenizer, mask_id: int | None, name: str) -> int | None:
    if not spec.is_diffusion or not spec.has_mask_token:
        return mask_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
    if mask_id is None:
        mask_id = spec.default_mask_id
    if tokenizer is not None:
        vocab_size = len(tokenizer)
        if mask_id is None or not 0 <= mask_id < vocab_size:
            raise BadValue(f"the tokenizer of {name!r} has no mask token (mask_id={mask_id}, vocabulary of {vocab_size}): "
                           "a diffusion family needs one; pass mask_id= explicitly")
    if mask_id is None:
        raise BadValue(f"{name!r} has no tokenizer and no mask id: pass mask_id= for the {spec.name} family")
    return mask_id


def _eos_ids(tokenizer, config) -> tuple[int, ...]:
    ids = []
    for source in (tokenizer, getattr(config, "generation_config", None), config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)
    return tuple(ids)
