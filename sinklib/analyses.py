"""The notebooks' analyses. A notebook section makes three calls, each visible in its cell:

- `pick_…` takes models and traces (or a run's tables) and returns the data the section shows, a DataFrame: the
  strongest head, every moving-sink event, the share Eq. 3 selects at each eps, ...;
- a plot of that frame (sinklib.plots), or `draw_…` where a step must be replayed through the model for its full
  attention map;
- `report_…` takes the frame and the figure and returns the summary.Result that `run.save` writes: figures, tables
  with their layouts, and the summary the notebook displays, its findings written from the frame's numbers.

Claims a notebook's prose would otherwise type (`do_sinks_move`, `sink_reliance`) are judged here from the run's
frames: a verdict per model, with its n and a 95 % interval. The picking rules live here and in sinklib.dynamics,
where they are unit-tested (tests/unit/test_analyses_picks.py), not in the notebooks."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinklib import carry, dynamics, lens, plots
from sinklib.capturing.replay import full_pass_scores, replay_map
from sinklib.evaluation.table1 import MaskingTable, column_name, column_words, family_before_loading
from sinklib.loading import LoadedModel
from sinklib.sinks import causal_uniform_scores, threshold_sweep
from sinklib.speed import AUTOREGRESSIVE_POLICY
from sinklib.stats import difference_of_changes
from sinklib.summary import (VERDICT_COLUMNS, Layout, Result, Summary, Verdicts, is_near_tie, label, near_tie_models,
                             significant)
from sinklib.trace import Trace
from sinklib.trace_store import stored_measurement

Traces = Mapping[str, Sequence[Trace]]
Models = Mapping[str, LoadedModel]


def _stem(name: str) -> str:
    return Path(name).name


# --- notebook 01 ---------------------------------------------------------------------------------------------
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


# --- notebook 02 ---------------------------------------------------------------------------------------------
def pick_sink_tokens(traces: Traces, eps: float) -> pd.DataFrame:
    """Table 2's data: per model, its five most frequent sink tokens over every step, layer and head
    (dynamics.sink_token_frequency). Columns model, token, count, share."""
    return pd.concat([dynamics.sink_token_frequency(ts, eps).assign(model=name) for name, ts in traces.items()],
                     ignore_index=True)[["model", "token", "count", "share"]]


def report_sink_tokens(table: pd.DataFrame, figure: Figure, traces: Traces) -> Result:
    """Table 2 as saved: the bars, the table (parquet and Markdown), and each model's two most frequent sink tokens
    beside the paper's."""
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: its most frequent sink token is {group.iloc[0]['token']!r} "
                f"({group.iloc[0]['share']:.0%} of its sink detections over steps, layers and heads), "
                f"then {group.iloc[1]['token']!r} ({group.iloc[1]['share']:.0%})."
                for name, group in table.groupby("model", sort=False) if len(group) >= 2]
    findings.append("Paper (Table 2): LLaDA-8B 'Ċ' (newline) .368, '<|mdm_mask|>' .366; Dream-7B '<|mask|>' .321, "
                    "'Ċ' .090; MMaDA-8B 'Ċ' .180, '<|mdm_mask|>' .166 — whitespace and the mask token host most sinks.")
    shown = Summary.by_model(table.set_index("model")[["token", "count", "share"]], flagged, findings)
    return Result(figures={"table2_sink_tokens": figure},
                  tables={"table2_sink_tokens": table}, layouts={"table2_sink_tokens": Layout(("model", "token"))},
                  texts={"table2_sink_tokens.md": table.to_markdown(index=False, floatfmt=".3f")}, shown=shown)


def pick_sink_dynamics(traces: Traces, eps: float) -> pd.DataFrame:
    """Per model and generation, the lifetime, move rate and distance to the unmasking frontier of each head's
    greatest sink (dynamics.dynamics_summary), with a model column."""
    return pd.concat([dynamics.dynamics_summary(ts, eps).assign(model=name) for name, ts in traces.items()],
                     ignore_index=True)


def report_sink_dynamics(summary: pd.DataFrame, traces: Traces) -> Result:
    """The dynamics as saved, and per model its mean move rate, lifetime and share of heads × steps with a sink."""
    shown = summary.groupby("model", sort=False)[["mean_lifetime", "move_rate", "mean_distance_to_frontier",
                                                  "share_heads_with_sink"]].mean()
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: a head's greatest sink moves at {row['move_rate']:.0%} of the step-to-step transitions "
                f"where both steps have a sink"
                f", and stays {significant(row['mean_lifetime'])} steps at one position on average; "
                f"{row['share_heads_with_sink']:.0%} "
                f"of heads × steps have a sink." for name, row in shown.iterrows()]
    findings.append("Paper (Fig. 7): Dream-7B's and LLaDA-8B's sinks shift position across steps, MMaDA-8B's are "
                    "mostly static, and an autoregressive model's stay where they are.")
    return Result(tables={"sink_dynamics": summary}, layouts={"sink_dynamics": Layout(("model", "trace"), "trace")},
                  shown=Summary.by_model(shown, flagged, findings))


def _diffusion(models: Models, name: str) -> bool:
    """Whether `name`'s family sees its whole canvas at every step, so that its sinks can move (Family.canvas_moves)."""
    return models[name].family.canvas_moves


def pick_moving_events(models: Models, traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 4 / 8's data: every moving-sink event of every diffusion model (dynamics.moving_events: trace, step,
    layer, head, position_before, position, …, model)."""
    events = [dynamics.moving_events(model_traces, eps).assign(model=name)
              for name, model_traces in traces.items() if _diffusion(models, name)]
    return pd.concat(events, ignore_index=True) if events else dynamics.empty_events()


def draw_moving_sinks(models: Models, traces: Traces, events: pd.DataFrame) -> dict[str, Figure]:
    """Per diffusion model with an event, its top one (dynamics.top_moving_event) drawn at the step before and the
    step of the move, from full attention maps the model replays (replay_map); by model."""
    figures = {}
    for name, found in events.groupby("model", sort=False):
        top = dynamics.top_moving_event(found.drop(columns="model"))
        if top is None:
            continue
        trace = traces[name][int(top["trace"])]
        step, layer, head = int(top["step"]), int(top["layer"]), int(top["head"])
        maps = [replay_map(models[name], trace, s, layer, head).numpy() for s in (step - 1, step)]
        figures[name] = plots.attention_pair(maps, [step - 1, step], trace, layer, head,
                                             marked=[int(top["position_before"]), int(top["position"])])
    return figures


def report_moving_sinks(events: pd.DataFrame, figures: Mapping[str, Figure], models: Models, traces: Traces) -> Result:
    """Fig. 4 / 8 as saved: the figures (by model), every event, and how many each diffusion model has."""
    result = Result(figures={f"fig04_moving_sink_{_stem(name)}": figure for name, figure in figures.items()})
    table = result.add_table("moving_sink_events", events, Layout(("model", "trace", "step", "layer", "head"), "trace"))
    counts = table.groupby("model").size().reindex([n for n in traces if _diffusion(models, n)], fill_value=0)
    result.shown = Summary.by_model(counts.rename("moving-sink events").to_frame(), near_tie_models(traces))
    return result


def pick_query_splits(models: Models, traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 6a's steps: per diffusion model, the first candidate of its first generation where masked and unmasked
    queries can favour different sinks (dynamics.split_candidates). Columns model, step, layer, head; a model with
    no candidate has no row."""
    rows = []
    for name, model_traces in traces.items():
        candidates = dynamics.split_candidates(model_traces[0], eps) if _diffusion(models, name) else []
        if len(candidates):
            rows.append((name, *(int(candidates.iloc[0][c]) for c in ("step", "layer", "head"))))
    return pd.DataFrame(rows, columns=["model", "step", "layer", "head"])


def draw_query_splits(models: Models, traces: Traces, splits: pd.DataFrame) -> dict[str, Figure]:
    """Each picked step's map, replayed by the model (replay_map), its rows split into masked and unmasked queries;
    by model."""
    figures = {}
    for row in splits.itertuples():
        trace = traces[row.model][0]
        attention = replay_map(models[row.model], trace, row.step, row.layer, row.head).numpy()
        figures[row.model] = plots.query_split(attention, trace.is_masked[row.step].numpy(), trace, row.step,
                                               row.layer, row.head)
    return figures


def report_query_splits(splits: pd.DataFrame, figures: Mapping[str, Figure], models: Models, traces: Traces) -> Result:
    """Fig. 6a as saved (by model); `shown` names each diffusion model without such a step (None when every one has)."""
    missing = [f"{name}: no step with masked and unmasked queries and two sinks in one head"
               for name in traces if _diffusion(models, name) and name not in set(splits["model"])]
    return Result(figures={f"fig06a_query_split_{_stem(name)}": figure for name, figure in figures.items()},
                  shown="\n".join(missing) or None)


def pick_transient(traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 6b's data: every sink that lives for a single step, of every model (dynamics.transient_events, with a
    model column)."""
    return pd.concat([dynamics.transient_events(ts, eps).assign(model=name) for name, ts in traces.items()],
                     ignore_index=True)


def strongest_transient(models: Models, events: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6b's sinks: per diffusion model with one, its strongest one-step sink (the highest score) among `events`
    (pick_transient's); its rows, in the models' order."""
    rows = [found.sort_values("score", ascending=False).iloc[:1] for name, found in events.groupby("model", sort=False)
            if _diffusion(models, name)]
    return pd.concat(rows, ignore_index=True) if rows else events.iloc[:0]


def pick_transient_scores(traces: Traces, strongest: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6b's scores: for each sink of `strongest`, its head's comparable scores (dynamics.comparable_scores) at
    the step before, its step and the step after. Columns model, step, position, score."""
    frames = []
    for row in strongest.itertuples():
        trace = traces[row.model][int(row.trace)]
        scores = dynamics.comparable_scores(trace)[:, int(row.layer), int(row.head)].numpy()
        for step in range(max(0, int(row.step) - 1), min(trace.n_steps, int(row.step) + 2)):
            frames.append(pd.DataFrame({"model": row.model, "step": step, "position": np.arange(scores.shape[1]),
                                        "score": scores[step]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["model", "step", "position", "score"])


def draw_transient(traces: Traces, strongest: pd.DataFrame, scores: pd.DataFrame) -> dict[str, Figure]:
    """Each sink of `strongest` drawn at the steps around it (plots.transient_sink) from pick_transient_scores'
    `scores`; by model."""
    return {row.model: plots.transient_sink(traces[row.model][int(row.trace)], int(row.step), int(row.layer),
                                            int(row.head), int(row.position), scores=scores[scores["model"] == row.model])
            for row in strongest.itertuples()}


def report_transient(events: pd.DataFrame, figures: Mapping[str, Figure], traces: Traces) -> Result:
    """Fig. 6b as saved (by model), every event, and how many each model has."""
    result = Result(figures={f"fig06b_transient_{_stem(name)}": figure for name, figure in figures.items()})
    table = result.add_table("transient_sinks", events, Layout(("model", "trace", "step", "layer", "head", "position"),
                                                               "trace", threshold="threshold_gap"))
    counts = table.groupby("model").size().reindex(list(traces), fill_value=0)
    result.shown = Summary.by_model(counts.rename("one-step sinks").to_frame(), near_tie_models(traces))
    return result


def pick_greatest_sinks(traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 7's data: per model, in its first generation, the greatest key of the head with the most steps that have
    a sink (dynamics.busiest_head) at every step (dynamics.greatest_sinks' columns: step, layer, head, position,
    is_sink, frontier, …), with a model column."""
    frames = []
    for name, model_traces in traces.items():
        top = dynamics.greatest_sinks(model_traces[0], eps)
        layer, head = dynamics.busiest_head(top)
        frames.append(top[(top["layer"] == layer) & (top["head"] == head)].assign(model=name))
    return pd.concat(frames, ignore_index=True)


def head_panels(frame: pd.DataFrame, by: str = "model", joiner: str = " — ") -> dict[str, pd.DataFrame]:
    """plots.greatest_sink_positions' panels: `frame`'s rows split by `by` (in order), each titled "<value><joiner>
    layer L, head H" after the one head its rows follow."""
    return {f"{value}{joiner}layer {rows['layer'].iloc[0]}, head {rows['head'].iloc[0]}": rows.drop(columns=by)
            for value, rows in frame.groupby(by, sort=False)}


def report_greatest_sinks(frame: pd.DataFrame, figure: Figure) -> Result:
    """Fig. 7 as saved: the figure and its rows."""
    return Result(figures={"fig07_greatest_sink_positions": figure}, tables={"fig07_greatest_sink": frame},
                  layouts={"fig07_greatest_sink": Layout(("model", "step"), "first")})


def pick_stability_by_key_type(traces: Traces, k: int, eps: float) -> pd.DataFrame:
    """"Do sinks move?" both ways, per model and key type (dynamics.stability_by_key_type): the paper's measure,
    how often the greatest sink changes position between consecutive steps (with its Wilson interval), and the set
    measure, the top-k Jaccard overlap."""
    return dynamics.stability_by_key_type([t for ts in traces.values() for t in ts], k, eps)


def report_stability_by_key_type(frame: pd.DataFrame, figure: Figure, traces: Traces) -> Result:
    """The figure, the table, and per model both measures over each key type that has pairs."""
    flagged = near_tie_models(traces)
    k = int(frame["k"].iloc[0]) if len(frame) else 0
    findings = []
    for name, rows in frame.groupby("model", sort=False):
        rows = rows.set_index("key_type")
        parts = [f"{kind} keys: moves {significant(rows.loc[kind, 'move_rate'])} "
                 f"[{significant(rows.loc[kind, 'move_rate_ci_low'])}, {significant(rows.loc[kind, 'move_rate_ci_high'])}] "
                 f"of {int(rows.loc[kind, 'pairs_with_sinks'])} pairs, top-{k} Jaccard "
                 f"{significant(rows.loc[kind, 'jaccard_mean'])}"
                 for kind in rows.index if rows.loc[kind, "pairs_with_sinks"] or rows.loc[kind, "jaccard_pairs"]]
        findings.append(f"{label(name, flagged)}: " + "; ".join(parts) + ".")
    findings.append("Paper: the greatest sink moves in diffusion models and stays in an autoregressive one; papers that "
                    "track the top-k set (Sparse-dLLM, SparseD, MaskKV, MAGE) find attention stable across steps. "
                    "Intervals treat step pairs as independent (they are not): read them as a lower bound on the spread.")
    return Result(figures={"fig_stability_by_key_type": figure},
                  tables={"stability_by_key_type": frame}, layouts={"stability_by_key_type": Layout(("model", "key_type"))},
                  shown=Summary(frame.assign(model=[label(m, flagged) for m in frame["model"]]).set_index(
                      ["model", "key_type"])[["move_rate", "move_rate_ci_low", "move_rate_ci_high", "pairs_with_sinks",
                                              "jaccard_mean"]], findings))


def pick_paper_layout(traces: Traces, eps: float, k: int = 5) -> pd.DataFrame:
    """Sinks under the paper's layout (long canvases: 128 tokens, one per step; LLaDA in blocks of 32): `traces` by
    layout label ("tiny-llada, 128 tokens, blocks of 32"). One row per label: where the greatest sinks sit — on the
    rightmost still-masked token (the paper's Dream: "originate at the rightmost masked token and shift leftward"), on
    any masked token, on prompt or decoded keys, over `sink_rows` sink-bearing (trace, step, layer, head)s — how the
    greatest sink's position follows the frontier and the rightmost masked position across steps (Spearman), and both
    stability measures over all keys and over masked keys (dynamics.stability_by_key_type)."""
    rows = []
    for name, layout_traces in traces.items():
        where = dynamics.frontier_summary(list(layout_traces), eps).iloc[0].drop("model")
        moving = dynamics.stability_by_key_type(list(layout_traces), k, eps).set_index("key_type")
        rows.append({"layout": name, "model": layout_traces[0].meta.get("model", ""), "n_traces": len(layout_traces),
                     "steps": layout_traces[0].n_steps, **where.to_dict(),
                     **{f"{column}_{kind}": moving.loc[kind, column] for kind in ("all", "masked")
                        for column in ("move_rate", "pairs_with_sinks", "jaccard_mean")}})
    return pd.DataFrame(rows)


def pick_paper_layout_heads(traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 7 under the paper's layout: per label of `traces`, its first generation's busiest head (dynamics.busiest_head)
    at every step — dynamics.greatest_sinks' columns, the rightmost still-masked position where the head has a sink
    (dynamics.frontier_tracking) and a layout column."""
    frames = []
    for name, layout_traces in traces.items():
        top = dynamics.frontier_tracking(layout_traces[0], eps)
        every = dynamics.greatest_sinks(layout_traces[0], eps)
        layer, head = dynamics.busiest_head(every)
        frames.append(every[(every["layer"] == layer) & (every["head"] == head)].merge(
            top[["step", "layer", "head", "rightmost_masked"]], on=["step", "layer", "head"], how="left").assign(
            layout=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["step", "layer", "head", "layout"])


def report_paper_layout(table: pd.DataFrame, heads: pd.DataFrame, figure: Figure, k: int = 5) -> Result:
    """Fig. 7 under the paper's layout as saved: the figure, both tables, and a finding per layout (no layout: says
    so)."""
    if table.empty:
        return Result(shown="paper_layouts is empty: no long canvas was generated.")
    findings = [f"{row.layout} ({row.n_traces} generations, {row.steps} steps): the greatest sink sits on the rightmost "
                f"masked token in {significant(row.share_on_rightmost_masked)} of sink-bearing heads × steps, on any masked "
                f"token in {significant(row.share_on_masked)}, on the prompt in {significant(row.share_on_prompt)}; "
                f"its position follows the rightmost masked position with median Spearman "
                f"{significant(row.spearman_rightmost_median)}; it moves in {significant(row.move_rate_all)} of "
                f"{int(row.pairs_with_sinks_all)} step pairs (top-{k} Jaccard {significant(row.jaccard_mean_all)})."
                for row in table.itertuples()]
    findings.append("Paper (Fig. 7): Dream's sinks originate at the rightmost masked token and shift leftward as tokens "
                    "are unmasked; LLaDA's move right as blocks complete; MMaDA's mostly stay.")
    return Result(figures={"fig07_paper_layout": figure},
                  tables={"paper_layout": table, "paper_layout_greatest_sink": heads},
                  layouts={"paper_layout": Layout(("layout",), "none"),
                           "paper_layout_greatest_sink": Layout(("layout", "step"), "none")},
                  shown=Summary(table.set_index("layout")[["share_on_rightmost_masked", "share_on_masked",
                                                          "share_on_prompt", "spearman_rightmost_median",
                                                          "move_rate_all", "jaccard_mean_all"]], findings))


# "Do sinks move?" judged from the run (do_sinks_move). Each rule compares a 95 % interval with one number, so a
# verdict changes only when the data move it across that number:
MOVES_OFTEN = 0.05  # the paper's measure calls a model's sinks moving when its greatest sink moves in 1 step pair in 20
STABLE_SET = 0.8  # the set measure calls attention stable when a head keeps 0.8 of its top-k keys (Jaccard) step to step
# Dream's picture under the paper's layout: the greatest sink sits on the rightmost still-masked token (the edge of the
# masked canvas the paper says Dream's sinks ride) in at least half of the sink-bearing heads × steps
ON_THE_FRONTIER = 0.5


def judged(low: float, high: float, threshold: float) -> str:
    """"supports" when a 95 % interval [low, high] lies at or above `threshold`, "contradicts" when it lies below,
    "cannot decide" when it holds the threshold or is undefined (no data)."""
    if np.isnan(low) or np.isnan(high):
        return "cannot decide"
    return "supports" if low >= threshold else "contradicts" if high < threshold else "cannot decide"


def _verdict(model: str, claim: str, n: int, estimate: float, interval: tuple[float, float], threshold: float) -> dict:
    return {"model": model, "claim": claim, "n": int(n), "estimate": estimate, "low": interval[0], "high": interval[1],
            "threshold": threshold, "verdict": judged(*interval, threshold)}


# A claim about a model holds across its generations, not across the steps, heads or positions inside one (those are
# far from independent): each verdict's interval resamples whole generations (a cluster bootstrap), and a model with
# fewer generations than MIN_GENERATIONS cannot decide
MIN_GENERATIONS = 3
BOOTSTRAP_DRAWS = 2000


def generation_bootstrap(sums, estimate: Callable[[np.ndarray], np.ndarray]) -> tuple[float, tuple[float, float]]:
    """A statistic over every generation, and its 95 % interval resampling whole generations.

    Args:
        sums: [generations, k] additive counts of each generation (e.g. its moves and its step pairs).
        estimate: totals [..., k] → the statistic [...], vectorised (e.g. moves / pairs).

    Returns:
        (the statistic on the summed counts, its percentile interval over BOOTSTRAP_DRAWS resamples of the
        generations, drawn from a fixed seed so the same data give the same interval); the interval is (nan, nan)
        with fewer than MIN_GENERATIONS generations, or where the statistic is undefined in most resamples.
    """
    sums = np.asarray(sums, dtype=float).reshape(len(sums), -1)
    nan = (float("nan"), float("nan"))
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(estimate(sums.sum(0))) if len(sums) else float("nan")
        if len(sums) < MIN_GENERATIONS:
            return point, nan
        picks = np.random.default_rng(0).integers(0, len(sums), (BOOTSTRAP_DRAWS, len(sums)))
        draws = estimate(sums[picks].sum(1))
    draws = draws[np.isfinite(draws)]
    if len(draws) < BOOTSTRAP_DRAWS // 2:
        return point, nan
    low, high = np.quantile(draws, [0.025, 0.975])
    return point, (float(low), float(high))


def _share(totals: np.ndarray) -> np.ndarray:
    """counts [..., 2] (hits, of) → hits / of."""
    return totals[..., 0] / totals[..., 1]


def _hits(share: float, of: int) -> tuple[int, int]:
    """(hits, of) from a share of `of` (0 hits of 0 where the share is undefined)."""
    return (int(round(share * of)), int(of)) if of else (0, 0)


def _moving_verdicts(name: str, traces: Sequence[Trace], k: int, eps: float) -> list[dict]:
    """One diffusion model's verdicts on "sinks move" (the paper's measure over all keys and over masked keys: each
    generation's moves of its step pairs with a sink at both steps) and on "attention is stable" (each generation's
    top-k Jaccard overlaps, all keys), over its generations."""
    per_generation = [dynamics.stability_by_key_type([trace], k, eps).set_index("key_type") for trace in traces]
    verdicts = []
    for kind in ("all", "masked"):
        counts = [_hits(rows.loc[kind, "move_rate"], rows.loc[kind, "pairs_with_sinks"]) for rows in per_generation]
        verdicts.append(_verdict(name, f"sinks move (paper's measure, {kind} keys)", len(traces),
                                 *generation_bootstrap(counts, _share), MOVES_OFTEN))
    overlaps = [dynamics.topk_overlap(trace, k)["jaccard"] for trace in traces]
    verdicts.append(_verdict(name, f"attention is stable (top-{k} Jaccard, all keys)", len(traces),
                             *generation_bootstrap([(part.sum(), len(part)) for part in overlaps], _share), STABLE_SET))
    return verdicts


def do_sinks_move(models: Models, traces: Traces, layouts: Mapping[str, Sequence[Trace]], k: int,
                  eps: float) -> Verdicts:
    """Notebook 02's "what this run shows", written from its own generations: per diffusion model, whether its sinks
    move under the paper's measure over all keys and over still-masked keys (dynamics.stability_by_key_type, judged
    against MOVES_OFTEN), whether its attention is stable under the set measure (the top-k Jaccard of every step
    pair, against STABLE_SET) and, per paper layout (`layouts`: its generations by label), whether its greatest sink
    rides the rightmost masked token as the paper's Dream's do (dynamics.frontier_summary's share of the sink-bearing
    heads × steps, against ON_THE_FRONTIER). Every interval resamples whole generations (generation_bootstrap), n is
    the generations. Autoregressive models are left out: a decoding row's greatest key is not the column sum a
    diffusion step's is (notebook 02)."""
    rows = [verdict for name in traces if _diffusion(models, name)
            for verdict in _moving_verdicts(name, traces[name], k, eps)]
    for layout, layout_traces in layouts.items():
        counts = [_hits(*dynamics.frontier_summary([trace], eps).iloc[0][["share_on_rightmost_masked", "sink_rows"]])
                  for trace in layout_traces]
        rows.append(_verdict(layout, "the greatest sink rides the rightmost masked token (paper's layout)",
                             len(layout_traces), *generation_bootstrap(counts, _share), ON_THE_FRONTIER))
    notes = [f"Rules: sinks move when the paper's measure's interval lies above {MOVES_OFTEN:g} (1 step pair in "
             f"{1 / MOVES_OFTEN:.0f}); attention is stable when the Jaccard's lies above {STABLE_SET:g}; the paper's "
             f"Dream picture holds when over {ON_THE_FRONTIER:g} of sink-bearing heads × steps sit on the rightmost "
             "masked token. An interval holding the number cannot decide. n counts generations: the steps and heads "
             f"of one are not independent, so each interval resamples whole generations ({BOOTSTRAP_DRAWS:,} draws), "
             f"and fewer than {MIN_GENERATIONS} cannot decide."]
    return Verdicts(pd.DataFrame(rows, columns=VERDICT_COLUMNS), near_tie_models(traces), notes)


# --- notebook 03 ---------------------------------------------------------------------------------------------
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


# --- notebook 07 ---------------------------------------------------------------------------------------------
def pick_carry(models: Models, traces: Traces, eps: float, store: str | Path | None = None) -> pd.DataFrame:
    """What each model's sinks carry (sinklib.carry.sink_carry): one row per trace, step, layer and head — the
    greatest key's value norm against the median key's, its share of the attention and of the output, whether it is a
    sink. `store`: the trace store the traces came from, where each trace's measurement (one forward per step) is kept
    once made (trace_store.stored_measurement)."""
    return pd.concat([stored_measurement(store, trace, "sink_carry", {"eps": eps}, "sinklib.carry",
                                         functools.partial(carry.sink_carry, models[name], trace, eps))
                      for name, model_traces in traces.items() for trace in model_traces], ignore_index=True)


def report_carry(frame: pd.DataFrame, figure: Figure, traces: Traces) -> Result:
    """What the sinks carry as saved: the figure (plots.carry_plot), the per-layer table, and per model, over the
    (step, layer, head)s whose greatest key is a sink (carry.carry_summary), what kind of sink it is."""
    summary = carry.carry_summary([frame]).reindex(list(traces))
    by_layer = frame[frame["is_sink"]].groupby(["model", "layer"], sort=False).agg(
        sink_heads=("value_ratio", "size"), value_ratio_median=("value_ratio", "median"),
        score_share=("score_share", "mean"), output_share=("output_share", "mean")).reset_index()
    flagged = near_tie_models(traces)
    findings = []
    for name, row in summary.iterrows():
        ratio = row["value / median key"]
        if pd.isna(ratio):
            findings.append(f"{label(name, flagged)}: no head's greatest key passes Eq. 3 in these generations.")
            continue
        kind = "a near no-op sink (small value)" if ratio < 0.5 else \
            "a sink that carries a value as large as other keys' or larger" if ratio >= 1 else "a sink with a smaller value"
        findings.append(f"{label(name, flagged)}: its sinks' value vectors are {significant(ratio)}× the median key's — "
                        f"{kind}; they take {row['score share']:.0%} of their head's attention and "
                        f"{row['output share']:.0%} of its output (norm-based).")
    findings.append("Literature (SPEC §8): real models' sinks are no-ops (MiniLM's [CLS] 0.13–0.37 against a median of "
                    "2.7–4.5; SmolLM2's first token 0.9–4.4 against 6–11).")
    return Result(figures={"fig_sink_carry": figure}, tables={"sink_carry_by_layer": by_layer},
                  layouts={"sink_carry_by_layer": Layout(("model", "layer"))},
                  shown=Summary.by_model(summary, flagged, findings))


def pick_step_stability(traces: Traces, k: int, eps: float) -> pd.DataFrame:
    """How much each head's top keys change from one step to the next (top-k Jaccard overlap) and how often the
    greatest sink moves, per model and layer (dynamics.stability_by_layer)."""
    return dynamics.stability_by_layer([t for ts in traces.values() for t in ts], k, eps)


def report_step_stability(frame: pd.DataFrame, figure: Figure, traces: Traces, k: int) -> Result:
    """The stability as saved: the figure (plots.stability_plot), the table, and per model its means over layers."""
    summary = frame.groupby("model", sort=False).agg(
        jaccard=("jaccard_mean", "mean"), jaccard_lowest_layer=("jaccard_mean", "min"),
        move_rate=("move_rate", "mean"), move_rate_highest_layer=("move_rate", "max")).reindex(list(traces))
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: consecutive steps share {significant(row['jaccard'])} of their top-{k} keys "
                f"(Jaccard, mean over layers; lowest layer {significant(row['jaccard_lowest_layer'])}); the greatest sink "
                f"moves in {significant(row['move_rate'])} of step pairs (highest layer "
                f"{significant(row['move_rate_highest_layer'])})." for name, row in summary.iterrows()]
    findings.append("Paper: diffusion models' sinks move across steps, an autoregressive model's stay; MAGE, LoSA and "
                    "SparseD (2026) report attention that is stable across denoising steps.")
    return Result(figures={"fig_step_stability": figure}, tables={"step_stability": frame},
                  layouts={"step_stability": Layout(("model", "layer"))},
                  shown=Summary.by_model(summary, flagged, findings))


def _lens_groups(trace, frame: pd.DataFrame, eps: float) -> pd.DataFrame:
    """One trace's lens frame with each (step, position) read's group: "masked sink", "other masked", "sink, not
    masked" or "other" ("masked" as lens.masked_position_table has it: the read and the predicted position both still
    masked)."""
    sinks = lens.sink_positions(trace, eps)[["step", "position"]].assign(is_sink=True)
    frame = frame.merge(sinks, on=["step", "position"], how="left")
    is_sink = frame["is_sink"].eq(True).to_numpy()
    masked = ((frame["state"] == "masked") & (frame["position_state"] == "masked")).to_numpy()
    return frame.assign(group=np.select([is_sink & masked, masked, is_sink],
                                        ["masked sink", "other masked", "sink, not masked"], "other"))


def _lens_finding(name: str, by_group: pd.DataFrame, curves: pd.DataFrame) -> str:
    """What one model's lens shows: how often and from which layer masked sinks and other masked positions name their
    final token, and what the sink positions decode to at the last layer (its `curves`' rows)."""
    last = curves[(curves["layer"] == curves["layer"].max()) & curves["group"].isin(["masked sink", "sink, not masked"])]
    decoded = ", ".join(f"{token!r} {share:.2f}" for token, share in
                        last["top_token"].value_counts(normalize=True).head(3).items())
    sink, other = by_group.loc["sink"], by_group.loc["other masked"]
    return (f"{name}: masked sinks name their final token at the last layer in {sink['share_final_at_last']:.2f} "
            f"of {int(sink['n'])} (position, step) cases, from layer {sink['mean_first_correct_layer']:.1f} on "
            f"average; other masked positions in {other['share_final_at_last']:.2f} of {int(other['n'])}, "
            f"from layer {other['mean_first_correct_layer']:.1f}; the sink positions decode at the last layer "
            f"to {decoded or 'nothing'}.")


LENS_READ_COLUMNS = ["model", "trace", "layer", "group", "top_is_final", "top_token", "position_state"]


def _stored_lens(model, trace, store: str | Path | None) -> pd.DataFrame:
    """One trace's logit lens (top 1), read from `store` where it was kept (trace_store.stored_measurement)."""
    return stored_measurement(store, trace, "logit_lens", {"top": 1}, "sinklib.lens",
                              functools.partial(lens.logit_lens, model, trace))


def pick_lens_reads(models: Models, traces: Traces, eps: float, names: Sequence[str], n_traces: int = 2,
                    store: str | Path | None = None) -> pd.DataFrame:
    """The paper's open question (§7), with a logit lens (sinklib.lens): for each model of `names` (native
    transformers models only) and its first n_traces generations, every layer's residual stream read through the
    final norm and unembedding at every position and step. One row per read: model, trace, layer, its group ("masked
    sink", "other masked", "sink, not masked", "other": _lens_groups), whether its argmax is already the token the
    generation ends with there (top_is_final), that argmax (top_token) and the position's state. The lens is read from
    `store` where it was kept."""
    reads = [_lens_groups(trace, _stored_lens(models[name], trace, store), eps).assign(model=name, trace=index)
             [LENS_READ_COLUMNS] for name in names for index, trace in enumerate(list(traces[name])[:n_traces])]
    return pd.concat(reads, ignore_index=True) if reads else pd.DataFrame(columns=LENS_READ_COLUMNS)


def share_final_by_layer(reads: pd.DataFrame) -> pd.DataFrame:
    """By model, group and layer: the share of reads whose lens already names their final token (share_final) and
    how many reads (n) — what plots.lens_plot draws."""
    return (reads.groupby(["model", "group", "layer"], sort=False)["top_is_final"].agg(["mean", "size"])
            .reset_index().rename(columns={"mean": "share_final", "size": "n"}))


def lens_groups(cases: pd.DataFrame) -> pd.DataFrame:
    """Per model, its masked sinks against its other masked positions (pick_lens_cases' rows, pooled over the
    traces, as lens.sink_vs_other_masked pools them): n cases, n_ever_correct (a first correct layer exists),
    mean_first_correct_layer (over those), share_final_at_last and mean_final_prob_last."""
    rows = [{"model": model, "group": group, "n": len(part),
             "n_ever_correct": int(part["first_correct_layer"].notna().sum()),
             "mean_first_correct_layer": float(part["first_correct_layer"].mean()),
             "share_final_at_last": float(part["final_at_last"].astype(float).mean()),
             "mean_final_prob_last": float(part["final_prob_last"].mean())}
            for model, mine in cases.groupby("model", sort=False)
            for group, part in (("sink", mine[mine["is_sink"]]), ("other masked", mine[~mine["is_sink"]]))]
    return pd.DataFrame(rows)


def report_lens(reads: pd.DataFrame, cases: pd.DataFrame, figure) -> Result:
    """The lens section's Result: the figure (plots.lens_plot of share_final_by_layer(reads)), the per-model table of
    lens_groups(cases) with what the sink positions decode to at the last layer, and the by-layer table."""
    if reads.empty:
        return Result(shown="lens_models is empty: no model was read by the logit lens.")
    table = lens_groups(cases)
    findings = [_lens_finding(name, table[table["model"] == name].set_index("group"), reads[reads["model"] == name])
                for name in plots.in_order(reads["model"])]
    findings.append("Paper §7 asks what the sinks on future positions store, e.g. with the logit lens. A sink that "
                    "predicts its final token earlier than other masked positions would be storing a plan for it.")
    return Result(figures={"fig_what_sinks_store": figure},
                  tables={"what_sinks_store": table, "what_sinks_store_by_layer": share_final_by_layer(reads)},
                  layouts={"what_sinks_store": Layout(("model", "group")),
                           "what_sinks_store_by_layer": Layout(("model", "group", "layer"))},
                  shown=Summary(table.set_index(["model", "group"]), findings))


def pick_lens_cases(models: Models, traces: Traces, eps: float, names: Sequence[str], n_traces: int = 2,
                    store: str | Path | None = None) -> pd.DataFrame:
    """The logit lens's cases, one row each: for each model of `names` and its first n_traces generations, every
    (step, position) whose read and predicted positions are both still masked (lens.masked_position_table): whether
    it is a sink, the first layer from which its lens names its final token, … with model and trace columns. The
    lens is read from `store` where it was kept (trace_store.stored_measurement), as pick_lens_reads reads it."""
    tables = [lens.masked_position_table(trace, _stored_lens(models[name], trace, store), eps)
              .assign(model=name, trace=index)
              for name in names for index, trace in enumerate(list(traces[name])[:n_traces])]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["model", "is_sink",
                                                                                     "first_correct_layer"])


# A masked sink "stores its token" when its lens names the final token at least this many layers before the other
# masked positions' does (the mean first correct layer; a layer is the lens's unit of depth)
EARLIER_BY = 1.0


def does_a_sink_store_its_token(cases: pd.DataFrame) -> Verdicts:
    """Notebook 07's "what this run shows": per model of `cases` (pick_lens_cases), how many layers earlier its masked
    sinks name their final token than its other masked positions do — the difference of the mean first correct layer
    (over the cases that ever name it), its 95 % interval resampling whole generations (generation_bootstrap: the
    cases of one generation over consecutive steps are largely the same positions) — judged against EARLIER_BY.
    n: the generations."""
    rows = []
    for name, part in cases.groupby("model", sort=False):
        counts = [(mine.loc[sink, "first_correct_layer"].sum(), mine.loc[sink, "first_correct_layer"].count(),
                   mine.loc[~sink, "first_correct_layer"].sum(), mine.loc[~sink, "first_correct_layer"].count())
                  for _, mine in part.groupby("trace", sort=False) for sink in [mine["is_sink"].astype(bool)]]
        rows.append(_verdict(name, f"masked sinks name their final token at least {EARLIER_BY:g} layer earlier than "
                             "other masked positions", len(counts), *generation_bootstrap(counts, _layers_earlier),
                             EARLIER_BY))
    notes = [f"Rule: supports when the interval of (other masked − masked sinks) lies at or above {EARLIER_BY:g} layer "
             "(analyses.EARLIER_BY), contradicts when it lies below (the sinks may still be earlier, by less). n counts "
             f"generations; each interval resamples whole ones, and fewer than {MIN_GENERATIONS} cannot decide."]
    return Verdicts(pd.DataFrame(rows, columns=VERDICT_COLUMNS), notes=notes)


def _layers_earlier(totals: np.ndarray) -> np.ndarray:
    """totals [..., 4] (sinks' first layers summed, sinks, others' summed, others) → others' mean − sinks' mean."""
    return totals[..., 2] / totals[..., 3] - totals[..., 0] / totals[..., 1]


def carry_against_masking(carry_frame: pd.DataFrame, frames: Sequence[pd.DataFrame]) -> list[str]:
    """Does masking hurt in proportion to what the sink carries? Per model of `carry_frame` (pick_carry): what its
    sinks carry (value / median key) beside the top-1 sink's masking cost over one random key's and the cost of
    ablating the top-1 sink's value (`frames`: the dose-response tables' frames); then, across the models, the rank
    correlation of what sinks carry with what masking them costs."""
    carried = carry.carry_summary([carry_frame]).reindex(pd.unique(carry_frame["model"]))
    table = pd.concat(frames, ignore_index=True)
    accuracy = table.pivot_table(index="model", columns=["condition", "k"], values="accuracy")
    lines, pairs = [], []
    for name in carried.index:
        if name not in accuracy.index:
            continue
        full = accuracy.loc[name]
        row = full.reindex([("sinks", 0), ("sinks", 1), ("random keys", 1)])  # a condition this run did not make: NaN
        base = row[("sinks", 0)]
        excess = row[("random keys", 1)] - row[("sinks", 1)]
        value_cost = next((base - full[key] for key in full.index if key[0].startswith("sink values") and key[1] == 1),
                          float("nan"))
        ratio = carried.loc[name, "value / median key"]
        pairs.append((ratio, excess))
        lines.append(f"{name}: sinks carry {significant(ratio)}× the median key's value; masking the top-1 sink costs "
                     f"{excess:+.2f} accuracy beyond masking one random key, and ablating its value costs "
                     f"{value_cost:+.2f} (unmasked {base:.2f}).")
    usable = [(r, e) for r, e in pairs if pd.notna(r) and pd.notna(e)]
    if len(usable) >= 3:
        rho = pd.Series([r for r, _ in usable]).corr(pd.Series([e for _, e in usable]), method="spearman")
        verdict = "supports" if rho > 0.5 else "contradicts" if rho < -0.5 else "neither supports nor contradicts"
        lines.append(f"Across {len(usable)} models the rank correlation of what the sinks carry with the top-1 sink's "
                     f"excess masking cost is {rho:+.2f}: this run {verdict} the explanation that masking hurts in "
                     "proportion to what the sink carries.")
    return lines


def masking_checks(tables: Mapping[str, MaskingTable]) -> Summary:
    """Every row's checks (MaskingTable.checks) of every task's table, one line per model, condition and k, shown to
    three significant digits like every other table."""
    frame = pd.concat([table.checks() for table in tables.values()], ignore_index=True)
    return Summary(frame.set_index(["model", "condition", "k"]))


def masking_tests(tables: Mapping[str, MaskingTable], matched: Sequence[str] = ()) -> Summary:
    """Table 1's paired tests, every task: each masked column against the same model unmasked (MaskingTable.paired)
    and the top-k sinks against k random keys (sinks_against_random), each with n, the problems lost and gained, the
    paired difference with its 95 % interval and McNemar's exact p. With `matched` (models that answer the same task),
    the findings add the competence-matched table: on the problems all of them solve unmasked, the share each keeps
    with its top-1 sink masked."""
    frames = [frame for table in tables.values() for frame in (table.paired(), table.sinks_against_random())]
    frame = pd.concat(frames, ignore_index=True).set_index(["model", "condition", "k"])
    frame["p_mcnemar"] = [f"{p:.2g}" for p in frame["p_mcnemar"]]  # shown as 3.4e-24: three decimals would say 0.000
    findings = []
    for table in tables.values():
        present = [name for name in matched if name in set(table.items["model"])]
        if len(present) < 2:
            continue
        kept = table.competence_matched(present)
        if kept.items.empty:
            findings.append(f"Competence-matched ({table.task}): no problem is solved unmasked by all of {present}.")
            continue
        accuracy = kept.frame.set_index(["model", "condition", "k"])
        n = int(accuracy["n"].max())
        parts = [f"{name} keeps {accuracy.loc[(name, 'sinks', 1), 'accuracy']:.2f} "
                 f"[{accuracy.loc[(name, 'sinks', 1), 'ci_low']:.2f}, {accuracy.loc[(name, 'sinks', 1), 'ci_high']:.2f}]"
                 for name in present if (name, "sinks", 1) in accuracy.index]
        findings.append(f"Competence-matched ({table.task}: the {n} problems {', '.join(present)} all solve unmasked), "
                        f"with the top-1 sink masked: " + "; ".join(parts) + ".")
    findings.append("delta is masked − unmasked (for 'sinks vs random keys': sinks − random keys); lost counts problems "
                    "right before and wrong after. McNemar's exact test uses only the problems that changed.")
    return Summary(frame, findings)


# what the paper's Table 1 says a model of each kind does with its top-1 sink masked (GSM8K)
PAPER_TOP1 = {"diffusion": ("barely notices", "the paper's diffusion models, which barely notice theirs (Dream-7B "
                                              ".82 → .79, LLaDA-8B .76 → .75, MMaDA-8B .54 → .53)"),
              "autoregressive": ("collapses", "the paper's Llama-3.1-8B, which collapses (.85 → .02)")}


def sink_reliance(tables: Mapping[str, MaskingTable]) -> Summary:
    """What this run shows, written from its own tables: for each model, whether masking its top-1 sink costs it
    anything (the paired change from unmasked and its 95 % interval: it "collapses" where a quarter of its unmasked
    accuracy or less is left, "loses" where the interval lies below 0, "barely notices" where it holds 0), whether
    that costs more than one random key does (the sinks-against-random paired test at k = 1), and whether a model of
    its kind (the family its config declares, where that is known without loading it) does what the paper's do."""
    rows = []
    for table in tables.values():
        paired = table.paired().set_index(["model", "condition", "k"])
        against = table.sinks_against_random().set_index(["model", "k"])
        accuracy = table.frame.set_index(["model", "condition", "k"])["accuracy"]
        for model in dict.fromkeys(table.frame["model"]):
            if (model, "sinks", 1) not in paired.index or (model, "sinks", 0) not in accuracy.index:
                continue
            rows.append(_reliance_row(model, table.task, accuracy, paired.loc[(model, "sinks", 1)],
                                      against.loc[(model, 1)] if (model, 1) in against.index else None))
    frame = pd.DataFrame(rows).set_index("model")
    findings = [f"{name}: {row['verdict']}." for name, row in frame.iterrows()]
    flagged = set().union(*(table.near_tie_models() for table in tables.values()))
    return Summary.by_model(frame.drop(columns="verdict"), flagged, findings)


def _reliance_row(model: str, task: str, accuracy: pd.Series, top1: pd.Series, against: pd.Series | None) -> dict:
    """One model's verdict on its top-1 sink (sink_reliance)."""
    unmasked, masked = accuracy.loc[(model, "sinks", 0)], accuracy.loc[(model, "sinks", 1)]
    if top1["delta_high"] < 0:
        cost = "collapses" if masked <= unmasked / 4 else "loses"
    else:
        cost = "barely notices"
    amount = f"loses {-top1['delta']:.2f}" if cost == "loses" else cost
    said = (f"with its top-1 sink masked it {amount} "
            f"({unmasked:.2f} → {masked:.2f}; paired {top1['delta']:+.2f} [{top1['delta_low']:+.2f}, "
            f"{top1['delta_high']:+.2f}], n = {int(top1['n'])})")
    if against is not None:
        beyond = "more than" if against["delta_high"] < 0 else "less than" if against["delta_low"] > 0 else "no more than"
        said += (f", {beyond} one random key costs it (sinks − random {against['delta']:+.2f} "
                 f"[{against['delta_low']:+.2f}, {against['delta_high']:+.2f}])")
    family = family_before_loading(model)
    kind = family.kind if family is not None else None
    if kind in PAPER_TOP1:
        expected, paper = PAPER_TOP1[kind]
        relation = "as" if cost == expected else "less than" if (cost, expected) == ("loses", "collapses") else "unlike"
        said += f"; {relation} {paper}"
    return {"model": model, "task": task, "kind": kind or "not declared", "unmasked": unmasked, "top-1": masked,
            "delta": top1["delta"], "delta_low": top1["delta_low"], "delta_high": top1["delta_high"],
            "verdict": said}


# --- notebook 08 ---------------------------------------------------------------------------------------------
def report_speed_frontier(table: pd.DataFrame, figure: Figure) -> Result:
    """Can sinks make a diffusion LM fast? `table` (SpeedRun.collect's pick, sinklib.speed.frontier): each policy's
    accuracy (n, Wilson 95 % interval, McNemar against the model's plain sampler on the same problems) against its
    seconds per answer; `figure` (plots.frontier_plot) draws it. The findings name, for each diffusion model, the
    fastest policy whose accuracy stays inside the plain sampler's interval, beside the autoregressive twin's KV
    cache."""
    findings = []
    autoregressive = table[table["policy"] == "KV cache"].set_index("model")
    for model, rows in table[table["policy"] != "KV cache"].groupby("model", sort=False):
        plain = rows[rows["policy"] == "plain"].iloc[0]
        kept = rows[(rows["accuracy"] >= plain["ci_low"]) & (rows["accuracy"] <= plain["ci_high"])]
        best = kept.sort_values("seconds_per_answer").iloc[0]
        line = (f"{model}: plain {plain['accuracy']:.3f} [{plain['ci_low']:.3f}, {plain['ci_high']:.3f}] "
                f"(n={int(plain['n'])}) in {plain['seconds_per_answer']:.2f} s an answer; the fastest policy inside that "
                f"interval is {best['policy']}: {best['accuracy']:.3f} [{best['ci_low']:.3f}, {best['ci_high']:.3f}], "
                f"{best['speedup']:.1f}× faster ({best['seconds_per_answer']:.2f} s, {best['forwards_per_answer']:.1f} "
                f"forwards an answer instead of {plain['forwards_per_answer']:.0f})")
        if best["policy"] != "plain":
            line += f", paired against plain: {int(best['lost'])} lost, {int(best['gained'])} gained, McNemar p = " \
                    f"{significant(best['mcnemar_p'])}"
        findings.append(line + ".")
    twin, arm = "smollm2-135m-diffusion", "smollm2-135m-autoregressive"
    if twin in set(table["model"]) and arm in autoregressive.index:
        rows = table[(table["model"] == twin) & (table["policy"] != "KV cache")]
        fastest = rows.sort_values("seconds_per_answer").iloc[0]
        other = autoregressive.loc[arm]
        findings.append(f"Against its autoregressive twin with a KV cache ({other['seconds_per_answer']:.2f} s an answer, "
                        f"{other['tokens_per_second']:.1f} answer tokens/s, accuracy {other['accuracy']:.3f} "
                        f"[{other['ci_low']:.3f}, {other['ci_high']:.3f}]): the diffusion twin's fastest policy "
                        f"({fastest['policy']}) takes {fastest['seconds_per_answer'] / other['seconds_per_answer']:.2f}× "
                        f"its time an answer and decodes {fastest['tokens_per_second'] / other['tokens_per_second']:.2f}× "
                        "its tokens a second (a diffusion answer decodes its whole slot; the autoregressive one stops "
                        "at its end token).")
    shown = table.set_index(["model", "policy"])[["n", "accuracy", "ci_low", "ci_high", "mcnemar_p",
                                                 "forwards_per_answer", "seconds_per_answer", "tokens_per_second",
                                                 "speedup"]]
    return Result(figures={"fig_speed_frontier": figure}, tables={"speed_frontier": table},
                  layouts={"speed_frontier": EVALUATION_POLICY}, shown=Summary(shown, findings))


EVALUATION_POLICY = Layout(("model", "policy"), "none")


def pick_sinks_under_cache(traces: Mapping[str, Trace], k: int = 5, eps: float = 3.0) -> pd.DataFrame:
    """What caching does to attention and sinks on one prompt: per trace (label → Trace, the plain sampler's and a
    cached policy's), its forwards, how many were full, the top-k overlap of consecutive steps, how often the greatest
    sink moved, and where the greatest sink most often sits (position and token; -1 and "" when it never is a sink)."""
    rows = []
    for name, trace in traces.items():
        overlap = dynamics.topk_overlap(trace, k)
        greatest = dynamics.greatest_sinks(trace, eps)
        moved = dynamics.moving_sink_events(trace, eps)
        pairs = len(overlap)
        full = np.ones(trace.n_steps, bool) if trace.recomputed is None else trace.recomputed.all(-1).numpy()
        sink_rows = greatest[greatest["is_sink"]]
        place = sink_rows["position"].mode()
        rows.append({"model": str(trace.meta.get("model", "")), "trace": name, "forwards": trace.n_steps,
                     "full_forwards": int(full.sum()),
                     "jaccard": float(overlap["jaccard"].mean()) if pairs else float("nan"),
                     "move_rate": len(moved) / pairs if pairs else float("nan"),
                     "sink_share": float(greatest["is_sink"].mean()),
                     "main_sink_position": int(place.iloc[0]) if len(place) else -1,
                     "main_sink_token": trace.token_text(int(trace.tokens[-1, int(place.iloc[0])])) if len(place) else "",
                     "prompt_len": trace.prompt_len, "text": trace.text})
    return pd.DataFrame(rows)


def pick_mean_scores(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """What plots.cached_attention_plot draws: per trace (label → Trace), each step's comparable scores averaged over
    layers and heads at every position. Columns trace, step, position, score (NaN where a key did not exist)."""
    frames = []
    for name, trace in traces.items():
        means = dynamics.comparable_scores(trace).nanmean(dim=(1, 2)).numpy()
        steps, positions = np.meshgrid(np.arange(means.shape[0]), np.arange(means.shape[1]), indexing="ij")
        frames.append(pd.DataFrame({"trace": name, "step": steps.ravel(), "position": positions.ravel(),
                                    "score": means.ravel()}))
    return pd.concat(frames, ignore_index=True)


def report_sinks_under_cache(frame: pd.DataFrame, figure: Figure, k: int = 5) -> Result:
    """The attention under a cache as saved: the figure (plots.cached_attention_plot), the table, a finding per trace."""
    findings = [f"{row['trace']}: {row['forwards']} forwards ({row['full_forwards']} full); consecutive steps share "
                f"{significant(row['jaccard'])} of each head's top-{k} keys and the greatest sink moves in "
                f"{significant(row['move_rate'])} of step pairs; the most frequent greatest sink is position "
                f"{row['main_sink_position']} ({row['main_sink_token']!r}, prompt of {row['prompt_len']} tokens)."
                for _, row in frame.iterrows()]
    return Result(figures={"fig_sinks_under_cache": figure},
                  tables={"sinks_under_cache": frame}, layouts={"sinks_under_cache": Layout(("model", "trace"), "first")},
                  shown=Summary(frame.set_index("trace"), findings))


# Table 1's columns on the twins beside each sampler they ran (SpeedRun.collect_masking): (model, sampler) → table
SamplerTables = Mapping[tuple[str, str], MaskingTable]
MASKED_BY_SAMPLER = Layout(("model", "sampler", "condition", "k"), "none")
SINK_COLUMNS = ("top-1", "random-1")  # Table 1's top-1 sink and its one-random-key control


def pick_columns_by_sampler(tables: SamplerTables, columns: Sequence[str] = SINK_COLUMNS) -> pd.DataFrame:
    """One row per (model, sampler, column of `columns`, unmasked first): accuracy with its Wilson 95 % interval and
    n, and a masked column's paired change from the same sampler unmasked (Newcombe interval, McNemar p)."""
    rows = []
    for (model, sampler), table in tables.items():
        paired = {(r.condition, r.k): r for r in table.paired().itertuples()}
        for row in table.frame[table.frame["model"] == model].itertuples():
            column = column_name(row.condition, row.k)
            if column != "unmasked" and column not in columns:
                continue
            test = paired.get((row.condition, row.k))
            rows.append({"model": model, "sampler": sampler, "column": column, "condition": row.condition, "k": row.k,
                         "n": row.n, "accuracy": row.accuracy, "ci_low": row.ci_low, "ci_high": row.ci_high,
                         "change": np.nan if test is None else test.delta,
                         "change_low": np.nan if test is None else test.delta_low,
                         "change_high": np.nan if test is None else test.delta_high,
                         "p_mcnemar": np.nan if test is None else test.p_mcnemar})
    return pd.DataFrame(rows)


def eviction_columns(ks: Sequence[int]) -> list[str]:
    """Table 1's column names for the oldest k keys evicted, each k of `ks` ("oldest-1", "oldest-3")."""
    return [column_name("oldest keys", k) for k in ks]


def _by_sampler_shown(frame: pd.DataFrame) -> pd.DataFrame:
    """pick_columns_by_sampler's rows as a notebook shows them: indexed by model, sampler and column."""
    return frame.set_index(["model", "sampler", "column"])[
        ["n", "accuracy", "ci_low", "ci_high", "change", "change_low", "change_high", "p_mcnemar"]]


def _correct(table: MaskingTable, model: str, column: str) -> pd.Series:
    items = table.items[table.items["model"] == model]
    chosen = items[[column_name(c, k) == column for c, k in zip(items["condition"], items["k"])]]
    return chosen.set_index("id")["correct"].astype(bool)


def _change_difference(first: MaskingTable, first_model: str, second: MaskingTable, second_model: str,
                       column: str) -> dict:
    """How much more `column` changes the second (table, model)'s accuracy than the first's, on the problems all
    four runs answered (stats.difference_of_changes)."""
    runs = [_correct(first, first_model, "unmasked"), _correct(first, first_model, column),
            _correct(second, second_model, "unmasked"), _correct(second, second_model, column)]
    common = [i for i in runs[0].index if all(i in run.index for run in runs[1:])]
    result = difference_of_changes(*[run.loc[common].tolist() for run in runs])
    return {"column": column, "n": result.n, "difference": result.delta, "low": result.low, "high": result.high,
            "p": result.p}


def _change_text(row) -> str:
    return (f"{row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}], {row['change']:+.3f} "
            f"[{row['change_low']:+.3f}, {row['change_high']:+.3f}] from unmasked (McNemar p = {significant(row['p_mcnemar'])})")


def pick_sampler_differences(tables: SamplerTables, columns: Sequence[str] = SINK_COLUMNS) -> pd.DataFrame:
    """Does a cached, parallel sampler lean on its sinks more? For each diffusion model that ran under its plain
    sampler and another: each column's change from unmasked under the other sampler minus its change under plain, on
    the same problems (a paired bootstrap interval and a sign-flip test: stats.difference_of_changes). Columns model,
    sampler, column, n, difference, low, high, p."""
    tests = []
    for model, sampler in tables:
        if sampler == "plain" or (model, "plain") not in tables:
            continue
        tests += [{"model": model, "sampler": sampler,
                   **_change_difference(tables[model, "plain"], model, tables[model, sampler], model, column)}
                  for column in columns]
    return pd.DataFrame(tests, columns=["model", "sampler", "column", "n", "difference", "low", "high", "p"])


def report_sink_reliance_by_sampler(frame: pd.DataFrame, differences: pd.DataFrame, figure: Figure) -> Result:
    """Table 1 under each sampler as saved: the figure (plots.columns_by_setting_plot of `frame`), both tables, and per
    model, sampler and column the two changes and their difference."""
    findings = []
    for test in differences.itertuples():
        rows = frame[(frame["model"] == test.model) & (frame["column"] == test.column)].set_index("sampler")
        findings.append(
            f"{test.model}, {column_words(test.column)}: plain {_change_text(rows.loc['plain'])}; {test.sampler} "
            f"{_change_text(rows.loc[test.sampler])}. The change under {test.sampler} minus the change under plain: "
            f"{test.difference:+.3f} [{test.low:+.3f}, {test.high:+.3f}] (n = {test.n}, sign-flip "
            f"p = {significant(test.p)}).")
    result = Result(figures={"fig_sinks_by_sampler": figure}, shown=Summary(_by_sampler_shown(frame), findings))
    result.add_table("masked_by_sampler", frame, MASKED_BY_SAMPLER)
    result.add_table("masked_by_sampler_differences", differences, Layout(("model", "sampler", "column"), "none"))
    return result


def pick_eviction_differences(tables: SamplerTables, ks: Sequence[int] = (1, 3)) -> pd.DataFrame:
    """The paper's §5.3 on the same problems: for each diffusion (model, sampler) and each autoregressive one (its KV
    cache), the diffusion run's change with its oldest k keys evicted minus the autoregressive run's, each k of `ks`
    (above 0: the diffusion model loses less). Columns model, sampler, against, column, n, difference, low, high, p."""
    autoregressive = [key for key in tables if key[1] == AUTOREGRESSIVE_POLICY]
    tests = [{"model": key[0], "sampler": key[1], "against": other[0],
              **_change_difference(tables[other], other[0], tables[key], key[0], column)}
             for key in tables if key[1] != AUTOREGRESSIVE_POLICY for other in autoregressive
             for column in eviction_columns(ks)]
    return pd.DataFrame(tests, columns=["model", "sampler", "against", "column", "n", "difference", "low", "high", "p"])


def report_oldest_context_evicted(frame: pd.DataFrame, differences: pd.DataFrame, figure: Figure) -> Result:
    """The eviction as saved: the figure (plots.columns_by_setting_plot of `frame`), both tables, and per (model,
    sampler) each column's change, then each diffusion run against each autoregressive one."""
    findings = []
    for (model, sampler), rows in frame.groupby(["model", "sampler"], sort=False):
        rows = rows.set_index("column")
        unmasked = rows.loc["unmasked"]
        parts = [f"{column_words(c)}: {_change_text(rows.loc[c])}" for c in rows.index if c != "unmasked"]
        findings.append(f"{model} ({sampler}): unmasked {unmasked['accuracy']:.3f} [{unmasked['ci_low']:.3f}, "
                        f"{unmasked['ci_high']:.3f}]; " + "; ".join(parts) + ".")
    findings += [f"{test.model} ({test.sampler}) against {test.against}, {column_words(test.column)}: the diffusion "
                 f"model's change minus the autoregressive one's {test.difference:+.3f} [{test.low:+.3f}, "
                 f"{test.high:+.3f}] (n = {test.n}, sign-flip p = {significant(test.p)})."
                 for test in differences.itertuples()]
    result = Result(figures={"fig_oldest_context_evicted": figure}, shown=Summary(_by_sampler_shown(frame), findings))
    result.add_table("oldest_context_evicted", frame, MASKED_BY_SAMPLER)
    result.add_table("oldest_context_evicted_differences", differences,
                     Layout(("model", "sampler", "against", "column"), "none"))
    return result


# Notebook 08's claims judged from the run. A loss of accuracy smaller than this is one nobody would act on: an
# interval that excludes every larger loss says "no cost"
NEGLIGIBLE_LOSS = 0.05


def _cost_verdict(who: str, claim: str, n: int, estimate: float, low: float, high: float) -> dict:
    """"supports" a cost when the interval lies below 0, "contradicts" it when the interval excludes every loss of
    NEGLIGIBLE_LOSS or more, "cannot decide" otherwise."""
    verdict = "supports" if high < 0 else "contradicts" if low > -NEGLIGIBLE_LOSS else "cannot decide"
    if np.isnan(low) or np.isnan(high):
        verdict = "cannot decide"
    return {"model": who, "claim": claim, "n": int(n), "estimate": estimate, "low": low, "high": high,
            "threshold": 0.0, "verdict": verdict}


def does_a_fast_sampler_lean_on_sinks(differences: pd.DataFrame) -> Verdicts:
    """Per diffusion model and fast sampler (`differences`: pick_sampler_differences), whether masking each column
    costs more under that sampler than under plain: its change minus plain's, with the paired bootstrap interval
    (stats.difference_of_changes), judged by _cost_verdict."""
    rows = [_cost_verdict(f"{test.model} ({test.sampler})", f"{column_words(test.column)} costs more than under plain",
                          test.n, test.difference, test.low, test.high) for test in differences.itertuples()]
    notes = ["Rule: supports when the difference's 95 % interval lies below 0; contradicts when it excludes a cost of "
             f"{NEGLIGIBLE_LOSS:g} or more (analyses.NEGLIGIBLE_LOSS); otherwise cannot decide."]
    return Verdicts(pd.DataFrame(rows, columns=VERDICT_COLUMNS), notes=notes)


def does_evicting_the_oldest_cost(frame: pd.DataFrame) -> Verdicts:
    """Per (model, sampler) and number of oldest keys evicted (`frame`: pick_columns_by_sampler with
    eviction_columns), whether evicting them costs accuracy: the paired change from the same run unmasked, with its
    Newcombe 95 % interval, judged by _cost_verdict."""
    evicted = frame[frame["column"] != "unmasked"]
    rows = [_cost_verdict(f"{row.model} ({row.sampler})", f"{column_words(row.column)} costs accuracy", row.n,
                          row.change, row.change_low, row.change_high) for row in evicted.itertuples()]
    notes = ["Rule: supports when the paired change's 95 % interval lies below 0; contradicts when it excludes a loss "
             f"of {NEGLIGIBLE_LOSS:g} or more (analyses.NEGLIGIBLE_LOSS); otherwise cannot decide."]
    return Verdicts(pd.DataFrame(rows, columns=VERDICT_COLUMNS), notes=notes)
