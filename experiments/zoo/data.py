"""A seeded generator of grade-school arithmetic word problems ("Q: … A: … #### N").

Several templates (add, subtract, multiply, two-person totals, two-step), distractor sentences (some
with numbers of their own) and varied lengths, so that some heads have nothing relevant to attend to.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from sinklib.validation import BadValue

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


# the sentences _distractor writes (never one of a template's own: those have, get, give, buy or hold)
_DISTRACTOR = re.compile(r"^(the sky is blue|it is a sunny day|\w+ likes \w+|\w+ is \d+ years old|\w+ lives on street \d+) \.$")


def story(question: str) -> tuple[str, ...]:
    """A question's story without its distractor sentences: its template's facts and question, names, items and
    numbers as written (two questions that differ only in their distractors have one story)."""
    body = question.removeprefix("Q: ").removesuffix(" A:")
    sentences = re.findall(r"[^.?]+[.?]", body)
    return tuple(s.strip() for s in sentences if not _DISTRACTOR.match(s.strip()))


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


_EQUATION = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")
_OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def work_is_sound(output: str) -> bool | None:
    """Whether a response in the generator's format ("a + b = c . c - d = e #### e") shows sound work: every
    equation before "####" is arithmetically right and the last one's result is the final answer. None when the
    output is not in that format (no "####", or a part that is not "a op b = c"): an answer can be scored right
    while its work is wrong ("17 + 4 = 11 #### 21"), and this says which."""
    if "####" not in output:
        return None
    work, final = output.split("####", 1)
    final_match = re.match(r"\s*(-?\d+)", final)
    parts = [part for part in work.strip().split(" . ") if part.strip()]
    equations = [_EQUATION.match(part) for part in parts]
    if final_match is None or not equations or any(e is None for e in equations):
        return None
    right = all(_OPERATIONS[e[2]](int(e[1]), int(e[3])) == int(e[4]) for e in equations)
    return right and int(equations[-1][4]) == int(final_match[1])


def held_out_by_work(seen_work: frozenset[str], n: int = 600, seed: int = 4321) -> list[Problem]:
    """The held-out split by arithmetic: n problems from their own seed, each with a work string (operation and
    operands, e.g. "7 + 9 = 16 . 16 - 3 = 13") that is in none of `seen_work` (what a model's training saw) and that
    no other problem of the split shares, and none of held_out()'s questions. In the generator's range every single
    operation's facts are soon all seen, so such a split is mostly two-step problems: say so wherever it is reported."""
    text_split = {p.question for p in held_out()}
    chosen: dict[str, Problem] = {}
    since_new = 0
    for problem in problems(seed, text_split):
        since_new += 1
        if problem.work not in seen_work and problem.work not in chosen:
            chosen[problem.work], since_new = problem, 0
            if len(chosen) == n:
                return list(chosen.values())
        if since_new > 50_000:  # the generator has about 6,900 work strings: the unseen ones are used up
            raise BadValue(f"n={n} is not allowed: only {len(chosen)} unseen work strings exist (none new in "
                           f"{since_new} draws)")
    raise AssertionError("unreachable")


def write_jsonl(items: list[Problem], path: Path, prefix: str = "arith") -> None:
    """Write the problems to `path` (parent folders made), one JSON object a line with an id "<prefix>-NNNN" by
    position."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for index, problem in enumerate(items):
            handle.write(json.dumps({"id": f"{prefix}-{index:04d}", **asdict(problem)}) + "\n")


def read_jsonl(path: Path) -> list[Problem]:
    """The problems of a JSONL file as write_jsonl writes it (ids and other extra keys ignored; blank lines skipped)."""
    with Path(path).open() as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Problem(r["question"], r["work"], r["answer"], r["template"]) for r in rows]
