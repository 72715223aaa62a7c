"""The tiny model zoo: models this project trains itself and ships in data/models/ (see train.py)."""
from __future__ import annotations

import json
from pathlib import Path

from sinklib.paths import DATA_DIR, ZOO_DIR  # noqa: F401  (the zoo's CLI and callers read them here too)

NAMES = ("tiny-llada", "tiny-dream", "tiny-arm")


def write_card(name: str, folder: Path, eval_n: int = 600) -> dict:
    """Measure held-out accuracy and sink statistics with sinklib and write card.json and README.md."""
    import sinklib
    from sinklib.zoo.data import held_out
    from sinklib.zoo.evaluate import accuracy, sink_statistics

    loaded = sinklib.load(str(folder))
    items = held_out()[:eval_n]
    card = json.loads((folder / "card.json").read_text())
    result = accuracy(loaded, items)
    card.update(accuracy=result["accuracy"], accuracy_n=result["n"], sinks=sink_statistics(loaded, items[:30]))
    (folder / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True))
    (folder / "README.md").write_text(render_card(card))
    return card


def render_card(card: dict) -> str:
    spec, sinks = card["spec"], card["sinks"]
    objective = {"llada": "LLaDA masked diffusion (t ~ U(ε,1), CE on masked response tokens weighted 1/t)",
                 "arm": "next-token prediction (causal attention)",
                 "dream": "Dream's shifted masked diffusion (position i predicted from output i−1), initialised from tiny-arm"}
    tokens = ", ".join(f"`{t['token']}` {t['share']:.3f}" for t in sinks["top_sink_tokens"]) or "none"
    return f"""# {card['name']}

A tiny Llama-style model (RMSNorm, RoPE, SwiGLU; {spec['layers']} layers, d_model {spec['hidden_size']},
{spec['heads']} heads, {card['parameters']:,} parameters, {'causal' if spec['causal'] else 'bidirectional'} attention)
trained by sinklib on its seeded arithmetic word problems (`sinklib/zoo/data.py`). Sampler family: `{spec['family']}`.

| | |
|---|---|
| objective | {objective[spec['objective']]} |
| steps × batch | {card['train_steps']} × {spec['batch_size']}, AdamW, lr {spec['lr']} (warm-up {spec['warmup']}, cosine to 10 %), seed {spec['seed']} |
| wall time | {card['wall_seconds'] / 60:.1f} min on 2 CPU cores |
| final training loss | {card['final_loss']:.4f} |
| held-out exact-answer accuracy (temperature 0, own sampler) | {card['accuracy']:.3f} on {card['accuracy_n']} problems |

## Sinks, measured with sinklib ({sinks['n_generations']} held-out generations, ε = {sinks['eps']}, sum units)

- share of (step, layer, head, key) scores selected by Eq. 3: {sinks['share_selected']:.4f}
- most frequent sink tokens (share of all detections): {tokens}
- mean value-vector norm of sink keys (one full pass over the final sequence): {_fmt(sinks['mean_value_norm_sinks'])}, of the other keys: {_fmt(sinks['mean_value_norm_others'])}

Reported as measured; the data was not tuned to produce the paper's result. Retrain with
`python -m sinklib.zoo train {card['name']}`; the loss curve is in `loss_curve.csv`.
"""


def _fmt(value) -> str:
    return "n/a (no sinks)" if value is None else f"{value:.3f}"
