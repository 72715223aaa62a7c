"""Notebook 08, sinks for speed: its run config (SpeedRun), the speed-accuracy frontier, Table 1 under each
sampler, the oldest keys evicted, attention under a cache, and its verdicts."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinklib import dynamics, speed
from sinklib.evaluation.conditions import column_name, column_words
from sinklib.evaluation.table1 import MaskingTable, masking_table
from sinklib.evaluation.tasks import TRACE_TASKS, get_task, trace_prompts
from sinklib.speed import AUTOREGRESSIVE_POLICY
from sinklib.stats import difference_of_changes
from sinklib.summary import (VERDICT_COLUMNS, Layout, Result, Summary, Verdicts, significant)
from sinklib.trace import Trace
from sinklib.trace_store import stored_traces
from sinklib.validation import BadValue, Count, Index, Ks, ModelNames, NonNegative, Text, validated
from sinklib.lab.runs import (FAST_SAMPLING, SPEED_MODELS, ModelsPart, OutputsPart, RunConfig,
                              default_copy)
from sinklib.lab.verdicts import (NEGLIGIBLE_LOSS, _cost_verdict)


@validated
@dataclass(frozen=True)
class SpeedRun(OutputsPart, ModelsPart, RunConfig):
    """Notebook 08: can sinks make a diffusion LM fast? Every model under each of its sampling policies
    (sinklib.speed: Fast-dLLM's caches and confidence threshold) on n_problems held-out problems of its task and
    n_timed of them timed side by side; then what a cached policy does to one generation's attention and sinks."""
    NOTEBOOK = "08_sinks_for_speed"
    READS_FROM = ("01_attention_distributions",)
    SECONDS_TO_REGENERATE = 40
    models: ModelNames = default_copy(SPEED_MODELS)
    n_problems: Count = 200
    n_timed: Count = 20
    trace_model: Text | None = None  # None: the run's first diffusion model on transformers' own code (the twin)
    trace_policy: Text = "threshold + dual cache"
    k: Count = 5
    eps: NonNegative = 3.0
    seed: Index = 0
    # Table 1's top-1 and random-1 columns and the oldest keys evicted (the paper's §5.3), on these models (None: the
    # traced diffusion model and every autoregressive one): a diffusion model under its plain sampler and
    # masking_policy, an autoregressive one with its KV cache
    masking_models: ModelNames | None = None
    masking_policy: Text = "threshold + dual cache"
    # the diffusion model's sampler for the eviction: a policy of sinklib.speed ("plain": about 90 minutes on one core
    # for the twin; the default, the fastest policy inside plain's interval, about 15)
    eviction_policy: Text = "threshold + dual cache"
    evicted: Ks = default_copy([1, 3])  # the oldest keys evicted (the twins' chat header, "<|im_start|>user\n", is 3)
    masking_batch_size: Count = 50  # as notebook 04's committed Table 1 runs, which the plain sampler's columns reuse

    def check(self) -> None:
        """trace_model one of models; trace_policy and masking_policy among sinklib.speed.POLICIES but plain,
        eviction_policy among them; masking_models among models."""
        if self.trace_model is not None and self.trace_model not in self.models:
            raise BadValue(f"trace_model={self.trace_model!r} is not allowed: it must be one of models={self.models!r}")
        for name in ("trace_policy", "masking_policy"):
            if getattr(self, name) not in speed.POLICIES or getattr(self, name) == "plain":
                raise BadValue(f"{name}={getattr(self, name)!r} is not allowed: choose one of "
                               f"{[p for p in speed.POLICIES if p != 'plain']}")
        if self.eviction_policy not in speed.POLICIES:
            raise BadValue(f"eviction_policy={self.eviction_policy!r} is not allowed: choose one of "
                           f"{list(speed.POLICIES)}")
        strangers = [name for name in self.masking_models or () if name not in self.models]
        if strangers:
            raise BadValue(f"masking_models={self.masking_models!r} is not allowed: {strangers} are not among "
                           f"models={self.models!r}")

    @property
    def speed_store(self) -> Path:
        """Where the evaluations and the timing live: results_dir/fast-sampling (FAST_SAMPLING)."""
        return Path(self.results_dir) / FAST_SAMPLING

    def collect(self) -> tuple[dict, pd.DataFrame]:
        """(loaded models, the speed–accuracy table): each (model, policy) evaluated on n_problems problems of its
        task (the held-out arithmetic) and n_timed of them timed side by side, all read from speed_store when it
        holds this run's (they resume there otherwise: an hour for the diffusion twin's plain sampler)."""
        loaded = self.load()
        task_of = {name: TRACE_TASKS[model.prompt_style] for name, model in loaded.items()}
        speed.measure(loaded, task_of, self.speed_store, self.n_problems, progress=self.progress)
        timing = speed.stored_timing(loaded, task_of, self.speed_store, self.n_timed, progress=self.progress)
        return loaded, speed.frontier(self.speed_store, timing, models=list(loaded))

    def collect_masking(self, loaded: Mapping[str, Any]) -> dict[tuple[str, str], MaskingTable]:
        """(model, sampler) → Table 1 with its top-1 sink and one random key masked, on n_problems of the model's
        task: a diffusion model under its plain sampler (notebook 04's runs in results_dir/table1-<task>) and under
        masking_policy (speed_store/table1), an autoregressive model with its KV cache. Every run resumes from its file
        (about 45 minutes a column for the diffusion twin's plain sampler on one core, 8 under the fast policy)."""
        return {(name, sampler): self._masking(loaded[name], sampler, [0, 1])
                for name in self.masked_models(loaded) for sampler in self._samplers(loaded[name], "plain",
                                                                                     self.masking_policy)}

    def collect_eviction(self, loaded: Mapping[str, Any]) -> dict[tuple[str, str], MaskingTable]:
        """(model, sampler) → Table 1 with each model's oldest `evicted` keys evicted (the paper's §5.3), on the
        models of collect_masking: a diffusion model under eviction_policy, an autoregressive one with its KV cache."""
        return {(name, sampler): self._masking(loaded[name], sampler, [0, *self.evicted], ["oldest keys"])
                for name in self.masked_models(loaded) for sampler in self._samplers(loaded[name], self.eviction_policy)}

    @staticmethod
    def _samplers(model, *policies: str) -> list[str]:
        return list(policies) if model.family.is_diffusion else [speed.AUTOREGRESSIVE_POLICY]

    def _masking(self, model, sampler: str, ks: list[int], conditions: list[str] | None = None) -> MaskingTable:
        """One model's Table 1 columns `ks` of `conditions` under `sampler` (a policy of sinklib.speed: "plain" and
        an autoregressive model's KV cache run its own settings from results_dir/table1-<task>, the others from
        speed_store/table1)."""
        task = TRACE_TASKS[model.prompt_style]
        own = sampler in ("plain", speed.AUTOREGRESSIVE_POLICY)
        return masking_table([model], get_task(task, limit=self.n_problems), conditions or ("sinks", "random keys"), ks,
                             None if own else speed.policy_settings(model, sampler),
                             batch_size=self.masking_batch_size, seed=self.seed, progress=self.progress,
                             out_dir=Path(self.results_dir) / f"table1-{task}" if own else self.speed_store / "table1")

    def masked_models(self, loaded: Mapping[str, Any]) -> list[str]:
        """masking_models, else the run's first diffusion model on transformers' own code (the traced one) and every
        autoregressive model of the run."""
        if self.masking_models is not None:
            return list(self.masking_models)
        diffusion = [name for name, model in loaded.items() if model.family.is_diffusion and model.calling == "native"]
        return diffusion[:1] + [name for name, model in loaded.items() if not model.family.is_diffusion]

    def traced(self, loaded: Mapping[str, Any]) -> str:
        """The model the attention section traces: trace_model, else the run's first diffusion model on transformers'
        own code (a cache needs one)."""
        name = self.trace_model or next((name for name, model in loaded.items() if model.family.is_diffusion
                                         and model.calling == "native"), None)
        if name is None:
            raise BadValue(f"models={self.models!r} is not allowed with trace_model=None: no model of the run is a "
                           "diffusion model on transformers' own code (a cache needs one)")
        return name

    def collect_traces(self, loaded: Mapping[str, Any]) -> dict[str, Any]:
        """trace_model's (or the run's first native diffusion model's) first traced prompt under its plain sampler
        (notebook 01's trace) and under trace_policy,
        with attention captured, from the trace store (made there if missing)."""
        model = loaded[self.traced(loaded)]
        prompt = trace_prompts(model.prompt_style, 1)
        store = Path(self.results_dir) / "traces"
        return {f"{policy}": stored_traces(model, prompt, store, seed=self.seed, progress=False,
                                           settings=speed.policy_settings(model, policy))[0]
                for policy in ("plain", self.trace_policy)}


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


def does_a_fast_sampler_lean_on_sinks(differences: pd.DataFrame) -> Verdicts:
    """Per diffusion model and fast sampler (`differences`: pick_sampler_differences), whether masking each column
    costs more under that sampler than under plain: its change minus plain's, with the paired bootstrap interval
    (stats.difference_of_changes), judged by _cost_verdict."""
    rows = [_cost_verdict(f"{test.model} ({test.sampler})", f"{column_words(test.column)} costs more than under plain",
                          test.n, test.difference, test.low, test.high) for test in differences.itertuples()]
    # "analyses.NEGLIGIBLE_LOSS" kept as written: the committed outputs of notebook 08 print this note (the
    # constant is sinklib.lab.verdicts.NEGLIGIBLE_LOSS now)
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
    # "analyses.NEGLIGIBLE_LOSS" kept as written: the committed outputs of notebook 08 print this note (the
    # constant is sinklib.lab.verdicts.NEGLIGIBLE_LOSS now)
    notes = ["Rule: supports when the paired change's 95 % interval lies below 0; contradicts when it excludes a loss "
             f"of {NEGLIGIBLE_LOSS:g} or more (analyses.NEGLIGIBLE_LOSS); otherwise cannot decide."]
    return Verdicts(pd.DataFrame(rows, columns=VERDICT_COLUMNS), notes=notes)
