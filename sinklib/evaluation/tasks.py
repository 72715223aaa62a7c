"""Task registry: the zoo's arithmetic and GSM8K (a local JSONL, or the hub through `datasets`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sinklib._checks import check_choice
from sinklib.evaluation.extract import flexible_answer, normalise_number, strict_answer


@dataclass(frozen=True)
class Sample:
    id: str
    prompt: str
    target: str


@dataclass(frozen=True)
class Task:
    name: str
    load: Callable[..., list[Sample]]
    chat: bool  # whether prompts go through the model's chat template

    def score(self, output: str, sample: Sample) -> dict:
        strict, flexible = strict_answer(output), flexible_answer(output)
        return {"extracted_strict": strict, "extracted_flexible": flexible,
                "correct": strict == sample.target, "correct_flexible": flexible == sample.target}


def _arithmetic(path: str | None = None) -> list[Sample]:
    from sinklib.zoo import DATA_DIR

    file = Path(path) if path else DATA_DIR / "arithmetic_test.jsonl"
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    return [Sample(r["id"], r["question"], str(r["answer"])) for r in rows]


def _gsm8k(path: str | None = None) -> list[Sample]:
    """GSM8K test: from a local JSONL with `question` and `answer` fields (the official format), else the hub."""
    if path:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    else:
        import datasets

        rows = list(datasets.load_dataset("openai/gsm8k", "main", split="test"))
    samples = []
    for index, row in enumerate(rows):
        target = normalise_number(row["answer"].split("####")[-1])
        samples.append(Sample(str(row.get("id", f"gsm8k-{index:04d}")), row["question"], target or ""))
    return samples


_TASKS = {"arithmetic": Task("arithmetic", _arithmetic, chat=False), "gsm8k": Task("gsm8k", _gsm8k, chat=True)}


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    return _TASKS[check_choice(name, "task", task_names())]
