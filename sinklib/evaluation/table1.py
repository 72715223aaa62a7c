"""Table 1: accuracy with the top-k sinks masked (the paper's policy: Eq. 3 on the previous step's scores; an
autoregressive model reads its last query row) and a random-key control.

Every (model, condition) is one resumable run of the evaluation runner, written to its own JSONL under `out_dir`
(its checks in its header): an interrupted table resumes where it stopped, a finished one is read back."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from sinklib import stats
from sinklib.validation import BadValue, Consent, Count, Index, Ks, bad_value, checked
from sinklib.evaluation.records import config_hash
from sinklib.evaluation.runner import evaluate, run_config
from sinklib.evaluation.tasks import Task, by_task, get_task, require_code_execution_opt_in  # noqa: F401  (by_task: lab/runs.py's)
from sinklib.evaluation.checks import CHECK_COLUMNS, Audit
from sinklib.evaluation.conditions import (CONDITIONS, Condition, checked_conditions, column_name,  # noqa: F401
                                          column_words, paper_masking, table_conditions)
from sinklib.families.base import Family, get_family
from sinklib.loading import LoadedModel, infer_family_from_dict, load, model_source
from sinklib.named import ADAPTED_MODELS
from sinklib.paths import ZOO_DIR
from sinklib.summary import EVALUATION, EVALUATION_ITEMS, Result, Summary, is_near_tie, label


ITEM_COLUMNS = ["model", "condition", "k", "id", "correct", "output", "margin"]


@dataclass
class MaskingTable:
    """frame: one row per (model, condition, k) with accuracy, stderr (binomial standard error), its Wilson 95 %
    interval (ci_low, ci_high) and n. items: one row per (model, condition, k, sample) with its correctness, output
    and closest decision margin — what lets a rerun on another CPU name a flipped answer as a near-tie
    (sinklib.lab.agreement), and what the paired tests (`paired`, `sinks_against_random`) and the competence-matched
    table read."""
    frame: pd.DataFrame
    task: str
    items: pd.DataFrame | None = None

    def wide(self) -> pd.DataFrame:
        """Models × conditions, each cell "accuracy [95 % Wilson interval]", columns in the paper's order."""
        labels = self.frame.assign(column=[column_name(c, k) for c, k in zip(self.frame["condition"], self.frame["k"])],
                                   cell=[f"{a:.2f} [{lo:.2f}, {hi:.2f}]" for a, lo, hi in
                                         zip(self.frame["accuracy"], self.frame["ci_low"], self.frame["ci_high"])])
        order = list(dict.fromkeys(labels["column"]))
        wide = labels.pivot(index="model", columns="column", values="cell")
        return wide.loc[list(dict.fromkeys(labels["model"])), order]

    def to_markdown(self) -> str:
        """The wide table (models × conditions) as a Markdown table."""
        return self.wide().to_markdown()

    def to_latex(self) -> str:
        """The wide table (models × conditions) as a LaTeX tabular."""
        return self.wide().to_latex()

    def paired(self) -> pd.DataFrame:
        """Each masked condition against the same model unmasked, on the problems both answered: one row per (model,
        condition, k) with n, lost (right unmasked, wrong masked), gained, the paired difference in accuracy
        (masked − unmasked) with its 95 % interval (Newcombe) and McNemar's exact p."""
        rows = []
        for (model, condition, k), group in self._items_by_run():
            if k == 0:
                continue
            rows.append({"model": model, "condition": condition, "k": k,
                         **_paired_row(self._correct(model, "sinks", 0), group.set_index("id")["correct"])})
        return pd.DataFrame(rows, columns=PAIRED_COLUMNS)

    def sinks_against_random(self) -> pd.DataFrame:
        """The top-k sinks masked against k random keys masked, per model and k, on the same problems: the paired
        difference (sinks − random: below 0 when the sinks cost more than as many random keys), its 95 % interval
        and McNemar's exact p. "lost" counts problems right with random keys masked and wrong with the sinks."""
        rows = []
        for (model, condition, k), group in self._items_by_run():
            if condition != "sinks" or k == 0 or ("random keys", k) not in self._runs(model):
                continue
            rows.append({"model": model, "condition": "sinks vs random keys", "k": k,
                         **_paired_row(self._correct(model, "random keys", k), group.set_index("id")["correct"])})
        return pd.DataFrame(rows, columns=PAIRED_COLUMNS)

    def competence_matched(self, models: Sequence[str] | None = None) -> "MaskingTable":
        """The table restricted to the problems every one of `models` (default: all the table's) answers right
        unmasked, so that models of different skill are compared on what each can do: its unmasked column is 1.0
        by construction, and each masked column is the share of those problems that survive the intervention."""
        items = self._require_items("competence_matched")
        models = list(dict.fromkeys(items["model"])) if models is None else list(models)
        unmasked = items[(items["k"] == 0) & items["model"].isin(models)]
        solved = unmasked[unmasked["correct"]].groupby("id")["model"].nunique()
        ids = set(solved[solved == len(models)].index)
        kept = items[items["model"].isin(models) & items["id"].isin(ids)].reset_index(drop=True)
        return MaskingTable(accuracy_rows(kept), self.task, kept)

    @classmethod
    def joined(cls, *tables: "MaskingTable") -> "MaskingTable":
        """Tables of one task (e.g. two masking_table calls with other conditions) as one; a run in several (their
        shared unmasked column) is kept once."""
        if len({table.task for table in tables}) != 1:
            raise BadValue(f"tables of tasks {[t.task for t in tables]} are not allowed: join the tables of one task")
        frame = pd.concat([t.frame for t in tables]).drop_duplicates(["model", "condition", "k"]).reset_index(drop=True)
        items = None if any(t.items is None for t in tables) else pd.concat([t.items for t in tables]).drop_duplicates(
            ["model", "condition", "k", "id"]).reset_index(drop=True)
        return cls(frame, tables[0].task, items)

    def _require_items(self, what: str) -> pd.DataFrame:
        if self.items is None or self.items.empty:
            raise BadValue(f"{what} needs the table's items (one row per sample); this table has none")
        return self.items

    def _items_by_run(self):
        return self._require_items("a paired test").groupby(["model", "condition", "k"], sort=False)

    def _runs(self, model: str) -> set[tuple[str, int]]:
        rows = self.items[self.items["model"] == model]
        return set(zip(rows["condition"], rows["k"]))

    def _correct(self, model: str, condition: str, k: int) -> pd.Series:
        rows = self.items[(self.items["model"] == model) & (self.items["condition"] == condition) & (self.items["k"] == k)]
        if rows.empty:
            raise BadValue(f"model={model!r} has no {column_name(condition, k)} run in this table to compare with")
        return rows.set_index("id")["correct"]

    def checks(self) -> pd.DataFrame:
        """Per model and condition, the checks its row carries (evaluation.checks): whether a capture that masks
        nothing is bit-identical to none, and the masked keys' summed score with the mask lifted and as run."""
        columns = ["model", "condition", "k", *CHECK_COLUMNS]
        return self.frame[[c for c in columns if c in self.frame]].reset_index(drop=True)

    def figure(self):
        """Accuracy against k, one line per model (solid: sinks, dotted: random keys), with standard errors."""
        return _plots().masking_plot(self.frame, self.task)

    def result(self, name: str = "table1_masking", figure=None):
        """As a summary.Result: the figure and the frame by `name`, the markdown and LaTeX tables, the wide table shown.

        Args:
            name: the file stem of the figure, the tables and the texts.
            figure: the table drawn (plots.masking_plot of `frame`, as a notebook shows the call); None draws it here.

        Returns:
            The summary.Result that a run config's `save` writes."""
        tables = {name: self.frame} if self.items is None else {name: self.frame, f"{name}_items": self.items}
        layouts = {name: EVALUATION, f"{name}_items": EVALUATION_ITEMS}
        figure = self.figure() if figure is None else figure
        return Result(figures={name: figure}, tables=tables, layouts={k: layouts[k] for k in tables},
                      texts={f"{name}.md": self.to_markdown() + "\n", f"{name}.tex": self.to_latex()}, shown=self.summary())

    def near_tie_models(self) -> set[str]:
        """The models any of whose answers passed a near-tie (a decision within float rounding: sinklib.ties)."""
        return set() if self.items is None else {
            name for name, margins in self.items.groupby("model")["margin"] if any(is_near_tie(m) for m in margins)}

    def summary(self):
        """The wide table as a notebook shows it, with a finding per model and the paper's values beside. A model
        any of whose samples was decided within float rounding is marked (sinklib.summary)."""
        flagged = self.near_tie_models()
        wide = self.wide()
        findings = [self._finding(name, row, label(name, flagged)) for name, row in wide.iterrows()]
        findings.append("Paper (Table 1, GSM8K): Llama-3.1-8B .85 unmasked, .02 with its top-1 sink masked; "
                        "LLaDA-8B .76 → .75, Dream-7B .82 → .79, MMaDA-8B .54 → .53.")
        return Summary.by_model(wide, flagged, findings)

    def _finding(self, name: str, row: pd.Series, shown_name: str) -> str:
        """"<model> (n = N): a unmasked, b with its top-1 sink masked (−drop), c with 1 random key masked (−drop)"
        and, where the items were decided at near-ties, how many."""
        frame = self.frame[self.frame["model"] == name]
        accuracy = {column_name(c, k): a for c, k, a in zip(frame["condition"], frame["k"], frame["accuracy"])}
        tests = {} if self.items is None or self.items.empty or "unmasked" not in accuracy else {
            column_name(r.condition, r.k): r for r in self.paired().itertuples() if r.model == name}
        parts = [f"{row[column]} {column_words(column)}" + _change(column, accuracy, tests)
                 for column in _headline_columns(list(row.index))]
        text = f"{shown_name} (n = {int(frame['n'].max())}): " + ", ".join(parts)
        if self.items is not None:
            margins = self.items.loc[self.items["model"] == name, "margin"]
            near = sum(is_near_tie(m) for m in margins)
            if near:  # another CPU may take another path to the answer there; the check excuses only parted outputs
                text += f"; answers whose generation passed a near-tie: {near} of {len(margins)}"
        return text + "."

    def save(self, folder: str | Path, name: str = "table1_masking") -> list[Path]:
        """name.md, name.tex, name.png, name.pdf in `folder`."""
        plots = _plots()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.md").write_text(self.to_markdown() + "\n")
        (folder / f"{name}.tex").write_text(self.to_latex())
        fig = self.figure()
        paths = plots.save_figure(fig, name, folder)
        plots.close(fig)
        return [folder / f"{name}.md", folder / f"{name}.tex", *paths]


def _change(column: str, accuracy: dict, tests: dict) -> str:
    """" (−0.10 [−0.17, −0.04], McNemar p = 0.003)": a masked column's paired change from unmasked, where known."""
    if column == "unmasked" or "unmasked" not in accuracy:
        return ""
    test = tests.get(column)
    if test is None:
        return f" ({accuracy[column] - accuracy['unmasked']:+.2f})"
    return f" ({test.delta:+.2f} [{test.delta_low:+.2f}, {test.delta_high:+.2f}], McNemar p = {test.p_mcnemar:.2g})"


PAIRED_COLUMNS = ["model", "condition", "k", "n", "lost", "gained", "delta", "delta_low", "delta_high", "p_mcnemar"]


def _paired_row(reference: pd.Series, other: pd.Series) -> dict:
    """The paired comparison of two runs' correctness (Series by sample id) on the samples both answered."""
    common = [i for i in reference.index if i in other.index]
    result = stats.paired([bool(reference[i]) for i in common], [bool(other[i]) for i in common])
    return {"n": result.n, "lost": result.lost, "gained": result.gained, "delta": result.delta,
            "delta_low": result.low, "delta_high": result.high, "p_mcnemar": result.p}


def accuracy_rows(items: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, condition, k) of `items`: accuracy, its binomial standard error (as the runner computes
    it), the Wilson 95 % interval and n."""
    rows = []
    for (model, condition, k), group in items.groupby(["model", "condition", "k"], sort=False):
        rows.append({"model": model, "condition": condition, "k": k, **interval_columns(int(group["correct"].sum()),
                                                                                       len(group))})
    return pd.DataFrame(rows, columns=["model", "condition", "k", "accuracy", "stderr", "ci_low", "ci_high", "n"])


def interval_columns(correct: int, n: int) -> dict:
    """accuracy, stderr (sqrt(p(1 − p) / (n − 1)), the runner's), ci_low, ci_high (Wilson 95 %) and n."""
    accuracy = correct / n if n else float("nan")
    low, high = stats.wilson_interval(correct, n)
    return {"accuracy": accuracy, "stderr": math.sqrt(accuracy * (1 - accuracy) / max(1, n - 1)) if n else float("nan"),
            "ci_low": low, "ci_high": high, "n": n}


def _headline_columns(columns: list[str]) -> list[str]:
    """What a finding reports: the unmasked column, then each condition's column at its smallest k, in table order
    (the paper's k = 1: top-1, random-1, values-1)."""
    smallest: dict[str, tuple[int, str]] = {}
    for column in columns:
        if column != "unmasked":
            prefix, k = column.rsplit("-", 1)
            smallest[prefix] = min(smallest.get(prefix, (int(k), column)), (int(k), column))
    return [c for c in columns if c == "unmasked"] + [column for _, column in smallest.values()]


def _plots():
    """sinklib.plots, imported on first use: the figures need matplotlib (the notebooks extra); the table's
    numbers and texts do not."""
    from sinklib import plots  # noqa: PLC0415  (matplotlib: the notebooks extra)

    return plots


TABLE1_CONDITIONS = ("sinks", "random keys")  # the paper's Table 1: the top-k sinks masked, and the random-key control


@checked
def masking_table(models: Sequence[LoadedModel | str], task: "str | Task" = "arithmetic",
                  conditions: Sequence["str | Condition"] = TABLE1_CONDITIONS, ks: Ks = (0, 1, 5, 10),
                  settings: Any = None, *, out_dir: str | Path | None = None, batch_size: Count = 8, seed: Index = 0,
                  allow_code_execution: Consent = False, progress: bool = True) -> MaskingTable:
    """Table 1 for `models` on `task`: the unmasked column (k = 0, when 0 is in ks), then each condition at every
    k > 0 of `ks`. Every row carries its checks: the no-op check (noop_identical: on the task's first sample,
    unbatched, a capture masking nothing is bit-identical to no capture) and the attention its policy moved in one
    audited generation of that sample (evaluation.checks).

    Args:
        models: loaded models or names for sinklib.load.
        task: a task's name or a Task: get_task(name, path=..., limit=...) for a local file of samples, its first
            `limit` samples.
        conditions: the columns by name (CONDITIONS, your own registered ones included): "sinks" (the paper's top-k
            sinks masked, Eq. 3 at eps = 3 on the previous step), "random keys", "oldest keys", "sink values (zero)"
            and "sink values (mean)" (the top-k sinks keep their attention; their values are ablated); a Condition
            for another eps: CONDITIONS.get("sinks").at(2.0).
        ks: keys masked per column; 0 is the unmasked column.
        settings: None: each model's LoadedModel.settings_for(task); one family's settings dataclass (a table of one
            model); or {model name: settings} (a run config's settings_for gives them).
        out_dir: each run is written to out_dir/<model>-<task>-<column>-<config hash>.jsonl, its checks in its
            header, and resumes; a changed key (limit, seed, settings, dtype, retrained weights, an edited config or
            scorer: evaluation.runner.run_config) writes a new file beside the old one. None: nothing is written.
        batch_size: prompts per generation, as for sinklib.evaluate, for every run.
        seed: the runs' seed, as for sinklib.evaluate (and the random-key control's draw: a problem's keys are a
            function of it, the problem, the step and the layer; CONDITIONS.get("random keys").drawn(1) is the
            control's next draw, at seed + 1).
        allow_code_execution: a code task's programs run, sandboxed, only with True (a real bool).
        progress: progress bars over the runs and their samples.

    Returns:
        The MaskingTable: one row per model and column (accuracy, its interval, n, the checks), and every run.

    Raises:
        BadValue: an unknown condition or task, a k below 0, settings that are not for the models given.
    """
    spec = get_task(task)
    require_code_execution_opt_in(spec, allow_code_execution, "masking_table")
    models = _checked_models(models)
    chosen = checked_conditions(conditions)
    _check_table_settings(settings, models)
    for model in models:  # every model whose family is known before loading: its conditions built before any run
        family = family_before_loading(model)
        if family is not None:
            table_conditions(family, ks, chosen, seed)
    rows, items = [], []
    for model in models:
        loaded = model if isinstance(model, LoadedModel) else load(model)
        given = settings.get(loaded.name) if isinstance(settings, Mapping) else settings
        run_settings = loaded.settings_for(spec) if given is None else loaded.runnable(given)
        audit, samples = Audit(loaded, spec, run_settings, seed), spec.samples()
        for condition, k, intervention in table_conditions(loaded.family, ks, chosen, seed):
            out = None
            if out_dir is not None:  # one file per key: a changed limit, dtype or retrained model starts afresh
                key = config_hash(run_config(loaded, spec, intervention, seed, batch_size, run_settings, samples))
                out = Path(out_dir) / f"{loaded.name.replace('/', '__')}-{spec.name}-{column_name(condition, k)}-{key}.jsonl"
            summary = evaluate(loaded, spec, run_settings, intervention=intervention, batch_size=batch_size, out=out,
                               seed=seed, progress=progress, allow_code_execution=allow_code_execution)
            correct = sum(bool(r["correct"]) for r in summary.records)
            rows.append({"model": loaded.name, "condition": condition, "k": k,
                         **interval_columns(correct, summary.n), "accuracy_flexible": summary.accuracy_flexible,
                         **audit.of(intervention, out)})
            items += [{"model": loaded.name, "condition": condition, "k": k, "id": str(r["id"]),
                       "correct": bool(r["correct"]), "output": r["output"], "margin": r.get("margin")}
                      for r in summary.records]
    items = pd.DataFrame(items, columns=ITEM_COLUMNS).astype({"margin": "float64"})
    return MaskingTable(pd.DataFrame(rows), spec.name, items)


def _check_table_settings(settings: Any, models: list) -> None:
    """One family's settings make a table of one model; a mapping names only the table's models."""
    names = [m.name if isinstance(m, LoadedModel) else str(m) for m in models]
    if isinstance(settings, Mapping):
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise bad_value("settings", dict(settings), f"settings by model name for models among {names} "
                                                         f"({unknown} are not)")
    elif settings is not None and len(models) > 1:
        raise bad_value("settings", settings, "one family's settings for a table of one model, or {model name: "
                                              "settings} for several")


def family_before_loading(model: LoadedModel | str | os.PathLike) -> Family | None:
    """The family `model` loads as where it is known without loading it: a loaded model's, a twin's, or the one its
    config.json declares (a zoo model's `sinklib_family`, a family's words in model_type / architectures); None where
    only loading tells (its conditions are then built when its turn comes)."""
    if isinstance(model, LoadedModel):
        return model.family
    name = str(model)
    if name in ADAPTED_MODELS:
        return get_family(ADAPTED_MODELS[name].family)
    source = model_source(name)
    if source not in ("zoo", "folder"):  # a named model converted on first use, a hub id: only loading tells
        return None
    config = (ZOO_DIR / name if source == "zoo" else Path(name).expanduser()) / "config.json"
    try:
        raw = json.loads(config.read_text())
        declared = raw.get("sinklib_family") or infer_family_from_dict(raw)
        return get_family(declared) if isinstance(declared, str) and declared else None
    except (OSError, ValueError, AttributeError):  # no readable config here: load() says what is wrong with it
        return None


def _checked_models(models) -> list:
    if isinstance(models, (str, os.PathLike, LoadedModel)):
        models = [models]  # one model, not a sequence of characters
    models = list(models)
    if not models or not all(isinstance(m, (str, os.PathLike, LoadedModel)) for m in models):
        raise bad_value("models", models, "a non-empty list of loaded models or model names")
    names = [m.name if isinstance(m, LoadedModel) else str(m) for m in models]
    if len(set(names)) != len(names):  # each model is one row group of every view: twice would break them all
        raise bad_value("models", names, "distinct models (each once)")
    return models
