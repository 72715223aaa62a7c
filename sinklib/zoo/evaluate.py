"""Held-out accuracy and sink statistics of a zoo model, measured with sinklib itself."""
from __future__ import annotations

import collections
import re
from typing import Any

import torch
from tqdm.auto import tqdm

import sinklib
from sinklib.dynamics import sink_mask
from sinklib.experiments import full_pass_scores
from sinklib.loading import LoadedModel
from sinklib.zoo.data import Problem

ANSWER = re.compile(r"####\s*(-?\d+)")



def extract_answer(text: str) -> int | None:
    """The integer after the first "####", or None."""
    match = ANSWER.search(text)
    return int(match.group(1)) if match else None


def accuracy(loaded: LoadedModel, items: list[Problem], batch_size: int = 50, progress: bool = True,
             intervention=None) -> dict[str, Any]:
    """Exact final-answer accuracy at temperature 0 with the model's own sampler."""
    settings = loaded.family.preset("zoo")  # temperature 0, the zoo's answer slot
    correct = 0
    outputs = []
    for start in tqdm(range(0, len(items), batch_size), desc=f"accuracy {loaded.name}", disable=not progress):
        chunk = items[start:start + batch_size]
        traces = sinklib.generate(loaded, [p.question for p in chunk], chat=False, progress=False,
                                  intervention=intervention, keep_scores=False, **settings)
        for problem, trace in zip(chunk, traces):
            predicted = extract_answer(trace.text)
            correct += predicted == problem.answer
            outputs.append(trace.text)
    return {"accuracy": correct / len(items), "n": len(items), "outputs": outputs}


def sink_statistics(loaded: LoadedModel, items: list[Problem], eps: float = 3.0, top: int = 5) -> dict[str, Any]:
    """Share of scores above eps (Eq. 3, sum units) over every step, most frequent sink tokens, and the value
    norms of the sinks of one full pass over the final sequence against the other keys."""
    settings = loaded.family.preset("zoo")  # temperature 0, the zoo's answer slot
    counts: collections.Counter = collections.Counter()
    selected = total = 0
    sink_norm, other_norm = [], []
    for problem in items:
        trace = sinklib.generate(loaded, problem.question, chat=False, progress=False, **settings)
        valid = ~torch.isnan(trace.scores)
        sinks = sink_mask(trace, eps)  # autoregressive decoding rows scaled to key units (SPEC §3)
        selected += int(sinks.sum())
        total += int(valid.sum())
        steps, _, _, seq = sinks.shape
        for step, _layer, _head, position in sinks.nonzero().tolist():
            counts[trace.token_text(int(trace.tokens[step, position]))] += 1
        # Value norms and sinks of one full pass over the final sequence, the same for every family.
        norms = _value_norms(loaded, trace.tokens[-1])  # [layers, heads, seq]
        final_sinks = sinklib.find_sinks(full_pass_scores(loaded, trace.tokens[-1]), eps)
        sink_norm.append(norms[final_sinks])
        other_norm.append(norms[~final_sinks])
    frequency = [{"token": token, "share": count / max(1, sum(counts.values()))} for token, count in counts.most_common(top)]
    sink_values = torch.cat(sink_norm) if sink_norm else torch.empty(0)
    other_values = torch.cat(other_norm)
    return {"eps": eps, "share_selected": selected / max(total, 1), "top_sink_tokens": frequency,
            "mean_value_norm_sinks": float(sink_values.mean()) if sink_values.numel() else None,
            "mean_value_norm_others": float(other_values.mean()), "n_generations": len(items)}


def _value_norms(loaded: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """‖v_j‖ per layer, head and position for one sequence (Llama-style v_proj)."""
    model = loaded.model
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    norms = []
    hooks = [layer.self_attn.v_proj.register_forward_hook(
        lambda m, i, out: norms.append(out[0].view(out.shape[1], -1, head_dim).norm(dim=-1).T))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=tokens[None])
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(norms)
