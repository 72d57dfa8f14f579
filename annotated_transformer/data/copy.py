"""The copy task (and its reverse): the target is the source, symbol for symbol.

Sequences of ``min_len..max_len`` random symbols, written as characters (``0``-``9``,
then letters, for larger vocabularies). ``src [B, Ls]`` is the symbols then EOS;
``tgt [B, Lt]`` is BOS, the symbols (reversed for ``reverse=True``), EOS; both padded
with ``PAD``. A fixed tenth of all sequences (chosen by a hash) is held out: training
batches never contain them, evaluation uses only them.
"""

from __future__ import annotations

import string
import zlib
from dataclasses import dataclass, field

import torch

from annotated_transformer.data.task import Pair, Task, randint
from annotated_transformer.data.vocab import BOS, EOS, PAD, SPECIALS, Vocabulary

NUM_SPECIAL = len(SPECIALS)
SYMBOLS = string.digits + string.ascii_lowercase
__all__ = ["BOS", "EOS", "PAD", "NUM_SPECIAL", "CopyTask"]


@dataclass(frozen=True)
class CopyTask(Task):
    """Copy (or reverse) sequences over ``vocab_size - 3`` symbols."""

    vocab_size: int = 13
    min_len: int = 4
    max_len: int = 10
    reverse: bool = False
    vocab: Vocabulary = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not NUM_SPECIAL < self.vocab_size <= NUM_SPECIAL + len(SYMBOLS):
            raise ValueError(f"vocab_size must exceed the {NUM_SPECIAL} special tokens and be at "
                             f"most {NUM_SPECIAL + len(SYMBOLS)}, got {self.vocab_size}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        symbols = tuple(SYMBOLS[: self.vocab_size - NUM_SPECIAL])
        object.__setattr__(self, "vocab", Vocabulary(SPECIALS + symbols))

    @property
    def name(self) -> str:  # type: ignore[override]
        return "reverse" if self.reverse else "copy"

    @staticmethod
    def is_held_out(symbols: list[int]) -> bool:
        """One sequence in ten, fixed by its content, is reserved for evaluation."""
        return zlib.crc32(bytes(symbols)) % 10 == 0

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        pairs: list[Pair] = []
        while len(pairs) < count:
            length = randint(self.min_len, self.max_len, generator)
            symbols = torch.randint(NUM_SPECIAL, self.vocab_size, (length,),
                                    generator=generator).tolist()
            if self.is_held_out(symbols) == held_out:
                text = self.vocab.decode(symbols)
                pairs.append((text, text[::-1] if self.reverse else text))
        return pairs

    def spec(self) -> dict:
        return {"task": self.name, "vocab_size": self.vocab_size, "min_len": self.min_len,
                "max_len": self.max_len}

    @property
    def max_source_len(self) -> int:
        return self.max_len + 1

    @property
    def max_target_len(self) -> int:
        return self.max_len + 2
