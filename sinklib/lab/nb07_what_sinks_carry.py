"""Notebook 07, what sinks carry: its run config (CarryRun), its sections (value and output norms, the
dose-response, step-to-step stability, the logit lens) and its verdict, does_a_sink_store_its_token."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinklib import carry, dynamics, lens, plots
from sinklib.evaluation.table1 import MaskingTable, by_task, masking_table
from sinklib.evaluation.tasks import get_task, trace_prompts
from sinklib.summary import (VERDICT_COLUMNS, Layout, Result, Summary, Verdicts, label, near_tie_models,
                             significant)
from sinklib.trace_store import stored_measurement, stored_traces
from sinklib.validation import BadValue, Count, Index, NonNegative, Text, validated
from sinklib.lab.nb01_attention_distributions import TracesRun
from sinklib.lab.runs import (Models, TaskPart, Traces, _check_models_named,
                              _check_task_limits, at_eps, default_copy)
from sinklib.lab.verdicts import (MIN_GENERATIONS, _verdict, generation_bootstrap)


@validated
@dataclass(frozen=True)
class CarryRun(TaskPart, TracesRun):
    """Notebook 07: what sinks carry (value and output norms), dose–response of masking the top-k sinks against k
    random keys and against ablating the sinks' values, and step-to-step stability of the top keys."""
    NOTEBOOK = "07_what_sinks_carry"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 260
    n_prompts: Count = 4
    masking_skip: list[Text] = default_copy([])  # models left out of the dose–response
    n_problems: Count = 20
    n_problems_by_task: dict[str, Count] = default_copy({"arithmetic-english": 10})
    ks: list[Index] = default_copy([0, 1, 2, 5, 10, 20])
    ks_by_task: dict[str, list[Index]] = default_copy({"arithmetic-english": [0, 1, 5, 20]})
    value_ablation: Literal["zero", "mean"] = "zero"
    # read by the logit lens; None: every diffusion model of the run on transformers' own code (not remote code)
    lens_models: list[Text] | None = None
    lens_traces: Count = 2  # generations per model the logit lens reads, every step and layer
    top_k: Count = 5
    eps: NonNegative = 3.0
    batch_size: Count = 20

    def check(self) -> None:
        """TracesRun's rules; ks distinct, with 0 (the unmasked baseline) among them."""
        super().check()
        _check_task_limits(self)
        _check_models_named(self, "tasks", "masking_skip")
        self.check_lens_models()
        for name, ks in {"ks": self.ks, **{f"ks_by_task[{t!r}]": k for t, k in self.ks_by_task.items()}}.items():
            if 0 not in ks or len(set(ks)) != len(ks):
                raise BadValue(f"{name}={ks!r} is not allowed: {name} must be distinct integers >= 0 and include 0 "
                               "(unmasked)")

    def check_lens_models(self) -> None:
        """The logit lens reads models this run generates with: each of lens_models must be one of models."""
        missing = [name for name in self.lens_models or () if name not in self.models]
        if missing:
            raise BadValue(f"lens_models={self.lens_models!r} is not allowed: {missing} are not in models={self.models!r}")

    def lens_names(self, loaded: Mapping[str, Any]) -> list[str]:
        """The models the logit lens reads: lens_models, or every diffusion model of `loaded` that runs on
        transformers' own code (sinklib.lens cannot read remote modelling code's hidden states)."""
        if self.lens_models is not None:
            return list(self.lens_models)
        return [name for name, model in loaded.items() if model.family.is_diffusion and model.calling == "native"]

    def collect_lens_traces(self, loaded: Mapping[str, Any]) -> dict[str, list]:
        """The generations the logit lens reads, by model (lens_names): the first lens_traces of each model's traces
        (the same inputs as collect()'s), kept with their lens measurements in long_trace_store."""
        return {name: stored_traces(loaded[name], trace_prompts(loaded[name].prompt_style, self.lens_traces),
                                    self.long_trace_store, seed=self.seed, progress=self.progress,
                                    settings=self.settings_for(loaded[name]))
                for name in self.lens_names(loaded)}

    def dose_response(self, loaded: dict) -> dict:
        """Table 1 per task over this run's ks for every model not in masking_skip: the top-k sinks masked, k random
        keys, the sinks' values ablated; every (model, condition) resumable under results_dir/table1-<task>/, each row
        with its checks."""
        loaded = {name: model for name, model in loaded.items() if name not in self.masking_skip}
        if not loaded:
            raise BadValue(f"masking_skip={self.masking_skip!r} is not allowed: it leaves no model of {self.models} "
                           "for the dose-response")
        conditions = at_eps(("sinks", "random keys", f"sink values ({self.value_ablation})"), self.eps)
        return {task: masking_table(group, get_task(task, limit=self.n_problems_by_task.get(task, self.n_problems)),
                                    conditions, self.ks_by_task.get(task, self.ks),
                                    {model.name: self.settings_for(model, task) for model in group},
                                    out_dir=Path(self.results_dir) / f"table1-{task}", batch_size=self.batch_size,
                                    seed=self.seed, progress=self.progress)
                for task, group in by_task(loaded, self.task, self.tasks).items()}


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
    # "analyses.EARLIER_BY" kept as written: the committed outputs of notebook 07 print this note (the constant is
    # this module's EARLIER_BY now)
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
