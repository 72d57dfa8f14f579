"""A user's own parallel text: one ``source<TAB>target`` pair per line.

The vocabulary (characters or whitespace-separated words) is built from the file and
saved with the checkpoint. A tenth of the lines, chosen by a hash of the source, is held
out (at least one, when the file has two pairs or more). Malformed files are refused with
the line number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from annotated_transformer.data.task import Pair, Task, held_out_by_hash
from annotated_transformer.data.vocab import LEVELS, Vocabulary


class DataError(ValueError):
    """A data file that cannot be used, with the reason (and the line)."""


def read_pairs(path: str | Path) -> list[Pair]:
    """The ``(source, target)`` pairs of a TSV file; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip(" \r"):
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}, line {number}: expected 'source<TAB>target' (one tab), "
                            f"found {len(fields) - 1} tabs: {line[:60]!r}")
        source, target = (f.strip() for f in fields)
        if not source or not target:
            raise DataError(f"{path}, line {number}: the "
                            f"{'source' if not source else 'target'} is empty")
        pairs.append((source, target))
    if not pairs:
        raise DataError(f"{path}: the file has no 'source<TAB>target' lines")
    return pairs


@dataclass(frozen=True)
class TsvTask(Task):
    """Pairs from ``path``; ``level`` is ``"char"`` or ``"word"``."""

    path: str
    level: str = "char"
    name = "tsv"
    vocab: Vocabulary = field(init=False, repr=False, compare=False)
    train_pairs: tuple[Pair, ...] = field(init=False, repr=False, compare=False)
    test_pairs: tuple[Pair, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise DataError(f"level must be one of {LEVELS}, got {self.level!r}")
        pairs = read_pairs(self.path)
        test = [p for p in pairs if held_out_by_hash(p[0])]
        if not test and len(pairs) > 1:
            test = [pairs[-1]]
        train = [p for p in pairs if p not in test] or pairs
        texts = [text for pair in pairs for text in pair]
        object.__setattr__(self, "vocab", Vocabulary.build(texts, self.level))
        object.__setattr__(self, "train_pairs", tuple(train))
        object.__setattr__(self, "test_pairs", tuple(test or pairs))

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        pool = self.test_pairs if held_out else self.train_pairs
        return [pool[i] for i in torch.randint(len(pool), (count,), generator=generator).tolist()]

    def held_out_pairs(self, size: int, seed: int = 1234) -> list[Pair]:
        """The first ``size`` held-out pairs, in file order."""
        return list(self.test_pairs[:size])

    def spec(self) -> dict:
        return {"task": self.name, "path": str(self.path), "level": self.level}

    def _longest(self, side: int) -> int:
        return max(len(Vocabulary.split_text(p[side], self.level))
                   for p in self.train_pairs + self.test_pairs)

    @property
    def max_source_len(self) -> int:
        return self._longest(0) + 1

    @property
    def max_target_len(self) -> int:
        return self._longest(1) + 2
