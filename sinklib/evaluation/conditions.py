"""Table 1's columns as data: a Condition is one kind of column (the unmasked run, the top-k sinks masked, k random
keys, the oldest keys evicted, the sinks' values ablated), registered in CONDITIONS by name, with the words and the
column name each k gets; masking_table (sinklib.evaluation.table1) runs them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sinklib.families.base import Family
from sinklib.interventions import AblateValues, EvictOldest, MaskRandomKeys, MaskSinks
from sinklib.registry import Registry
from sinklib.validation import BadValue, bad_value, check_choice, check_eps, check_int

@dataclass(frozen=True)
class Condition:
    """One kind of Table 1 column, as data; k = 0 is the unmasked column every table starts with, whatever its
    conditions. CONDITIONS holds them by name (`CONDITIONS.get("sinks").at(2.0)`: the sinks' column at another eps).

    Attributes:
        label: the rows' condition ("sinks", "random keys", …).
        column: its column name before "-k" ("top-1", "random-5").
        words: how a finding says it ("with its top-{k} sinks masked"; "{s}" is "s" unless k is 1).
        policy: policy(family=, k=, eps=, seed=) builds the intervention for a model of that family.
        eps: the Eq. 3 threshold of a sink condition (sum units; the paper's 3 unless made `at` another).
        draw: which draw of a random condition (0: the table's seed; `drawn(d)`: its policy gets seed + d), so that
            a random-key control is made over several draws on the same problems and sampler seed.
    """
    label: str
    column: str
    words: str
    policy: Callable[..., Any]
    eps: float = 3.0
    draw: int = 0

    def intervention(self, family: Family, k: int, seed: int):
        """This condition's intervention with k keys for a model of `family` (the registered policy, built by
        `policy`, at the table's seed + this condition's draw)."""
        return self.policy(family=family, k=k, eps=self.eps, seed=seed + self.draw)

    def at(self, eps: float) -> "Condition":
        """This condition with another Eq. 3 threshold (a finite number >= 0, sum units): its columns and words stay."""
        return dataclasses.replace(self, eps=check_eps(eps))

    def drawn(self, draw: int) -> "Condition":
        """This condition at another draw (an integer >= 0: its policy's seed is the table's seed + draw); a policy
        that draws nothing at random (the sinks) is the same at every draw."""
        return dataclasses.replace(self, draw=check_int(draw, "draw", 0))

    def in_words(self, k: int) -> str:
        """How a finding names this condition at k."""
        return self.words.format(k=k, s="" if k == 1 else "s")


def paper_masking(family: Family, top_k: int, eps: float = 3.0) -> MaskSinks:
    """The paper's top-k sink masking (Table 1's "sinks"): Eq. 3 on the previous step's scores, its sinks read from
    the query rows the family computes (Family.sink_rows).

    Args:
        family: the model's Family (LoadedModel.family).
        top_k: how many of the strongest sinks are masked.
        eps: the Eq. 3 threshold (sum units).

    Returns:
        The MaskSinks policy, for generate, evaluate or capture's `intervention`.
    """
    return MaskSinks(top_k=top_k, eps=eps, source="previous_step", rows=family.sink_rows)


def _ablated_sinks(mode: str) -> Callable[..., Any]:
    def policy(family: Family, k: int, eps: float, seed: int):
        return AblateValues(paper_masking(family, k, eps), mode)
    return policy


# Table 1's conditions by name: masking_table(conditions=[...]) takes any of these; register your own with
# CONDITIONS.register(name, Condition(...)) (tests/unit/test_extending.py adds one from outside the package).
CONDITIONS: Registry[Condition] = Registry("condition", {
    "sinks": Condition("sinks", "top", "with its top-{k} sink{s} masked",
                       lambda family, k, eps, seed: paper_masking(family, k, eps)),
    "random keys": Condition("random keys", "random", "with {k} random key{s} masked",
                             lambda family, k, eps, seed: MaskRandomKeys(k=k, seed=seed)),
    # the paper's §5.3: the oldest context dropped, sinks or not (the first token among it)
    "oldest keys": Condition("oldest keys", "oldest", "with its oldest {k} key{s} evicted",
                             lambda family, k, eps, seed: EvictOldest(k=k)),
    **{f"sink values ({mode})": Condition(f"sink values ({mode})", "values", "with its top-{k} sinks' values ablated",
                                          _ablated_sinks(mode)) for mode in AblateValues.MODES},
})


def _condition_of(label: str) -> Condition:
    """The registered condition whose rows carry `label` (registered under that name)."""
    return CONDITIONS.get(label)


def column_words(column: str) -> str:
    """"top-5" → "with its top-5 sinks masked", "random-1" → "with 1 random key masked"."""
    if column == "unmasked":
        return "unmasked"
    prefix, k = column.rsplit("-", 1)
    condition = next(CONDITIONS.get(name) for name in CONDITIONS if CONDITIONS.get(name).column == prefix)
    return condition.in_words(int(k))


def column_name(condition: str, k: int) -> str:
    """The Table 1 column of a condition at k: "unmasked" at k = 0, else the condition's column and k ("top-1")."""
    return "unmasked" if k == 0 else f"{_condition_of(condition).column}-{k}"


def table_conditions(family: Family, ks: Sequence[int], chosen: Sequence[Condition],
                     seed: int) -> list[tuple[str, int, Any]]:
    """(condition, k, intervention) in table order: unmasked (k = 0), then per condition (checked_conditions) its
    k > 0 columns, each policy built for `family` with the condition's own eps and the table's `seed`."""
    result = [("sinks", 0, None)] if 0 in ks else []
    for condition in chosen:
        for k in (k for k in ks if k):
            intervention = condition.intervention(family, k, seed)
            if intervention is None:  # it would run unmasked and be reported as masked
                raise BadValue(f"conditions={[c.label for c in chosen]!r} is not allowed: the policy of "
                               f"{condition.label!r} builds no intervention for a {family.name} model at k={k}; a "
                               "masked column must mask")
            result.append((condition.label, k, intervention))
    return result


def checked_conditions(conditions: Sequence["str | Condition"]) -> list[Condition]:
    """The Conditions that make a table, checked before any run: a list (one string would be its characters) of
    registered names or Conditions (a registered one made `at` another eps), each once, whose columns differ (two
    conditions in one column make every view fail), each registered under its own label (the rows carry the label)
    with words that take only {k} and {s}."""
    if isinstance(conditions, str) or not isinstance(conditions, Sequence):
        raise bad_value("conditions", conditions, f"a list of condition names, e.g. [{conditions!r}]"
                        if isinstance(conditions, str) else f"a list of condition names ({CONDITIONS.names()})")
    names = [c.label if isinstance(c, Condition) else c for c in conditions]
    for name in names:
        check_choice(name, "conditions", CONDITIONS.names())
    if len(set(names)) != len(names):
        raise bad_value("conditions", list(names), "distinct condition names (each once)")
    _check_columns(names, {name: CONDITIONS.get(name) for name in names})
    for condition in conditions:  # one given whole is a registered one at its own eps: the views look it up by label
        registered = CONDITIONS.get(condition.label) if isinstance(condition, Condition) else None
        if registered is not None and dataclasses.replace(condition, eps=registered.eps, draw=0) != registered:
            raise bad_value("conditions", list(names), f"registered conditions, by name or made `at` another eps or "
                            f"`drawn` at another draw ({condition.label!r} differs from the registered one beyond "
                            "its eps and draw)")
    return [c if isinstance(c, Condition) else CONDITIONS.get(c) for c in conditions]


def _check_columns(names: list[str], chosen: dict) -> None:
    """Each condition registered under its own label, the columns distinct, the words taking only {k} and {s}."""
    columns: dict[str, str] = {}
    for name, condition in chosen.items():
        if condition.label != name:
            raise bad_value("conditions", list(names), f"names registered under their own label ({name!r} is "
                            f"registered with label {condition.label!r})")
        if condition.column in columns or condition.column == "unmasked":
            raise bad_value("conditions", list(names), f"names whose columns differ ({name!r} and "
                            f"{columns.get(condition.column, 'the unmasked column')!r} both write {condition.column!r})")
        columns[condition.column] = name
        try:
            condition.words.format(k=1, s="")
        except (KeyError, IndexError, ValueError) as error:
            raise bad_value("conditions", list(names), f"names whose words take only {{k}} and {{s}} ({name!r} "
                            f"says {condition.words!r}: {error!r})") from None
