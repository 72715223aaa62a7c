"""Notebook 03, the threshold sweep: its run config and Fig. 10 (the share of entries Eq. 3 selects at each
eps, against uniform causal attention)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd
from matplotlib.figure import Figure

from sinklib.capturing.replay import full_pass_scores
from sinklib.sinks import causal_uniform_scores, threshold_sweep
from sinklib.summary import (Layout, Result, Summary, label, near_tie_models)
from sinklib.validation import BadValue, NonNegative, validated
from sinklib.lab.nb01_attention_distributions import TracesRun
from sinklib.lab.runs import (Models, Traces, default_copy)


@validated
@dataclass(frozen=True)
class ThresholdSweepRun(TracesRun):
    """Notebook 03: the share of tokens Eq. 3 selects at each eps."""
    NOTEBOOK = "03_threshold_sweep"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 30
    eps_values: list[NonNegative] = default_copy([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0])

    def check(self) -> None:
        """TracesRun's rules, and at least one eps value."""
        super().check()
        if not self.eps_values:
            raise BadValue("eps_values=[] is not allowed: eps_values must be a non-empty list of numbers >= 0")


def pick_threshold_sweep(models: Models, traces: Traces, eps_values: Sequence[float]) -> pd.DataFrame:
    """Fig. 10's data: per model, the share of (step, layer, head, key) entries Eq. 3 selects at each eps
    (sinks.threshold_sweep: eps, units, selected, tokens, share, with a model column). Diffusion models over every
    step's scores; an autoregressive model over one full causal pass of each final sequence (full_pass_scores)."""
    sweeps = []
    for name, model_traces in traces.items():
        if models[name].family.scores_cover_the_canvas:
            scores = [t.scores for t in model_traces]
        else:
            scores = [full_pass_scores(models[name], t.tokens[-1]) for t in model_traces]
        sweeps.append(threshold_sweep(scores, eps_values).assign(model=name))
    return pd.concat(sweeps, ignore_index=True)


def _uniform_name(model: str) -> str:
    return f"uniform causal attention ({model}'s lengths)"


def pick_uniform_sweep(models: Models, traces: Traces, eps_values: Sequence[float]) -> pd.DataFrame:
    """Fig. 10's baseline: for each autoregressive model, the same sweep over uniform causal attention at the lengths
    of its generations (causal_uniform_scores), its model column "uniform causal attention (<model>'s lengths)"; no
    row when no model is autoregressive."""
    baselines = [threshold_sweep([causal_uniform_scores(t.tokens.shape[1]) for t in model_traces], eps_values).assign(
        model=_uniform_name(name)) for name, model_traces in traces.items()
        if not models[name].family.scores_cover_the_canvas]
    return pd.concat(baselines, ignore_index=True) if baselines else pd.DataFrame(columns=["eps", "share", "model"])


def report_threshold_sweep(sweep: pd.DataFrame, uniform: pd.DataFrame, figure: Figure, traces: Traces) -> Result:
    """Fig. 10 as saved: the figure, both sweeps in one table, each model's share per eps, and its share at the eps
    closest to 3 beside the paper's."""
    shares = sweep.pivot(index="model", columns="eps", values="share").loc[list(traces)]
    shares.columns = [f"eps={eps:g}" for eps in shares.columns]
    flagged = near_tie_models(traces)
    near_three = min(sweep["eps"].unique(), key=lambda eps: abs(eps - 3.0))
    full_pass = {name for name in traces if _uniform_name(name) in set(uniform["model"])}
    findings = [f"{label(name, flagged)}: at eps = {near_three:g}, Eq. 3 selects {share:.1%} of its (step, layer, head, key) "
                f"entries{' (one full causal pass of each final sequence)' if name in full_pass else ''}."
                for name, share in sweep[sweep["eps"] == near_three].set_index("model")["share"].items()]
    findings.append("Paper (Appendix B): for a 64-token sequence, eps = 3 keeps at most about 4% of tokens in most "
                    "diffusion models.")
    return Result(figures={"fig10_threshold_sweep": figure},
                  tables={"fig10_threshold_sweep": pd.concat([sweep, uniform]) if len(uniform) else sweep},
                  layouts={"fig10_threshold_sweep": Layout(("model", "eps", "units"))},
                  shown=Summary.by_model(shares, flagged, findings))
