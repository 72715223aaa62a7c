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
import dataclasses
import inspect
import logging
import os
import types
import typing
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from sinklib.validation import (BadValue, Consent, Count, Index, NonNegative, bad_value,
                                check_choice, check_value, did_you_mean, validated)
from sinklib.capturing import check_intervention
from sinklib.evaluation.extract import cut_at_stops
from sinklib.evaluation.conditions import CONDITIONS
from sinklib.families.base import RENAMED, Family, check_options, get_family, option_owners
from sinklib.generation import generate
from sinklib.interventions import MASKING_POLICIES, AblateValues, MaskSinks, make_policy
from sinklib.loading import LoadedModel, load

logger = logging.getLogger(__name__)


POLICY_PREFIX = "policy."  # model_args keys that set the named policy's settings


def _named_policy(name: str, settings: dict[str, Any]):
    """The registered policy `name` with its settings (model_args policy.<setting>=value), each setting checked
    against what that policy takes before it is built: an unknown or missing one is refused naming
    policy.<setting>, never a raw TypeError. A policy that wraps another (ablate_values) is refused with the
    model_args that build it."""
    check_choice(name, "policy", MASKING_POLICIES.names())
    if name == "ablate_values":
        raise bad_value("policy", name, "a policy that chooses keys; ablate_values wraps one: give mask_values=zero "
                        "or mask_values=mean beside mask_top_k, mask_random_k or policy")
    parameters = inspect.signature(MASKING_POLICIES.get(name)).parameters
    takes = [key for key, parameter in parameters.items() if parameter.kind is not parameter.VAR_KEYWORD]
    for key in settings:
        if key not in takes:
            raise BadValue(f"model_args {POLICY_PREFIX}{key}= is not allowed: policy {name!r} takes "
                           f"{[POLICY_PREFIX + t for t in takes]}"
                           f"{did_you_mean(POLICY_PREFIX + key, [POLICY_PREFIX + t for t in takes])}")
    hints = typing.get_type_hints(MASKING_POLICIES.get(name))
    # one value where the policy takes several ("policy.layers=3") is a list of one, as "policy.layers=3 5" is of two
    settings = {key: [value] if _takes_several(hints.get(key)) and not isinstance(value, (list, tuple)) else value
                for key, value in settings.items()}
    missing = [key for key, parameter in parameters.items()
               if parameter.default is parameter.empty and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
               and key not in settings]
    if missing:
        raise BadValue(f"model_args {POLICY_PREFIX}{missing[0]}= is required by policy {name!r} "
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


@validated
@dataclass(frozen=True)
class MaskingArgs:
    """The intervention model_args choose, checked when made (before any model loads): the paper's top-k sink
    masking (mask_top_k, mask_eps in sum units, mask_source), the random-key control (mask_random_k, with `seed`), or
    any registered policy by name (policy, its policy_settings); mask_values "zero" or "mean" ablates the chosen
    keys' values instead of their attention. One intervention at a time."""
    mask_top_k: Index = 0
    mask_eps: NonNegative = 3.0
    mask_source: str = "previous_step"
    mask_random_k: Index = 0
    policy: str | None = None
    policy_settings: dict[str, Any] | None = None
    mask_values: Literal["zero", "mean"] | None = None
    seed: Index = 0

    def check(self) -> None:
        """One intervention at a time; policy settings only with a policy (each checked against what it takes)."""
        if self.mask_top_k and self.mask_random_k:
            raise bad_value("mask_random_k", self.mask_random_k, "0 when mask_top_k is set (one intervention at a time)")
        if self.policy is not None and (self.mask_top_k or self.mask_random_k):
            raise bad_value("policy", self.policy, "None when mask_top_k or mask_random_k is set (one intervention at a "
                                                   "time)")
        if self.policy_settings and self.policy is None:
            raise bad_value("policy_settings", self.policy_settings, "empty unless policy names the policy they set")
        if self.policy is not None:
            _named_policy(self.policy, self.policy_settings or {})
        check_choice(self.mask_source, "mask_source", ["previous_step", "previous_step_clean", "same_step"])
        if self.mask_values is not None and not (self.mask_top_k or self.mask_random_k or self.policy):
            raise bad_value("mask_values", self.mask_values, "None unless mask_top_k, mask_random_k or policy chooses keys")

    def intervention(self, family: Family):
        """The intervention for a model of `family` (None: none): the Table 1 conditions' own policies where they
        apply (evaluation.conditions.CONDITIONS: "sinks", "random keys", "sink values (…)"), else the named policy."""
        if self.mask_top_k and self.mask_source != "previous_step":  # the paper's masking read from another step
            keys = MaskSinks(top_k=self.mask_top_k, eps=self.mask_eps, source=self.mask_source, rows=family.sink_rows)
        elif self.mask_top_k or self.mask_random_k:
            name = "sinks" if self.mask_top_k else "random keys"
            if self.mask_values is not None and self.mask_top_k:
                name = f"sink values ({self.mask_values})"
            k = self.mask_top_k or self.mask_random_k
            built = CONDITIONS.get(name).at(self.mask_eps).intervention(family, k, self.seed)
            if name.startswith("sink values"):
                return built
            keys = built
        else:
            keys = _named_policy(self.policy, self.policy_settings or {}) if self.policy is not None else None
        return AblateValues(keys, self.mask_values) if self.mask_values is not None else keys


LOAD_ARGS = ("pretrained", "family", "dtype", "device", "trust_remote_code")  # model_args for sinklib.load
RUN_ARGS = ("batch_size", "max_batch_size")  # model_args for the LM itself (seed is MaskingArgs' and the run's)


@register_model("sinklib")
class SinklibLM(LM):
    """sinklib's lm-eval model. model_args (lm-eval's --model_args key=value,...): pretrained (hub id, local path or
    zoo name), family, dtype, device, trust_remote_code (sinklib.load); any option of the model's sampler family by
    name (steps, gen_length, block_length, temperature, alg, remasking, threshold, cache, refresh, …: laid over the
    model's own settings by LoadedModel.settings_for); mask_top_k / mask_eps / mask_source (the paper's masking: Eq. 3
    on the previous step), mask_random_k (the random-key control), policy (any registered masking policy by name,
    sinklib.interventions.MASKING_POLICIES, its settings given as policy.<setting>=value; a list as values separated by
    spaces: policy=mask_keys,policy.positions=0 3), mask_values ("zero" or "mean": the chosen keys keep their attention
    and their values are ablated instead), seed; batch_size, max_batch_size."""

    def __init__(self, model: LoadedModel | str, settings: Any = None, *, intervention=None, seed: int = 0,
                 batch_size: int | str | None = 1, max_batch_size: int | None = None) -> None:
        """Args:
            model: a LoadedModel (sinklib.load) or a name to load with its defaults.
            settings: the family's settings dataclass, used for every task as it is; a mapping of sampler options
                laid over the model's own settings for each task's length (LoadedModel.settings_for(gen_length=the
                task's max_gen_toks, **options); a gen_length among them fixes the length); None: the model's own.
            intervention: a policy applied at every forward (MaskingArgs builds it from model_args).
            seed: the generations' seed. batch_size: prompts per generation ("auto" runs one at a time).
            max_batch_size: accepted for lm-eval, which passes it (sinklib does not probe memory)."""
        super().__init__()
        self.batch_size = _batch_size(batch_size)
        self.seed = check_value(seed, Index, "seed")
        self.max_batch_size = max_batch_size
        self._rank, self._world_size = _init_distributed()
        self.loaded = model if isinstance(model, LoadedModel) else load(model)
        self._device = torch.device(self.loaded.device)
        check_intervention(intervention)
        self.intervention = intervention
        self._options = dict(settings) if isinstance(settings, Mapping) else None
        # the settings of the model's own length: a fixed object, else built (and so checked) before any request
        self.settings = self.loaded.runnable(settings) if settings is not None and self._options is None else \
            self.loaded.settings_for(**(self._options or {}))
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
            raise BadValue(f"model_args {repeated[0]}= is not allowed: it is given twice")
        malformed = [item for item in pairs if len(item) != 2]
        if malformed:
            raise BadValue(f"model_args {malformed[0][0].strip()!r} is not allowed: each argument is key=value")
        return cls.create_from_arg_obj({key.strip(): _policy_arg(value) if key.strip().startswith(POLICY_PREFIX)
                                        else _model_arg(value) for key, value in pairs}, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "SinklibLM":
        """As create_from_arg_string, for model_args given as a mapping (lm-eval's Python API and newer CLI): where
        model_args and lm-eval's own options (--batch_size, --device) both set a key, model_args win. Every argument
        is checked before the model loads but the sampler's options, which its family checks as soon as it is
        known."""
        args = dict(arg_dict)
        policy = {key[len(POLICY_PREFIX):]: args.pop(key) for key in list(args) if key.startswith(POLICY_PREFIX)}
        if policy and "policy_settings" in args:
            raise bad_value("policy_settings", args["policy_settings"], f"left out when model_args give "
                            f"{[POLICY_PREFIX + key for key in policy]} (one place for the policy's settings)")
        if policy:
            args["policy_settings"] = policy
        masking_names = [f.name for f in dataclasses.fields(MaskingArgs)]
        allowed = [*LOAD_ARGS, *RUN_ARGS, *masking_names, *option_owners()]
        for key in args:
            if key not in allowed and key not in RENAMED:
                raise BadValue(f"model_args {key}= is not allowed: the sinklib model takes {allowed}"
                               f"{did_you_mean(key, allowed)}")
        if "pretrained" not in args:
            raise BadValue("model_args pretrained= is required: a hub id, a local folder or a zoo name "
                           "(e.g. --model_args pretrained=tiny-llada)")
        given = {**{k: v for k, v in (additional_config or {}).items() if v is not None and k in (*LOAD_ARGS, *RUN_ARGS)},
                 **args}
        masking = MaskingArgs(**{key: given.pop(key) for key in masking_names if key in given})
        run = {key: given.pop(key) for key in RUN_ARGS if key in given}
        loading = {key: given.pop(key) for key in LOAD_ARGS if key in given}
        if "trust_remote_code" in loading:  # consent is a real bool, checked before any code could run
            loading["trust_remote_code"] = check_value(loading["trust_remote_code"], Consent, "trust_remote_code")
        device = loading.get("device")
        if (device is None or str(device).startswith("cuda")) and torch.cuda.is_available() and _init_distributed()[1] > 1:
            loading["device"] = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"  # one GPU per data-parallel process
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            logger.warning("device=%r (lm-eval's command-line default) but CUDA is unavailable: using the CPU", device)
            loading["device"] = "cpu"
        check_options(None, given)  # an option no family has, before the model loads
        for key, value in given.items():  # and each value against its field's declared type
            settings_class = get_family(option_owners()[key][0]).settings
            given[key] = check_value(value, typing.get_type_hints(settings_class, include_extras=True)[key], key)
        loaded = load(loading.pop("pretrained"), **loading)
        return cls(loaded, given, intervention=masking.intervention(loaded.family), seed=masking.seed, **run)

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
        """The settings for a task asking max_gen_toks: the task's length is the generation length unless the settings
        fix one (a settings object, or a gen_length among the options; said once in the log); the layout follows the
        one rule (families.base.fit)."""
        if max_gen_toks is None or max_gen_toks == self.settings.gen_length:
            return self.settings
        if self._options is None or "gen_length" in self._options:
            if max_gen_toks not in self._overridden:
                self._overridden.add(max_gen_toks)
                logger.warning("the task asks for max_gen_toks=%s; the settings' gen_length=%s is used instead",
                               max_gen_toks, self.settings.gen_length)
            return self.settings
        return self.loaded.settings_for(gen_length=int(max_gen_toks), **self._options)

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
