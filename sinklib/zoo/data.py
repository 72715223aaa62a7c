"""A seeded generator of grade-school arithmetic word problems ("Q: … A: … #### N").

Several templates (add, subtract, multiply, two-person totals, two-step), distractor sentences (some
with numbers of their own) and varied lengths, so that some heads have nothing relevant to attend to.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

NAMES = ["tom", "ana", "li", "sam", "maya", "omar", "eva", "raj", "zoe", "ben", "kim", "leo"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "stamps", "shells", "marbles"]
MAX_NUMBER = 200  # every number token the data can produce is below this


@dataclass(frozen=True)
class Problem:
    """One arithmetic word problem: the prompt, its worked answer, the integer answer and the template that made it
    ("add", "subtract", "multiply", "together" or "two_step")."""
    question: str  # "Q: … A:" — the prompt
    work: str  # the worked answer, e.g. "5 + 3 = 8"
    answer: int
    template: str

    @property
    def response(self) -> str:
        """The target answer text: the worked answer then "#### N"."""
        return f"{self.work} #### {self.answer}"

    @property
    def text(self) -> str:
        """The whole training text: the question followed by its response."""
        return f"{self.question} {self.response}"


def _distractor(rng: random.Random, avoid: set[str]) -> str:
    other = rng.choice([n for n in NAMES if n not in avoid])
    return rng.choice([
        "the sky is blue .",
        "it is a sunny day .",
        f"{other} likes {rng.choice(ITEMS)} .",
        f"{other} is {rng.randint(5, 90)} years old .",
        f"{other} lives on street {rng.randint(1, 99)} .",
    ])


def _core(rng: random.Random) -> tuple[list[str], str, str, int, set[str]]:
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.choice(["add", "subtract", "multiply", "together", "two_step"])
    if kind == "add":
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return [f"{name} has {a} {item} .", f"{name} gets {b} more {item} .", f"how many {item} does {name} have now ?"], \
            f"{a} + {b} = {a + b}", kind, a + b, {name}
    if kind == "subtract":
        a = rng.randint(2, 30)
        b = rng.randint(1, a)
        return [f"{name} has {a} {item} .", f"{name} gives away {b} {item} .", f"how many {item} does {name} have left ?"], \
            f"{a} - {b} = {a - b}", kind, a - b, {name}
    if kind == "multiply":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return [f"{name} buys {a} boxes .", f"each box holds {b} {item} .", f"how many {item} does {name} buy ?"], \
            f"{a} * {b} = {a * b}", kind, a * b, {name}
    if kind == "together":
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return [f"{name} has {a} {item} .", f"{other} has {b} {item} .",
                f"how many {item} do {name} and {other} have together ?"], \
            f"{a} + {b} = {a + b}", kind, a + b, {name, other}
    a, b = rng.randint(1, 20), rng.randint(1, 15)
    c = rng.randint(1, a + b)
    return [f"{name} has {a} {item} .", f"{name} buys {b} more and then gives away {c} .",
            f"how many {item} does {name} have ?"], \
        f"{a} + {b} = {a + b} . {a + b} - {c} = {a + b - c}", kind, a + b - c, {name}


def make_problem(rng: random.Random) -> Problem:
    """One problem drawn from `rng`: a random template, with zero to three distractor sentences inserted among its facts."""
    sentences, work, kind, answer, used = _core(rng)
    question, facts = sentences[-1], sentences[:-1]
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        facts.insert(rng.randint(0, len(facts)), _distractor(rng, used))
    return Problem("Q: " + " ".join(facts + [question]) + " A:", work, answer, kind)


def problems(seed: int, exclude: set[str] = frozenset()) -> Iterator[Problem]:
    """An endless, seeded stream of problems whose question is not in `exclude`."""
    rng = random.Random(seed)
    while True:
        problem = make_problem(rng)
        if problem.question not in exclude:
            yield problem


def held_out(n: int = 600, seed: int = 1234) -> list[Problem]:
    """The held-out test set: n distinct questions from their own seed (training excludes them)."""
    seen: dict[str, Problem] = {}
    for problem in problems(seed):
        seen.setdefault(problem.question, problem)
        if len(seen) == n:
            return list(seen.values())
    raise AssertionError("unreachable")


def write_jsonl(items: list[Problem], path: Path) -> None:
    """Write the problems to `path` (parent folders made), one JSON object a line with an id "arith-NNNN" by position."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for index, problem in enumerate(items):
            handle.write(json.dumps({"id": f"arith-{index:04d}", **asdict(problem)}) + "\n")


def read_jsonl(path: Path) -> list[Problem]:
    """The problems of a JSONL file as write_jsonl writes it (ids and other extra keys ignored; blank lines skipped)."""
    with Path(path).open() as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Problem(r["question"], r["work"], r["answer"], r["template"]) for r in rows]
