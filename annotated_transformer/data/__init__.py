"""Tasks, generated offline and deterministically from a seed: nothing is downloaded.

``make_task("dates")``, ``make_task("addition", max_digits=3)``,
``make_task("tsv", path="pairs.tsv")``: every task has the interface of :class:`Task`.
"""

from __future__ import annotations

from annotated_transformer.data.addition import AdditionTask
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.dates import DateTask
from annotated_transformer.data.task import Task
from annotated_transformer.data.tsv import DataError, TsvTask
from annotated_transformer.data.vocab import BOS, EOS, PAD, Vocabulary, VocabularyError

TASKS = ("copy", "reverse", "dates", "addition", "tsv")

__all__ = ["BOS", "EOS", "PAD", "TASKS", "AdditionTask", "CopyTask", "DataError", "DateTask",
           "Task", "TsvTask", "Vocabulary", "VocabularyError", "make_task"]


def make_task(task: str, **options) -> Task:
    """The task called ``task`` (one of :data:`TASKS`), with its options."""
    if task in ("copy", "reverse"):
        return CopyTask(reverse=task == "reverse", **options)
    if task == "dates":
        return DateTask(**options)
    if task == "addition":
        return AdditionTask(**options)
    if task == "tsv":
        if not options.get("path"):
            raise DataError("--task tsv needs its data file: --data FILE")
        return TsvTask(**options)
    raise DataError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
