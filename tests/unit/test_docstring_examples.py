"""Every example in a public docstring runs. The public docstrings are those of what `import sinklib` and
`sinklib.extend` give: the two modules' own, each object of their __all__, and a class's public methods and properties.
An example is either a block (an indented paragraph, not inside an Args: / Returns: / … section), which must be Python
and runs in a namespace holding what its reader has at hand (a tiny model, a prompt's ids, the objects the prose names),
or an inline call after "e.g." naming something sinklib exports ("e.g. MaskSinks(top_k=1)"), which must evaluate. A
shape a comment gives an expression ("# [steps, layers, batch, heads, keys]") must be the value's."""
import ast
import builtins
import dataclasses
import importlib.util
import inspect
import re
import textwrap

import pytest
import torch

import sinklib
from sinklib import extend
from sinklib.evaluation.conditions import Condition
from sinklib.evaluation.tasks import Task
from sinklib.interventions import Intervention, MaskKeys

SECTIONS = ("Args:", "Returns:", "Yields:", "Raises:", "Attributes:")
INLINE = re.compile(r"e\.g\.,? ((?:\w+\.)*\w+\((?:[^()]|\([^()]*\))*\))")
SHAPE = re.compile(r"#\s*\[([^\]]*)\]")


def public_docstrings() -> dict[str, str]:
    """Where each public docstring is (a dotted name) → the docstring."""
    found = {module.__name__: inspect.getdoc(module) for module in (sinklib, extend)}
    for module in (sinklib, extend):
        for name in module.__all__:
            obj = getattr(module, name)
            found[f"{module.__name__}.{name}"] = inspect.getdoc(obj)
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                        found[f"{module.__name__}.{name}.{member}"] = inspect.getdoc(value)
    return {where: doc for where, doc in found.items() if doc}


def blocks(doc: str) -> list[str]:
    """The indented paragraphs of a docstring that are not the items of a Google-style section."""
    lines, found, index = doc.splitlines(), [], 0
    while index < len(lines):
        starts = lines[index].startswith("    ") and index > 0 and not lines[index - 1].strip()
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        end = index + 1
        while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
            end += 1
        if starts and not previous.startswith(" ") and not previous.rstrip().endswith(SECTIONS):
            found.append(textwrap.dedent("\n".join(lines[index:end])).strip())
            index = end
        else:
            index += 1
    return found


EXAMPLES = [(where, block) for where, doc in public_docstrings().items() for block in blocks(doc)]
INLINE_EXAMPLES = [(where, call) for where, doc in public_docstrings().items() for call in INLINE.findall(doc)
                   if call.split("(")[0].split(".")[0] in {*sinklib.__all__, "sinklib", *dir(builtins)}]


class MaskFirstKeys(Intervention):
    """The extension guide's toy policy: every query loses the first `count` keys."""

    def __init__(self, count: int = 1) -> None:
        self.count = count

    def keys_to_mask(self, call):
        mask = torch.zeros(call.batch, call.heads, call.n_keys, dtype=torch.bool, device=call.device)
        mask[..., :self.count] = True
        return mask


@pytest.fixture(scope="module")
def at_hand():
    """What a reader of the examples has at hand: a tiny model (as a torch module), a prompt's ids, and the objects the
    extension example's prose names (a Task named "doubling", an Intervention class, a Condition, a run config)."""
    loaded = sinklib.load("tiny-llada")
    names = {"sinklib": sinklib, "torch": torch, "model": loaded.model,
             "ids": torch.tensor([sinklib.encode(loaded, "Q: 3 + 4 = ? A:", chat=False)]),
             "doubling": Task("doubling", lambda path=None: [], chat=False, scorer=lambda output, sample: {}),
             "MaskFirstKeys": MaskFirstKeys,
             "first_keys": Condition("first keys", "first", "with its first {k} key{s} masked",
                                     lambda family, k, eps, seed: MaskKeys(positions=tuple(range(k))))}
    if importlib.util.find_spec("matplotlib") is not None:  # a run config is of the notebooks' tier (the notebooks extra)
        from sinklib.lab.runs import RunConfig

        names["MyRun"] = dataclasses.dataclass(frozen=True)(type("MyRun", (RunConfig,), {}))
    yield names
    registered = {"family": "toy", "task": "doubling", "policy": "mask_first_keys", "condition": "first keys",
                  "notebook": "99_mine"}
    for kind, name in registered.items():
        if name in extend.registry(kind).names():
            extend.registry(kind).unregister(name)


def run_example(block: str, namespace: dict) -> None:
    """Each statement in turn; an expression whose comment names a shape is held to it."""
    lines = block.splitlines()
    for statement in ast.parse(block).body:
        code = ast.Module([statement], type_ignores=[])
        if not isinstance(statement, ast.Expr):
            exec(compile(code, "<example>", "exec"), namespace)
            continue
        value = eval(compile(ast.Expression(statement.value), "<example>", "eval"), namespace)
        shape = SHAPE.search(lines[statement.end_lineno - 1])
        if shape is not None:
            named = [part.strip() for part in shape.group(1).split(",")]
            assert len(value.shape) == len(named), f"{lines[statement.end_lineno - 1]!r}: the value is {tuple(value.shape)}"


def test_the_public_docstrings_hold_examples_of_both_kinds():
    assert {where for where, _ in EXAMPLES} >= {"sinklib.capture", "sinklib.extend"}
    assert {where for where, _ in INLINE_EXAMPLES} >= {"sinklib.generate", "sinklib.evaluate"}


@pytest.mark.parametrize("where, block", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_example_block_in_a_public_docstring_runs(where, block, at_hand):
    if "MyRun" in block and "MyRun" not in at_hand:
        pytest.skip("the notebooks extra is not installed: a run config is of the notebooks' tier")
    run_example(block, dict(at_hand))


@pytest.mark.parametrize("where, call", INLINE_EXAMPLES, ids=[f"{where}: {call}" for where, call in INLINE_EXAMPLES])
def test_every_inline_example_in_a_public_docstring_evaluates(where, call):
    eval(call, {name: getattr(sinklib, name) for name in sinklib.__all__} | {"sinklib": sinklib})
