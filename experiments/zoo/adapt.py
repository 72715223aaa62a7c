"""SmolLM2-135M-Instruct adapted to masked diffusion, beside its autoregressive twin (the zoo's design on a real model).

smollm2-135m-autoregressive SmolLM2 fine-tuned on the task: causal, next-token loss on the answer and its first
                            `<|im_end|>` (600 steps × 16 problems).
smollm2-135m-diffusion      Dream's route at 135M, in two runs. Dream-7B is Qwen2.5-7B, a trained autoregressive
                            model, adapted to masked diffusion; `smollm2-135m-diffusion-v1` is the autoregressive
                            twin adapted the same way (its shipped adapter is where v1 starts, `init_from`):
                            DiffuLLaMA's attention annealing (causal ∪ a Bernoulli(r) share of the other keys, r rising
                            to 1 over the first 150 steps, then full bidirectional attention), an unused special id as
                            the mask token (16, `<empty_output>`: the tied embeddings need no resize), Dream's shifted
                            prediction (output i−1 predicts token i, so the pretrained head keeps its meaning) and
                            LLaDA's SFT loss: the prompt is never masked, the answer slot (padded with `<|im_end|>`) is
                            masked at t ~ U(ε, 1) and its masked tokens' cross-entropy is weighted 1/t (1000 steps × 16
                            problems, the forward under bf16 autocast; 0.67 of 200 held out). The shipped twin
                            continues from v1's adapter for 1,600 steps with complementary masks (each problem twice
                            in a batch, masked with m and with its complement, so every answer token is supervised),
                            fresh problems (seed 22) and the new-arithmetic split's work strings left out of training
                            (0.80 of 500 new questions).

Measured choices (the session notes give the numbers): started from the base with bidirectional attention at once
(dllm's Tiny-A2D), 600 steps gave 0.05 held out; from the autoregressive twin without annealing, 0 of 20 at step
100 against 0.25 with it, so that run was stopped; with annealing, 400 steps gave 0.17 of 200 (teacher-forced it
computed the tens digit of every sum but not the units: it was undertrained, not wrongly decoded), and 1000 steps in
bf16 (1.5× faster per step: benchmarks/adapt_precision.py) 0.20 of 20 at step 200, 0.45 at step 400.
Both train a LoRA adapter (`peft`, every linear layer of every
block) on the frozen base, which comes from the offline GGUF through `sinklib.load("smollm2-135m-instruct")`; only
the adapter (safetensors) ships in data/models/NAME/. The task is the zoo's arithmetic in plain English, read
through SmolLM2's own chat template (as sinklib.generate prompts a chat model), answered as "a + b = c #### c".
Runs are deterministic from their seed and thread count, and resume from their checkpoints with the same bits (the
batch of step k, its masks and its annealed attention are functions of the seed and k).
"""
from __future__ import annotations

import functools
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from sinklib import compat
from sinklib.cache_manifest import fingerprint, weights_fingerprint, write_shipped_manifest
from sinklib.loading import load
from sinklib.provenance import describe
from sinklib.stats import paired
from sinklib.validation import (BadValue, Count, Flag, Index, Positive, Text, bad_value, check_choice, check_int,
                                validated)
from sinklib.named import ADAPTED_MODELS, TWIN_CHAT_TEMPLATE, check_adapter, quiet_peft
from sinklib.paths import DATA_DIR, ZOO_DIR
from sinklib.evaluation.tasks import plain
from sinklib.zoo import over_training
from experiments.zoo import retrain
from experiments.zoo.data import Problem, held_out, held_out_by_work, problems, read_jsonl, story
from experiments.zoo.evaluate import accuracy, by_template
from experiments.zoo.loop import (RunState, card_record, checkpoint_folder, read_state_file, restores_torch_threads, run,
                                  saved_checkpoints, state_header, write_whole)

BASE = ADAPTED_MODELS["smollm2-135m-diffusion"].base
MASK_ID = ADAPTED_MODELS["smollm2-135m-diffusion"].mask_id  # 16, `<empty_output>`: unused by SmolLM2's chat template
CHAT_TEMPLATE = TWIN_CHAT_TEMPLATE
END_ID = 2  # `<|im_end|>`: the end of an answer, and the slot's padding
MASK_EPS = 1e-3
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CHECKPOINT_ROOT = DATA_DIR / "checkpoints"  # not committed: a run's resumable state
HELD_OUT_RESULTS = DATA_DIR / "results" / "held-out"  # committed: the cards' and learning curves' per-problem records
STATE_FILE = "state.pt"  # a twin checkpoint's whole content: adapter weights, optimiser moments, recipe, curve


@validated
@dataclass(frozen=True)
class AdaptSpec:
    """One adapted SmolLM2's recipe: objective ("dream": masked diffusion, shifted; "arm": next token), seed, optimiser
    steps and batch, the LoRA adapter's rank and scale, and the answer slot's length in tokens (answer, `<|im_end|>`,
    then `<|im_end|>` padding)."""
    name: Text
    objective: str
    seed: Index = 21
    steps: Count = 600
    batch_size: Count = 16
    lr: Positive = 1e-3
    warmup: Index = 30
    lora_rank: Count = 16
    lora_alpha: Count = 32
    slot: Count = 28
    checkpoint_every: Count = 50  # optimiser steps between resumable checkpoints
    init_from: str | None = None  # a twin whose shipped adapter this one starts from (Dream: from a trained AR model)
    anneal_steps: Index = 0  # DiffuLLaMA's attention annealing (0: bidirectional from the first step)
    # "elbo": LLaDA's SFT estimator, Σ CE / t over the masked tokens ÷ the slot tokens (a row may mask none);
    # "elbo-forced": the same with at least one token masked per row (the shipped twin's recipe: its rows at small t
    # then weigh 1/t each, and dominate the clipped gradient); "flat": the mean CE over the masked tokens (no 1/t)
    weighting: str = "elbo"
    # "bfloat16": the forward and loss under CPU autocast (float32 master weights and optimiser, as Dream trains in
    # bf16); 1.5× faster per step on an AVX-512 BF16 CPU, measured side by side in benchmarks/adapt_precision.py
    precision: str = "float32"
    # Fast-dLLM v2's complementary masks: each problem twice in a batch, masked with m and with its complement, so
    # every answer token is supervised once per pair (batch_size rows then hold batch_size // 2 problems)
    complementary: Flag = False
    # hold out by arithmetic too: no training problem shares a work string with data.held_out_by_work's split
    hold_out_work: Flag = False

    def check(self) -> None:
        """The choices by name (objective, weighting, precision; "did you mean"), and complementary masks only for a
        diffusion objective with an even batch (each problem twice)."""
        check_choice(self.objective, "objective", OBJECTIVES)
        check_choice(self.weighting, "weighting", WEIGHTINGS)
        check_choice(self.precision, "precision", PRECISIONS)
        if self.complementary and (self.objective != "dream" or self.batch_size % 2 or self.weighting == "elbo-forced"):
            raise bad_value("complementary", self.complementary,
                            f"False unless objective='dream', batch_size is even and weighting is not 'elbo-forced' "
                            f"(a forced token would be masked in both rows of a pair; got {self.objective!r}, "
                            f"{self.batch_size}, {self.weighting!r})")


OBJECTIVES = ("dream", "arm")  # AdaptSpec.objective: masked diffusion (Dream's shifted loss) or next token
WEIGHTINGS = ("elbo", "elbo-forced", "flat")  # AdaptSpec.weighting: how diffusion_loss weighs the masked tokens
PRECISIONS = ("float32", "bfloat16")  # AdaptSpec.precision: the training forward's compute dtype

TWINS = {
    "smollm2-135m-autoregressive": AdaptSpec("smollm2-135m-autoregressive", "arm"),
    # the first diffusion twin (0.67 of 200 held out), kept under this name while its rows are still shown
    "smollm2-135m-diffusion-v1": AdaptSpec("smollm2-135m-diffusion-v1", "dream", steps=1000, lr=5e-4, warmup=20,
                                           init_from="smollm2-135m-autoregressive", anneal_steps=150,
                                           weighting="elbo-forced", precision="bfloat16"),
    # the first twin trained on: complementary masks, fresh problems (seed 22), the work split held out
    "smollm2-135m-diffusion": AdaptSpec("smollm2-135m-diffusion", "dream", seed=22, steps=1600, lr=3e-4, warmup=20,
                                        init_from="smollm2-135m-diffusion-v1", weighting="elbo",
                                        precision="bfloat16", complementary=True, hold_out_work=True),
}


def prompt_ids(tokenizer, problem: Problem) -> list[int]:
    """The prompt as sinklib.generate builds it for the twins: their chat template, one user turn."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": plain(problem.question)}],
                                        add_generation_prompt=True, tokenize=True, chat_template=CHAT_TEMPLATE)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def answer_ids(tokenizer, problem: Problem, slot: int) -> tuple[list[int], int]:
    """(the answer slot's ids: the response, `<|im_end|>`, then `<|im_end|>` padding to `slot`; the answer's length
    with its first `<|im_end|>`)."""
    answer = tokenizer(problem.response, add_special_tokens=False)["input_ids"] + [END_ID]
    if len(answer) > slot:
        raise BadValue(f"slot={slot} is too short for {problem.response!r} ({len(answer)} tokens)")
    return answer + [END_ID] * (slot - len(answer)), len(answer)


@dataclass
class Batch:
    """Right-padded rows of prompt + answer slot: ids, attention_mask [B, S]; slot and answer (bool [B, S]: the
    whole slot; the answer up to its first `<|im_end|>`)."""
    ids: torch.Tensor
    attention_mask: torch.Tensor
    slot: torch.Tensor
    answer: torch.Tensor


def make_batch(items: list[Problem], tokenizer, slot: int) -> Batch:
    """The problems as one right-padded Batch."""
    rows = []
    for problem in items:
        prompt = prompt_ids(tokenizer, problem)
        filled, answer_len = answer_ids(tokenizer, problem, slot)
        rows.append((prompt, filled, answer_len))
    width = max(len(p) + slot for p, _, _ in rows)
    batch = Batch(torch.full((len(rows), width), END_ID), torch.zeros((len(rows), width), dtype=torch.long),
                  torch.zeros((len(rows), width), dtype=torch.bool), torch.zeros((len(rows), width), dtype=torch.bool))
    for row, (prompt, filled, answer_len) in enumerate(rows):
        start = len(prompt)
        batch.ids[row, :start + slot] = torch.tensor(prompt + filled)
        batch.attention_mask[row, :start + slot] = 1
        batch.slot[row, start:start + slot] = True
        batch.answer[row, start:start + answer_len] = True
    return batch


def batch_problems(spec: AdaptSpec, step: int, exclude: frozenset[str],
                   exclude_work: frozenset[str] = frozenset()) -> list[Problem]:
    """The problems of optimiser step `step`: a function of the seed and the step alone (a resumed run draws the same),
    none with a question in `exclude` or a work string in `exclude_work`; with complementary masks each problem
    twice, side by side."""
    stream = (p for p in problems(spec.seed * 1_000_003 + step, exclude) if p.work not in exclude_work)
    if spec.complementary:
        return [p for p in (next(stream) for _ in range(spec.batch_size // 2)) for _ in range(2)]
    return [next(stream) for _ in range(spec.batch_size)]


def seen_work(spec: AdaptSpec) -> frozenset[str]:
    """Every work string a twin's training saw, its starting adapter's lineage included (init_from, recursively)."""
    exclude = frozenset(p.question for p in held_out())
    own = frozenset(p.work for step in range(spec.steps) for p in batch_problems(spec, step, exclude))
    return own | (seen_work(TWINS[spec.init_from]) if spec.init_from else frozenset())


def lineage(spec: AdaptSpec) -> list[AdaptSpec]:
    """The recipe and each it started from (init_from, recursively), the recipe first."""
    return [spec, *(lineage(TWINS[spec.init_from]) if spec.init_from else [])]


def text_split_overlap(name: str, n: int) -> dict:
    """How "held out" the first n problems of the new-text split are from twin `name` and the runs it started from
    (lineage): none of their questions was trained on, but some share a trained problem's story once the
    distractor sentences are left out (data.story), and more its template and work string (the operands). Returns
    {"n", "lineage", "same_question", "same_story", "same_template_and_work"}: counts of the n problems."""
    chain = lineage(TWINS[check_choice(name, "name", TWINS)])
    questions, stories, works = set(), set(), set()
    for spec in chain:
        exclusions = training_exclusions(spec)
        for step in range(spec.steps):
            for problem in batch_problems(spec, step, *exclusions):
                questions.add(problem.question)
                stories.add(story(problem.question))
                works.add((problem.template, problem.work))
    items = read_jsonl(DATA_DIR / CARD_SPLITS["text"][1])[:n]
    return {"n": len(items), "lineage": [spec.name for spec in chain],
            "same_question": sum(p.question in questions for p in items),
            "same_story": sum(story(p.question) in stories for p in items),
            "same_template_and_work": sum((p.template, p.work) in works for p in items)}


def work_split(n: int = 600) -> list[Problem]:
    """The held-out split by arithmetic shared by every twin: problems whose work string no twin's training saw (the
    recipes that hold it out exclude it; the others are in `seen_work`)."""
    past = frozenset().union(*(seen_work(spec) for spec in TWINS.values() if not spec.hold_out_work))
    return held_out_by_work(past, n)


def training_exclusions(spec: AdaptSpec) -> tuple[frozenset[str], frozenset[str]]:
    """(questions, work strings) a recipe's training never draws: the text split's questions, and with hold_out_work
    the work split's questions and work strings."""
    questions = frozenset(p.question for p in held_out())
    if not spec.hold_out_work:
        return questions, frozenset()
    split = work_split()
    shipped = read_jsonl(DATA_DIR / "arithmetic_unseen_work_test.jsonl")
    if split != shipped:  # work_split depends on every recipe in TWINS: a new or edited one would move it
        raise BadValue(f"recipe {spec.name!r} holds out data/arithmetic_unseen_work_test.jsonl, but work_split() no "
                       "longer computes it (a twin recipe was added or edited): a resumed run would train on other "
                       "problems; restore the recipes, or rewrite the split (python -m experiments.zoo data) and retrain")
    return questions | {p.question for p in split}, frozenset(p.work for p in split)


def _hidden(model, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model.get_base_model().model(input_ids=ids, attention_mask=attention_mask).last_hidden_state


def annealed_mask(attention_mask: torch.Tensor, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """DiffuLLaMA's annealed attention, as a [B, 1, S, S] bool mask: every query sees the causal keys and, beyond
    them, each key with probability `ratio` (one draw shared by the batch and the heads, as upstream), and never a
    padding key. ratio 1 is full bidirectional attention."""
    width = attention_mask.shape[-1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    extra = torch.rand(width, width, generator=generator) < ratio
    return compat.bidirectional_key_mask(attention_mask) & (causal | extra)


def attention_ratio(spec: AdaptSpec, step: int) -> float:
    """The share of non-causal keys a query sees at optimiser step `step`: (step + 1) / anneal_steps, then 1."""
    return 1.0 if spec.anneal_steps == 0 else min(1.0, (step + 1) / spec.anneal_steps)


def diffusion_loss(model, batch: Batch, generator: torch.Generator, ratio: float = 1.0,
                   weighting: str = "elbo", complementary: bool = False) -> torch.Tensor:
    """Dream's shifted masked-diffusion loss on the answer slot (the prompt never masked, as LLaDA's SFT): per row
    t = (i + u) / B (stratified, the same U(0, 1) marginal), each slot token masked with probability t. `weighting`
    "elbo" is LLaDA's unbiased estimator, Σ CE / t over the masked tokens divided by the slot tokens; "flat" is the
    mean CE over the masked tokens; "elbo-forced" masks at least one token per row first. The LM head runs only where
    a masked token is predicted (position − 1).
    `ratio`: the annealed attention's share of non-causal keys (1: bidirectional). `complementary`: rows come in
    pairs of one problem, the second masked exactly where the first is not (t pairs stratified in (ε, 1 − ε); each
    row's 1/t is its own masking rate)."""
    rows = batch.ids.shape[0]
    if complementary:  # rows 2i and 2i+1 hold one problem: masked where draw < t, and exactly the rest (rate 1 − t)
        pairs = rows // 2
        u = torch.rand(pairs, 1, generator=generator)
        t_pair = MASK_EPS + (1 - 2 * MASK_EPS) * (torch.arange(pairs, dtype=torch.float32)[:, None] + u) / pairs
        draw_pair = torch.rand(pairs, batch.ids.shape[1], generator=generator)
        t = torch.stack([t_pair, 1 - t_pair], 1).reshape(rows, 1)
        draw = torch.stack([draw_pair, 1 - draw_pair], 1).reshape(rows, -1)
    else:
        u = torch.rand(rows, 1, generator=generator)
        t = MASK_EPS + (1 - MASK_EPS) * (torch.arange(rows, dtype=torch.float32)[:, None] + u) / rows
        draw = torch.rand(batch.ids.shape, generator=generator)
    masked = batch.slot & (draw < t)
    if weighting == "elbo-forced":  # a row with nothing masked masks its least-drawn slot token
        lowest = draw.masked_fill(~batch.slot, 2.0).argmin(-1)
        masked[torch.arange(rows), lowest] |= ~masked.any(-1)
    noisy = batch.ids.masked_fill(masked, MASK_ID)
    mask = (compat.bidirectional_key_mask(batch.attention_mask) if ratio >= 1.0
            else annealed_mask(batch.attention_mask, ratio, generator))
    hidden = _hidden(model, noisy, mask)
    row, col = masked.nonzero(as_tuple=True)
    logits = model.get_base_model().lm_head(hidden[row, col - 1])
    losses = torch.nn.functional.cross_entropy(logits.float(), batch.ids[row, col], reduction="none")
    if weighting == "flat":
        return losses.mean()
    return (losses / t[row, 0]).sum() / batch.slot.sum()


def next_token_loss(model, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy over the answer and its first `<|im_end|>` (the LM head only where they are predicted)."""
    hidden = _hidden(model, batch.ids, batch.attention_mask)
    row, col = batch.answer.nonzero(as_tuple=True)
    logits = model.get_base_model().lm_head(hidden[row, col - 1])
    return torch.nn.functional.cross_entropy(logits.float(), batch.ids[row, col])


def lora_config(spec: AdaptSpec):
    """The adapter: LoRA of spec.lora_rank on every linear layer of every block, no dropout (so a run is a function
    of its seed)."""
    import peft  # noqa: PLC0415  (optional heavy dependency: only training and loading an adapter need it)

    return peft.LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=0.0,
                           target_modules=list(LORA_TARGETS), bias="none", task_type="CAUSAL_LM")


def base_model():
    """SmolLM2-135M-Instruct from the offline GGUF (converted once by sinklib.named), float32, with its tokenizer."""

    loaded = load(BASE)
    return loaded.model, loaded.tokenizer


def build(spec: AdaptSpec):
    """(the base with a fresh adapter initialised from spec.seed, bidirectional for a diffusion objective; tokenizer)."""
    import peft  # noqa: PLC0415  (optional heavy dependency)

    if spec.init_from is not None and spec.init_from not in TWINS:  # a zoo model has no adapter to start from
        raise bad_value("init_from", spec.init_from, f"None or one of the twins {sorted(TWINS)}")
    model, tokenizer = base_model()
    if spec.objective == "dream":
        model.config.is_causal = False
        compat.make_bidirectional(model)
    torch.manual_seed(spec.seed)
    with quiet_peft():
        adapted = peft.get_peft_model(model, lora_config(spec))
    if spec.init_from is not None:
        _load_shipped_adapter(adapted, spec.init_from)
    return adapted, tokenizer


def _load_shipped_adapter(model, name: str) -> None:
    """Start `model`'s adapter from the one twin `name` ships (data/models/NAME), as Dream starts from Qwen2.5."""
    import peft  # noqa: PLC0415  (optional heavy dependency)
    from safetensors.torch import load_file  # noqa: PLC0415  (only a recipe that starts from a twin reads one)

    # as its training wrote it (its manifest), before peft reads it: the same check sinklib.load makes
    spec = ADAPTED_MODELS[check_choice(name, "init_from", sorted(ADAPTED_MODELS))]
    source = check_adapter(spec, param="init_from") / "adapter_model.safetensors"
    result = peft.set_peft_model_state_dict(model, load_file(str(source)))
    if result.unexpected_keys:
        raise BadValue(f"init_from={name!r}: its adapter has keys this recipe's has not: {result.unexpected_keys[:3]}")


def _load_weights(model, weights: dict[str, torch.Tensor]) -> None:
    """Copy a checkpoint's adapter weights into `model`'s parameters of the same names."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def read_state(path: Path, name: str) -> dict:
    """A checkpoint's state.pt, read as tensors and plain values only (never unpickling code); a damaged or foreign
    file is refused naming it, with the fix (resume from the checkpoint before it, or start over), never torch's
    advice to load it unsafely (loop.read_state_file)."""
    return read_state_file(path, f"python -m experiments.zoo adapt {name}")


def checked_state(folder: Path, name: str, step: int) -> dict:
    """The saved state of twin `name`'s checkpoint after `step` optimiser steps in `folder`, refused (ValueError naming
    it) unless it is whole and says it is that recipe's at that step (a folder copied or linked under another step's
    name, or another twin's, is caught)."""
    path = checkpoint_folder(folder, step) / STATE_FILE
    state = read_state(path, name)
    if state["spec"].get("name") != name or state["step"] != step:
        raise BadValue(f"checkpoint {str(path.parent)!r} is not allowed: it holds {state['spec'].get('name')!r} after "
                       f"step {state['step']}, not {name!r} after step {step}")
    return state


def _save_checkpoint(folder: Path, spec: AdaptSpec, model, optimizer, state: RunState) -> bool:
    """Adapter weights, optimiser moments, recipe, thread count and curve as folder/step-NNNNN/state.pt, whole or
    absent (loop.write_whole; one that exists is kept). Returns whether it was written. No generator state: a twin's
    step k draws from its own seed."""
    def write(scratch: Path) -> None:
        trainable = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
        torch.save({**state_header(spec, state), "weights": trainable, "optimizer": optimizer.state_dict()},
                   scratch / STATE_FILE)

    return write_whole(checkpoint_folder(folder, state.step), write)


def _resume(folder: Path, spec: AdaptSpec, model, optimizer) -> RunState:
    """Load the latest checkpoint's adapter weights and optimiser moments into the run (a fresh run: step 0), refusing
    one another recipe or thread count saved."""
    saved = saved_checkpoints(folder, STATE_FILE)
    if not saved:
        return RunState(step=0, curve=[])
    state = read_state(saved[max(saved)] / STATE_FILE, spec.name)
    if state["spec"] != asdict(spec) or state["threads"] != torch.get_num_threads():
        raise BadValue(f"checkpoints={str(folder)!r} is not allowed: {saved[max(saved)].name} was saved by "
                       f"{state['spec']} on {state['threads']} threads, not {asdict(spec)} on "
                       f"{torch.get_num_threads()}; give an empty folder or that recipe's")
    _load_weights(model, state["weights"])
    optimizer.load_state_dict(state["optimizer"])
    return RunState(step=state["step"], curve=state["curve"])


def _checked_run(name: str, spec: AdaptSpec | None, steps: int | None, threads: int) -> tuple[AdaptSpec, int]:
    """(the recipe: name's, or the trial `spec`; the steps to run), refusing a bad name, weighting, steps or threads."""
    spec = TWINS[check_choice(name, "name", TWINS)] if spec is None else spec
    check_choice(spec.weighting, "weighting", WEIGHTINGS)
    check_choice(spec.precision, "precision", PRECISIONS)
    check_int(threads, "threads", 1)
    return spec, spec.steps if steps is None else check_int(steps, "steps", 1, spec.steps)  # past it the cosine turns back


def _refuse_past(folder: Path, total: int) -> None:
    """Refuse `total` steps when `folder` already holds the run past them: resuming there would return that later
    model, not the one asked for (a run never goes back)."""
    saved = saved_checkpoints(folder, STATE_FILE)
    if saved and max(saved) > total:
        raise bad_value("steps", total, f"at least {max(saved)}: {str(folder)!r} already holds this run after step "
                        f"{max(saved)}, and a run never goes back (a saved step's model: checkpoint_model(name, step, "
                        f"checkpoints), saved steps {sorted(saved)}; or give an empty checkpoints folder)")


@restores_torch_threads
def train(name: str, threads: int = 1, checkpoints: Path | None = None, steps: int | None = None,
          progress: bool = True, spec: AdaptSpec | None = None):
    """Train one twin from its seed, resuming from the latest checkpoint in `checkpoints` (default
    data/checkpoints/NAME); returns (peft model, loss curve rows). `spec`: another recipe under that name (a trial).
    `steps` stops the run early: at most the recipe's (the schedule is the recipe's), and not fewer than the folder
    already holds (refused: the run would return that later model)."""
    spec, total = _checked_run(name, spec, steps, threads)
    torch.set_num_threads(threads)
    folder = CHECKPOINT_ROOT / name if checkpoints is None else checkpoints
    _refuse_past(folder, total)  # before the base loads
    folder.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build(spec)
    model.train()
    # the twins' optimiser (the zoo's differs): only the adapter trains, on a pretrained base, without weight decay
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr, weight_decay=0.0)
    state = _resume(folder, spec, model, optimizer)
    step_loss = functools.partial(_step_loss, spec, model, tokenizer, training_exclusions(spec), state.curve)

    def checkpoint(done: int) -> None:
        # step 0 (the base, bidirectional but untrained), every checkpoint_every steps and the last; the curve's file
        # with each one this run adds
        if done % spec.checkpoint_every == 0 or done == total:
            _save_checkpoint(folder, spec, model, optimizer, RunState(done, state.curve))
            if done > state.step:
                (folder / "curve.json").write_text(json.dumps(state.curve))

    return model, run(spec, optimizer, state, total, step_loss, checkpoint, f"adapt {name}", progress)


def _step_loss(spec: AdaptSpec, model, tokenizer, exclusions: tuple[frozenset[str], frozenset[str]],
               curve: list[dict], step: int) -> tuple[torch.Tensor, dict]:
    """Optimiser step `step`'s loss and the curve's `tokens` column (tokens seen so far). Unlike the zoo's one
    persistent generator, the batch, its masks and its annealed attention are drawn from a generator seeded
    seed × 1,000,003 + step: a function of the seed and the step alone, so a checkpoint needs no generator state. The
    forward runs under bf16 autocast when the recipe says so (the zoo's trains in float32)."""
    batch = make_batch(batch_problems(spec, step, *exclusions), tokenizer, spec.slot)
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.precision == "bfloat16"):
        loss = (diffusion_loss(model, batch, generator, attention_ratio(spec, step), spec.weighting,
                               spec.complementary)
                if spec.objective == "dream"
                else next_token_loss(model, batch))
    return loss, {"tokens": (curve[-1]["tokens"] if curve else 0) + int(batch.attention_mask.sum())}


def export_adapter(name: str, step: int | None = None, checkpoints: Path | None = None,
                   out: Path | None = None) -> Path:
    """Write the adapter of checkpoint `step` (default: the latest) as peft saves it — adapter_config.json and
    adapter_model.safetensors — to `out` (default data/models/NAME); returns that folder."""
    spec = TWINS[check_choice(name, "name", TWINS)]
    folder = CHECKPOINT_ROOT / name if checkpoints is None else checkpoints
    saved = saved_checkpoints(folder, STATE_FILE)
    if not saved:
        raise FileNotFoundError(f"checkpoints={str(folder)!r} holds no checkpoint of {name}: train it first "
                                f"(python -m experiments.zoo adapt {name})")
    if step is not None and step not in saved:
        raise BadValue(f"step={step!r} is not allowed: {str(folder)!r} holds checkpoints {sorted(saved)}")
    state = read_state(saved[max(saved) if step is None else step] / STATE_FILE, name)
    model, _ = build(spec)
    _load_weights(model, state["weights"])
    target = ZOO_DIR / name if out is None else out
    model.peft_config["default"].base_model_name_or_path = BASE  # a name, not this machine's cache path
    model.save_pretrained(str(target))
    _sort_target_modules(target / "adapter_config.json")
    write_shipped_manifest(target, name)  # what every load checks the adapter against (not its card)
    return target


def _sort_target_modules(config: Path) -> None:
    """peft writes target_modules from a set, in an order that changes with each process's string hashing: sorted,
    the file changes only when the adapter does (written back as peft writes it: indent 2, keys sorted)."""
    settings = json.loads(config.read_text())
    settings["target_modules"] = sorted(settings["target_modules"])
    config.write_text(json.dumps(settings, indent=2, sort_keys=True))


# the held-out splits a twin's card reports: new text (the problems' questions never in training) and new arithmetic
# (their work strings never in any twin's training: mostly two-step problems, as data.held_out_by_work says)
CARD_SPLITS = {"text": ("arithmetic-english", "arithmetic_test.jsonl"),
               "work": ("arithmetic-english-unseen-work", "arithmetic_unseen_work_test.jsonl")}


def write_card(name: str, eval_n: int | dict[str, int] = 500, checkpoints: Path | None = None, progress: bool = True,
               results: Path | None = None, curve_steps: tuple[int, ...] = (), curve_n: Count = 200) -> dict:
    """Measure the shipped adapter on both held-out splits (CARD_SPLITS; the model's own sampler at temperature 0,
    batches of 50): accuracy with its Wilson 95 % interval, per template, and how many answers were scored right on
    unsound work; write card.json, README.md and loss_curve.csv beside it. `results`: a folder for the evaluations'
    per-problem files (<split>.jsonl; default HELD_OUT_RESULTS/<name>/<the adapter's weights fingerprint>), resumed
    where an earlier run of the same configuration wrote them. `curve_steps`: checkpoints for the card's learning
    curve (learning_curve on the first `curve_n` new-text problems, each paired with the shipped adapter)."""

    spec = TWINS[name]
    results = HELD_OUT_RESULTS / name / weights_fingerprint(ZOO_DIR / name) if results is None else results
    folder = CHECKPOINT_ROOT / name if checkpoints is None else checkpoints
    curve = json.loads((folder / "curve.json").read_text())
    saved = saved_checkpoints(folder, STATE_FILE)
    threads = read_state(saved[max(saved)] / STATE_FILE, name)["threads"]
    splits = measure_held_out(load(name), eval_n, progress, results)
    overall = splits["text"]["rows"][0]
    card = {**card_record(name, spec, curve), "base": BASE, "tokens_seen": curve[-1]["tokens"],
            "problems_seen": _problems_seen(spec, len(curve)), "machine": machine(threads),
            "accuracy": overall["accuracy"], "accuracy_n": overall["n"], "held_out": splits,
            "held_out_overlap": text_split_overlap(name, overall["n"]),
            "adapter_parameters": _adapter_parameters(ZOO_DIR / name)}
    if curve_steps:
        card["learning_curve"] = _card_curve(name, curve_steps, curve_n, checkpoints, progress)
    target = ZOO_DIR / name
    (target / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    (target / "README.md").write_text(render_card(card))
    rows = ["step,loss,lr,tokens,seconds"] + [f"{r['step']},{r['loss']!r},{r['lr']!r},{r['tokens']},{r['seconds']}"
                                              for r in curve]
    (target / "loss_curve.csv").write_text("\n".join(rows) + "\n")
    return card


def _card_curve(name: str, steps: tuple[int, ...], n: int, checkpoints: Path | None, progress: bool) -> list[dict]:
    """The card's learning curve: learning_curve's rows (each checkpoint paired with the shipped adapter) as JSON records."""
    rows = learning_curve(name, tuple(steps), n, checkpoints=checkpoints, progress=progress)
    return json.loads(rows.to_json(orient="records"))


def _problems_seen(spec: AdaptSpec, steps: int) -> int:
    """Problems a recipe's first `steps` steps drew (with complementary masks, half its rows)."""
    exclusions = training_exclusions(spec)
    return sum(len(batch_problems(spec, step, *exclusions)) // (2 if spec.complementary else 1) for step in range(steps))


def measure_held_out(loaded, eval_n: int | dict[str, int], progress: bool = True, results: Path | None = None) -> dict:
    """The card's held-out section: for each split of CARD_SPLITS, its task and by_template's rows (accuracy with
    Wilson intervals per template, sound work) on its first eval_n problems (one number, or one per split name),
    the model's own sampler at temperature 0.
    `results`: a folder for the per-problem files (<split>.jsonl), resumed where a run of the same configuration
    wrote them."""

    splits = {}
    for split, (task, file) in CARD_SPLITS.items():
        out = None if results is None else Path(results) / f"{split}.jsonl"
        n = eval_n[split] if isinstance(eval_n, dict) else eval_n
        result = accuracy(loaded, n, progress=progress, task=task, out=out)
        table = by_template(result["records"], read_jsonl(DATA_DIR / file))
        splits[split] = {"task": task, "rows": table.to_dict("records")}
    return splits


def remeasure_card(name: str, eval_n: int | dict[str, int] = 500, progress: bool = True, results: Path | None = None,
                   curve_steps: tuple[int, ...] = (), curve_n: Count = 200, checkpoints: Path | None = None) -> dict:
    """Re-measure a shipped twin's held-out section (both splits, per template) and, with `curve_steps`, its learning
    curve (as write_card), and rewrite its card.json and README.md; the training record already on the card (steps,
    loss, wall time, the machine it trained on) is kept, so this may run on another machine than training did.
    `results`: as write_card's (default: the committed per-problem files of this adapter, resumed)."""

    target = ZOO_DIR / check_choice(name, "name", TWINS)
    card = json.loads((target / "card.json").read_text())
    results = HELD_OUT_RESULTS / name / weights_fingerprint(target) if results is None else results
    card["held_out"] = measure_held_out(load(name), eval_n, progress, results)
    overall = card["held_out"]["text"]["rows"][0]  # the text split, all templates
    card["accuracy"], card["accuracy_n"] = overall["accuracy"], overall["n"]
    card["held_out_overlap"] = text_split_overlap(name, overall["n"])
    if curve_steps:
        card["learning_curve"] = _card_curve(name, curve_steps, curve_n, checkpoints, progress)
    (target / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    (target / "README.md").write_text(render_card(card))
    return card


def _held_out_table(splits: dict) -> str:
    """The card's held-out section: per split and template, n, accuracy [Wilson 95 %], sound work, right on unsound work."""
    lines = ["", "Held out, per split and template (accuracy with its 95 % Wilson interval; *sound work*: every equation "
             "right and the last one's result the final answer; the score reads only `#### N`):", "",
             "| split | template | n | accuracy | sound work | right on unsound work |", "|---|---|---|---|---|---|"]
    names = {"text": "new text (questions never trained on)", "work": "new arithmetic (work strings never trained on)"}
    for split, entry in splits.items():
        for row in entry["rows"]:
            lines.append(f"| {names.get(split, split)} | {row['template']} | {row['n']} | {row['accuracy']:.3f} "
                         f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}] | {row['sound_work']:.3f} | "
                         f"{row['right_on_unsound_work']} |")
    return "\n".join(lines) + "\n"


def _overlap_note(overlap: dict, splits: bool) -> str:
    """What "held out" means for the new-text split (text_split_overlap): the questions, not their stories or sums
    (`splits`: the card's table of both splits follows)."""
    runs = " → ".join(f"`{name}`" for name in reversed(overlap["lineage"]))
    return (f"\n\"Held out\" means new question text: none of the first {overlap['n']} new-text problems was trained on "
            f"({overlap['same_question']} questions in common). It does not mean unseen problems: the training of this "
            f"adapter's lineage ({runs}) held the same story, without its distractor sentences, for "
            f"{overlap['same_story']} of them, and the same template and operands (work string) for "
            f"{overlap['same_template_and_work']}."
            + (" The new-arithmetic split below is the one held out by its sums.\n" if splits else "\n"))


def _curve_table(rows: list[dict]) -> str:
    """The card's learning curve: per checkpoint, accuracy [Wilson 95 %] on the same first n new-text problems, and
    the shipped adapter's paired gain over it with McNemar's exact p."""
    lines = ["", f"Learning curve (the first {rows[-1]['n']} new-text problems, each checkpoint paired with the shipped "
             "adapter on the same problems; step 0 is the adapter this run started from):", "",
             "| checkpoint | accuracy | sound work | right here only / shipped only | shipped − this [95 %] | McNemar p |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        accuracy = f"{row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        if row["step"] == "shipped":
            lines.append(f"| shipped | {accuracy} | {row['sound_work']:.3f} | | | |")
        else:
            lines.append(f"| step {row['step']} | {accuracy} | {row['sound_work']:.3f} | {row['lost']:.0f} / {row['gained']:.0f} "
                         f"| {row['shipped_gain']:+.3f} [{row['shipped_gain_low']:+.3f}, {row['shipped_gain_high']:+.3f}] "
                         f"| {row['mcnemar_p']:.2g} |")
    return "\n".join(lines) + "\n"


def _adapter_parameters(folder: Path) -> int:
    from safetensors import safe_open  # noqa: PLC0415  (only cards count parameters)

    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as handle:
        return sum(handle.get_slice(key).get_shape()[0] * handle.get_slice(key).get_shape()[1] for key in handle.keys())


def _card_objective(spec: dict) -> str:
    """The card's objective row: what the adapter was trained to do."""
    return {"dream": "masked diffusion, Dream's shifted prediction (output i−1 predicts token i), the answer slot "
                     "masked at t ~ U(ε, 1) and its masked tokens' CE weighted 1/t (LLaDA's SFT: the prompt never "
                     "masked); mask token id 16 (`<empty_output>`); "
                     + (f"attention annealed from causal to bidirectional over the first {spec['anneal_steps']} "
                        "steps (DiffuLLaMA)" if spec.get("anneal_steps") else
                        "bidirectional attention from the first step (the adapter it starts from already is)"),
            "arm": "next-token prediction on the answer and its first `<|im_end|>`, causal attention"}[spec["objective"]]


def render_card(card: dict) -> str:
    """The adapted model's README.md from its card record."""
    spec = card["spec"]
    objective = _card_objective(spec)
    adapter = (f"LoRA r = {spec['lora_rank']}, α = {spec['lora_alpha']}, every linear layer of the 30 blocks "
               f"({card['adapter_parameters']:,} parameters), `peft`"
               + (f"; started from `{spec['init_from']}`'s adapter" if spec.get("init_from") else "")
               + (" (Dream's route: a trained autoregressive model adapted to diffusion)"
                  if getattr(TWINS.get(spec.get("init_from")), "objective", None) == "arm" else ""))
    rows = (f"{spec['batch_size']} rows ({spec['batch_size'] // 2} problems, each with complementary masks)"
            if spec.get("complementary") else f"{spec['batch_size']} problems")
    budget = (f"{card['train_steps']} × {rows} ({card['problems_seen']:,} problems, "
              f"{card['tokens_seen']:,} tokens seen), AdamW lr {spec['lr']} (warm-up {spec['warmup']}, cosine to 10 %), "
              f"seed {spec['seed']}")
    wall = f"{card['wall_seconds'] / 60:.0f} min on {card['machine']}"
    score = f"{card['accuracy']:.3f} on {card['accuracy_n']} problems (task `arithmetic-english`)"
    held_out = _overlap_note(card["held_out_overlap"], "held_out" in card) if "held_out_overlap" in card else ""
    held_out += _held_out_table(card["held_out"]) if "held_out" in card else ""
    held_out += _curve_table(card["learning_curve"]) if card.get("learning_curve") else ""
    return f"""# {card['name']}

SmolLM2-135M-Instruct (`{card['base']}`, the offline Q4_1 GGUF dequantised to float32) with a LoRA adapter trained
by sinklib (`experiments/zoo/adapt.py`) on the zoo's arithmetic word problems in plain English, read through SmolLM2's
chat template without its default system turn, answered as `a + b = c #### c`. Load it with
`sinklib.load("{card['name']}")`: the base comes from the GGUF, this folder holds only the adapter.

| | |
|---|---|
| objective | {objective} |
| adapter | {adapter} |
| steps × batch | {budget} |
| wall time | {wall} |
| final training loss | {card['final_loss']:.4f} |
| held-out exact-answer accuracy (temperature 0, own sampler) | {score} |
{held_out}
Reported as measured. Retrain with `python -m experiments.zoo adapt {card['name']}` (resumes from its checkpoints in
`data/checkpoints/`); the loss curve is in `loss_curve.csv`.
"""



def measured_steps(name: str) -> tuple[int, ...]:
    """The checkpoints measure_adaptation measures by default: the start (step 0), halfway, the end."""
    spec = TWINS[check_choice(name, "name", TWINS)]
    return (0, spec.steps // 2, spec.steps)


def checkpoint_model(name: str, step: int, checkpoints: Path | None = None):
    """The twin as it was after `step` optimiser steps (a sinklib LoadedModel): the base with
    that checkpoint's adapter merged, and everything else — family, mask id, chat template — as the shipped twin.
    Step 0 is the run's start, rebuilt from the recipe (build: the fresh adapter from its seed, or the shipped adapter
    of the twin it starts from), so it needs no saved checkpoint."""
    import dataclasses  # noqa: PLC0415  (only measurements rebuild a loaded model)


    folder = CHECKPOINT_ROOT / name if checkpoints is None else checkpoints
    saved = saved_checkpoints(folder, STATE_FILE)
    if step not in saved and step != 0:
        raise BadValue(f"step={step!r} is not allowed: {str(folder)!r} holds checkpoints {sorted(saved)} "
                       "(and step 0, the run's start)")
    model, _ = build(TWINS[name])  # step 0 needs no checkpoint: this is it (a fresh adapter, or init_from's)
    if step != 0:
        _load_weights(model, checked_state(folder, name, step)["weights"])
    merged = model.merge_and_unload().eval()
    # the name stays the twin's: its sampler settings are looked up by it (named.sampling); the weights are this
    # checkpoint's, as every run and trace of it is keyed
    return dataclasses.replace(load(name), model=merged, weights=f"{name}@step-{step:05d}")


def measure_adaptation(names: list[str], steps: tuple[int, ...] | None = None, how=None,
                       results: Path = over_training.ADAPTATION_PATH, checkpoint_root: Path | None = None, progress: bool = True):
    """Measure the twins' checkpoints as notebook 06 measures the zoo's (retrain.measure: accuracy unmasked,
    top-1 sink masked and one random key masked; where the sinks sit; the top key's score; the move rate) into
    `results`, one row per checkpoint written as it finishes; a checkpoint already measured on the same weights and
    settings is not measured again. `checkpoint_root` holds one folder per twin (default data/checkpoints/); `steps`
    defaults to measured_steps(name).
    Returns every row."""

    how = how or over_training.Measurement(n_problems=20, n_traces=4)
    for name in names:
        folder = (CHECKPOINT_ROOT if checkpoint_root is None else Path(checkpoint_root)) / check_choice(name, "names", TWINS)
        for step in tqdm(steps or measured_steps(name), desc=f"measure {name}", disable=not progress):
            state = checkpoint_folder(folder, step) / STATE_FILE
            key = {"model": name, "checkpoint": state.parent.name, "weights": fingerprint(state),
                   "n_problems": how.n_problems, "n_traces": how.n_traces, "eps": how.eps, "seed": how.seed}
            rows = over_training.read_rows(results)
            if len(rows) and ((rows[list(key)] == pd.Series(key)).all(axis=1)).any():
                continue
            curve = checked_state(folder, name, step)["curve"]
            window = [r["loss"] for r in curve if step - 50 <= r["step"] < step]
            row = {**key, "step": step, "train_steps": TWINS[name].steps,
                   "loss": sum(window) / len(window) if window else float("nan"),
                   **retrain.measure(checkpoint_model(name, step, folder), how, progress=False)}
            over_training._add_row(row, Path(results), describe({"n_problems": how.n_problems, "n_traces": how.n_traces,
                                                                 "eps": how.eps, "seed": how.seed},
                                                                what="SmolLM2's adaptation"))
    return over_training.read_rows(results)



def learning_curve(name: str, steps: tuple[int, ...], n: int = 200, split: str = "text",
                   results: Path | None = None, checkpoints: Path | None = None, progress: bool = True,
                   shipped: bool = True) -> pd.DataFrame:
    """Held-out accuracy of a twin's checkpoints: for each of `steps`, the checkpoint (checkpoint_model) on the first
    n problems of one card split (CARD_SPLITS: "text" or "work"), the model's own sampler at temperature 0, scored as
    the card scores them (by_template's "all" row: accuracy with its Wilson 95 % interval, sound work).
    `results`: a folder for per-problem files (<name>-step-NNNNN-<split>.jsonl; default HELD_OUT_RESULTS/<name>) that
    an interrupted run resumes from (the evaluation runner's key holds the checkpoint's name and every setting). One
    row per step.
    `shipped`: add a last row for the shipped adapter on the same n problems (its own resumable file,
    <name>-shipped-<split>.jsonl beside the checkpoints', keyed by the runner like theirs), and give every
    checkpoint's row its paired comparison with it: `lost` (right at the checkpoint only), `gained` (right shipped
    only), the shipped adapter's gain with its 95 % interval (Newcombe) and McNemar's exact p."""

    task, file = CARD_SPLITS[check_choice(split, "split", CARD_SPLITS)]
    check_int(n, "n", 1)
    items = read_jsonl(DATA_DIR / file)
    measured = []
    for step in steps:
        out = (HELD_OUT_RESULTS / name if results is None else Path(results)) / f"{name}-step-{step:05d}-{split}.jsonl"
        records = accuracy(checkpoint_model(name, step, checkpoints), n, progress=progress, task=task, out=out)["records"]
        measured.append(({"model": name, "step": step, "split": split}, records))
    if shipped:  # measured, not read from the card's file: that run's key (its n, its settings) is another one
        out = (HELD_OUT_RESULTS / name if results is None else Path(results)) / f"{name}-shipped-{split}.jsonl"
        records = accuracy(load(name), n, progress=progress, task=task, out=out)["records"]
        measured.append(({"model": name, "step": "shipped", "split": split}, records))
    return curve_rows(measured, items, against_last=shipped)


def curve_rows(measured: list[tuple[dict, list[dict]]], items: list[Problem], against_last: bool) -> pd.DataFrame:
    """One row per (head, per-problem records) of `measured`: the head's fields and by_template's "all" row; with
    `against_last`, each row but the last also carries its paired comparison with the last on the same problems
    (lost: right here only; gained: right in the last only; shipped_gain = last − this with its Newcombe 95 %
    interval; McNemar's exact p)."""

    final = {str(r["id"]): bool(r["correct"]) for r in measured[-1][1]} if against_last else {}
    rows = []
    for index, (head, records) in enumerate(measured):
        row = {**head, **by_template(records, items).iloc[0].to_dict()}
        if against_last and index < len(measured) - 1:
            mine = {str(r["id"]): bool(r["correct"]) for r in records}
            if sorted(mine) != sorted(final):
                raise BadValue(f"measured[{index}] ({head}) holds other problems than the last entry: a paired "
                               "comparison needs the same problems")
            ids = sorted(final)
            comparison = paired([mine[i] for i in ids], [final[i] for i in ids])
            row.update(lost=comparison.lost, gained=comparison.gained, shipped_gain=comparison.delta,
                       shipped_gain_low=comparison.low, shipped_gain_high=comparison.high, mcnemar_p=comparison.p)
        rows.append(row)
    return pd.DataFrame(rows)


def machine(threads: int) -> str:
    """The CPU, torch's version and the thread count a run used, for model cards."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu} ({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}, {threads} thread(s)"
