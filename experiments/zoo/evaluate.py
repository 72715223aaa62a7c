"""Held-out accuracy and sink statistics of a zoo model, measured with sinklib itself."""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sinklib.capturing.replay import full_pass_scores
from sinklib.carry import value_norms
from sinklib.dynamics import sink_mask
from sinklib.evaluation.runner import evaluate
from sinklib.evaluation.tasks import get_task
from sinklib.generation import generate
from sinklib.loading import LoadedModel, load
from sinklib.sinks import find_sinks
from sinklib.stats import wilson_interval
from experiments.zoo.data import Problem, held_out, work_is_sound


def accuracy(loaded: LoadedModel, n: int = 600, batch_size: int = 50, progress: bool = True,
             intervention=None, task: str = "arithmetic", out=None) -> dict[str, Any]:
    """Exact final-answer accuracy on the first n held-out problems (the arithmetic task, or its plain-English
    form "arithmetic-english"), at temperature 0 with the model's own sampler: the evaluation runner and its strict
    "#### N" extractor, as Table 1 scores them; `out`: the runner's resumable per-problem file."""
    summary = evaluate(loaded, get_task(task, limit=n), intervention=intervention, batch_size=batch_size, out=out,
                       progress=progress)
    return {"accuracy": summary.accuracy, "n": summary.n, "outputs": [record["output"] for record in summary.records],
            "records": summary.records}


def by_template(records: list[dict], items: list[Problem]) -> pd.DataFrame:
    """Per template of the generator (and "all"): n, exact-answer accuracy with its Wilson 95 % interval, the share
    of answers whose work is sound (every equation right and the last one's result the final answer:
    data.work_is_sound), and how many answers were scored right on unsound work. `records` are the evaluation
    runner's (id, output, correct), `items` the task file's problems in id order ("arith-0007" is items[7])."""
    rows = []
    for record in records:
        problem = items[int(str(record["id"]).rsplit("-", 1)[1])]
        sound = work_is_sound(record["output"])
        rows.append({"template": problem.template, "correct": bool(record["correct"]), "sound": sound is True})
    frame = pd.DataFrame(rows, columns=["template", "correct", "sound"])
    groups = [("all", frame), *frame.groupby("template")]
    out = []
    for template, group in groups:
        n, right = len(group), int(group["correct"].sum())
        low, high = wilson_interval(right, n)
        out.append({"template": template, "n": n, "accuracy": right / n if n else float("nan"), "ci_low": low,
                    "ci_high": high, "sound_work": group["sound"].mean() if n else float("nan"),
                    "right_on_unsound_work": int((group["correct"] & ~group["sound"]).sum())})
    return pd.DataFrame(out)


def sink_statistics(loaded: LoadedModel, items: list[Problem], eps: float = 3.0, top: int = 5) -> dict[str, Any]:
    """Share of scores above eps (Eq. 3, sum units) over every step, most frequent sink tokens, and the value
    norms of the sinks of one full pass over the final sequence against the other keys."""
    settings = loaded.settings_for()  # temperature 0, the zoo's answer slot
    counts: collections.Counter = collections.Counter()
    selected = total = 0
    sink_norm, other_norm, top_scores = [], [], []
    for problem in items:
        trace = generate(loaded, problem.question, settings, chat=False, progress=False)
        valid = ~torch.isnan(trace.scores)
        top_scores.append(trace.scores.nan_to_num(float("-inf")).amax(-1).flatten())  # per (step, layer, head)
        sinks = sink_mask(trace, eps)  # autoregressive decoding rows scaled by their number of keys
        selected += int(sinks.sum())
        total += int(valid.sum())
        steps, _, _, seq = sinks.shape
        for step, _layer, _head, position in sinks.nonzero().tolist():
            counts[trace.token_text(int(trace.tokens[step, position]))] += 1
        # Value norms and sinks of one full pass over the final sequence, the same for every family.
        norms = value_norms(loaded, trace.tokens[-1])[0]  # ‖v_j‖ [layers, heads, seq] (carry's one definition)
        final_sinks = find_sinks(full_pass_scores(loaded, trace.tokens[-1]), eps)
        sink_norm.append(norms[final_sinks])
        other_norm.append(norms[~final_sinks])
    frequency = [{"token": token, "share": count / max(1, sum(counts.values()))} for token, count in counts.most_common(top)]
    sink_values = torch.cat(sink_norm) if sink_norm else torch.empty(0)
    other_values = torch.cat(other_norm)
    tops = torch.cat(top_scores)
    return {"eps": eps, "share_selected": selected / max(total, 1), "top_sink_tokens": frequency,
            "top_score_median": float(tops.median()), "top_score_mean": float(tops.mean()),
            "share_heads_with_sink": float((tops > eps).float().mean()),
            "mean_value_norm_sinks": float(sink_values.mean()) if sink_values.numel() else None,
            "mean_value_norm_others": float(other_values.mean()), "n_generations": len(items)}


def write_card(name: str, folder: Path, eval_n: int = 600) -> dict:
    """Measure held-out accuracy and sink statistics with sinklib and write card.json and README.md."""
    loaded = load(str(folder))
    card = json.loads((folder / "card.json").read_text())
    result = accuracy(loaded, eval_n)
    right = round(result["accuracy"] * result["n"])
    card.update(accuracy=result["accuracy"], accuracy_n=result["n"], accuracy_ci95=list(wilson_interval(right, result["n"])),
                sinks=sink_statistics(loaded, held_out()[:30]))
    (folder / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True))
    (folder / "README.md").write_text(render_card(card))
    return card


def render_card(card: dict) -> str:
    """The model card's README.md text from its card.json record."""
    spec, sinks = card["spec"], card["sinks"]
    objective = {"llada": "LLaDA masked diffusion (t ~ U(ε,1), CE on masked response tokens weighted 1/t)",
                 "arm": "next-token prediction (causal attention)",
                 "dream": "Dream's shifted masked diffusion (position i predicted from output i−1), initialised from tiny-arm",
                 "udlm": "uniform-noise diffusion, no mask token (t ~ U(ε,1), response tokens replaced by uniformly "
                         "random tokens, CE of the clean token at every response position)"}
    block = ("Qwen3.5-style model (its full-attention block: a sigmoid gate on each head's output and QK-norm; "
             "RMSNorm, RoPE, SwiGLU" if spec.get("gated_attention") else "Llama-style model (RMSNorm, RoPE, SwiGLU")
    sampling = ("own sampler: tokens drawn at temperature 0.8 → 0.4, seed 0" if spec["family"] == "udlm"
                else "temperature 0, own sampler")  # the uniform-noise sampler draws; the others decode greedily
    threads = card.get("threads")  # cards written before the thread count was kept: the recipe's two
    hardware = f"{threads} CPU thread{'s' if threads > 1 else ''}" if threads else "2 CPU cores"
    interval = card.get("accuracy_ci95")
    interval = f" (95 % interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
    tops = (f"\n- largest score a head gives one key, per (step, layer, head): median {sinks['top_score_median']:.2f}, "
            f"mean {sinks['top_score_mean']:.2f}; share of (step, layer, head) with a sink: "
            f"{sinks['share_heads_with_sink']:.3f}" if "top_score_median" in sinks else "")
    tokens = ", ".join(f"`{t['token']}` {t['share']:.3f}" for t in sinks["top_sink_tokens"]) or "none"
    schedule = f"AdamW, lr {spec['lr']} (warm-up {spec['warmup']}, cosine to 10 %), seed {spec['seed']}"
    norms = f"{_fmt(sinks['mean_value_norm_sinks'])}, of the other keys: {_fmt(sinks['mean_value_norm_others'])}"
    return f"""# {card['name']}

A tiny {block}; {spec['layers']} layers, d_model {spec['hidden_size']},
{spec['heads']} heads, {card['parameters']:,} parameters, {'causal' if spec['causal'] else 'bidirectional'} attention)
trained by sinklib on its seeded arithmetic word problems (`experiments/zoo/data.py`). Sampler family: `{spec['family']}`.

| | |
|---|---|
| objective | {objective[spec['objective']]} |
| steps × batch | {card['train_steps']} × {spec['batch_size']}, {schedule} |
| wall time | {card['wall_seconds'] / 60:.1f} min on {hardware} |
| final training loss | {card['final_loss']:.4f} |
| held-out exact-answer accuracy ({sampling}) | {card['accuracy']:.3f} on {card['accuracy_n']} problems{interval} |

## Sinks, measured with sinklib ({sinks['n_generations']} held-out generations, ε = {sinks['eps']}, sum units)

- share of (step, layer, head, key) scores selected by Eq. 3: {sinks['share_selected']:.4f}
- most frequent sink tokens (share of all detections): {tokens}
- mean value-vector norm of sink keys (one full pass over the final sequence): {norms}{tops}

Reported as measured; the data was not tuned to produce the paper's result. Retrain with
`python -m experiments.zoo train {card['name']}`; the loss curve is in `loss_curve.csv`.
"""


def _fmt(value) -> str:
    return "n/a (no sinks)" if value is None else f"{value:.3f}"
