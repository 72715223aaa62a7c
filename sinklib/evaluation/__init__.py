"""Evaluation: tasks, answer extraction and a resumable runner (reused by notebook 04 and Table 1)."""
from sinklib.evaluation.runner import EvalSummary, evaluate
from sinklib.evaluation.tasks import Sample, Task, get_task, task_names

__all__ = ["EvalSummary", "Sample", "Task", "evaluate", "get_task", "task_names"]
