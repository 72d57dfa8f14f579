"""The copy task (and its reverse): the target is the source, symbol for symbol.

Sequences of ``min_len..max_len`` random symbols. ``src [B, Ls]`` is the symbols
then EOS; ``tgt [B, Lt]`` is BOS, the symbols (reversed for ``reverse=True``),
EOS; both padded with ``PAD``. A fixed tenth of all sequences (chosen by a hash)
is held out: training batches never contain them, evaluation uses only them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3


@dataclass(frozen=True)
class CopyTask:
    """Copy (or reverse) sequences over ``vocab_size - 3`` symbols."""

    vocab_size: int = 13
    min_len: int = 4
    max_len: int = 10
    reverse: bool = False

    def __post_init__(self) -> None:
        if self.vocab_size <= NUM_SPECIAL:
            raise ValueError(f"vocab_size must exceed the {NUM_SPECIAL} special tokens, got "
                             f"{self.vocab_size}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")

    @staticmethod
    def is_held_out(symbols: list[int]) -> bool:
        """One sequence in ten, fixed by its content, is reserved for evaluation."""
        return zlib.crc32(bytes(symbols)) % 10 == 0

    def _sequences(self, count: int, generator: torch.Generator, held_out: bool) -> list[list[int]]:
        sequences: list[list[int]] = []
        while len(sequences) < count:
            length = int(torch.randint(self.min_len, self.max_len + 1, (), generator=generator))
            symbols = torch.randint(NUM_SPECIAL, self.vocab_size, (length,),
                                    generator=generator).tolist()
            if self.is_held_out(symbols) == held_out:
                sequences.append(symbols)
        return sequences

    def _pad(self, rows: list[list[int]]) -> Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)

    def sample(self, batch_size: int, generator: torch.Generator,
               held_out: bool = False) -> tuple[Tensor, Tensor]:
        """``(src [B, Ls], tgt [B, Lt])``, from the training or the held-out sequences."""
        sequences = self._sequences(batch_size, generator, held_out)
        src = self._pad([s + [EOS] for s in sequences])
        tgt = self._pad([[BOS] + (s[::-1] if self.reverse else s) + [EOS] for s in sequences])
        return src, tgt

    def held_out_set(self, size: int, seed: int = 1234) -> tuple[Tensor, Tensor]:
        """A fixed evaluation set of ``size`` held-out sequences."""
        return self.sample(size, torch.Generator().manual_seed(seed), held_out=True)
