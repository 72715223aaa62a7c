"""Notebook 04, Table 1: its run config (MaskingRun), the paired tests and its verdict, sink_reliance."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from sinklib.evaluation.conditions import CONDITIONS
from sinklib.evaluation.table1 import MaskingTable, by_task, family_before_loading, masking_table
from sinklib.evaluation.tasks import get_task
from sinklib.summary import Summary, label
from sinklib.validation import Consent, Count, Flag, Ks, NonNegative, Text, validated
from sinklib.lab.runs import (ModelsPart, OutputsPart, RunConfig,
                              SamplingPart, TaskPart, _check_consent, _check_layout, _check_models_named,
                              _check_task_limits, at_eps, default_copy)


@validated
@dataclass(frozen=True)
class MaskingRun(OutputsPart, TaskPart, SamplingPart, ModelsPart, RunConfig):
    """Notebook 04: Table 1, accuracy with the top-k sinks masked and a random-key control."""
    NOTEBOOK = "04_masking_ablation"
    SECONDS_TO_REGENERATE = 190
    task_path: str | None = None  # a local JSONL for the task (e.g. GSM8K on an offline node)
    n_problems_by_task: dict[str, Count] = default_copy({"arithmetic-english": 200})  # the twins' committed runs
    ks: Ks = default_copy([0, 1, 5, 10])
    random_control: Flag = True
    # the random-key control's draws by task or model, a model's own entry first (control seeds seed, seed + 1, …;
    # neither named: one draw): each further draw is one run per model and k > 0. The diffusion twin's take hours
    control_draws: dict[str, Count] = default_copy({"arithmetic": 3, "capitals": 3,
                                                    "smollm2-135m-autoregressive": 3})
    eps: NonNegative = 3.0
    batch_size: Count = 50
    allow_code_execution: Consent = False
    # models compared on the problems all of them solve unmasked (a table per task where two or more answer it)
    competence_matched: list[Text] = default_copy(["smollm2-135m-diffusion", "smollm2-135m-autoregressive"])

    def check(self) -> None:
        """Cross-field rules, run when the config is made: gen_length a multiple of block_length, tasks that exist,
        consent for a task that runs model-written code, and a task_path that exists."""
        _check_layout(self)
        _check_task_limits(self)
        _check_models_named(self, "tasks")
        _check_consent(self)

    def collect(self) -> dict[str, MaskingTable]:
        """Table 1, one table per task: each model on its own task (by_task), every (model, condition) resumable under
        results_dir/table1-<task>/."""
        conditions = at_eps(("sinks", "random keys") if self.random_control else ("sinks",), self.eps)
        return {task: masking_table(group, self.task_of(task), conditions, self.ks,
                                    {model.name: self.settings_for(model, task) for model in group},
                                    batch_size=self.batch_size, seed=self.seed,
                                    out_dir=Path(self.results_dir) / f"table1-{task}",
                                    allow_code_execution=self.allow_code_execution, progress=self.progress)
                for task, group in by_task(self.load(), self.task, self.tasks).items()}

    def control_draws_of(self, tables: Mapping[str, MaskingTable]) -> dict[str, list[MaskingTable]]:
        """The random-key control at its further draws (control_draws: a model's own entry, else its task's, else
        one draw), one table per model and draw, by task, beside Table 1's own draw (`tables`, collect()'s: control
        seed = seed): only the "random keys" condition at Table 1's k > 0, each run resumable beside Table 1's."""
        ks = [k for k in self.ks if k]
        if not self.random_control or not ks:
            return {}
        drawn = {}
        for task, group in by_task(self.load(), self.task, self.tasks).items():
            drawn[task] = [masking_table([model], self.task_of(task), [CONDITIONS.get("random keys").drawn(draw)], ks,
                                         {model.name: self.settings_for(model, task)}, batch_size=self.batch_size,
                                         seed=self.seed, out_dir=Path(self.results_dir) / f"table1-{task}",
                                         allow_code_execution=self.allow_code_execution, progress=self.progress)
                           for model in group
                           for draw in range(1, self.control_draws.get(model.name, self.control_draws.get(task, 1)))]
        return {task: found for task, found in drawn.items() if task in tables}

    def evaluation_of(self, model: Any, limit: int | None = None) -> dict[str, Any]:
        """What collect() evaluates `model` (a LoadedModel) with, as keyword arguments of sinklib.evaluate: its task
        (with the run's task file where it is the run's own task; its first `limit` problems, None: the run's
        n_problems), its settings, seed, batch size and consent."""
        task = self.tasks.get(model.name, self.task)
        return dict(task=get_task(self.task_of(task), limit=limit), settings=self.settings_for(model, task),
                    seed=self.seed, batch_size=self.batch_size, allow_code_execution=self.allow_code_execution)

    def task_of(self, task: str):
        """The Task a table of `task` reads: its n_problems (n_problems_by_task, else n_problems), and the run's task
        file where it is the run's own task (a model given another task reads that task's own data)."""
        return get_task(task, path=self.task_path if task == self.task else None,
                        limit=self.n_problems_by_task.get(task, self.n_problems))


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


def control_spread(tables: Mapping[str, MaskingTable], draws: Mapping[str, Sequence[MaskingTable]]) -> Summary:
    """The random-key control over its draws: per model and k, the accuracy at each draw (Table 1's own first), their
    mean and range, and the top-k sinks against k random keys at every draw (paired on the same problems: the
    difference's 95 % interval and McNemar's exact p per draw). A comparison "holds at every draw" where each draw's
    interval lies below 0 (the sinks cost more than random keys) or each lies above it; with one draw, the spread is
    not measured, and the findings say so."""
    rows, flagged = [], set().union(*(t.near_tie_models() for ts in [tables.values(), *draws.values()] for t in ts))
    for task, table in tables.items():
        others = list(draws.get(task, ()))
        against = [table.sinks_against_random()] + [draw.sinks_against_random() for draw in _as_draws(table, others)]
        accuracy = [t.frame.set_index(["model", "condition", "k"])["accuracy"] for t in [table, *others]]
        for (model, k), first in against[0].set_index(["model", "k"]).iterrows():
            per_draw = [frame.set_index(["model", "k"]).loc[(model, k)] for frame in against
                        if (model, k) in frame.set_index(["model", "k"]).index]
            shares = [a.loc[(model, "random keys", k)] for a in accuracy if (model, "random keys", k) in a.index]
            below, above = all(d["delta_high"] < 0 for d in per_draw), all(d["delta_low"] > 0 for d in per_draw)
            rows.append({"model": model, "task": task, "k": k, "draws": len(per_draw), "n": int(first["n"]),
                         "random_mean": sum(shares) / len(shares), "random_min": min(shares),
                         "random_max": max(shares), "sinks": table.frame.set_index(["model", "condition", "k"])
                         .loc[(model, "sinks", k), "accuracy"],
                         "largest_p": max(d["p_mcnemar"] for d in per_draw),
                         "holds": "sinks cost more" if below else "sinks cost less" if above else "undecided"})
    frame = pd.DataFrame(rows).set_index("model")
    findings = [f"{label(model, flagged)} ({row.task}), k = {row.k}: random keys {row.random_mean:.2f} over {row.draws} draw"
                f"{'s' if row.draws > 1 else ''} [{row.random_min:.2f}–{row.random_max:.2f}], sinks {row.sinks:.2f}: "
                + ((f"{row.holds} at every draw" if row.holds != "undecided" else "not decided at every draw")
                   + f" (largest McNemar p = {row.largest_p:.2g}, n = {row.n})" if row.draws > 1 else
                   f"{row.holds} at its one draw (n = {row.n}; the spread over draws is not measured)")
                for model, row in frame.iterrows()]
    frame["largest_p"] = [f"{p:.2g}" for p in frame["largest_p"]]  # 3.4e-24, not 0.000
    return Summary.by_model(frame, flagged, findings)


def _as_draws(table: MaskingTable, others: Sequence[MaskingTable]) -> list[MaskingTable]:
    """Each further draw's table with Table 1's sinks columns, so that its sinks_against_random pairs them."""
    sinks = table.items[table.items["condition"] == "sinks"]
    return [MaskingTable(other.frame, other.task, pd.concat([sinks, other.items], ignore_index=True)) for other in others]


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
    kind = None if family is None else "diffusion" if family.is_diffusion else "autoregressive"
    if kind in PAPER_TOP1:
        expected, paper = PAPER_TOP1[kind]
        relation = "as" if cost == expected else "less than" if (cost, expected) == ("loses", "collapses") else "unlike"
        said += f"; {relation} {paper}"
    return {"model": model, "task": task, "kind": kind or "not declared", "unmasked": unmasked, "top-1": masked,
            "delta": top1["delta"], "delta_low": top1["delta_low"], "delta_high": top1["delta_high"],
            "verdict": said}
