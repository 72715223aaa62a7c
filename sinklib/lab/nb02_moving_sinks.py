"""Notebook 02, moving sinks: its run config, its sections (Table 2's sink tokens, lifetimes, the moving-sink
events of Fig. 4 / 8, the query splits of Fig. 6a, the one-step sinks of Fig. 6b, the greatest sinks of Fig. 7,
both stability measures, Fig. 7 under the paper's layout) and its verdict, do_sinks_move."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinklib import dynamics, frontier, plots
from sinklib.capturing.replay import replay_map
from sinklib.evaluation.tasks import trace_prompts
from sinklib.generation import encode
from sinklib.sinks import SinkRule
from sinklib.summary import (VERDICT_COLUMNS, Layout, Result, Summary, Verdicts, label, near_tie_models,
                             significant)
from sinklib.trace import Trace
from sinklib.trace_store import stored_traces
from sinklib.validation import BadValue, Count, NonNegative, validated
from sinklib.lab.nb01_attention_distributions import TracesRun
from sinklib.lab.runs import (Models, Traces, _stem)
from sinklib.lab.verdicts import (BOOTSTRAP_DRAWS, MIN_GENERATIONS, _hits, _share,
                                  _verdict, generation_bootstrap)


@validated
@dataclass(frozen=True)
class MovingSinksRun(TracesRun):
    """Notebook 02: sink tokens, dynamics and moving sinks, with the Eq. 3 threshold eps (sum units)."""
    NOTEBOOK = "02_moving_sinks"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 60
    eps: NonNegative = 3.0  # Eq. 3 threshold, sum units
    # Fig. 7 under the paper's layout, model → {gen_length, steps, block_length}; None: every diffusion model of the
    # run with its family's paper layout (128 tokens in 128 steps, LLaDA in blocks of 32), halved until it fits
    paper_layouts: dict[str, dict[str, Count]] | None = None
    paper_layout_prompts: Count = 1
    top_k: Count = 5  # the set measure of "do sinks move": each head's top-k keys, step to step

    def check(self) -> None:
        """TracesRun's rules, and layouts that name only steps, gen_length and block_length."""
        super().check()
        allowed = {"steps", "gen_length", "block_length"}
        for name, layout in (self.paper_layouts or {}).items():
            if not layout or set(layout) - allowed:
                raise BadValue(f"paper_layouts[{name!r}]={layout!r} is not allowed: a layout is a non-empty dict of "
                               f"{sorted(allowed)}")
            if name not in self.models:
                raise BadValue(f"paper_layouts[{name!r}] is not allowed: {name!r} is not one of models={self.models!r}")

    @property
    def rule(self) -> SinkRule:
        """The sink rule (Eq. 3) with this run's eps, in sum units."""
        return SinkRule(self.eps)


    def collect_paper_layouts(self, loaded: Mapping[str, Any]) -> dict[str, list]:
        """Traces under the paper's layout, by label ("tiny-llada, 64 tokens in 64 steps, blocks of 16"): each model of
        `paper_layouts` (default: every diffusion model of `loaded`, its family's paper layout fitted by
        fitted_paper_layout) on the first paper_layout_prompts prompts of its task, kept in long_trace_store."""
        traces = {}
        for name, model in loaded.items():
            prompts = trace_prompts(model.prompt_style, self.paper_layout_prompts)
            layout = (self.paper_layouts.get(name) if self.paper_layouts is not None
                      else fitted_paper_layout(model, prompts))
            if layout is None:
                continue
            settings = model.settings_for(**layout)
            blocks = f", blocks of {layout['block_length']}" if layout.get("block_length") else ""
            label = f"{name}, {settings.gen_length} tokens in {settings.steps} steps{blocks}"
            traces[label] = stored_traces(model, prompts, self.long_trace_store, seed=self.seed,
                                          progress=self.progress, settings=settings)
        return traces


def fitted_paper_layout(model: Any, prompts: list[str]) -> dict[str, int] | None:
    """A diffusion model's family's paper layout (gen_length, steps and, for LLaDA / MMaDA, block_length), halved
    until the longest prompt and the canvas fit the positions the model handles; None for an autoregressive model."""
    if not model.family.is_diffusion or model.family.paper is None:
        return None
    paper = model.family.paper
    layout = {"gen_length": paper.gen_length, "steps": paper.steps,
              **({"block_length": paper.block_length} if getattr(paper, "block_length", None) else {})}
    longest = max(len(encode(model, prompt, chat=model.chat)) for prompt in prompts)
    while model.max_length is not None and longest + layout["gen_length"] > model.max_length and layout["gen_length"] > 1:
        layout = {key: max(1, value // 2) for key, value in layout.items()}
    return layout


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
                                             marked={f"greatest sink at step {step - 1} (before)": [int(top["position_before"])],
                                                     f"greatest sink at step {step} (after)": [int(top["position"])]})
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
    model column), and the rows a rounding could make one (`transient` False: what --check on another CPU needs)."""
    return pd.concat([dynamics.transient_events(ts, eps, undecided=True).assign(model=name)
                      for name, ts in traces.items()], ignore_index=True)


def strongest_transient(models: Models, events: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6b's sinks: per diffusion model with one, its strongest one-step sink (the highest score) among `events`
    (pick_transient's, `transient` rows); its rows, in the models' order."""
    events = events[events["transient"].astype(bool)]
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
    """Fig. 6b as saved (by model), every event (and each position a rounding could make one: `transient` False), and
    how many events each model has."""
    result = Result(figures={f"fig06b_transient_{_stem(name)}": figure for name, figure in figures.items()})
    table = result.add_table("transient_sinks", events, Layout(("model", "trace", "step", "layer", "head", "position"),
                                                               "trace", threshold="threshold_gap", outcome="transient"))
    counts = table[table["transient"].astype(bool)].groupby("model").size().reindex(list(traces), fill_value=0)
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
        where = frontier.frontier_summary(list(layout_traces), eps).iloc[0].drop("model")
        moving = dynamics.stability_by_key_type(list(layout_traces), k, eps).set_index("key_type")
        rows.append({"layout": name, "model": layout_traces[0].meta.get("model", ""), "n_traces": len(layout_traces),
                     "steps": layout_traces[0].n_steps, **where.to_dict(),
                     **{f"{column}_{kind}": moving.loc[kind, column] for kind in ("all", "masked")
                        for column in ("move_rate", "pairs_with_sinks", "jaccard_mean")}})
    return pd.DataFrame(rows)


def pick_paper_layout_heads(traces: Traces, eps: float) -> pd.DataFrame:
    """Fig. 7 under the paper's layout: per label of `traces`, its first generation's busiest head (dynamics.busiest_head)
    at every step — dynamics.greatest_sinks' columns, the rightmost still-masked position where the head has a sink
    (frontier.frontier_tracking) and a layout column."""
    frames = []
    for name, layout_traces in traces.items():
        top = frontier.frontier_tracking(layout_traces[0], eps)
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
    rides the rightmost masked token as the paper's Dream's do (frontier.frontier_summary's share of the sink-bearing
    heads × steps, against ON_THE_FRONTIER). Every interval resamples whole generations (generation_bootstrap), n is
    the generations. Autoregressive models are left out: a decoding row's greatest key is not the column sum a
    diffusion step's is (notebook 02)."""
    rows = [verdict for name in traces if _diffusion(models, name)
            for verdict in _moving_verdicts(name, traces[name], k, eps)]
    for layout, layout_traces in layouts.items():
        counts = [_hits(*frontier.frontier_summary([trace], eps).iloc[0][["share_on_rightmost_masked", "sink_rows"]])
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
