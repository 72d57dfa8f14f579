"""The tasks that the tests of ``train --compile`` train through the command line, and the
arguments that choose one (for the ``tsv`` and ``text`` tasks, a small corpus written for
it)."""

from __future__ import annotations

from pathlib import Path

from annotated_transformer.data import TASKS
from annotated_transformer.data.text import TINY_SHAKESPEARE

TRAINED_TASKS = sorted(set(TASKS) - {"translation"})  # translation: test_translation.py
WORDS = ["cat", "dog", "bird", "fish", "horse", "mouse", "sheep", "goat"]


def task_arguments(task: str, folder: Path) -> list[str]:
    """``train``'s ``--task TASK``; for ``tsv`` also ``--data`` naming a corpus written into
    ``folder``: each of ``WORDS`` with its reversal (``cat<TAB>tac``), four times over; for
    ``text``, ``--data`` naming the first 20,000 characters of Tiny Shakespeare."""
    if task == "text":
        path = folder / "text.txt"
        corpus = Path(__file__).resolve().parents[1] / TINY_SHAKESPEARE
        path.write_text(corpus.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
        return ["--task", task, "--data", str(path)]
    if task != "tsv":
        return ["--task", task]
    path = folder / "pairs.tsv"
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in WORDS * 4), encoding="utf-8")
    return ["--task", task, "--data", str(path)]
