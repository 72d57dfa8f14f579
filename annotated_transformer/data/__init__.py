"""Tasks: generated offline and deterministically from a seed, a user's file, or a corpus.

``make_task("dates")``, ``make_task("addition", max_digits=3)``,
``make_task("tsv", path="pairs.tsv")``,
``make_task("translation", dataset="bentrevett/multi30k", source_lang="de",
target_lang="en")``: every task has the interface of :class:`Task`. Only the translation
task reads a corpus (from the Hugging Face hub or from local files).

One module a task: ``copy`` (and reverse), ``dates``, ``addition`` (decoder-only), ``tsv`` (a
user's file), ``translation`` (with ``corpus``, the sentence pairs, and ``subword``, its BPE
vocabulary; ``optional`` imports their libraries when first needed); beside them ``task``
(the interface), ``vocab`` (characters and the special tokens) and ``batching`` (training
batches by a token budget).
"""

from __future__ import annotations

from annotated_transformer.data.addition import AdditionTask
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.dates import DateTask
from annotated_transformer.data.subword import LEVEL as SUBWORD
from annotated_transformer.data.subword import SubwordVocabulary
from annotated_transformer.data.task import Task
from annotated_transformer.data.translation import TranslationTask
from annotated_transformer.data.tsv import DataError, TsvTask
from annotated_transformer.data.vocab import BOS, EOS, PAD, Vocabulary, VocabularyError

TASKS = ("copy", "reverse", "dates", "addition", "tsv", "translation")

__all__ = ["BOS", "EOS", "PAD", "TASKS", "AdditionTask", "CopyTask", "DataError", "DateTask",
           "Task", "TranslationTask", "TsvTask", "Vocabulary", "VocabularyError", "make_task",
           "vocabulary_from_dict"]


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
    if task == "translation":
        if not options.get("dataset"):
            raise DataError("--task translation needs its corpus: --dataset NAME_OR_PATH "
                            "(a Hugging Face hub dataset, a .jsonl or .tsv file, or a folder)")
        return TranslationTask(**options)
    raise DataError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def vocabulary_from_dict(data: dict) -> Vocabulary | SubwordVocabulary:
    """A saved vocabulary (``to_dict``) back: a subword one when its ``level`` says so."""
    if data.get("level") == SUBWORD:
        return SubwordVocabulary.from_dict(data)
    return Vocabulary.from_dict(data)
