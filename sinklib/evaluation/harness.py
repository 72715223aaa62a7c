"""lm-evaluation-harness backend for diffusion (and autoregressive) models, sampled by sinklib.

lm-eval 0.4 has no diffusion backend and no plugin entry point for models, so its own `lm_eval` command
cannot see this one. Run lm-eval's CLI through this module instead (same arguments):

    python -m sinklib.evaluation.harness --model sinklib \\
        --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,trust_remote_code=true,gen_length=256,steps=256,\\
block_length=32,mask_top_k=1 \\
        --tasks gsm8k --apply_chat_template
    accelerate launch -m sinklib.evaluation.harness ...   # data-parallel: lm-eval shards the requests

From Python, importing this module registers the name: `lm_eval.simple_evaluate(model="sinklib", ...)`.
Only `generate_until` tasks are supported: a masked diffusion model has no left-to-right likelihood.
"""
from __future__ import annotations

import atexit
import inspect
import logging
import os
import types
import typing
from collections import defaultdict
from typing import Any, Literal

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from sinklib.validation import (Consent, Count, Index, NonNegative, Share, Temperature, Text, Threshold, bad_value, check_choice,
                                check_value, checked, did_you_mean)
from sinklib.evaluation.extract import cut_at_stops
from sinklib.evaluation.table1 import paper_masking
from sinklib.families.base import Family, fit
from sinklib.generate import generate, resolve_settings
from sinklib.interventions import POLICIES, AblateValues, MaskRandomKeys, make_policy
from sinklib.loading import load

logger = logging.getLogger(__name__)


POLICY_PREFIX = "policy."  # model_args keys that set the named policy's settings


def _named_policy(name: str, settings: dict[str, Any]):
    """The registered policy `name` with its settings (model_args policy.<setting>=value), each setting checked
    against what that policy takes before it is built: an unknown or missing one is refused naming
    policy.<setting>, never a raw TypeError. A policy that wraps another (ablate_values) is refused with the
    model_args that build it."""
    check_choice(name, "policy", POLICIES.names())
    if name == "ablate_values":
        raise bad_value("policy", name, "a policy that chooses keys; ablate_values wraps one: give mask_values=zero "
                        "or mask_values=mean beside mask_top_k, mask_random_k or policy")
    parameters = inspect.signature(POLICIES.get(name)).parameters
    takes = [key for key, parameter in parameters.items() if parameter.kind is not parameter.VAR_KEYWORD]
    for key in settings:
        if key not in takes:
            raise ValueError(f"model_args {POLICY_PREFIX}{key}= is not allowed: policy {name!r} takes "
                             f"{[POLICY_PREFIX + t for t in takes]}"
                             f"{did_you_mean(POLICY_PREFIX + key, [POLICY_PREFIX + t for t in takes])}")
    hints = typing.get_type_hints(POLICIES.get(name))
    # one value where the policy takes several ("policy.layers=3") is a list of one, as "policy.layers=3 5" is of two
    settings = {key: [value] if _takes_several(hints.get(key)) and not isinstance(value, (list, tuple)) else value
                for key, value in settings.items()}
    missing = [key for key, parameter in parameters.items()
               if parameter.default is parameter.empty and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
               and key not in settings]
    if missing:
        raise ValueError(f"model_args {POLICY_PREFIX}{missing[0]}= is required by policy {name!r} "
                         f"(e.g. policy={name},{POLICY_PREFIX}{missing[0]}=1)")
    return make_policy(name, **settings)


def _takes_several(hint: Any) -> bool:
    """A type hint for a tuple or list of values (possibly None): tuple[int, ...], list[int] | None."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return any(typing.get_origin(option) in (tuple, list) or option in (tuple, list) for option in options)


def _policy_arg(text: str) -> Any:
    """A policy setting: as _model_arg, and values separated by spaces a list of such values ("0 3" → [0, 3])."""
    items = text.split()
    return [_model_arg(item) for item in items] if len(items) > 1 else _model_arg(text)


def _model_arg(text: str) -> Any:
    """One model_args value as lm-eval 0.4.9 reads it: 'true' / 'false' / 'none', an optionally signed run of
    digits as an int, anything float() takes as a float, a quoted text or anything else as a str."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    words = {"true": True, "false": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    if text.lstrip("+-").isdigit() and len(text.lstrip("+-")) == len(text) - (text[:1] in "+-"):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _intervention(family: Family, chosen, mask_top_k: int, mask_eps: float, mask_source: str, mask_random_k: int,
                  mask_values: str | None, seed: int):
    """The run's intervention from model_args: the paper's masking, the random-key control or the named policy
    (`chosen`), its values ablated instead where mask_values says so; None for none."""
    keys = (paper_masking(family, mask_top_k, mask_eps, mask_source) if mask_top_k
            else MaskRandomKeys(k=mask_random_k, seed=seed) if mask_random_k else chosen)
    if mask_values is None:
        return keys
    if keys is None:
        raise bad_value("mask_values", mask_values, "None unless mask_top_k, mask_random_k or policy chooses keys")
    return AblateValues(keys, mask_values)


@register_model("sinklib")
class SinklibLM(LM):
    """model_args: pretrained (hub id, local path or zoo name), family, steps, gen_length, block_length,
    temperature, alg (dream), remasking (llada), threshold and cache (Fast-dLLM's parallel decoding and prefix / dual
    KV cache) and refresh (the cache refreshed when the greatest sinks drift: families.cached), mask_top_k / mask_eps /
    mask_source (the paper's masking: Eq. 3 on the previous step), mask_random_k (the random-key control), policy
    (any registered masking policy by name, sinklib.interventions.POLICIES, its settings given as
    policy.<setting>=value; a list as values separated by spaces: policy=mask_keys,policy.positions=0 3), mask_values
    ("zero" or "mean": the chosen keys keep their attention and their values are ablated instead), seed, dtype,
    device, batch_size, trust_remote_code."""

    @checked
    def __init__(self, pretrained: Text, family: str | None = None, steps: Count | None = None,
                 gen_length: Count | None = None, block_length: Count | None = None, temperature: Temperature = 0.0,
                 alg: str | None = None, remasking: str | None = None, threshold: Threshold | None = None,
                 cache: Literal["prefix", "dual"] | None = None, refresh: Share | None = None, mask_top_k: Index = 0,
                 mask_eps: NonNegative = 3.0, mask_source: str = "previous_step", mask_random_k: Index = 0,
                 policy: str | None = None, policy_settings: dict[str, Any] | None = None,
                 mask_values: Literal["zero", "mean"] | None = None, seed: Index = 0, dtype: str | None = None,
                 device: str | None = None,
                 batch_size: int | str | None = 1, max_batch_size: Count | None = None,
                 trust_remote_code: Consent = False) -> None:
        super().__init__()
        if mask_top_k and mask_random_k:
            raise bad_value("mask_random_k", mask_random_k, "0 when mask_top_k is set (one intervention at a time)")
        if policy is not None and (mask_top_k or mask_random_k):
            raise bad_value("policy", policy, "None when mask_top_k or mask_random_k is set (one intervention at a time)")
        if policy_settings and policy is None:
            raise bad_value("policy_settings", policy_settings, "empty unless policy names the policy they set")
        chosen = _named_policy(policy, policy_settings or {}) if policy is not None else None  # before any model loads
        check_choice(mask_source, "mask_source", ["previous_step", "previous_step_clean", "same_step"])
        self.batch_size = _batch_size(batch_size)
        self._rank, self._world_size = _init_distributed()
        if (device is None or str(device).startswith("cuda")) and torch.cuda.is_available() and self._world_size > 1:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"  # one GPU per data-parallel process
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            logger.warning("device=%r (lm-eval's command-line default) but CUDA is unavailable: using the CPU", device)
            device = "cpu"
        self.loaded = load(pretrained, family=family, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        self._device = torch.device(self.loaded.device)
        self._layout = (steps, gen_length, block_length)  # as given; a task's max_gen_toks fills gen_length when unset
        # the model's own settings with these options; the layout is fitted to the generation length in one go
        self._own = resolve_settings(self.loaded, self.loaded.settings_for(), temperature=float(temperature), alg=alg,
                                     remasking=remasking)
        if block_length is not None and not hasattr(self._own, "block_length"):  # fit would drop it without a word
            raise bad_value("block_length", block_length, f"None for {self.loaded.name} (the {self.loaded.family.name} "
                            "family's sampler has no blocks)")
        # laid over every fitted layout (they need its blocks)
        self._fast = {"threshold": threshold, "cache": cache, "refresh": refresh}
        self.settings = self._fitted(gen_length)
        self.intervention = _intervention(self.loaded.family, chosen, mask_top_k, mask_eps, mask_source,
                                          mask_random_k, mask_values, seed)
        self.seed = seed
        self._overridden: set[int] = set()

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "SinklibLM":
        """lm-eval's model_args ("key=value,..."), checked: an unknown key is refused with "did you mean", a key
        given twice is refused, `pretrained` is required, and where model_args and lm-eval's own options (its
        --batch_size, --device) both set a key, model_args wins rather than clash. Values are read as lm-eval 0.4.9
        reads them on every lm-eval version ("-1" an integer, not -1.0 as older releases made it)."""
        pairs = [item.split("=", 1) for item in (arg_string or "").split(",") if item.strip()]
        keys = [pair[0].strip() for pair in pairs]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"model_args {repeated[0]}= is not allowed: it is given twice")
        malformed = [item for item in pairs if len(item) != 2]
        if malformed:
            raise ValueError(f"model_args {malformed[0][0].strip()!r} is not allowed: each argument is key=value")
        return cls.create_from_arg_obj({key.strip(): _policy_arg(value) if key.strip().startswith(POLICY_PREFIX)
                                        else _model_arg(value) for key, value in pairs}, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "SinklibLM":
        """As create_from_arg_string, for model_args given as a mapping (lm-eval's Python API and newer CLI)."""
        allowed = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "policy_settings")]
        arg_dict = dict(arg_dict)
        settings = {key[len(POLICY_PREFIX):]: arg_dict.pop(key) for key in list(arg_dict) if key.startswith(POLICY_PREFIX)}
        if settings and "policy_settings" in arg_dict:
            raise bad_value("policy_settings", arg_dict["policy_settings"], f"left out when model_args give "
                            f"{[POLICY_PREFIX + key for key in settings]} (one place for the policy's settings)")
        if settings:
            arg_dict["policy_settings"] = settings
        for key in arg_dict:
            if key not in allowed and key != "policy_settings":
                raise ValueError(f"model_args {key}= is not allowed: the sinklib model takes {allowed}"
                                 f"{did_you_mean(key, allowed)}")
        if "pretrained" not in arg_dict:
            raise ValueError("model_args pretrained= is required: a hub id, a local folder or a zoo name "
                             "(e.g. --model_args pretrained=tiny-llada)")
        return cls._with_options(dict(arg_dict), additional_config)

    @classmethod
    def _with_options(cls, args: dict, additional_config: dict | None) -> "SinklibLM":
        """model_args over lm-eval's own options (--batch_size, --device): where both set a key, model_args win."""
        allowed = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        options = {k: v for k, v in (additional_config or {}).items() if v is not None and k in allowed}
        return cls(**{**options, **args})

    # -- requests --------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request: (context, {"until": [...], ...}); the output is cut at the first `until` string."""
        outputs: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            _, gen_kwargs = request.args
            groups[(tuple(_stops(gen_kwargs)), gen_kwargs.get("max_gen_toks"))].append(index)
        bar = tqdm(total=len(requests), desc="sinklib generate_until", disable=disable_tqdm or self.rank != 0)
        for (stops, max_gen_toks), indices in groups.items():
            settings = self.settings_for(max_gen_toks)
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start:start + self.batch_size]
                traces = generate(self.loaded, [requests[i].args[0] for i in chunk], settings, chat=False,
                                  progress=False, seed=self.seed, intervention=self.intervention, keep_scores=False)
                for index, trace in zip(chunk, traces):
                    text = cut_at_stops(trace.text, stops)
                    outputs[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
                bar.update(len(chunk))
        bar.close()
        return outputs  # type: ignore[return-value]

    def settings_for(self, max_gen_toks: int | None):
        """The settings for a task asking max_gen_toks: the task's length is the generation length unless model_args
        set gen_length, which then wins (said once in the log); the layout follows the one rule (families.base.fit)."""
        _, gen_length, _ = self._layout
        if max_gen_toks is None or max_gen_toks == self.settings.gen_length:
            return self.settings
        if gen_length is not None:
            if max_gen_toks not in self._overridden:
                self._overridden.add(max_gen_toks)
                logger.warning("the task asks for max_gen_toks=%s; model_args gen_length=%s is used instead",
                               max_gen_toks, gen_length)
            return self.settings
        return self._fitted(int(max_gen_toks))

    def _fitted(self, gen_length: int | None):
        """The model's own settings fitted to `gen_length` by the one layout rule, then threshold, cache and refresh."""
        steps, _, block_length = self._layout
        return resolve_settings(self.loaded, fit(self._own, steps=steps, gen_length=gen_length,
                                                 block_length=block_length), **self._fast)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """Not supported: always raises NotImplementedError (a masked diffusion model has no left-to-right likelihood)."""
        raise NotImplementedError("the sinklib lm-eval model runs generate_until tasks only: a masked diffusion model "
                                  "has no left-to-right log-likelihood (use a generation task such as gsm8k)")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """Not supported: raises NotImplementedError, as loglikelihood does."""
        self.loglikelihood(requests)

    # -- chat templates (lm-eval applies them with --apply_chat_template) ---------------------------------
    @property
    def tokenizer_name(self) -> str:
        """The tokenizer's name_or_path (else the model's name) with "/" as "__": lm-eval's request-cache key."""
        return getattr(self.loaded.tokenizer, "name_or_path", self.loaded.name).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's own chat template, or "" when it has none; the argument is ignored (lm-eval logs the result)."""
        return getattr(self.loaded.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat history rendered as prompt text (not token ids) by the tokenizer's chat template."""
        return self.loaded.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)

    # -- data parallel: lm-eval shards requests by rank and gathers through these -----------------------
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` from every rank, in rank order: stacked when 0-d, else concatenated on dim 0; itself on one process."""
        if self.world_size == 1:
            return tensor
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst: int = 0):
        """Every rank's `obj` as a list on rank `dst` (None on the others); `[obj]` on one process."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        """Wait for every rank (torch.distributed's barrier); nothing on one process."""
        if self.world_size > 1:
            torch.distributed.barrier()


def _batch_size(value: int | str | None) -> int:
    """lm-eval's batch size: an integer >= 1, its text ("4", from the command line), or "auto" / "auto:N" (one at
    a time: sinklib does not probe memory)."""
    if value is None or (isinstance(value, str) and value.split(":")[0] == "auto"):
        return 1
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    return check_value(number, Count, "batch_size")


def _stops(gen_kwargs: dict) -> list[str]:
    until = gen_kwargs.get("until", [])
    return [until] if isinstance(until, str) else list(until)


def _init_distributed() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment (accelerate launch or torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend=backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # A gloo group still alive at interpreter exit aborts the process (std::terminate on its threads),
        # so a rank that finishes early would fail the whole launch.
        atexit.register(_close_distributed)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _close_distributed(wait_for_peers: bool = False) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait_for_peers:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    """lm-eval's command line with the `sinklib` model registered."""
    cli_evaluate()
    # Rank 0 still writes results after the other ranks return; keep them alive (and the group whole) till then.
    _close_distributed(wait_for_peers=True)


if __name__ == "__main__":
    main()
