"""Extending sinklib: every registry, and one verb that adds to any of them. With `doubling` a Task named "doubling",
MaskFirstKeys an Intervention class, `first_keys` a Condition and MyRun a run config of yours (docs/extending.md
builds each):

    from sinklib import extend

    extend.register("family", "toy", "tests.toy_family:TOY")     # a Family, or its lazy "module:ATTRIBUTE"
    extend.register("task", "doubling", doubling)                 # an evaluation task, under its own name
    extend.register("policy", "mask_first_keys", MaskFirstKeys)   # a masking policy, by name in lm-eval's model_args
    extend.register("condition", "first keys", first_keys)        # a Table 1 column (masking_table's conditions)
    extend.register("notebook", "99_mine", MyRun)                 # a notebook's run config (its NOTEBOOK does it too)

Each registry refuses a name registered already (replace=True replaces it) and an unknown name with "did you mean";
`extend.registry(kind)` is the registry itself (names(), unregister()). The guide: docs/extending.md.
"""
from __future__ import annotations

import importlib
from typing import Any

from sinklib.evaluation.tasks import register_task
from sinklib.families.base import register_family
from sinklib.registry import Registry
from sinklib.validation import BadValue, check_choice

__all__ = ["REGISTRIES", "register", "register_family", "register_task", "registry"]

# each kind's registry, as "module:attribute": the notebook layer (sinklib.lab.runs) is imported only to register there
REGISTRIES = {
    "family": "sinklib.families.base:FAMILIES",
    "task": "sinklib.evaluation.tasks:TASKS",
    "policy": "sinklib.interventions:MASKING_POLICIES",
    "condition": "sinklib.evaluation.table1:CONDITIONS",
    "notebook": "sinklib.lab.runs:RUNS",
}


def registry(kind: str) -> Registry:
    """The registry of `kind` itself (names(), get(), unregister()).

    Args:
        kind: one of REGISTRIES: "family", "task", "policy", "condition", "notebook".

    Returns:
        The Registry.

    Raises:
        BadValue: an unknown kind (with "did you mean").
    """
    module, attribute = REGISTRIES[check_choice(kind, "kind", list(REGISTRIES))].split(":")
    return getattr(importlib.import_module(module), attribute)


def register(kind: str, name: str, target: Any, *, replace: bool = False) -> None:
    """Add `target` under `name` to the registry of `kind`.

    Args:
        kind: one of REGISTRIES: "family", "task", "policy", "condition", "notebook".
        name: the name it is reached by; a task is registered under its own name (`name` must be the Task's).
        target: the object (a Family, a Task, a policy class, a Condition, a run config), or a lazy
            "module:attribute" imported on first use.
        replace: replace what is registered under that name already (else that is refused).

    Raises:
        BadValue: an unknown kind, a name registered already, a task under another name than its own.
    """
    if kind == "task" and getattr(target, "name", name) != name:
        raise BadValue(f"name={name!r} is not allowed: name must be the task's own ({target.name!r})")
    registry(kind).register(name, target, replace=replace)
