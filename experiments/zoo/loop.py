"""The one training loop of the zoo (train.py) and of SmolLM2's twins (adapt.py): the learning-rate schedule, the
update step, the step loop, whole checkpoint folders and the card fields both record.

What differs stays with each caller, on purpose: how a step's batch and loss are made (the zoo draws from one
persistent data stream and masking generator; a twin's step k draws from seed × 1,000,003 + k, under bf16 autocast
when its recipe says so), the optimiser's settings, what a checkpoint holds and how a resume reads it, and the cards.
"""
from __future__ import annotations

import functools
import math
import os
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

import torch
from tqdm.auto import tqdm

from sinklib.validation import BadValue

T = TypeVar("T")


class Schedule(Protocol):
    """A recipe's learning-rate fields (train.ZooSpec and adapt.AdaptSpec have them)."""

    lr: float
    warmup: int
    steps: int


@dataclass
class RunState:
    """Where a run stands: optimiser updates done and the loss curve so far (one row per update)."""

    step: int
    curve: list[dict]


def learning_rate(spec: Schedule, step: int) -> float:
    """The learning rate at optimiser step `step`: linear warm-up over spec.warmup steps, then a cosine from spec.lr
    down to 0.1 × spec.lr at spec.steps."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def update(optimizer: torch.optim.Optimizer, loss: torch.Tensor, lr: float) -> None:
    """One optimiser update at learning rate `lr`: the gradient of `loss`, its norm over the optimiser's parameters
    clipped to 1.0 (the zoo's optimiser holds every weight, a twin's only its adapter's: the same lists the
    clipping always covered, in the same order)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
    optimizer.step()


def run(spec: Schedule, optimizer: torch.optim.Optimizer, state: RunState, total: int,
        step_loss: Callable[[int], tuple[torch.Tensor, dict]], checkpoint: Callable[[int], Any], desc: str,
        progress: bool = True, add_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Train from state.step to `total`: per step, `step_loss(step)` gives the loss and the curve's own columns, the
    update runs at learning_rate(spec, step), and a row (step, loss, lr, those columns, seconds since the run began,
    a resumed run's earlier seconds included) goes to the curve (`add_row`, default state.curve.append).
    `checkpoint(done)` is called with the updates done before the first step and after each one (it decides whether
    to save). Returns state.curve."""
    add_row = state.curve.append if add_row is None else add_row
    clock = time.perf_counter() - (state.curve[-1]["seconds"] if state.curve else 0.0)
    checkpoint(state.step)
    for step in tqdm(range(state.step, total), desc=desc, disable=not progress, initial=state.step, total=total):
        loss, columns = step_loss(step)
        lr = learning_rate(spec, step)
        update(optimizer, loss, lr)
        add_row({"step": step, "loss": float(loss.detach()), "lr": lr, **columns,
                 "seconds": round(time.perf_counter() - clock, 3)})
        checkpoint(step + 1)
    return state.curve


def checkpoint_folder(folder: Path, step: int) -> Path:
    """Where a run saves its state after `step` optimiser updates: folder/step-NNNNN."""
    return folder / f"step-{step:05d}"


def checkpoint_step(name: str) -> int | None:
    """The step of checkpoint folder name `name` when it is the one name checkpoint_folder writes for it (step-00002,
    step-123456), else None: step-2, step-002 or step-٠٠٠٠٢ would read as step 2 beside step-00002, two folders for
    one step."""
    digits = name[5:] if name.startswith("step-") else ""
    if not (digits.isascii() and digits.isdigit()) or name != checkpoint_folder(Path(), int(digits)).name:
        return None
    return int(digits)


def saved_checkpoints(folder: Path | None, state_file: str) -> dict[int, Path]:
    """The whole checkpoints in `folder` by step: step-NNNNN folders holding `state_file` (a scratch folder a killed
    run left, step-NNNNN.partial, is not one). Any other step-… name is refused (BadValue naming the folder): a
    checkpoint is read under the one name a run writes, never under a second spelling of its step."""
    if folder is None or not folder.is_dir():
        return {}
    saved, foreign = {}, []
    for path in sorted(folder.glob("step-*")):
        step = checkpoint_step(path.name)
        if step is not None:
            if (path / state_file).is_file():
                saved[step] = path
        elif not (path.name.endswith(".partial") and checkpoint_step(path.name[:-len(".partial")]) is not None):
            foreign.append(path.name)
    if foreign:
        raise BadValue(f"checkpoints={str(folder)!r} is not allowed: it holds {foreign}, not named as a run names its "
                       "checkpoints (step-NNNNN: five digits or more, e.g. step-00002); rename or remove them")
    return saved


def read_state_file(path: Path, command: str) -> dict:
    """A checkpoint's saved run state (torch.load with weights_only: tensors and plain values, never code), refused
    when damaged or foreign (BadValue naming the folder, and what to do: resume from the checkpoint before it, or start
    over with `command`), never with torch's advice to load it unsafely."""
    redo = (f"it is damaged: remove {str(path.parent)!r} to resume from the checkpoint before it, or start over "
            f"(remove the run's checkpoints and run {command})")
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
        text = " ".join(str(error).split())
        reason = "it is not a checkpoint sinklib wrote" if isinstance(error, pickle.UnpicklingError) or \
            "weights_only" in text else (text[:200] or "it is empty or cut short")
        raise BadValue(f"checkpoint {str(path.parent)!r} is not allowed: its {path.name} cannot be read ({reason}); "
                       f"{redo}") from None
    if not isinstance(state, dict) or not isinstance(state.get("spec"), dict) or not isinstance(state.get("step"), int):
        raise BadValue(f"checkpoint {str(path.parent)!r} is not allowed: its {path.name} is not a run's training state "
                       f"(a recipe and a step); {redo}")
    return state


def write_whole(final: Path, write: Callable[[Path], None]) -> bool:
    """Make folder `final` whole or not at all: `write` fills final.partial (this function's own scratch name: one a
    killed run left is written over), which is then renamed. A `final` that exists is kept as it is (a resumed run
    reaches the step it resumed from again). Returns whether it was written."""
    if final.exists():
        return False
    scratch = final.with_name(final.name + ".partial")
    scratch.mkdir(parents=True, exist_ok=True)
    write(scratch)
    os.replace(scratch, final)
    return True


def state_header(spec: Any, state: RunState) -> dict:
    """What every checkpoint's state starts with: the recipe (a dataclass), the torch thread count (another count sums
    floats in another order: a resume must run on the same), the step and the curve so far."""
    return {"spec": asdict(spec), "threads": torch.get_num_threads(), "step": state.step, "curve": state.curve}


def card_record(name: str, spec: Any, curve: list[dict]) -> dict:
    """The training record both cards carry: name, recipe, steps trained, final loss, wall seconds."""
    return {"name": name, "spec": asdict(spec), "train_steps": len(curve), "final_loss": curve[-1]["loss"],
            "wall_seconds": curve[-1]["seconds"]}


def restores_torch_threads(function: Callable[..., T]) -> Callable[..., T]:
    """Give the process back its torch thread count when `function` returns or raises: training pins its own count
    (a loss curve's last bits depend on it), and whatever the caller runs next must not run on that count unasked
    (a test worker of one thread that trained a model computed on two, and its results no longer matched a fresh
    process's)."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper
