"""A vocabulary: the tokens of a task's text, with the three special tokens first.

``PAD = 0`` (padding), ``BOS = 1`` (begin a target), ``EOS = 2`` (end a sequence).
A character vocabulary splits text into characters and joins them with ``""``; a word
vocabulary splits on whitespace and joins with ``" "``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
LEVELS = ("char", "word")


class VocabularyError(ValueError):
    """Text with a token the vocabulary does not know."""


@dataclass(frozen=True)
class Vocabulary:
    """``tokens[i]`` is the text of id ``i``; ids 0, 1, 2 are PAD, BOS, EOS."""

    tokens: tuple[str, ...]
    level: str = "char"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        if tuple(self.tokens[:3]) != SPECIALS:
            raise ValueError(f"a vocabulary starts with {SPECIALS}, got {self.tokens[:3]}")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("a vocabulary's tokens must be distinct")
        object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.tokens)})

    @classmethod
    def build(cls, texts: Iterable[str], level: str = "char") -> Vocabulary:
        """Every token that occurs in ``texts``, sorted, after the special tokens."""
        seen: set[str] = set()
        for text in texts:
            seen.update(cls.split_text(text, level))
        return cls(SPECIALS + tuple(sorted(seen)), level)

    @staticmethod
    def split_text(text: str, level: str) -> list[str]:
        return list(text) if level == "char" else text.split()

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        """The id of padding (``PAD``): the id a loss ignores and a mask hides."""
        return PAD

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens); unknown tokens raise VocabularyError."""
        pieces = self.split_text(text, self.level)
        unknown = sorted({p for p in pieces if p not in self._ids})
        if unknown:
            raise VocabularyError(
                f"{text!r} has {'characters' if self.level == 'char' else 'words'} outside the "
                f"vocabulary: {', '.join(map(repr, unknown))}")
        return [self._ids[p] for p in pieces]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: stops at the first EOS, skips PAD and BOS."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i not in (PAD, BOS):
                pieces.append(self.tokens[i])
        return ("" if self.level == "char" else " ").join(pieces)

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "level": self.level}

    @classmethod
    def from_dict(cls, data: dict) -> Vocabulary:
        return cls(tuple(data["tokens"]), data["level"])
