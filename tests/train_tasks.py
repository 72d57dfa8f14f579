"""The tasks that the tests of ``train --compile`` train through the command line, and the
arguments that choose one (for the ``tsv`` task, a small corpus written for it)."""

from __future__ import annotations

from pathlib import Path

from annotated_transformer.data import TASKS

TRAINED_TASKS = sorted(set(TASKS) - {"translation"})  # translation: test_translation.py
WORDS = ["cat", "dog", "bird", "fish", "horse", "mouse", "sheep", "goat"]


def task_arguments(task: str, folder: Path) -> list[str]:
    """``train``'s ``--task TASK``; for ``tsv`` also ``--data`` naming a corpus written into
    ``folder``: each of ``WORDS`` with its reversal (``cat<TAB>tac``), four times over."""
    if task != "tsv":
        return ["--task", task]
    path = folder / "pairs.tsv"
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in WORDS * 4), encoding="utf-8")
    return ["--task", task, "--data", str(path)]
