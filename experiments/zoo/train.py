"""Train the tiny zoo: one architecture, one data stream, three objectives.

tiny-llada  bidirectional, LLaDA's objective: response tokens masked with probability t ~ U(ε, 1),
            cross-entropy on masked tokens weighted 1/t (the prompt is never masked).
tiny-arm    the same blocks, causal, next-token loss.
tiny-dream  initialised from tiny-arm, bidirectional, Dream's shifted objective (masked position i is
            predicted from output i−1), weighted 1/t.
tiny-udlm   bidirectional, uniform noise instead of a mask token (UDLM's corruption): response tokens replaced with
            probability t ~ U(ε, 1) by tokens drawn uniformly from the vocabulary, cross-entropy of the clean token
            at every response position.
Each run is deterministic from its seed (data order, masking and initialisation).
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

from sinklib import compat
from sinklib.cache_manifest import check_shipped, sha256_of, write_shipped_manifest
from sinklib.validation import BadValue, Count, Index, bad_value, check_int, checked
from sinklib.zoo.recipes import GEN_LENGTH, ZOO, ZooSpec, recipe
from experiments.zoo.data import Problem, held_out, problems
from experiments.zoo.loop import (RunState, card_record, checkpoint_folder, read_state_file, restores_torch_threads, run,
                                  saved_checkpoints, state_header, write_whole)
from experiments.zoo.tokenizer import build_tokenizer, save_tokenizer

MASK_EPS = 1e-3
TRAINING_STATE = "training_state.pt"  # a zoo checkpoint's run state, beside its model.safetensors


def model_config(spec: ZooSpec, tokenizer) -> transformers.PretrainedConfig:
    """The spec's config: its sizes, the tokenizer's vocabulary and special ids, SDPA attention, is_causal as the
    spec says, and the sinklib family and [MASK] id recorded for loading. A Llama; with spec.gated_attention,
    Qwen3.5's full-attention blocks (a sigmoid gate on every head's output, computed from the block's input, and
    RMS-normed queries and keys) at the same sizes, rotary embedding and context."""
    sizes = dict(vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                 num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                 max_position_embeddings=128, tie_word_embeddings=True, is_causal=spec.causal,
                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa")
    if spec.gated_attention:
        config = transformers.Qwen3_5TextConfig(  # Llama's rotary embedding on every dimension, Llama's rms_norm_eps
            **sizes, head_dim=spec.hidden_size // spec.heads, layer_types=["full_attention"] * spec.layers,
            partial_rotary_factor=1.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    else:
        config = transformers.LlamaConfig(**sizes)
    config.sinklib_family = spec.family
    config.mask_token_id = tokenizer.mask_token_id
    return config


def model_class(spec: ZooSpec) -> type:
    """The transformers class of the spec's model: Qwen3.5's causal LM (text only) for gated attention, else Llama's."""
    return transformers.Qwen3_5ForCausalLM if spec.gated_attention else transformers.LlamaForCausalLM


@dataclass
class Batch:
    """One training batch: left-padded prompts, each followed by its GEN_LENGTH response slot; attention_mask and
    position_ids are [B, S]."""

    ids: torch.Tensor  # [B, S] left-padded prompt + GEN_LENGTH response slot
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response: torch.Tensor  # bool [B, S]: the response slot
    first_eos: torch.Tensor  # bool [B, S]: response tokens up to and including the first [EOS]


def make_batch(items: list[Problem], tokenizer) -> Batch:
    """The problems as a Batch: each response and its [EOS], filled to GEN_LENGTH tokens with [EOS]; a response
    that does not fit is refused."""
    rows, prompt_lens = [], []
    for problem in items:
        prompt = tokenizer(problem.question)["input_ids"]
        answer = tokenizer(problem.response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(answer) > GEN_LENGTH:
            raise BadValue(f"response of {len(answer)} tokens does not fit GEN_LENGTH={GEN_LENGTH}: {problem.response!r}")
        rows.append((prompt, answer + [tokenizer.eos_token_id] * (GEN_LENGTH - len(answer)), len(answer)))
        prompt_lens.append(len(prompt))
    width = max(prompt_lens) + GEN_LENGTH
    batch = len(items)
    ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    first_eos = torch.zeros((batch, width), dtype=torch.bool)
    for row, (prompt, answer, answer_len) in enumerate(rows):
        sequence = prompt + answer
        ids[row, width - len(sequence):] = torch.tensor(sequence)
        attention[row, width - len(sequence):] = 1
        first_eos[row, width - GEN_LENGTH:width - GEN_LENGTH + answer_len] = True
    response = torch.zeros((batch, width), dtype=torch.bool)
    response[:, -GEN_LENGTH:] = True
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch(ids, attention, positions, response, first_eos)


def _model_mask(model, batch: Batch) -> torch.Tensor:
    """Bidirectional models get 4D key-padding masks, which every transformers version honours."""
    return compat.bidirectional_key_mask(batch.attention_mask) if compat.is_bidirectional(model.config) else batch.attention_mask


def masked_diffusion_loss(model, batch: Batch, mask_id: int, generator: torch.Generator, shifted: bool,
                          stratified: bool = False, mask_prompt: bool = False) -> torch.Tensor:
    """LLaDA (shifted=False) / Dream (shifted=True): Σ over masked response tokens of CE / t, per response token.
    mask_prompt: in the odd rows the prompt's tokens after [BOS] are masked with the same t and predicted too (the
    sum is still divided by the response tokens, so that loss is not on the same scale as the shipped recipe's)."""
    rows = batch.ids.shape[0]
    u = torch.rand(rows, 1, generator=generator)
    if stratified:
        u = (torch.arange(rows, dtype=torch.float32)[:, None] + u) / rows
    t = MASK_EPS + (1 - MASK_EPS) * u
    maskable = batch.response
    if mask_prompt:
        odd_rows = (torch.arange(rows) % 2 == 1)[:, None]
        maskable = maskable | (odd_rows & (batch.attention_mask == 1) & (batch.position_ids > 0))
    masked = maskable & (torch.rand(batch.ids.shape, generator=generator) < t)
    noisy = batch.ids.masked_fill(masked, mask_id)
    logits = model(input_ids=noisy, attention_mask=_model_mask(model, batch), position_ids=batch.position_ids).logits
    if shifted:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.ids, reduction="none")
    weighted = (losses * masked / t).sum()
    return weighted / (rows * GEN_LENGTH)


def uniform_noise_loss(model, batch: Batch, vocab_size: int, generator: torch.Generator,
                       stratified: bool = False) -> torch.Tensor:
    """tiny-udlm: each response token replaced, with probability t ~ U(ε, 1) per row, by a token drawn uniformly from
    ids 0..vocab_size − 1 (what its sampler's noise is drawn from); the cross-entropy of the clean token at every
    response position, replaced or not (the model cannot tell which were), averaged over the response tokens. The
    plain clean-token loss, not UDLM's ELBO weighting (which weighs a position by t and the vocabulary size): the
    same loss at every t as tiny-llada's 1/t-weighted one is in expectation over its masked tokens."""
    rows = batch.ids.shape[0]
    u = torch.rand(rows, 1, generator=generator)
    if stratified:
        u = (torch.arange(rows, dtype=torch.float32)[:, None] + u) / rows
    t = MASK_EPS + (1 - MASK_EPS) * u
    replaced = batch.response & (torch.rand(batch.ids.shape, generator=generator) < t)
    noise = torch.randint(0, vocab_size, batch.ids.shape, generator=generator)
    noisy = torch.where(replaced, noise, batch.ids)
    logits = model(input_ids=noisy, attention_mask=_model_mask(model, batch), position_ids=batch.position_ids).logits
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.ids, reduction="none")
    return (losses * batch.response).sum() / (rows * GEN_LENGTH)


def next_token_loss(model, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy (tiny-arm), averaged over the response tokens up to and including the first [EOS]."""
    logits = model(input_ids=batch.ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    targets = batch.ids[:, 1:].masked_fill(~batch.first_eos[:, 1:], -100)
    return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100)


def build_model(spec: ZooSpec, tokenizer, zoo_dir: Path) -> transformers.PreTrainedModel:
    """A new model initialised from spec.seed, or with the weights of the zoo model saved as spec.init_from in
    zoo_dir; bidirectional attention on every transformers version when the spec is not causal."""
    torch.manual_seed(spec.seed)
    model = model_class(spec)(model_config(spec, tokenizer))
    if spec.init_from is not None:
        source = zoo_dir / spec.init_from
        if not (source / "model.safetensors").exists():
            raise FileNotFoundError(f"{spec.name} starts from {spec.init_from}'s weights: train {spec.init_from} first "
                                    f"(python -m experiments.zoo train {spec.init_from})")
        # the donor as its training wrote it (its manifest), as sinklib.load reads a zoo model
        check_shipped(source, spec.init_from, f"python -m experiments.zoo train {spec.init_from}", "init_from")
        donor = model_class(spec).from_pretrained(source)
        model.load_state_dict(donor.state_dict())
    compat.make_bidirectional(model)
    return model


def objective_loss(spec: ZooSpec, model, batch, mask_id: int, generator: torch.Generator) -> torch.Tensor:
    """The spec's training loss on one batch: next-token (arm), uniform-noise diffusion (udlm) or masked diffusion
    (llada; dream shifted)."""
    if spec.objective == "arm":
        return next_token_loss(model, batch)
    if spec.objective == "udlm":
        return uniform_noise_loss(model, batch, model.config.vocab_size, generator, stratified=spec.stratified_t)
    return masked_diffusion_loss(model, batch, mask_id, generator, shifted=spec.objective == "dream",
                                 stratified=spec.stratified_t, mask_prompt=spec.mask_prompt)


def _save_checkpoint(folder: Path, spec: ZooSpec, model, optimizer, generator: torch.Generator,
                     state: RunState) -> None:
    """The model (safetensors, loadable by sinklib.load), its tokenizer and the run's state (recipe, thread count,
    loss curve so far, optimiser moments, masking generator) as folder/step-NNNNN, whole or absent (loop.write_whole;
    one that exists is kept)."""
    def write(scratch: Path) -> None:
        model.save_pretrained(scratch)
        save_tokenizer(scratch)
        torch.save({**state_header(spec, state), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                    "weights_sha256": sha256_of(scratch / "model.safetensors")}, scratch / TRAINING_STATE)

    write_whole(checkpoint_folder(folder, state.step), write)


def checked_checkpoint(path: Path, name: str, step: int) -> dict:
    """The saved run state of checkpoint folder `path`, refused (ValueError naming the folder and what to do) unless
    it holds recipe `name`'s weights after `step` optimiser updates, whole: its state names the recipe and the step
    (a folder copied or linked under another step's name is caught) and the sha256 of the weights it was saved with
    (a cut or edited weights file is caught; a checkpoint saved before the hash was kept has its safetensors header
    checked against the file's length)."""
    redo = f"remove {path} and retrain it (python -m experiments.zoo over-training {name})"
    weights, state_file = path / "model.safetensors", path / TRAINING_STATE
    if not weights.is_file() or not state_file.is_file():
        raise BadValue(f"checkpoint {str(path)!r} is not allowed: it lacks "
                       f"{'model.safetensors' if not weights.is_file() else TRAINING_STATE}; {redo}")
    saved = read_state_file(state_file, f"python -m experiments.zoo over-training {name}")
    if saved["spec"].get("name") != name:
        raise BadValue(f"checkpoint {str(path)!r} is not allowed: recipe {saved['spec'].get('name')!r} saved it, "
                       f"not {name!r}; give {name}'s checkpoints folder")
    if saved["step"] != step:
        raise BadValue(f"checkpoint {str(path)!r} is not allowed: it holds the weights after step {saved['step']}, "
                       f"not {step} (a folder copied or linked under another step's name); {redo}")
    recorded = saved.get("weights_sha256")
    whole = sha256_of(weights) == recorded if recorded else _safetensors_whole(weights)
    if not whole:
        raise BadValue(f"checkpoint {str(path)!r} is not allowed: its model.safetensors is not the file it was saved "
                       f"with (cut or edited); {redo}")
    return saved


def _safetensors_whole(path: Path) -> bool:
    """Whether a safetensors file is as long as its header says (8-byte header length, header, then the data)."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        try:
            header = json.loads(handle.read(size))
        except (ValueError, UnicodeDecodeError):
            return False
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    return path.stat().st_size == 8 + size + max(ends, default=0)


def training_state(path: Path, spec: ZooSpec | None = None, threads: int | None = None) -> dict:
    """A checkpoint's saved run state; with `spec` / `threads`, refused unless it was saved by that recipe and
    thread count (another thread count sums floats in another order: the run would not have the same bits)."""
    saved = read_state_file(path / TRAINING_STATE, f"python -m experiments.zoo over-training "
                            f"{spec.name if spec is not None else path.parent.name}")
    if spec is not None and saved["spec"] != asdict(spec):
        raise BadValue(f"checkpoints={str(path.parent)!r} is not allowed: {path.name} was saved by another recipe "
                       f"({saved['spec']}), not {asdict(spec)}; give an empty folder or that recipe's")
    if threads is not None and saved.get("threads", threads) != threads:
        raise BadValue(f"threads={threads} is not allowed: {path} was trained with threads={saved['threads']}, and "
                       "another thread count would not continue it with the same bits")
    return saved


def _resume(path: Path, spec: ZooSpec, threads: int, model, optimizer, generator: torch.Generator) -> RunState:
    """Load a checkpoint's weights, optimiser moments and masking generator into the run."""
    saved = training_state(path, spec, threads)
    model.load_state_dict(model_class(spec).from_pretrained(path).state_dict())
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    return RunState(step=saved["step"], curve=saved["curve"])


def _resume_point(checkpoints: Path | None, checkpoint_at: tuple[int, ...], total: int) -> Path | None:
    """The checkpoint to go on from: the latest one not past the first asked-for checkpoint that is missing (or
    past the end, when none is missing), so that every asked-for checkpoint gets made."""
    saved = saved_checkpoints(checkpoints, TRAINING_STATE)
    missing = [step for step in checkpoint_at if step <= total and step not in saved]
    limit = min(missing, default=total)
    usable = [step for step in saved if step <= limit]
    return saved[max(usable)] if usable else None


def _checked_run(spec: ZooSpec, steps: int | None, checkpoints: Path | None, checkpoint_at: tuple[int, ...]) -> int:
    """The steps to run, refusing before any work: more steps than the recipe's (past spec.steps the cosine schedule
    turns back up: a longer run is another recipe, spec=dataclasses.replace(recipe(name), steps=...)), checkpoints
    asked at steps this run never reaches, or asked without a folder to save them in."""
    total = spec.steps if steps is None else check_int(steps, "steps", 1, spec.steps)
    unreached = sorted(step for step in checkpoint_at if step > total)
    if unreached:
        raise bad_value("checkpoint_at", checkpoint_at,
                        f"steps this run reaches, 0 to {total} ({unreached} would never be saved; a run stopped early "
                        "with steps= saves the ones it reaches, and the run that resumes it asks for the rest)")
    if checkpoint_at and checkpoints is None:
        raise bad_value("checkpoint_at", checkpoint_at, "() when checkpoints is None (a folder to save them in)")
    return total


@checked
@restores_torch_threads
def train(name: str, zoo_dir: Path, steps: Count | None = None, progress: bool = True, threads: Count = 2,
          curve_path: Path | None = None, spec: ZooSpec | None = None, checkpoints: Path | None = None,
          checkpoint_at: tuple[Index, ...] = ()) -> tuple[transformers.PreTrainedModel, list[dict]]:
    """Train one zoo model from its seed; returns the model and the loss curve (one row per step).

    `spec` replaces the recipe of `name` (train.recipe) for experiments with other settings. `steps` stops the run
    early (at most the recipe's steps: the learning-rate schedule is the recipe's). With `checkpoints`, the weights
    are saved to checkpoints/step-NNNNN after each step count in `checkpoint_at` (0: the initialisation; each at
    most the steps this run makes), and a run that finds checkpoints there goes on from the latest one before the
    first missing one and not past `steps`: the same batches, masks and updates as an uninterrupted run with the same
    thread count (a checkpoint of another recipe or thread count is refused). The donor of spec.init_from is read
    from zoo_dir."""
    spec = recipe(name) if spec is None else spec
    total = _checked_run(spec, steps, checkpoints, checkpoint_at)
    latest = _resume_point(checkpoints, checkpoint_at, total)  # a misnamed checkpoint folder refused before any work
    torch.set_num_threads(threads)
    tokenizer = build_tokenizer()
    model = build_model(spec, tokenizer, zoo_dir).train()
    # the zoo's optimiser (the twins' differ): every weight trains from scratch, so weight decay and β2 0.98
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    # one masking generator and one data stream for the whole run (a twin's step k draws from its own seed instead):
    # a checkpoint carries the generator's state, and a resumed run skips the batches already drawn
    generator = torch.Generator().manual_seed(spec.seed)
    state = _resume(latest, spec, threads, model, optimizer, generator) if latest else RunState(step=0, curve=[])
    stream = problems(spec.seed, {p.question for p in held_out()})
    for _ in range(state.step * spec.batch_size):  # the batches the checkpoint has already seen
        next(stream)

    def step_loss(step: int) -> tuple[torch.Tensor, dict]:
        batch = make_batch([next(stream) for _ in range(spec.batch_size)], tokenizer)
        return objective_loss(spec, model, batch, tokenizer.mask_token_id, generator), {}

    def checkpoint(done: int) -> None:
        if checkpoints is not None and done in checkpoint_at:
            _save_checkpoint(checkpoints, spec, model, optimizer, generator, RunState(done, state.curve))

    with _CurveWriter(curve_path, state.curve) as writer:
        run(spec, optimizer, state, total, step_loss, checkpoint, f"train {name}", progress, writer.add)
    return model.eval(), state.curve


class _CurveWriter:
    """Appends loss-curve rows to a list and, when given a path, to a CSV (rewritten from the list on entry, so a
    resumed run's file holds each step once)."""

    def __init__(self, path: Path | None, curve: list[dict]):
        self.path, self.curve, self.handle = path, curve, None

    def __enter__(self) -> _CurveWriter:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = self.path.open("w", newline="")
            self.csv = csv.writer(self.handle)
            self.csv.writerow(["step", "loss", "lr", "seconds"])
            for row in self.curve:
                self._write(row)
        return self

    def _write(self, row: dict) -> None:
        self.csv.writerow([row["step"], repr(row["loss"]), repr(row["lr"]), row["seconds"]])

    def add(self, row: dict) -> None:
        self.curve.append(row)
        if self.handle is not None:
            self._write(row)
            if row["step"] % 50 == 0:
                self.handle.flush()

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.close()


def save(name: str, model, zoo_dir: Path, curve: list[dict], extra: dict) -> Path:
    """Write the model, its tokenizer, their manifest (cache_manifest.write_shipped_manifest) and card.json (spec,
    steps trained, final loss, wall seconds, parameter count, then `extra`) to zoo_dir/name; returns that folder."""
    folder = zoo_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    write_shipped_manifest(folder, name)  # what every load checks the folder against (not the card, written next)
    card = {**card_record(name, ZOO[name], curve), "parameters": sum(p.numel() for p in model.parameters()), **extra}
    (folder / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True))
    return folder
