"""A small corpus for the ``tsv`` task, for the tests that train from the command line."""

from __future__ import annotations

from pathlib import Path

WORDS = ["cat", "dog", "bird", "fish", "horse", "mouse", "sheep", "goat"]


def write_reversed_words(path: Path) -> Path:
    """Write ``WORDS`` four times over as ``word<TAB>drow`` lines (UTF-8); return ``path``."""
    path.write_text("".join(f"{w}\t{w[::-1]}\n" for w in WORDS * 4), encoding="utf-8")
    return path
