"""Batches by a token budget, as the paper trains: "sentence pairs were batched together by
approximate sequence length. Each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens" (section 5.1).

A batch of rows padded to its longest costs ``rows x longest`` tokens of computation on
each side. Sorting examples by length before cutting them into batches keeps the
padding small, and a budget instead of a row count keeps every step's work about the
same: many short sequences or few long ones.

    batches = TokenBudgetStream(task, max_tokens=2000, seed=0)
    for src, tgt in batches: ...  # src [B, Ls], tgt [B, Lt], B * Ls <= 2000, B * Lt <= 2000
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from itertools import count

import torch
from torch import Tensor

from annotated_transformer.data.task import Pair, Task


def token_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int,
                  generator: torch.Generator) -> list[list[int]]:
    """The examples ``0 .. n-1`` grouped into batches of at most ``max_tokens`` padded
    tokens on each side.

    The examples are sorted by (source length, target length), equal lengths in random
    order; consecutive examples join a batch while ``rows x longest source`` and
    ``rows x longest target`` both stay within ``max_tokens``. Returns the batches (lists
    of indices) in random order: every index exactly once. ``ValueError`` when
    ``max_tokens`` is below 1 or an example alone is longer than it.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"src_lengths and tgt_lengths must have one entry per example; got "
                         f"{len(src_lengths)} and {len(tgt_lengths)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    longest = max([*src_lengths, *tgt_lengths], default=0)
    if longest > max_tokens:
        raise ValueError(f"max_tokens={max_tokens} is smaller than the longest example "
                         f"({longest} tokens)")
    shuffled = torch.randperm(len(src_lengths), generator=generator).tolist()
    order = sorted(shuffled, key=lambda i: (src_lengths[i], tgt_lengths[i]))  # stable
    batches: list[list[int]] = []
    batch: list[int] = []
    widest_src = widest_tgt = 0
    for i in order:
        s, t = max(widest_src, src_lengths[i]), max(widest_tgt, tgt_lengths[i])
        if batch and (len(batch) + 1) * max(s, t) > max_tokens:
            batches.append(batch)
            batch, s, t = [], src_lengths[i], tgt_lengths[i]
        batch.append(i)
        widest_src, widest_tgt = s, t
    if batch:
        batches.append(batch)
    return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]


class TokenBudgetStream:
    """An endless stream of training batches ``(src [B, Ls], tgt [B, Lt])`` of ``task``, each
    within a token budget.

    The examples come in pools of ``pool_size`` (default: about 64 batches of the longest
    examples) drawn from the task's training part; each pool is cut by
    :func:`token_batches`, so that every example of a pool is trained on once, and its
    batches come in random order. Pool ``k`` is drawn from a generator seeded by
    ``(seed, k)``: the same seed gives the same batches, and skipping the first ``n``
    batches resumes a run where it stopped.
    """

    def __init__(self, task: Task, max_tokens: int, seed: int = 0,
                 pool_size: int | None = None) -> None:
        longest = max(task.max_source_len, task.max_target_len)
        if max_tokens < longest:
            raise ValueError(f"max_tokens={max_tokens} is smaller than the task's longest "
                             f"sequence ({longest} tokens)")
        self.task, self.max_tokens, self.seed = task, max_tokens, seed
        self.pool_size = pool_size or max(1, 64 * max_tokens // longest)

    def generator(self, k: int) -> torch.Generator:
        """The generator of pool ``k``: it draws the pool, then orders its batches."""
        digest = hashlib.sha256(f"{self.seed}/{k}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        task = self.task
        for k in count():
            generator = self.generator(k)
            pairs: list[Pair] = task.pairs(self.pool_size, generator)
            src = [len(task.source_ids(s)) for s, _ in pairs]
            tgt = [len(task.target_ids(t)) for _, t in pairs]
            for batch in token_batches(src, tgt, self.max_tokens, generator):
                yield task.encode_pairs([pairs[i] for i in batch])
