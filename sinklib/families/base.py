"""What a model family is, and the registry of families.

A Family owns everything that differs between model families: its sampler and the settings dataclass it
takes (whose fields are the family's option names), its default settings (the paper's and the tiny zoo's), the
special ids, which configs declare it, how its remote modelling code is called, and how its canvases become
traces. Adding a family is one file defining a Family and one `register_family` call.

Settings travel as the family's frozen dataclass: `fit` resizes them to a generation length by the one layout
rule, `dataclasses.replace` overrides a field, and `record` is what a run is keyed by.

A sampler is a plain function: sample(forward, prompt_ids, prompt_mask, settings, generator) → list of
canvases [batch, seq], the canvas before each forward and the final one. `forward(ids, mask_2d,
position_ids)` returns logits (an autoregressive family's forward also takes and returns a KV cache); the
caller decides how a model is called and what is recorded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

import torch

from sinklib.registry import Registry
from sinklib.validation import BadValue, bad_value, check_int, did_you_mean, is_validated

Forward = Callable[..., torch.Tensor]
S = TypeVar("S")


@dataclass(frozen=True)
class Canvas:
    """A batch's canvases as traces store them: tokens [forwards + 1, batch, width] (short canvases filled),
    is_masked [forwards, batch, width], and each row's left padding [batch]."""
    tokens: torch.Tensor
    is_masked: torch.Tensor
    padding: torch.Tensor


class FamilySettings:
    """What every family's settings dataclass inherits (sinklib.settings.Settings declares it): record()."""

    def record(self) -> dict[str, Any]:
        """What a run with these settings is keyed by (families.base.record)."""
        return record(self)


@dataclass(frozen=True)
class Family:
    """A model family, as the registry holds it: its sampler and settings dataclass, its default settings, the mask
    id used when the tokenizer has none (default_mask_id, diffusion families) and how its remote code is called.
    Subclasses (DiffusionFamily, AutoregressiveFamily) set `kind`, `is_diffusion` and how canvases become traces."""
    name: str
    sample: Callable[..., list[torch.Tensor]]
    # a frozen dataclass decorated with sinklib.validation.validated (its check() refuses bad values when an instance
    # is made, dataclasses.replace included) that inherits FamilySettings (its record()); its fields are this
    # family's option names
    settings: type
    default_mask_id: int | None = None
    description: str = ""
    # default settings (instances of `settings`, special ids left at their defaults): the paper's generation for a
    # real checkpoint, and the tiny zoo's answer slot (None: the paper's fitted to ZOO_GEN_LENGTH tokens). A task's
    # own generation length resizes them (fit); no family keeps settings per task.
    paper: Any = None
    zoo: Any = None
    # words in a config's model_type / architectures that declare this family (remote-code checkpoints)
    model_types: tuple[str, ...] = ()
    # how the family's own (remote) modelling code is called: (model, ids, mask_2d, position_ids) → logits
    remote_call: Callable[..., torch.Tensor] | None = None

    # "diffusion" or "autoregressive": what a trace records (trace_meta); callers ask the answers below, never this
    kind: ClassVar[str] = ""
    sink_rows: ClassVar[str] = "all"  # the query rows sinks are read from when they are masked (MaskSinks.rows)
    # what a family answers about itself, so that no caller asks its kind: whether it is a diffusion family (every
    # forward sees the whole canvas, masked positions hold the mask id until decoded; else it is autoregressive: the
    # canvas grows by one token a forward), whether its sinks can move from step to step (the moving-sink figures),
    # and whether each step's scores sum over every query of the canvas (what the threshold sweep reads; else one
    # full pass of the final sequence stands for them)
    is_diffusion: ClassVar[bool] = False
    canvas_moves: ClassVar[bool] = False
    scores_cover_the_canvas: ClassVar[bool] = False
    # whether its canvas marks undecided positions with a mask token (a uniform-noise family's holds random tokens
    # instead, and its sampler records which positions are not yet accepted), and the transformers class that loads
    # its native checkpoints (a class name of transformers)
    has_mask_token: ClassVar[bool] = True
    native_class: ClassVar[str] = "AutoModelForCausalLM"

    def __post_init__(self) -> None:
        # settings that were never checked would reach the sampler unchecked: refused where the family is declared
        if not (dataclasses.is_dataclass(self.settings) and isinstance(self.settings, type) and is_validated(self.settings)):
            raise TypeError(f"settings={self.settings!r} is not allowed for the {self.name} family: settings must be a "
                            "dataclass decorated with sinklib.validation.validated (its check() refuses bad values "
                            "when settings are made)")
        if not issubclass(self.settings, FamilySettings):
            raise TypeError(f"settings={self.settings!r} is not allowed for the {self.name} family: settings must "
                            "inherit sinklib.families.base.FamilySettings (its record() is what runs are keyed by)")

    def defaults(self, zoo: bool = False):
        """This family's default settings: the tiny zoo's answer slot (`zoo`) or the paper's generation."""
        paper = self.paper if self.paper is not None else self.zoo
        if paper is None:
            raise TypeError(f"the {self.name} family declares no default settings (Family.paper or Family.zoo)")
        if not zoo:
            return paper
        return self.zoo if self.zoo is not None else fit(paper, gen_length=ZOO_GEN_LENGTH)

    def trace_meta(self) -> dict[str, str]:
        """What a trace records of the family that made it: its name ("family") and its kind ("kind": "diffusion" or
        "autoregressive", which Trace.is_autoregressive reads back)."""
        return {"family": self.name, "kind": self.kind}

    def option_names(self) -> list[str]:
        """The field names of this family's settings dataclass, in declaration order (special ids included)."""
        return [f.name for f in dataclasses.fields(self.settings)]

    def declared_by(self, config_text: str) -> bool:
        """Whether a config whose model_type and architectures read `config_text` (lower case) declares this family."""
        return any(word in config_text for word in self.model_types)

    def matches_native(self, config: Any) -> bool:
        """Whether a transformers-native config with no family words is this family (the fallback for causal LMs)."""
        return False

    def call(self, model: torch.nn.Module, ids, attention_mask, position_ids) -> torch.Tensor:
        """Logits from this family's remote modelling code, called the way that code expects."""
        if self.remote_call is None:
            raise TypeError(f"the {self.name} family has no remote modelling code to call")
        return self.remote_call(model, ids, attention_mask, position_ids)

    def layer_names(self, model: torch.nn.Module) -> list[str] | None:
        """The attention modules the capture records, one per layer (None: found by sinklib.layers)."""
        return None

    def run(self, model: torch.nn.Module, ids, attention_mask, position_ids, **stage):
        """A native forward its sampler asks for by keywords (`stage`: an encoder pass, a decoder step with its
        own inputs), for a family whose model is not called as one causal or masked LM."""
        raise TypeError(f"the {self.name} family's model takes no keywords beyond (ids, attention_mask, position_ids): "
                        f"{sorted(stage)}")

    # --- how a run's canvases become traces (diffusion and autoregressive families differ) ---
    uses_cache: ClassVar[bool] = False

    def n_forwards(self, settings) -> int:
        """How many model forwards a run with these (validated) settings makes at most."""
        raise NotImplementedError

    def layout(self, canvases: list[torch.Tensor], prompt_lengths: list[int], settings, mask_id, pad_id) -> Canvas:
        """The sampler's canvases (each [batch, width_t], the one before each forward and the final one) as a Canvas
        of one width, with each row's left padding worked out from `prompt_lengths`."""
        raise NotImplementedError

    def extent(self, tokens: torch.Tensor, prompt_len: int, forwards: int, eos_ids) -> tuple[int, int]:
        """(positions kept, steps kept) of one row's tokens [forwards + 1, width] (already without left padding)."""
        raise NotImplementedError

    def replay_canvas(self, tokens: torch.Tensor, is_masked: torch.Tensor) -> torch.Tensor:
        """The ids one full forward sees to replay a step (the canvas of that step)."""
        return tokens


class DiffusionFamily(Family):
    """Every forward sees the whole canvas; masked positions hold the mask id until decoded."""
    kind: ClassVar[str] = "diffusion"
    is_diffusion: ClassVar[bool] = True
    canvas_moves: ClassVar[bool] = True
    scores_cover_the_canvas: ClassVar[bool] = True

    def n_forwards(self, settings) -> int:
        """At most one forward per denoising step: settings.steps; with a confidence threshold, which writes at least
        one token a step and ends a block when it has no masks, at most gen_length steps; with a sink-anchored refresh,
        at most three forwards a step (a window whose sinks drifted, the refresh, the window that anchors it)."""
        steps = settings.gen_length if getattr(settings, "threshold", None) is not None else settings.steps
        return steps * (3 if getattr(settings, "refresh", None) is not None else 1)

    def layout(self, canvases, prompt_lengths, settings, mask_id, pad_id) -> Canvas:
        """The canvases stacked (all share one width); a position is masked where it holds `mask_id` before the
        forward, and a row's left padding is the width less gen_length and its prompt length."""
        tokens = torch.stack(canvases).cpu()
        padding = tokens.shape[-1] - settings.gen_length - torch.tensor(prompt_lengths)
        return Canvas(tokens, tokens[:-1] == mask_id, padding)

    def extent(self, tokens, prompt_len, forwards, eos_ids) -> tuple[int, int]:
        """Every position and every step: the whole canvas is generated at once, end tokens included."""
        return tokens.shape[1], forwards


class AutoregressiveFamily(Family):
    """The canvas grows by one token a forward (a KV cache holds the rest); positions not yet generated count as
    masked; a row ends at its first end token."""
    kind: ClassVar[str] = "autoregressive"
    sink_rows: ClassVar[str] = "last"  # a cached step computes only its last query row: sinks are read from it
    uses_cache: ClassVar[bool] = True

    def matches_native(self, config: Any) -> bool:
        """True for a causal decoder config (a *ForCausalLM architecture, is_decoder, or a Llama, Qwen2, Mistral or
        Gemma model type) unless it declares itself not causal (is_causal=False or bidirectional attention)."""
        model_type = str(getattr(config, "model_type", "")).lower()
        architectures = " ".join(getattr(config, "architectures", None) or []).lower()
        if getattr(config, "is_causal", True) is False or getattr(config, "use_bidirectional_attention", False):
            return False
        return "forcausallm" in architectures or bool(getattr(config, "is_decoder", False)) or \
            model_type in ("llama", "qwen2", "mistral", "gemma")

    def n_forwards(self, settings) -> int:
        """One forward per generated token: settings.gen_length."""
        return settings.gen_length

    def layout(self, canvases, prompt_lengths, settings, mask_id, pad_id) -> Canvas:
        """The growing canvases right-padded with `pad_id` to the final width and stacked; positions at or past a
        forward's canvas length (not yet generated) are masked; left padding is the first canvas's width less each
        prompt length."""
        width = canvases[-1].shape[1]
        tokens = torch.stack([torch.nn.functional.pad(c, (0, width - c.shape[1]), value=pad_id) for c in canvases]).cpu()
        lengths = torch.tensor([c.shape[1] for c in canvases])
        batch = tokens.shape[1]
        is_masked = (torch.arange(width)[None, :] >= lengths[:-1, None])[:, None, :].expand(-1, batch, -1)
        return Canvas(tokens, is_masked, canvases[0].shape[1] - torch.tensor(prompt_lengths))

    def extent(self, tokens, prompt_len, forwards, eos_ids) -> tuple[int, int]:
        """Positions up to and including the first end token after the prompt in the final canvas (all when there is
        none), and the forwards that produced them."""
        final = tokens[-1]
        keep = next((p + 1 for p in range(prompt_len, final.shape[0]) if int(final[p]) in eos_ids), final.shape[0])
        return keep, min(forwards, keep - prompt_len)

    def replay_canvas(self, tokens, is_masked) -> torch.Tensor:
        """The tokens that existed at that step (the not-masked ones): prompt and tokens generated so far, [seq]."""
        return tokens[~is_masked]


FAMILIES: Registry[Family] = Registry("family", {
    "llada": "sinklib.families.llada:LLADA",
    "mmada": "sinklib.families.llada:MMADA",
    "dream": "sinklib.families.dream:DREAM",
    "arm": "sinklib.families.arm:ARM",
    "diffusion_gemma": "sinklib.families.diffusion_gemma:DIFFUSION_GEMMA",
    "udlm": "sinklib.families.udlm:UDLM",
})


ZOO_GEN_LENGTH = 16  # the tiny zoo's answer slot, in tokens


def fit(settings: S, *, gen_length: int | None = None, steps: int | None = None, block_length: int | None = None) -> S:
    """The layout rule, one for every family: `settings` (a family's settings dataclass) with the given values in
    place; a value for a field the family does not have or use is ignored (block_length for arm, steps for arm,
    whose steps stay None: one forward per token; a Dream sampler without blocks keeps none unless block_length is
    given).

    A gen_length given alone keeps a valid layout: block_length (where the family has blocks) becomes the largest
    divisor of gen_length not above the current block (32 → 16 for gen_length 16), and steps keep the current
    steps per token, rounded up to a multiple of the number of blocks. The given values must be integers >= 1;
    the settings made refuse a layout their family cannot run."""
    return dataclasses.replace(settings, **layout_changes(settings, gen_length=gen_length, steps=steps,
                                                          block_length=block_length))


def layout_changes(settings: Any, *, gen_length: int | None = None, steps: int | None = None,
                   block_length: int | None = None) -> dict[str, int]:
    """The fields `fit` changes, by name (LoadedModel.settings_for lays them over its other changes at once)."""
    names = {f.name for f in dataclasses.fields(settings)} - ({"steps"} if getattr(settings, "steps", None) is None else set())
    given = {name: check_int(value, name, 1) for name, value in
             (("gen_length", gen_length), ("steps", steps), ("block_length", block_length)) if value is not None}
    changes = {name: value for name, value in given.items() if name in names}
    gen_length = changes.get("gen_length")
    block = getattr(settings, "block_length", None)
    if gen_length is not None and "block_length" not in changes and block is not None:
        changes["block_length"] = max(d for d in range(1, min(block, gen_length) + 1) if gen_length % d == 0)
    block = changes.get("block_length") or gen_length
    if gen_length is not None and "steps" not in changes and "steps" in names and gen_length % block == 0:
        blocks = gen_length // block
        wanted = max(1, -(-gen_length * settings.steps // settings.gen_length))
        changes["steps"] = -(-wanted // blocks) * blocks
    return changes


def check_block_layout(steps: int, gen_length: int, block_length: int) -> int:
    """The blocks a block-wise sampler runs: gen_length a multiple of block_length, steps a multiple of the number of
    blocks (each block gets as many); → the number of blocks."""
    block = check_int(block_length, "block_length", 1)
    if gen_length % block:
        raise bad_value("gen_length", gen_length, f"a multiple of block_length={block}")
    blocks = gen_length // block
    if steps % blocks:
        raise bad_value("steps", steps, f"a multiple of the number of blocks ({blocks} = gen_length {gen_length} / "
                                        f"block_length {block})")
    return blocks


def record(settings: Any) -> dict[str, Any]:
    """What a run's records are keyed by: every field of `settings` but the special ids (which come with the
    weights), by name — and but the fields a settings class names in KEYED_WHEN_SET while they hold their default:
    fields added after runs were first keyed (Fast-dLLM's threshold and cache), whose default runs the sampler as it
    ran before they existed, so those runs stay resumable under their keys."""
    late = getattr(type(settings), "KEYED_WHEN_SET", ())
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if f.name not in SPECIAL_IDS and not (f.name in late and getattr(settings, f.name) == f.default)}


def register_family(name: str, target: "str | Family", *, replace: bool = False) -> None:
    """Register a family, reachable by name wherever a family is named (load's family=, a config that declares it).

    Args:
        name: the family's name, e.g. "llada".
        target: a Family, or its import path "module:ATTRIBUTE" (imported on first use, so registering costs nothing).
        replace: replace a family registered under that name already (else that is refused).

    Raises:
        BadValue: the name is registered already and replace is False.
    """
    FAMILIES.register(name, target, replace=replace)


def family_names() -> list[str]:
    """The registered family names, sorted."""
    return FAMILIES.names()


def get_family(name: str) -> Family:
    """The family registered as `name` (imported on first use); an unknown name is refused with "did you mean"."""
    return FAMILIES.get(name)


SPECIAL_IDS = ("mask_id", "eos_ids", "pad_id")  # settings fields filled from the model, never given as options
LAYOUT = ("steps", "gen_length", "block_length")  # the fields fit() keeps consistent with each other
# options renamed so that one name means one thing: eps is the Eq. 3 sink threshold everywhere in sinklib
RENAMED = {"eps": "final_time (Dream's last timestep; eps is the Eq. 3 sink threshold of find_sinks / MaskSinks)"}



def option_owners() -> dict[str, list[str]]:
    """option name → the families whose settings have it (special ids excluded: they come from the model)."""
    owners: dict[str, list[str]] = {}
    for name in family_names():
        for option in get_family(name).option_names():
            if option not in SPECIAL_IDS:
                owners.setdefault(option, []).append(name)
    return owners


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists (as upstream batched sampling does) → ids [B, P] and attention mask [B, P]."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def check_options(family, options: dict) -> None:
    """Refuse an option no family has (with "did you mean", or the new name of a renamed one) and, given a value,
    an option of another `family` (None: any family's option passes), naming its owner."""
    owners = option_owners()
    for key, value in options.items():
        if key in RENAMED:
            raise TypeError(f"{key}={value!r} is not a sampler option: did you mean {RENAMED[key]}?")
        if key not in owners:
            raise TypeError(f"{key}={value!r} is not a sampler option: the options are {sorted(owners)}"
                            f"{did_you_mean(key, owners)}")
        if value is not None and family is not None and family.name not in owners[key]:
            raise BadValue(f"{key}={value!r} is not allowed for the {family.name} family: it applies to "
                           f"{'/'.join(owners[key])} only")
