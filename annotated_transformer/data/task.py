"""What every task provides: text pairs, a vocabulary, a held-out split, tensors.

A task makes ``(source, target)`` text pairs. Encoder-decoder tasks turn a pair into
``src = source + EOS`` and ``tgt = BOS + target + EOS``; decoder-only tasks (addition)
into a prompt ``BOS + source`` and an answer ``target + EOS``. Batches are padded with
``PAD`` on the right. A fixed part of the examples, chosen by their content, is held out:
training batches never contain them, evaluation uses only them.
"""

from __future__ import annotations

import zlib
from typing import ClassVar

import torch
from torch import Tensor

from annotated_transformer.data.vocab import BOS, EOS, PAD, Vocabulary

Pair = tuple[str, str]


def held_out_by_hash(key: str, one_in: int = 10) -> bool:
    """One key in ``one_in``, fixed by its content (CRC-32), is held out."""
    return zlib.crc32(key.encode("utf-8")) % one_in == 0


def pad_rows(rows: list[list[int]]) -> Tensor:
    """Rows of ids to ``[len(rows), longest]``, padded on the right with ``PAD``."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)


class Task:
    """The interface of every task (see the module docstring)."""

    name: ClassVar[str]
    decoder_only: ClassVar[bool] = False
    # Held-out outputs are decoded and compared with the targets (exact match); False for a
    # language model of text, scored by its held-out perplexity alone (data/text.py).
    judged_by_decoding: ClassVar[bool] = True
    vocab: Vocabulary

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        """``count`` random ``(source, target)`` pairs from the training or held-out part."""
        raise NotImplementedError

    def spec(self) -> dict:
        """What rebuilds this task: ``make_task(**task.spec())`` (saved with checkpoints)."""
        raise NotImplementedError

    @property
    def max_source_len(self) -> int:
        """The longest ``src`` (or prompt) in tokens, special tokens included."""
        raise NotImplementedError

    @property
    def max_target_len(self) -> int:
        """The longest ``tgt`` (BOS and EOS included) or answer (EOS included)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- tensors

    def source_ids(self, source: str) -> list[int]:
        """The ids the model reads for ``source``: ``source + EOS`` or ``BOS + source``."""
        ids = self.vocab.encode(source)
        return [BOS] + ids if self.decoder_only else ids + [EOS]

    def target_ids(self, target: str) -> list[int]:
        """``BOS + target + EOS`` (encoder-decoder) or ``target + EOS`` (decoder-only)."""
        ids = self.vocab.encode(target) + [EOS]
        return ids if self.decoder_only else [BOS] + ids

    def encode_pairs(self, pairs: list[Pair]) -> tuple[Tensor, Tensor]:
        """``(src [B, Ls], tgt [B, Lt])``, padded with ``PAD``."""
        return (pad_rows([self.source_ids(s) for s, _ in pairs]),
                pad_rows([self.target_ids(t) for _, t in pairs]))

    def sample(self, batch_size: int, generator: torch.Generator,
               held_out: bool = False) -> tuple[Tensor, Tensor]:
        """A random batch ``(src [B, Ls], tgt [B, Lt])`` from the training (or held-out) part."""
        return self.encode_pairs(self.pairs(batch_size, generator, held_out))

    def held_out_pairs(self, size: int, seed: int = 1234) -> list[Pair]:
        """A fixed evaluation set: ``size`` held-out pairs drawn with ``seed``."""
        return self.pairs(size, torch.Generator().manual_seed(seed), held_out=True)

    def held_out_set(self, size: int, seed: int = 1234) -> tuple[Tensor, Tensor]:
        """:meth:`held_out_pairs` as tensors."""
        return self.encode_pairs(self.held_out_pairs(size, seed))


def draw_pairs(draw, count: int, generator: torch.Generator, held_out: bool,
               key=lambda pair: pair[0]) -> list[Pair]:
    """Rejection sampling: ``draw(generator) -> pair`` until ``count`` pairs on the wanted side
    of the held-out split (decided by ``held_out_by_hash(key(pair))``)."""
    pairs: list[Pair] = []
    while len(pairs) < count:
        pair = draw(generator)
        if held_out_by_hash(key(pair)) == held_out:
            pairs.append(pair)
    return pairs


def randint(low: int, high: int, generator: torch.Generator) -> int:
    """A uniform integer in ``[low, high]`` (both included) from ``generator``."""
    return int(torch.randint(low, high + 1, (), generator=generator))
