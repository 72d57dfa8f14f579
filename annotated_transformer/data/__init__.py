"""Tasks: generated offline and deterministically from a seed, a user's file, or a corpus.

``make_task("dates")``, ``make_task("addition", max_digits=3)``,
``make_task("tsv", path="pairs.tsv")``, ``make_task("text", path="input.txt")``,
``make_task("translation", dataset="bentrevett/multi30k", source_lang="de",
target_lang="en")``: every task has the interface of :class:`Task`. Only the translation
task reads a corpus (from the Hugging Face hub or from local files).

One module a task: ``copy`` (and reverse), ``dates``, ``addition`` (decoder-only), ``tsv`` (a
user's file), ``text`` (a plain-text file for a character-level language model, Chapter
8), ``translation`` (with ``corpus``, the sentence pairs, and ``subword``, its BPE
vocabulary; ``optional`` imports their libraries when first needed); beside them ``task``
(the interface), ``vocab`` (characters and the special tokens) and ``batching`` (training
batches by a token budget).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from annotated_transformer.data.addition import AdditionTask
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.dates import DateTask
from annotated_transformer.data.subword import LEVEL as SUBWORD
from annotated_transformer.data.subword import SubwordVocabulary
from annotated_transformer.data.task import Task
from annotated_transformer.data.text import TINY_SHAKESPEARE, TextTask
from annotated_transformer.data.translation import TranslationTask
from annotated_transformer.data.tsv import DataError, TsvTask
from annotated_transformer.data.vocab import BOS, EOS, PAD, Vocabulary, VocabularyError


def _needs(option: str, message: str, make: Callable[..., Task]) -> Callable[..., Task]:
    """``make``, refusing with ``message`` a call without ``option``."""
    def checked(**options) -> Task:
        if not options.get(option):
            raise DataError(message)
        return make(**options)
    return checked


# The tasks by name, in the order the command line lists them: the one place a task is added
# (its default run, recipes.RECIPES[name], joins it: recipes.recipe_for).
REGISTRY: dict[str, Callable[..., Task]] = {
    "copy": CopyTask,
    "reverse": functools.partial(CopyTask, reverse=True),
    "dates": DateTask,
    "addition": AdditionTask,
    "tsv": _needs("path", "--task tsv needs its data file: --data FILE", TsvTask),
    "text": _needs("path", f"--task text needs its text file: --data FILE (the course's "
                   f"corpus: {TINY_SHAKESPEARE})", TextTask),
    "translation": _needs("dataset", "--task translation needs its corpus: --dataset "
                          "NAME_OR_PATH (a Hugging Face hub dataset, a .jsonl or .tsv file, "
                          "or a folder)", TranslationTask),
}
TASKS = tuple(REGISTRY)

__all__ = ["BOS", "EOS", "PAD", "REGISTRY", "TASKS", "AdditionTask", "CopyTask", "DataError",
           "DateTask", "Task", "TextTask", "TranslationTask", "TsvTask", "Vocabulary",
           "VocabularyError", "make_task", "vocabulary_from_dict"]


def make_task(task: str, **options) -> Task:
    """The task called ``task`` (one of :data:`TASKS`), with its options."""
    if task not in REGISTRY:
        raise DataError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    return REGISTRY[task](**options)


def vocabulary_from_dict(data: dict) -> Vocabulary | SubwordVocabulary:
    """A saved vocabulary (``to_dict``) back: a subword one when its ``level`` says so."""
    if data.get("level") == SUBWORD:
        return SubwordVocabulary.from_dict(data)
    return Vocabulary.from_dict(data)
