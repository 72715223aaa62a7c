"""The paper's experimental settings and the loops the notebooks share: sampling presets per family,
prompt sets, trace collection (written as it goes, resumable), and map replay."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

import sinklib
from sinklib.capture import capture
from sinklib.interventions import identity
from sinklib.loading import LoadedModel
from sinklib.named import NAMED_MODELS
from sinklib.trace import Trace


def is_zoo(loaded: LoadedModel) -> bool:
    """Zoo checkpoints declare their sampler family in their config; real checkpoints do not."""
    return getattr(getattr(loaded.model, "config", None), "sinklib_family", None) is not None


def sampling(loaded: LoadedModel, steps: int | None = None, gen_length: int | None = None,
             block_length: int | None = None) -> dict[str, Any]:
    """The family's settings (zoo, named laptop model, or paper: Family.presets) with any given value overriding,
    by fit_layout's rule."""
    named = NAMED_MODELS.get(loaded.name)
    preset = dict(named.sampling) if named is not None and named.sampling else \
        loaded.family.preset("zoo" if is_zoo(loaded) else "paper")
    return fit_layout(preset, steps, gen_length, block_length)


def fit_layout(preset: dict[str, Any], steps: int | None = None, gen_length: int | None = None,
               block_length: int | None = None) -> dict[str, Any]:
    """`preset` with the given values overriding; options the preset does not have are dropped (block_length
    for dream/arm, steps for arm).

    A gen_length given alone keeps a valid layout: block_length becomes the largest divisor of gen_length not
    above the preset's block (32 → 16 for gen_length 16), and steps keep the preset's steps per token,
    rounded up to a multiple of the number of blocks."""
    fitted = dict(preset)
    for key, value in (("steps", steps), ("gen_length", gen_length), ("block_length", block_length)):
        if value is not None and key in preset:
            fitted[key] = value
    if gen_length is not None and block_length is None and "block_length" in preset:
        fitted["block_length"] = max(d for d in range(1, min(preset["block_length"], gen_length) + 1) if gen_length % d == 0)
    if gen_length is not None and steps is None and "steps" in preset:
        blocks = gen_length // fitted.get("block_length", gen_length)
        wanted = max(1, -(-gen_length * preset["steps"] // preset["gen_length"]))
        fitted["steps"] = -(-wanted // blocks) * blocks
    return fitted


def prompts(loaded: LoadedModel, n: int) -> list[str]:
    """n prompts: the zoo's held-out questions for zoo models; the same problems as plain English for
    real checkpoints (used through their chat template)."""
    from sinklib.zoo.data import held_out

    items = held_out()[:n]
    if is_zoo(loaded):
        return [p.question for p in items]
    plain = [p.question.removeprefix("Q: ").removesuffix(" A:").replace(" .", ".").replace(" ?", "?") for p in items]
    return [text[0].upper() + text[1:] for text in plain]


def collect_traces(loaded: LoadedModel, texts: Sequence[str], out: str | Path | None = None, seed: int = 0,
                   intervention=None, progress: bool = True, **settings) -> list[Trace]:
    """One trace per prompt. With `out`, each trace is saved as it finishes (out/trace-0007/) and a rerun
    loads the finished ones instead of generating them again."""
    chat = not is_zoo(loaded)
    recorded = identity(intervention) if intervention is not None else None  # refused before any work if unstable
    traces = []
    for index, text in enumerate(tqdm(texts, desc=f"traces {loaded.name}", disable=not progress)):
        folder = Path(out) / f"trace-{index:04d}" if out is not None else None
        if folder is not None and (folder / "meta.json").exists():
            traces.append(_resumed(Trace.load(folder), folder, loaded, text, seed + index, recorded, settings))
            continue
        trace = sinklib.generate(loaded, text, seed=seed + index, chat=chat, progress=False, intervention=intervention, **settings)
        if folder is not None:
            trace.save(folder)
        traces.append(trace)
    return traces


def _resumed(trace: Trace, folder: Path, loaded: LoadedModel, text: str, seed: int, intervention: str | None,
             settings: dict) -> Trace:
    """A trace saved by an earlier run is reused only if that run asked for the same thing."""
    meta = trace.meta
    saved = meta.get("settings", {})
    differs = {key: (meta.get(key), want) for key, want in (("model", loaded.name), ("prompt", text), ("seed", seed),
               ("intervention", intervention)) if meta.get(key) != want}
    differs.update({key: (saved.get(key), value) for key, value in settings.items()
                    if value is not None and key in saved and saved[key] != value})
    if differs:
        raise ValueError(f"out={str(folder.parent)!r} is not allowed: {folder.name} was written by another run "
                         f"(saved vs asked: {differs}); use a new folder or delete it")
    return trace


def demo_trace(loaded: LoadedModel, prompt: str, seed: int = 0, steps: int | None = None,
               gen_length: int | None = None, block_length: int | None = None) -> Trace:
    """One generation of `prompt` with the family's settings (sampling()), as the explorer shows it: the zoo
    reads plain text, real checkpoints get their chat template."""
    return sinklib.generate(loaded, prompt, seed=seed, chat=not is_zoo(loaded), progress=False,
                            **sampling(loaded, steps, gen_length, block_length))


def replay_map(loaded: LoadedModel, trace: Trace, step: int, layer: int, head: int) -> torch.Tensor:
    """The full [queries, keys] attention map of (step, layer, head), recomputed by running the model once
    on the canvas the sampler saw at that step (exact for runs without an intervention or guidance)."""
    canvas = loaded.family.replay_canvas(trace.tokens[step], trace.is_masked[step])
    with torch.no_grad(), capture(loaded.model, maps=[(0, layer, head)]) as rec:
        loaded.logits(canvas[None].to(loaded.device))
    return rec.maps[(0, layer, head)][0]


def full_pass_scores(loaded: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """[layers, heads, seq] scores of one forward over a whole sequence (for an autoregressive model: the
    causal column sums a single pass gives, comparable with uniform causal attention)."""
    with torch.no_grad(), capture(loaded.model) as rec:
        loaded.logits(tokens[None].to(loaded.device))
    return rec.scores[0, :, 0]


def by_task(loaded: dict[str, LoadedModel], task: str, tasks: dict[str, str] | None = None) -> dict[str, list[LoadedModel]]:
    """Models grouped by the task Table 1 runs them on: `tasks` names a task per model (a real instruct model
    cannot answer the zoo's arithmetic format), every other model runs `task`. Groups keep the models' order."""
    from sinklib.loading import is_default_model

    tasks = dict(tasks or {})
    # entries for default models this run leaves out are fine (the notebook's default names SmolLM2's task)
    unknown = sorted(name for name in tasks if name not in loaded and not is_default_model(name))
    if unknown:
        raise ValueError(f"tasks={tasks!r} is not allowed: it names models not in models ({unknown}); "
                         f"models are {list(loaded)}")
    groups: dict[str, list[LoadedModel]] = {}
    for name, model in loaded.items():
        groups.setdefault(tasks.get(name, task), []).append(model)
    return groups


def load_models(names: Sequence[str], device: str | None = None, dtype: str | None = None,
                trust_remote_code: bool = False) -> dict[str, LoadedModel]:
    return {name: sinklib.load(name, device=device, dtype=dtype, trust_remote_code=trust_remote_code) for name in names}
