"""Notebook 01, attention distributions: its run config (TracesRun: the traces every notebook reads), and its
sections — the score histograms (Fig. 3 / 9), the token × step map (Fig. 1), the layer × head map (Fig. 5) and
the generations step by step. A section is three calls: pick_… (a DataFrame), a plot of it (sinklib.plots) or
draw_…, and report_… (the summary.Result run.save writes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinklib import dynamics, plots
from sinklib.evaluation.tasks import trace_prompts
from sinklib.summary import (Layout, Result, Summary, is_near_tie, label, near_tie_models,
                             significant)
from sinklib.trace_store import stored_traces
from sinklib.validation import Count, validated
from sinklib.lab.runs import (LONG_TRACES, ModelsPart, OutputsPart, RunConfig,
                              SamplingPart, Traces, _check_layout, _stem)


@validated
@dataclass(frozen=True)
class TracesRun(OutputsPart, SamplingPart, ModelsPart, RunConfig):
    """Notebook 01: traces of every model on n_prompts prompts, then their score distributions."""
    NOTEBOOK = "01_attention_distributions"
    SECONDS_TO_REGENERATE = 150
    n_prompts: Count = 6

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length."""
        _check_layout(self)

    def collect(self) -> tuple[dict, dict]:
        """(loaded models by name, their traces by name): one generation per prompt with the family's settings."""
        loaded = self.load()
        traces = {name: stored_traces(model, trace_prompts(model.prompt_style, self.n_prompts), self.trace_store,
                                      seed=self.seed, progress=self.progress, settings=self.settings_for(model))
                  for name, model in loaded.items()}
        return loaded, traces

    @property
    def trace_store(self) -> Path:
        """Where this run's traces are kept, read by every notebook that asks for the same generations (and by a
        rerun): results_dir/traces (sinklib.trace_store)."""
        return Path(self.results_dir) / "traces"

    @property
    def long_trace_store(self) -> Path:
        """Where the traces that take minutes to make are kept: results_dir/long-traces (LONG_TRACES), read by
        `make figures` too and made again only by `python -m sinklib.reproduce --remake-long-runs`."""
        return Path(self.results_dir) / LONG_TRACES


def pick_score_summary(traces: Traces) -> pd.DataFrame:
    """Fig. 3 / 9's table: per model (the index), the count, mean, spread and quantiles of every score of its traces
    (dynamics.score_distribution)."""
    return dynamics.score_distribution([t for ts in traces.values() for t in ts]).groupby("model")["score"].describe()


def pick_score_histograms(traces: Traces, bins: int = 60) -> pd.DataFrame:
    """Fig. 3 / 9's data: per model, the counts of its scores in `bins` equal bins between its least and greatest
    score (numpy.histogram's, as plots.score_histograms draws them). Columns model, left, right, count."""
    scores = dynamics.score_distribution([t for ts in traces.values() for t in ts])
    frames = []
    for name in plots.in_order(scores["model"]):
        counts, edges = np.histogram(scores.loc[scores["model"] == name, "score"], bins=bins)
        frames.append(pd.DataFrame({"model": name, "left": edges[:-1], "right": edges[1:], "count": counts}))
    return pd.concat(frames, ignore_index=True)


def report_scores(summary: pd.DataFrame, figure: Figure, traces: Traces) -> Result:
    """Fig. 3 / 9 as saved: the histograms, each model's quantiles (pick_score_summary: the table) and a finding per
    model. `traces`: only to mark the models that decided a step at a near-tie."""
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: half of its scores are below {significant(row['50%'])} "
                "(the mean is 1 by construction); "
                f"the largest is {significant(row['max'])} times the mean." for name, row in summary.iterrows()]
    findings.append("Paper (Fig. 3, LLaDA-8B; Fig. 9, Dream and MMaDA): most scores sit near 0 and a few are very large.")
    return Result(figures={"fig03_score_histograms": figure},
                  tables={"fig03_score_summary": summary},
                  layouts={"fig03_score_summary": Layout(("model",), "model", index=True)},
                  shown=Summary.by_model(summary.astype({"count": int}), flagged, findings))


def pick_strongest_heads(traces: Traces) -> pd.DataFrame:
    """Fig. 1's heads: per model, the head of its first generation whose main sink is strongest averaged over the
    steps (dynamics.strongest_head). Columns model, layer, head; one row per model, in `traces`' order."""
    rows = [(name, *dynamics.strongest_head(model_traces[0])) for name, model_traces in traces.items()]
    return pd.DataFrame(rows, columns=["model", "layer", "head"])


def pick_token_step(traces: Traces, heads: pd.DataFrame) -> pd.DataFrame:
    """Fig. 1's scores: per model, its first generation's scores in the head `heads` picks, every step and position
    (Trace.to_frame's columns, with a model column, and `comparable`: dynamics.comparable_scores, what the figure
    draws)."""
    rows = []
    for row in heads.itertuples():
        trace = traces[row.model][0]
        frame = trace.to_frame(layers=[row.layer], heads=[row.head])
        comparable = dynamics.comparable_scores(trace)[:, row.layer, row.head].numpy()
        rows.append(frame.assign(model=row.model, comparable=comparable[frame["step"], frame["position"]]))
    return pd.concat(rows, ignore_index=True)


def draw_token_step(traces: Traces, table: pd.DataFrame) -> dict[str, Figure]:
    """Fig. 1 per model (plots.token_step_heatmap) from pick_token_step's table; by model."""
    return {name: plots.token_step_heatmap(traces[name][0], int(rows["layer"].iloc[0]), int(rows["head"].iloc[0]),
                                           scores=rows)
            for name, rows in table.groupby("model", sort=False)}


def report_token_step(heads: pd.DataFrame, figures: Mapping[str, Figure], table: pd.DataFrame) -> Result:
    """Fig. 1 as saved: each model's figure (`figures`, by model) and, in one table, the scores its figure draws —
    its first generation's, in the head `heads` picked, every step and position (pick_token_step's table)."""
    result = Result(figures={f"fig01_token_step_{_stem(name)}": figure for name, figure in figures.items()})
    result.add_table("fig01_token_step", table.drop(columns="comparable"),
                     Layout(("model", "step", "layer", "head", "position"), "first"))
    return result


def pick_layer_heads(traces: Traces) -> pd.DataFrame:
    """Fig. 5's data: per model, layer and head, the main sink's score averaged over steps and generations
    (dynamics.main_sink_by_layer_head). Columns layer, head, score, …, model."""
    frames = [pd.concat([dynamics.main_sink_by_layer_head(t) for t in model_traces]).groupby(
        ["layer", "head"], as_index=False).mean().assign(model=name) for name, model_traces in traces.items()]
    return pd.concat(frames, ignore_index=True)


def report_layer_heads(table: pd.DataFrame, figures: Mapping[str, Figure], traces: Traces) -> Result:
    """Fig. 5 as saved: each model's map (`figures`, by model), the table, and per model the layers where its main
    sink is strongest and weakest."""
    result = Result(figures={f"fig05_layer_head_{_stem(name)}": figure for name, figure in figures.items()})
    result.add_table("fig05_layer_head", table, Layout(("model", "layer", "head")))
    by_layer = table.groupby(["model", "layer"])["score"].mean()
    flagged = near_tie_models(traces)
    layers = table.groupby("model")["layer"].max()
    findings = [f"{label(name, flagged)}: its top key scores highest in layer {layer} (of layers 0–{layers[name]}; "
                f"{significant(by_layer[(name, layer)])} on average over heads) and lowest in layer "
                f"{by_layer[name].idxmin()} ({significant(by_layer[name].min())})."
                for name in traces for layer in [by_layer[name].idxmax()]]
    findings.append("The table: the top key's score, averaged over steps and prompts, then its mean and max over layers "
                    "and heads. Paper (Fig. 5, LLaDA-8B): deeper layers have fewer sinks, so each receives a higher score.")
    shown = table.groupby("model")["score"].agg(["mean", "max"])
    result.shown = Summary.by_model(shown, flagged, findings)
    return result


def pick_generations(traces: Traces) -> pd.DataFrame:
    """Every generation step by step: the canvas after each step's decision and that decision's margin (the
    relative gap by which it beat the best alternative). A rerun on another CPU is compared against these: a
    canvas that differs from a step whose margin is within float rounding is a near-tie, not a bug."""
    rows = []
    for name, model_traces in traces.items():
        for index, trace in enumerate(model_traces):
            margins = trace.margins.tolist() if trace.margins is not None else [float("nan")] * trace.n_steps
            rows += [{"model": name, "trace": index, "step": step, "margin": margins[step],
                      "canvas": trace.tokens[step + 1].tolist()} for step in range(trace.n_steps)]
    return pd.DataFrame(rows, columns=["model", "trace", "step", "margin", "canvas"])


def report_generations(table: pd.DataFrame, traces: Traces) -> Result:
    """The generations as saved, and per model how many of its decisions were within float rounding."""
    flagged = near_tie_models(traces)
    shown = table.groupby("model", sort=False)["margin"].agg(
        decisions="size", within_float_rounding=lambda m: int(sum(is_near_tie(x) for x in m)))
    findings = [f"{label(name, flagged)}: {row['within_float_rounding']} of its {row['decisions']} decisions were within "
                f"float rounding." for name, row in shown.iterrows()]
    return Result(tables={"generations": table}, layouts={"generations": Layout(("model", "trace", "step"), "trace")},
                  shown=Summary.by_model(shown, flagged, findings))
