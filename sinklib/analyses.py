"""The notebooks' analyses: each function takes models and traces, picks what to show (the strongest head, the
top moving-sink event, ...) and returns a summary.Result — figures, tables and the summary a notebook displays.
The picking rules live here and in sinklib.dynamics, where they are unit-tested, not in the notebooks."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from sinklib import carry, dynamics, lens, plots
from sinklib.capturing.replay import full_pass_scores, replay_map
from sinklib.evaluation.table1 import MaskingTable, column_name, column_words, family_before_loading
from sinklib.loading import LoadedModel
from sinklib.sinks import causal_uniform_scores, threshold_sweep
from sinklib.stats import difference_of_changes
from sinklib.summary import Layout, Result, Summary, is_near_tie, label, near_tie_models, significant
from sinklib.trace import Trace
from sinklib.trace_store import stored_measurement

Traces = Mapping[str, Sequence[Trace]]
Models = Mapping[str, LoadedModel]


def _stem(name: str) -> str:
    return Path(name).name


# --- notebook 01 ---------------------------------------------------------------------------------------------
def score_distribution(traces: Traces) -> Result:
    """Fig. 3 / 9: every score of every model, as histograms; the table summarises each model's scores."""
    distribution = dynamics.score_distribution([t for ts in traces.values() for t in ts])
    summary = distribution.groupby("model")["score"].describe()
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: half of its scores are below {significant(row['50%'])} "
                "(the mean is 1 by construction); "
                f"the largest is {significant(row['max'])} times the mean." for name, row in summary.iterrows()]
    findings.append("Paper (Fig. 3, LLaDA-8B; Fig. 9, Dream and MMaDA): most scores sit near 0 and a few are very large.")
    return Result(figures={"fig03_score_histograms": plots.score_histograms(distribution)},
                  tables={"fig03_score_summary": summary},
                  layouts={"fig03_score_summary": Layout(("model",), "model", index=True)},
                  shown=Summary.by_model(summary.astype({"count": int}), flagged, findings))


def token_step(traces: Traces) -> Result:
    """Fig. 1: per model, the strongest head's score of every token at every step (first prompt)."""
    result, rows = Result(), []
    for name, model_traces in traces.items():
        trace = model_traces[0]
        layer, head = dynamics.strongest_head(trace)
        result.figures[f"fig01_token_step_{_stem(name)}"] = plots.token_step_heatmap(trace, layer, head)
        rows.append(trace.to_frame(layers=[layer], heads=[head]).assign(model=name))
    result.add_table("fig01_token_step", pd.concat(rows), Layout(("model", "step", "layer", "head", "position"), "first"))
    return result


def layer_head_maps(traces: Traces) -> Result:
    """Fig. 5: the main sink's score per layer and head, averaged over steps and prompts."""
    result, frames = Result(), []
    for name, model_traces in traces.items():
        frame = pd.concat([dynamics.main_sink_by_layer_head(t) for t in model_traces]).groupby(
            ["layer", "head"], as_index=False).mean()
        result.figures[f"fig05_layer_head_{_stem(name)}"] = plots.layer_head_map(frame, name)
        frames.append(frame.assign(model=name))
    table = result.add_table("fig05_layer_head", pd.concat(frames, ignore_index=True), Layout(("model", "layer", "head")))
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


def generations(traces: Traces) -> Result:
    """Every generation step by step: the canvas after each step's decision and that decision's margin (the
    relative gap by which it beat the best alternative). A rerun on another CPU is compared against these: a
    canvas that differs from a step whose margin is within float rounding is a near-tie, not a bug."""
    rows = []
    for name, model_traces in traces.items():
        for index, trace in enumerate(model_traces):
            margins = trace.margins.tolist() if trace.margins is not None else [float("nan")] * trace.n_steps
            rows += [{"model": name, "trace": index, "step": step, "margin": margins[step],
                      "canvas": trace.tokens[step + 1].tolist()} for step in range(trace.n_steps)]
    table = pd.DataFrame(rows, columns=["model", "trace", "step", "margin", "canvas"])
    flagged = near_tie_models(traces)
    shown = table.groupby("model", sort=False)["margin"].agg(
        decisions="size", within_float_rounding=lambda m: int(sum(is_near_tie(x) for x in m)))
    findings = [f"{label(name, flagged)}: {row['within_float_rounding']} of its {row['decisions']} decisions were within "
                f"float rounding." for name, row in shown.iterrows()]
    return Result(tables={"generations": table}, layouts={"generations": Layout(("model", "trace", "step"), "trace")},
                  shown=Summary.by_model(shown, flagged, findings))


# --- notebook 02 ---------------------------------------------------------------------------------------------
def sink_tokens(traces: Traces, eps: float) -> Result:
    """Table 2: which tokens become sinks, per model."""
    table = pd.concat([dynamics.sink_token_frequency(ts, eps).assign(model=name) for name, ts in traces.items()],
                      ignore_index=True)[["model", "token", "count", "share"]]
    flagged = near_tie_models(traces)
    findings = [f"{label(name, flagged)}: its most frequent sink token is {group.iloc[0]['token']!r} "
                f"({group.iloc[0]['share']:.0%} of its sink detections over steps, layers and heads), "
                f"then {group.iloc[1]['token']!r} ({group.iloc[1]['share']:.0%})."
                for name, group in table.groupby("model", sort=False) if len(group) >= 2]
    findings.append("Paper (Table 2): LLaDA-8B 'Ċ' (newline) .368, '<|mdm_mask|>' .366; Dream-7B '<|mask|>' .321, "
                    "'Ċ' .090; MMaDA-8B 'Ċ' .180, '<|mdm_mask|>' .166 — whitespace and the mask token host most sinks.")
    shown = Summary.by_model(table.set_index("model")[["token", "count", "share"]], flagged, findings)
    return Result(figures={"table2_sink_tokens": plots.sink_token_bars(table, models=list(traces), eps=eps)},
                  tables={"table2_sink_tokens": table}, layouts={"table2_sink_tokens": Layout(("model", "token"))},
                  texts={"table2_sink_tokens.md": table.to_markdown(index=False, floatfmt=".3f")}, shown=shown)


def sink_dynamics(traces: Traces, eps: float) -> Result:
    """Lifetime, move rate and distance to the unmasking frontier of each head's sinks."""
    summary = pd.concat([dynamics.dynamics_summary(ts, eps).assign(model=name) for name, ts in traces.items()],
                        ignore_index=True)
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


def moving_sinks(models: Models, traces: Traces, eps: float) -> Result:
    """Fig. 4 / 8: every moving-sink event; per diffusion model the top one drawn at the step before and the
    step of the move, from maps the model replays."""
    result, events = Result(), []
    for name, model_traces in traces.items():
        if not _diffusion(models, name):
            continue
        found = dynamics.moving_events(model_traces, eps)
        events.append(found.assign(model=name))
        top = dynamics.top_moving_event(found)
        if top is not None:
            trace = model_traces[int(top["trace"])]
            step, layer, head = int(top["step"]), int(top["layer"]), int(top["head"])
            maps = [replay_map(models[name], trace, s, layer, head).numpy() for s in (step - 1, step)]
            result.figures[f"fig04_moving_sink_{_stem(name)}"] = plots.attention_pair(
                maps, [step - 1, step], trace, layer, head, marked=[int(top["position_before"]), int(top["position"])])
    table = result.add_table("moving_sink_events",
                             pd.concat(events, ignore_index=True) if events else dynamics.empty_events(),
                             Layout(("model", "trace", "step", "layer", "head"), "trace"))
    counts = table.groupby("model").size().reindex([n for n in traces if _diffusion(models, n)], fill_value=0)
    result.shown = Summary.by_model(counts.rename("moving-sink events").to_frame(), near_tie_models(traces))
    return result


def query_splits(models: Models, traces: Traces, eps: float) -> Result:
    """Fig. 6a: a step where masked and unmasked queries can favour different sinks (first prompt)."""
    result, missing = Result(), []
    for name, model_traces in traces.items():
        if not _diffusion(models, name):
            continue
        trace = model_traces[0]
        candidates = dynamics.split_candidates(trace, eps)
        if not len(candidates):
            missing.append(f"{name}: no step with masked and unmasked queries and two sinks in one head")
            continue
        step, layer, head = (int(candidates.iloc[0][c]) for c in ("step", "layer", "head"))
        attention = replay_map(models[name], trace, step, layer, head).numpy()
        result.figures[f"fig06a_query_split_{_stem(name)}"] = plots.query_split(
            attention, trace.is_masked[step].numpy(), trace, step, layer, head)
    result.shown = "\n".join(missing) or None
    return result


def transient(models: Models, traces: Traces, eps: float) -> Result:
    """Fig. 6b: sinks that live for a single step; per diffusion model the strongest one drawn."""
    result, frames = Result(), []
    for name, model_traces in traces.items():
        found = dynamics.transient_events(model_traces, eps)
        frames.append(found.assign(model=name))
        if len(found) and _diffusion(models, name):
            top = found.sort_values("score", ascending=False).iloc[0]
            result.figures[f"fig06b_transient_{_stem(name)}"] = plots.transient_sink(
                model_traces[int(top["trace"])], int(top["step"]), int(top["layer"]), int(top["head"]),
                int(top["position"]))
    table = result.add_table("transient_sinks", pd.concat(frames, ignore_index=True),
                             Layout(("model", "trace", "step", "layer", "head", "position"), "trace",
                                    threshold="threshold_gap"))
    counts = table.groupby("model").size().reindex(list(traces), fill_value=0)
    result.shown = Summary.by_model(counts.rename("one-step sinks").to_frame(), near_tie_models(traces))
    return result


def greatest_sink_positions(traces: Traces, eps: float) -> Result:
    """Fig. 7: where the greatest sink sits at each step, for the head with the most steps that have a sink."""
    panels, frames = {}, []
    for name, model_traces in traces.items():
        top = dynamics.greatest_sinks(model_traces[0], eps)
        layer, head = dynamics.busiest_head(top)
        frame = top[(top["layer"] == layer) & (top["head"] == head)]
        panels[f"{name} — layer {layer}, head {head}"] = frame
        frames.append(frame.assign(model=name))
    return Result(figures={"fig07_greatest_sink_positions": plots.greatest_sink_positions(panels)},
                  tables={"fig07_greatest_sink": pd.concat(frames, ignore_index=True)},
                  layouts={"fig07_greatest_sink": Layout(("model", "step"), "first")})


def paper_layout(traces: Mapping[str, Sequence[Trace]], eps: float, k: int = 5) -> Result:
    """Sinks under the paper's layout (long canvases: 128 tokens, one per step; LLaDA in blocks of 32): `traces` by
    layout label ("tiny-llada, 128 tokens, blocks of 32"). Per label, where the greatest sinks sit — on the rightmost
    still-masked token (the paper's Dream: "originate at the rightmost masked token and shift leftward"), on any
    masked token, on prompt or decoded keys — how the greatest sink's position follows the frontier and the rightmost
    masked position across steps (Spearman), and both stability measures (dynamics.stability_by_key_type); Fig. 7
    for each label's busiest head, with the first and the rightmost still-masked positions."""
    if not traces:
        return Result(shown="paper_layouts is empty: no long canvas was generated.")
    rows, panels, frames = [], {}, []
    for name, layout_traces in traces.items():
        where = dynamics.frontier_summary(list(layout_traces), eps).iloc[0].drop("model")
        moving = dynamics.stability_by_key_type(list(layout_traces), k, eps).set_index("key_type")
        rows.append({"layout": name, "model": layout_traces[0].meta.get("model", ""), "n_traces": len(layout_traces),
                     "steps": layout_traces[0].n_steps, **where.to_dict(),
                     **{f"{column}_{kind}": moving.loc[kind, column] for kind in ("all", "masked")
                        for column in ("move_rate", "pairs_with_sinks", "jaccard_mean")}})
        top = dynamics.frontier_tracking(layout_traces[0], eps)
        every = dynamics.greatest_sinks(layout_traces[0], eps)
        layer, head = dynamics.busiest_head(every)
        frame = every[(every["layer"] == layer) & (every["head"] == head)].merge(
            top[["step", "layer", "head", "rightmost_masked"]], on=["step", "layer", "head"], how="left")
        panels[f"{name}\nlayer {layer}, head {head}"] = frame
        frames.append(frame.assign(layout=name))
    table = pd.DataFrame(rows)
    findings = [f"{row.layout} ({row.n_traces} generations, {row.steps} steps): the greatest sink sits on the rightmost "
                f"masked token in {significant(row.share_on_rightmost_masked)} of sink-bearing heads × steps, on any masked "
                f"token in {significant(row.share_on_masked)}, on the prompt in {significant(row.share_on_prompt)}; "
                f"its position follows the rightmost masked position with median Spearman "
                f"{significant(row.spearman_rightmost_median)}; it moves in {significant(row.move_rate_all)} of "
                f"{int(row.pairs_with_sinks_all)} step pairs (top-{k} Jaccard {significant(row.jaccard_mean_all)})."
                for row in table.itertuples()]
    findings.append("Paper (Fig. 7): Dream's sinks originate at the rightmost masked token and shift leftward as tokens "
                    "are unmasked; LLaDA's move right as blocks complete; MMaDA's mostly stay.")
    return Result(figures={"fig07_paper_layout": plots.greatest_sink_positions(panels)},
                  tables={"paper_layout": table, "paper_layout_greatest_sink": pd.concat(frames, ignore_index=True)},
                  layouts={"paper_layout": Layout(("layout",), "none"),
                           "paper_layout_greatest_sink": Layout(("layout", "step"), "none")},
                  shown=Summary(table.set_index("layout")[["share_on_rightmost_masked", "share_on_masked",
                                                          "share_on_prompt", "spearman_rightmost_median",
                                                          "move_rate_all", "jaccard_mean_all"]], findings))


# --- notebook 03 ---------------------------------------------------------------------------------------------
def threshold_sweeps(models: Models, traces: Traces, eps_values: Sequence[float]) -> Result:
    """Fig. 10: the share of tokens Eq. 3 selects at each eps. Diffusion models over every step's scores; an
    autoregressive model over one full causal pass of its final sequence, beside uniform causal attention over
    the same lengths."""
    sweeps, baselines = [], []
    for name, model_traces in traces.items():
        model = models[name]
        if model.family.scores_cover_the_canvas:
            scores = [t.scores for t in model_traces]
        else:
            scores = [full_pass_scores(model, t.tokens[-1]) for t in model_traces]
            uniform = [causal_uniform_scores(t.tokens.shape[1]) for t in model_traces]
            baselines.append(threshold_sweep(uniform, eps_values).assign(
                model=f"uniform causal attention ({name}'s lengths)"))
        sweeps.append(threshold_sweep(scores, eps_values).assign(model=name))
    sweep = pd.concat(sweeps, ignore_index=True)
    baseline = pd.concat(baselines, ignore_index=True) if baselines else None
    shares = sweep.pivot(index="model", columns="eps", values="share").loc[list(traces)]
    shares.columns = [f"eps={eps:g}" for eps in shares.columns]
    flagged = near_tie_models(traces)
    near_three = min(eps_values, key=lambda eps: abs(eps - 3.0))
    full_pass = {name for name in traces if not models[name].family.scores_cover_the_canvas}
    findings = [f"{label(name, flagged)}: at eps = {near_three:g}, Eq. 3 selects {share:.1%} of its (step, layer, head, key) "
                f"entries{' (one full causal pass of each final sequence)' if name in full_pass else ''}."
                for name, share in sweep[sweep["eps"] == near_three].set_index("model")["share"].items()]
    findings.append("Paper (Appendix B): for a 64-token sequence, eps = 3 keeps at most about 4% of tokens in most "
                    "diffusion models.")
    return Result(figures={"fig10_threshold_sweep": plots.threshold_sweep_plot(sweep, baseline)},
                  tables={"fig10_threshold_sweep": pd.concat([sweep, baseline])},
                  layouts={"fig10_threshold_sweep": Layout(("model", "eps", "units"))},
                  shown=Summary.by_model(shares, flagged, findings))


# --- notebook 07 ---------------------------------------------------------------------------------------------
def what_sinks_carry(models: Models, traces: Traces, eps: float,
                     store: str | Path | None = None) -> tuple[Result, pd.DataFrame]:
    """What each model's sinks carry (sinklib.carry): per model, over the (step, layer, head)s whose greatest key is a
    sink, the value norm against the median key's, the sink's share of the attention and of the output. Returns the
    Result and the per-model summary (for findings that set it beside the masking results). `store`: the trace store
    the traces came from, where each trace's measurement (one forward per step) is kept once made
    (trace_store.stored_measurement)."""
    frame = pd.concat([stored_measurement(store, trace, "sink_carry", {"eps": eps}, "sinklib.carry",
                                          functools.partial(carry.sink_carry, models[name], trace, eps))
                       for name, model_traces in traces.items() for trace in model_traces], ignore_index=True)
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
    result = Result(figures={"fig_sink_carry": plots.carry_plot(frame)}, tables={"sink_carry_by_layer": by_layer},
                    layouts={"sink_carry_by_layer": Layout(("model", "layer"))},
                    shown=Summary.by_model(summary, flagged, findings))
    return result, summary


def step_stability(traces: Traces, k: int, eps: float) -> Result:
    """How much each head's top keys change from one step to the next (top-k Jaccard overlap) and how often the
    greatest sink moves, per layer (dynamics.stability_by_layer), with a per-model summary."""
    frame = dynamics.stability_by_layer([t for ts in traces.values() for t in ts], k, eps)
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
    return Result(figures={"fig_step_stability": plots.stability_plot(frame)}, tables={"step_stability": frame},
                  layouts={"step_stability": Layout(("model", "layer"))},
                  shown=Summary.by_model(summary, flagged, findings))


def stability_by_key_type(traces: Traces, k: int, eps: float) -> Result:
    """"Do sinks move?" both ways (dynamics.stability_by_key_type): the paper's measure, how often the greatest sink
    changes position between consecutive steps, and the set measure, the top-k Jaccard overlap, each over all keys
    and over the prompt, decoded and still-masked keys alone; one finding per model says which measure calls its
    attention moving."""
    frame = dynamics.stability_by_key_type([t for ts in traces.values() for t in ts], k, eps)
    flagged = near_tie_models(traces)
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
    return Result(figures={"fig_stability_by_key_type": plots.key_type_stability_plot(frame)},
                  tables={"stability_by_key_type": frame}, layouts={"stability_by_key_type": Layout(("model", "key_type"))},
                  shown=Summary(frame.assign(model=[label(m, flagged) for m in frame["model"]]).set_index(
                      ["model", "key_type"])[["move_rate", "move_rate_ci_low", "move_rate_ci_high", "pairs_with_sinks",
                                              "jaccard_mean"]], findings))


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


def what_sinks_store(models: Models, traces: Traces, eps: float, names: Sequence[str], n_traces: int = 2,
                     store: str | Path | None = None) -> Result:
    """The paper's open question (§7), with a logit lens (sinklib.lens): for each model of `names` (native
    transformers models only) and its first n_traces generations, every layer's residual stream read through the
    final norm and unembedding at every position and step. Figure: by layer, the share of still-masked positions whose
    lens already names their final token, sinks against the other masked positions; and the same at the sink
    positions of any kind. Table: per model, the masked sink and other masked groups (lens.sink_vs_other_masked) and
    what the sink positions decode to at the last layer (their most frequent lens tokens). `store`: the trace store the
    traces came from, where each trace's lens is kept once read (trace_store.stored_measurement)."""
    if not names:
        return Result(shown="lens_models is empty: no model was read by the logit lens.")
    rows, curves, findings = [], [], []
    for name in names:
        chosen = list(traces[name])[:n_traces]
        frames = [stored_measurement(store, trace, "logit_lens", {"top": 1}, "sinklib.lens",
                                     functools.partial(lens.logit_lens, models[name], trace)) for trace in chosen]
        groups = lens.sink_vs_other_masked(None, chosen, eps, frames=frames)
        rows += [{"model": name, **row} for row in groups.to_dict("records")]
        mine = [_lens_groups(trace, frame, eps).assign(model=name, trace=index)[
            ["model", "trace", "layer", "group", "top_is_final", "top_token", "position_state"]]
            for index, (trace, frame) in enumerate(zip(chosen, frames))]
        curves += mine
        findings.append(_lens_finding(name, groups.set_index("group"), pd.concat(mine)))
    curve = (pd.concat(curves).groupby(["model", "group", "layer"], sort=False)["top_is_final"].agg(["mean", "size"])
             .reset_index().rename(columns={"mean": "share_final", "size": "n"}))
    findings.append("Paper §7 asks what the sinks on future positions store, e.g. with the logit lens. A sink that "
                    "predicts its final token earlier than other masked positions would be storing a plan for it.")
    table = pd.DataFrame(rows)
    return Result(figures={"fig_what_sinks_store": plots.lens_plot(curve)},
                  tables={"what_sinks_store": table, "what_sinks_store_by_layer": curve},
                  layouts={"what_sinks_store": Layout(("model", "group")),
                           "what_sinks_store_by_layer": Layout(("model", "group", "layer"))},
                  shown=Summary(table.set_index(["model", "group"]), findings))


def carry_against_masking(carried: pd.DataFrame, frames: Sequence[pd.DataFrame]) -> list[str]:
    """Does masking hurt in proportion to what the sink carries? Per model: what its sinks carry (value / median
    key) beside the top-1 sink's masking cost over one random key's and the cost of ablating the top-1 sink's value;
    then, across the models, the rank correlation of what sinks carry with what masking them costs."""
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
def speed_frontier(table: pd.DataFrame) -> Result:
    """Can sinks make a diffusion LM fast? Each policy's accuracy (n, Wilson 95 % interval, McNemar against the
    model's plain sampler on the same problems) against its seconds per answer (sinklib.speed.frontier), and for each
    diffusion model the fastest policy whose accuracy stays inside the plain sampler's interval, beside the
    autoregressive twin's KV cache."""
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
    return Result(figures={"fig_speed_frontier": plots.frontier_plot(table)}, tables={"speed_frontier": table},
                  layouts={"speed_frontier": EVALUATION_POLICY}, shown=Summary(shown, findings))


EVALUATION_POLICY = Layout(("model", "policy"), "none")


def sinks_under_cache(traces: Mapping[str, Trace], k: int = 5, eps: float = 3.0) -> Result:
    """What caching does to attention and sinks on one prompt: per trace (label → Trace, the plain sampler's and a
    cached policy's), its forwards, how many were full, the top-k overlap of consecutive steps and how often the
    greatest sink moved — over every step pair and over the pairs of full forwards only — and where the greatest sink
    sits."""
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
    frame = pd.DataFrame(rows)
    findings = [f"{row['trace']}: {row['forwards']} forwards ({row['full_forwards']} full); consecutive steps share "
                f"{significant(row['jaccard'])} of each head's top-{k} keys and the greatest sink moves in "
                f"{significant(row['move_rate'])} of step pairs; the most frequent greatest sink is position "
                f"{row['main_sink_position']} ({row['main_sink_token']!r}, prompt of {row['prompt_len']} tokens)."
                for _, row in frame.iterrows()]
    return Result(figures={"fig_sinks_under_cache": plots.cached_attention_plot(traces)},
                  tables={"sinks_under_cache": frame}, layouts={"sinks_under_cache": Layout(("model", "trace"), "first")},
                  shown=Summary(frame.set_index("trace"), findings))


# Table 1's columns on the twins beside each sampler they ran (SpeedRun.collect_masking): (model, sampler) → table
SamplerTables = Mapping[tuple[str, str], MaskingTable]
MASKED_BY_SAMPLER = Layout(("model", "sampler", "condition", "k"), "none")


def _columns_by_sampler(tables: SamplerTables, columns: Sequence[str]) -> pd.DataFrame:
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


def _by_sampler_shown(frame: pd.DataFrame) -> pd.DataFrame:
    """_columns_by_sampler's rows as a notebook shows them: indexed by model, sampler and column."""
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


def sink_reliance_by_sampler(tables: SamplerTables, columns: Sequence[str] = ("top-1", "random-1")) -> Result:
    """Does a cached, parallel sampler lean on its sinks more? For each diffusion model that ran under more than one
    sampler: Table 1's `columns` (its top-1 sink masked, one random key masked) under each, each with its paired
    change from the same sampler unmasked, and the difference of those changes between the plain sampler and each
    other one on the same problems (a paired bootstrap interval and a sign-flip test)."""
    frame = _columns_by_sampler(tables, columns)
    samplers: dict[str, list[str]] = {}
    for model, sampler in tables:
        samplers.setdefault(model, []).append(sampler)
    findings, tests = [], []
    for model, names in samplers.items():
        if len(names) < 2 or "plain" not in names:
            continue
        for sampler in (name for name in names if name != "plain"):
            for column in columns:
                test = _change_difference(tables[model, "plain"], model, tables[model, sampler], model, column)
                tests.append({"model": model, "sampler": sampler, **test})
                rows = frame[(frame["model"] == model) & (frame["column"] == column)].set_index("sampler")
                findings.append(
                    f"{model}, {column_words(column)}: plain {_change_text(rows.loc['plain'])}; {sampler} "
                    f"{_change_text(rows.loc[sampler])}. The change under {sampler} minus the change under plain: "
                    f"{test['difference']:+.3f} [{test['low']:+.3f}, {test['high']:+.3f}] (n = {test['n']}, sign-flip "
                    f"p = {significant(test['p'])}).")
    differences = pd.DataFrame(tests, columns=["model", "sampler", "column", "n", "difference", "low", "high", "p"])
    result = Result(figures={"fig_sinks_by_sampler": plots.columns_by_setting_plot(frame, "Table 1 under each sampler")},
                    shown=Summary(_by_sampler_shown(frame), findings))
    result.add_table("masked_by_sampler", frame, MASKED_BY_SAMPLER)
    result.add_table("masked_by_sampler_differences", differences, Layout(("model", "sampler", "column"), "none"))
    return result


def oldest_context_evicted(tables: SamplerTables, ks: Sequence[int] = (1, 3)) -> Result:
    """The paper's §5.3: can a diffusion LM drop its oldest context, the first token among it, where an autoregressive
    model cannot? Each (model, sampler) with its oldest k keys evicted (interventions.EvictOldest: masked for every
    query, layer, head and step) for each k in `ks`, with the paired change from the same run unmasked; and, on the
    same problems, how much less each diffusion (model, sampler) loses than each autoregressive one."""
    columns = [column_name("oldest keys", k) for k in ks]
    frame = _columns_by_sampler(tables, columns)
    findings = []
    for (model, sampler), rows in frame.groupby(["model", "sampler"], sort=False):
        rows = rows.set_index("column")
        unmasked = rows.loc["unmasked"]
        parts = [f"{column_words(c)}: {_change_text(rows.loc[c])}" for c in columns if c in rows.index]
        findings.append(f"{model} ({sampler}): unmasked {unmasked['accuracy']:.3f} [{unmasked['ci_low']:.3f}, "
                        f"{unmasked['ci_high']:.3f}]; " + "; ".join(parts) + ".")
    tests = []
    autoregressive = [key for key in tables if key[1] == "KV cache"]
    for key in tables:
        for other in autoregressive if key[1] != "KV cache" else ():
            for column in columns:
                test = _change_difference(tables[other], other[0], tables[key], key[0], column)
                tests.append({"model": key[0], "sampler": key[1], "against": other[0], **test})
                findings.append(f"{key[0]} ({key[1]}) against {other[0]}, {column_words(column)}: the diffusion "
                                f"model's change minus the autoregressive one's {test['difference']:+.3f} [{test['low']:+.3f}, "
                                f"{test['high']:+.3f}] (n = {test['n']}, sign-flip p = {significant(test['p'])}).")
    differences = pd.DataFrame(tests, columns=["model", "sampler", "against", "column", "n", "difference", "low", "high",
                                               "p"])
    result = Result(figures={"fig_oldest_context_evicted": plots.columns_by_setting_plot(frame, "the oldest keys evicted")},
                    shown=Summary(_by_sampler_shown(frame), findings))
    result.add_table("oldest_context_evicted", frame, MASKED_BY_SAMPLER)
    result.add_table("oldest_context_evicted_differences", differences,
                     Layout(("model", "sampler", "against", "column"), "none"))
    return result
