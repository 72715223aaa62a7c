"""A logit lens over a generation's denoising steps: what each layer's residual stream would already predict.

It asks the paper's open question (§7): what information the model stores in the sinks that sit on future
(still-masked) positions. For a step s of a trace, the model runs once more on the canvas the sampler saw at s
(as capture.replay does: exact for runs without an intervention or guidance), and the residual stream after
every block is read through the model's own final norm and unembedding: lens_l = softmax(head(norm(h_l))).

Decisions, each for a reason:

- Layers are the blocks 0..L−1, the same indices as a trace's scores (hidden_states[l + 1] is block l's output).
  The embedding (hidden_states[0]) is left out: no block has acted on it, and with tied embeddings (the zoo) its
  lens returns a position's own input token — the mask token at a masked position, the token itself at a decoded
  one — which says nothing about what the layers store and would make every decoded position "correct" from the
  start.
- The last layer: transformers returns the final norm's output as hidden_states[-1] (last_hidden_state, in 4.x and
  5.x: see capture_outputs' tie_last_hidden_states), so it goes through the head alone; every earlier layer goes
  through norm, then head. Which of the two reproduces the model's own logits is checked on every forward, so a
  version that changed the convention, or a head the lens cannot reproduce (a logit transform it does not know),
  fails loudly instead of giving a lens that is off by a norm.
- The shift: Dream (like every autoregressive model) predicts token i + 1 from output i — Dream's sampler
  shifts its logits right by one (families.dream.shift_right); LLaDA and MMaDA predict token i from output i. Each
  row keeps `position`, where the residual stream is read, and `predicts` = position + offset, the position whose
  token it is scored against (Dream's output at the last position predicts past the canvas and has no row).
- A row's "final" token is the token its predicted position holds at the end of the generation (trace.tokens[-1]).
- Layers are chosen as capture and carry choose theirs: `names_filter` over the activation names
  "blocks.{layer}.resid" (sinklib.activation_names); the forward is the same, only the kept layers are unembedded.

Probabilities are float32 softmaxes of the lens logits (computed in the model's dtype, as its own head would).
Only transformers-native models are read (the zoo, adapted named models, any AutoModelForCausalLM): remote
modelling code has no common way to return hidden states.
"""
from __future__ import annotations

import ctypes
import numbers
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from sinklib.activation_names import RESID, NamesFilter, count_layers, select_layers
from sinklib.dynamics import greatest_sinks
from sinklib.trace import Trace
from sinklib.validation import BadValue, bad_value, check_eps, check_int

try:  # glibc's malloc_trim (see _return_freed_memory), from the symbols the process has loaded: no ldconfig run
    _LIBC = ctypes.CDLL(None) if hasattr(ctypes.CDLL(None), "malloc_trim") else None
except OSError:
    _LIBC = None

if TYPE_CHECKING:  # only for annotations: lens reads a LoadedModel's fields, it never builds one
    from sinklib.loading import LoadedModel

# diffusion families whose output at position i predicts token i + 1 (their sampler shifts logits right by one)
PREDICTS_NEXT = ("dream",)
# a position's state at a step, as the lens frame reports it
STATES = ("prompt", "decoded", "masked")
# where transformers' base models keep their final norm (Llama, Qwen2, Mistral, Gemma: `norm`; GPT-2 and OLMo:
# `ln_f`; Phi: `final_layernorm`; ModernBERT: `final_norm`)
_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "final_norm")
LENS_COLUMNS = ["step", "layer", "position", "predicts", "state", "position_state", "top_id", "top_token", "top_prob",
                "final_id", "final_token", "final_prob", "final_rank", "top_is_final"]


def prediction_offset(family) -> int:
    """How far ahead a family's output predicts: 1 when the output at position i is read as token i + 1 (Dream and
    every autoregressive family), 0 when it is token i itself (LLaDA, MMaDA and other diffusion families)."""
    return 1 if not family.is_diffusion or family.name in PREDICTS_NEXT else 0


def lens_modules(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(final norm, output embedding) of a transformers model: the head from get_output_embeddings() (lm_head, tied
    or not), the norm from its base model (model.model.norm for Llama-style models, see _NORM_NAMES)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    base = getattr(model, "base_model", model)
    norm = next((getattr(base, name) for name in _NORM_NAMES if isinstance(getattr(base, name, None), nn.Module)), None)
    if head is None or norm is None:
        missing = " and ".join(part for part, module in (("output embedding", head), ("final norm", norm)) if module is None)
        raise BadValue(f"model={type(model).__name__} is not allowed: the logit lens needs a transformers model with "
                       f"an output embedding (get_output_embeddings()) and a final norm on its base model (one of "
                       f"{list(_NORM_NAMES)}); this one has no {missing}")
    return norm, head


def _unembed(model: nn.Module, head: nn.Module, residual: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
    """float32 logits of residual streams [seq, hidden] through `norm` (None: already normed) and the head, with the
    final soft-capping of models that have one (Gemma 2), as their own forward applies it."""
    with torch.no_grad():  # here, not around the caller's yields: grad mode must not leak out of a generator
        logits = head(residual if norm is None else norm(residual)).float()
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _reproduces(lens: torch.Tensor, own: torch.Tensor) -> bool:
    scale = max(1.0, float(own.abs().max()))
    return bool(torch.allclose(lens, own, rtol=1e-4, atol=1e-4 * scale))


def _require_native(loaded: "LoadedModel") -> None:
    if loaded.calling != "native":
        raise BadValue(f"loaded={loaded.name!r} is not allowed: the logit lens reads hidden states from "
                       "transformers-native models (the zoo, adapted named models, AutoModelForCausalLM "
                       "checkpoints); this model runs its own remote modelling code")


def lens_layers(loaded: "LoadedModel", names_filter: NamesFilter) -> list[int]:
    """The blocks whose lens `names_filter` keeps, by activation name "blocks.{layer}.resid" (None: every block)."""
    return select_layers(names_filter, count_layers(loaded), RESID)


def iter_layer_logits(loaded: "LoadedModel", ids: torch.Tensor,
                      names_filter: NamesFilter = None) -> Iterator[tuple[int, torch.Tensor]]:
    """(layer, float32 logits [seq, vocab]) for every block 0..L−1 of one forward over ids [seq] (no padding), indexed
    by the position the residual stream is read at (not shifted). One layer at a time: a real model's [L, seq,
    vocab] would not fit in memory. names_filter: only the blocks it keeps, by activation name "blocks.{layer}.resid"
    (None: all; sinklib.activation_names). Raises RuntimeError when the last layer's lens does not reproduce the
    model's own logits (see the module docstring; checked whichever layers are kept)."""
    _require_native(loaded)
    model = loaded.model
    norm, head = lens_modules(model)
    kept = None if names_filter is None else set(lens_layers(loaded, names_filter))
    with torch.no_grad():
        out = model(input_ids=ids[None].to(loaded.device), output_hidden_states=True)
    hidden = [h[0] for h in out.hidden_states]  # [embedding, block 0, …, block L−1 (already normed)]
    for layer, residual in enumerate(hidden[1:-1]):
        if kept is None or layer in kept:
            yield layer, _unembed(model, head, residual, norm)
    own = out.logits[0].float()
    last = _unembed(model, head, hidden[-1])  # transformers: hidden_states[-1] is the final norm's output
    if not _reproduces(last, own):  # a model whose last hidden state is taken before its norm
        last = _unembed(model, head, hidden[-1], norm)
    if not _reproduces(last, own):
        raise RuntimeError(f"the logit lens of {loaded.name!r} does not reproduce its own output at the last "
                           f"layer (head(norm(h)) with {type(norm).__name__} and {type(head).__name__}): its "
                           "output applies something the lens does not know")
    if kept is None or len(hidden) - 2 in kept:
        yield len(hidden) - 2, last


def layer_logits(loaded: "LoadedModel", ids: torch.Tensor, names_filter: NamesFilter = None) -> torch.Tensor:
    """float32 [layers, seq, vocab]: iter_layer_logits stacked (for short canvases and small vocabularies); the
    layers names_filter keeps (None: all)."""
    return torch.stack([logits for _, logits in iter_layer_logits(loaded, ids, names_filter)])


def _indices(values, param: str, low: int, high: int) -> list[int]:
    """Sorted distinct integers in [low, high] from a list (refusing a bare number, text or an empty list)."""
    allowed = f"None or a non-empty list of integers in {low}..{high}"
    if isinstance(values, (str, bytes, numbers.Number)) or not isinstance(values, Iterable):
        raise bad_value(param, values, allowed)
    picked = [check_int(value, param, low, high) for value in values]
    if not picked:
        raise bad_value(param, values, allowed)
    return sorted(set(picked))


def _check_pair(loaded: "LoadedModel", trace: Trace) -> None:
    if not isinstance(trace, Trace):
        raise bad_value("trace", type(trace).__name__, "a sinklib.Trace (sinklib.generate's result)")
    made_by = trace.meta.get("family")
    if made_by and made_by != loaded.family.name:
        raise bad_value("trace", f"<a {made_by} trace>", f"a trace generated by a {loaded.family.name} model, as "
                        f"loaded={loaded.name!r} is (the lens's shift and canvas depend on the family)")


def position_states(trace: Trace, step: int) -> np.ndarray:
    """[seq] str: each position's state when `step` ran: "prompt", "decoded" (written by an earlier step) or
    "masked" (still masked; for an autoregressive trace, not yet generated)."""
    states = np.full(trace.tokens.shape[1], "decoded", dtype=object)
    states[trace.is_masked[step].numpy()] = "masked"
    states[: trace.prompt_len] = "prompt"
    return states


class _Texts:
    """Token id → text through the tokenizer (the trace's strings only cover the tokens it wrote), memoised."""

    def __init__(self, loaded: "LoadedModel", trace: Trace) -> None:
        self.tokenizer, self.trace = loaded.tokenizer, trace
        self.known: dict[int, str] = {}

    def __call__(self, ids: np.ndarray) -> list[str]:
        new = sorted({int(i) for i in ids} - self.known.keys())
        if new and self.tokenizer is not None:
            # None for ids past the tokenizer in a padded vocabulary: those fall back to the trace's text (the id)
            self.known.update((i, t) for i, t in zip(new, self.tokenizer.convert_ids_to_tokens(new)) if t is not None)
        self.known.update({i: self.trace.token_text(i) for i in new if i not in self.known})
        return [self.known[int(i)] for i in ids]


def _read_layer(logits: torch.Tensor, rows: torch.Tensor, final: torch.Tensor, top: int) -> dict[str, np.ndarray]:
    """The lens's numbers for read positions `rows` of one layer's logits [seq, vocab], against final ids [rows]."""
    chosen = logits[rows]
    probs = torch.softmax(chosen, dim=-1)
    top_probs, top_ids = probs.topk(top, dim=-1)
    final_logit = chosen.gather(-1, final[:, None])
    columns = {"top_id": top_ids[:, 0].numpy(), "top_prob": top_probs[:, 0].numpy(),
               "final_prob": probs.gather(-1, final[:, None])[:, 0].numpy(),
               # 0 = the lens's argmax; tokens with an equal logit do not push the final token down
               "final_rank": (chosen > final_logit).sum(-1).numpy()}
    if top > 1:
        columns["top_ids"] = list(top_ids.numpy())
        columns["top_probs"] = list(top_probs.numpy())
    return columns


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc's malloc_trim; elsewhere nothing). Each step frees ~30
    [seq, vocab] float32 logits (15 MB each for SmolLM2); glibc raises its mmap threshold after the first frees, so
    later ones land on the heap, fragment it and are never returned: a 28-step lens of SmolLM2 kept 5 GB, and notebook
    07 reached 17 GB and was killed. Trimmed after every step, the process stays at the model's size."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _step_frame(loaded: "LoadedModel", trace: Trace, step: int, wanted: set[int], top: int, texts: _Texts,
                names_filter: NamesFilter = None) -> pd.DataFrame:
    """The lens rows of one step: every kept layer × every read position whose predicted position is in `wanted`."""
    canvas = loaded.family.replay_canvas(trace.tokens[step], trace.is_masked[step])
    offset = prediction_offset(loaded.family)
    reads = [p for p in range(canvas.shape[0]) if p + offset in wanted]
    rows = torch.tensor(reads, dtype=torch.long)
    predicts = rows + offset
    final = trace.tokens[-1][predicts]
    states = position_states(trace, step)
    pieces = []
    for layer, logits in iter_layer_logits(loaded, canvas, names_filter):
        columns = _read_layer(logits.cpu(), rows, final, top)
        pieces.append(pd.DataFrame({"step": step, "layer": layer, "position": rows.numpy(), "predicts": predicts.numpy(),
                                    "state": states[predicts.numpy()], "position_state": states[rows.numpy()],
                                    "final_id": final.numpy(), **columns}))
    frame = pd.concat(pieces, ignore_index=True)
    frame["top_token"] = texts(frame["top_id"].to_numpy())
    frame["final_token"] = texts(frame["final_id"].to_numpy())
    frame["top_is_final"] = frame["top_id"] == frame["final_id"]
    return frame


def logit_lens(loaded: "LoadedModel", trace: Trace, steps: Sequence[int] | None = None,
               positions: Sequence[int] | None = None, top: int = 1, names_filter: NamesFilter = None) -> pd.DataFrame:
    """The logit lens of a generation: one row per (step, layer, read position), sorted so.

    loaded: sinklib.load's result for the model that made `trace` (transformers-native). steps: denoising steps
    (0..trace.n_steps − 1; default all), one extra forward each. positions: the predicted positions to keep (the
    `predicts` column, in prediction_offset(family)..seq − 1; default all). top: how many of the lens's best
    tokens to report (1..vocab). names_filter: the layers, by activation name "blocks.{layer}.resid" (None: all; as
    capture and carry choose theirs, sinklib.activation_names); rows keep the layers' own numbers.

    Columns: step; layer (block 0..L−1, as in trace.scores; the embedding is left out); position (where the
    residual stream is read); predicts (the position whose token it predicts: position + 1 for Dream and
    autoregressive models, position for LLaDA / MMaDA); state and position_state (the predicted / read position
    when the step ran: "prompt", "decoded" or "masked"); top_id, top_token, top_prob (the lens's argmax and its
    probability); final_id, final_token (the token the generation ended with at `predicts`), final_prob (its
    probability under the lens), final_rank (how many tokens the lens ranks strictly above it: 0 = argmax);
    top_is_final. With top > 1 also top_ids and top_probs: arrays of the `top` best, best first.
    """
    _check_pair(loaded, trace)
    _require_native(loaded)
    seq = trace.tokens.shape[1]
    chosen_steps = list(range(trace.n_steps)) if steps is None else _indices(steps, "steps", 0, trace.n_steps - 1)
    offset = prediction_offset(loaded.family)
    wanted = set(range(offset, seq) if positions is None else _indices(positions, "positions", offset, seq - 1))
    top = check_int(top, "top", 1, lens_modules(loaded.model)[1].weight.shape[0])  # at most the vocabulary
    if names_filter is not None:
        lens_layers(loaded, names_filter)  # refused here, before any forward
    texts = _Texts(loaded, trace)
    frames = []
    for step in chosen_steps:
        frames.append(_step_frame(loaded, trace, step, wanted, top, texts, names_filter))
        _return_freed_memory()
    if not frames:  # a trace without steps
        return pd.DataFrame(columns=LENS_COLUMNS)
    frame = pd.concat(frames, ignore_index=True)
    extra = [c for c in frame.columns if c not in LENS_COLUMNS]
    return frame[LENS_COLUMNS + extra]


_FIRST_CORRECT_NEEDS = ("step", "layer", "predicts", "top_id", "final_id")


def first_correct_layer(lens_frame: pd.DataFrame) -> pd.DataFrame:
    """Per (step, predicts): the first layer from which the lens's argmax is the final token at every layer up to
    the last one in the frame (a float; NaN when the last layer's argmax is not the final token).

    lens_frame: logit_lens's result (or any frame with columns step, layer, predicts, top_id, final_id). Columns:
    step, predicts, the read position, state and position_state where the frame has them, first_correct_layer.
    """
    missing = [c for c in _FIRST_CORRECT_NEEDS if c not in getattr(lens_frame, "columns", ())]
    if not isinstance(lens_frame, pd.DataFrame) or missing:
        raise BadValue(f"lens_frame (missing {missing}) is not allowed: lens_frame must be a logit_lens frame, a "
                       f"DataFrame with columns {list(_FIRST_CORRECT_NEEDS)}")
    keys = ["step", "predicts"]
    correct = lens_frame["top_id"] == lens_frame["final_id"]
    wrong_layer = lens_frame["layer"].where(~correct)
    last_wrong = wrong_layer.groupby([lens_frame[k] for k in keys]).transform("max")
    # a correct layer above every wrong one (all layers, when none is wrong) begins the run that lasts to the end
    stays = lens_frame["layer"].where(correct & (last_wrong.isna() | (lens_frame["layer"] > last_wrong)))
    grouped = lens_frame.assign(first_correct_layer=stays.astype(float)).groupby(keys, sort=True)
    carried = {c: (c, "first") for c in ("position", "state", "position_state") if c in lens_frame.columns}
    result = grouped.agg(**carried, first_correct_layer=("first_correct_layer", "min"))
    return result.reset_index()


def sink_positions(trace: Trace, eps: float = 3.0, min_heads: int = 1) -> pd.DataFrame:
    """Per step, the positions that are a sink: the greatest key (dynamics.greatest_sinks) of at least `min_heads`
    (layer, head) pairs at that step and an Eq. 3 sink there with `eps`. Columns step, position, heads (how many
    (layer, head) pairs it is the greatest sink of)."""
    eps = check_eps(eps)
    min_heads = check_int(min_heads, "min_heads", 1)
    top = greatest_sinks(trace, eps)
    counts = top[top["is_sink"]].groupby(["step", "position"]).size().rename("heads").reset_index()
    return counts[counts["heads"] >= min_heads].reset_index(drop=True)


def masked_position_table(trace: Trace, lens_frame: pd.DataFrame, eps: float = 3.0, min_heads: int = 1) -> pd.DataFrame:
    """One row per (step, read position) where the read position and the position it predicts are both still
    masked (the same position for LLaDA; for Dream the next one must be masked too, so that the prediction is not
    of a token already on the canvas). Columns step, position, predicts, is_sink (sink_positions at that step),
    first_correct_layer, final_at_last (the last layer's argmax is the final token), final_prob_last."""
    firsts = first_correct_layer(lens_frame)
    last = lens_frame[lens_frame["layer"] == lens_frame["layer"].max()]
    last = last[["step", "predicts", "top_is_final", "final_prob"]].rename(
        columns={"top_is_final": "final_at_last", "final_prob": "final_prob_last"})
    table = firsts.merge(last, on=["step", "predicts"])
    table = table[(table["state"] == "masked") & (table["position_state"] == "masked")]
    sinks = sink_positions(trace, eps, min_heads)[["step", "position"]].assign(is_sink=True)
    table = table.merge(sinks, on=["step", "position"], how="left")
    table["is_sink"] = table["is_sink"].fillna(False).astype(bool)
    return table[["step", "position", "predicts", "is_sink", "first_correct_layer", "final_at_last",
                  "final_prob_last"]].reset_index(drop=True)


def sink_vs_other_masked(loaded: "LoadedModel | None", traces: Sequence[Trace], eps: float = 3.0, *, min_heads: int = 1,
                         frames: Sequence[pd.DataFrame] | None = None) -> pd.DataFrame:
    """Does a sink sitting on a still-masked position predict its final token earlier than other masked positions?

    Over every step of every trace, the masked positions of masked_position_table split into "sink" (a sink at
    that step: sink_positions with `eps` and `min_heads`) and "other masked". frames: the traces' logit_lens frames
    if already computed (then `loaded` may be None), else computed here (one forward per step). One row per group:
    n ((trace, step, position) rows), n_ever_correct (a first correct layer exists), mean_first_correct_layer
    (over those), share_final_at_last (the last layer's argmax is the final token) and mean_final_prob_last.
    """
    traces = list(traces)
    if frames is not None and len(frames) != len(traces):
        raise bad_value("frames", f"<{len(frames)} frames>", f"None or one logit_lens frame per trace ({len(traces)})")
    if frames is None and loaded is None:
        raise bad_value("loaded", None, "a loaded model (sinklib.load) when frames are not given")
    tables = [masked_position_table(trace, logit_lens(loaded, trace) if frames is None else frames[index], eps, min_heads)
              .assign(trace=index) for index, trace in enumerate(traces)]
    empty = pd.DataFrame({"is_sink": pd.Series(dtype=bool), "first_correct_layer": pd.Series(dtype=float),
                          "final_at_last": pd.Series(dtype=float), "final_prob_last": pd.Series(dtype=float)})
    pooled = pd.concat(tables, ignore_index=True) if tables else empty
    rows = []
    for group, part in (("sink", pooled[pooled["is_sink"]]), ("other masked", pooled[~pooled["is_sink"]])):
        # an empty group's means are NaN: nothing to compare
        rows.append({"group": group, "n": len(part), "n_ever_correct": int(part["first_correct_layer"].notna().sum()),
                     "mean_first_correct_layer": float(part["first_correct_layer"].mean()),
                     "share_final_at_last": float(part["final_at_last"].astype(float).mean()),
                     "mean_final_prob_last": float(part["final_prob_last"].mean())})
    return pd.DataFrame(rows)
