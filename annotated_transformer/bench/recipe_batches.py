"""The CPU recipe's real batches: Multi30k cut by the recipe's budget of tokens a side
(``recipes.CPU_TRANSLATION.train.max_tokens``), with their padding.

``train --task translation --model cpu`` trains on :class:`~annotated_transformer.data.
batching.TokenBudgetStream` batches (sorted by source length within a pool, so the source
is padded little and the target more). The bench's recipe shape is those batches' lengths:
the first :data:`COUNT` of the stream (seed 0) are kept in ``multi30k_batches.json``,
written by :func:`save` from Multi30k's raw files, so that the bench needs no corpus;
``bench --recipe-shape --dataset DIR`` draws them from ``DIR`` instead.
"""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import torch
from torch import Tensor

from annotated_transformer.data.vocab import BOS, EOS, PAD
from annotated_transformer.recipes import CPU_TRANSLATION

FILE = Path(__file__).with_name("multi30k_batches.json")
COUNT = 32  # batches kept: their padding is the stream's (measured over 300)
MAX_TOKENS, VOCAB = CPU_TRANSLATION.train.max_tokens, CPU_TRANSLATION.vocab_size
SEED = 0

Lengths = tuple[list[int], list[int]]
"""One batch: each row's source length (EOS included) and target length (BOS and EOS)."""


def from_corpus(dataset: str, count: int = COUNT) -> list[Lengths]:
    """The lengths of the first ``count`` batches of the recipe's stream over ``dataset``
    (a Multi30k folder or any corpus ``train --dataset`` reads)."""
    from annotated_transformer.data.batching import TokenBudgetStream
    from annotated_transformer.data.translation import TranslationTask

    task = TranslationTask(dataset, "de", "en", vocab_size=VOCAB)
    return [((src != PAD).sum(1).tolist(), (tgt != PAD).sum(1).tolist())
            for src, tgt in islice(TokenBudgetStream(task, MAX_TOKENS, SEED), count)]


def save(dataset: str, path: Path = FILE, count: int = COUNT) -> None:
    """Write :func:`from_corpus`'s lengths to ``path`` (the committed file)."""
    batches = [{"src": s, "tgt": t} for s, t in from_corpus(dataset, count)]
    path.write_text(json.dumps({"dataset": "Multi30k (de-en), its raw training files",
                                "max_tokens": MAX_TOKENS, "vocab_size": VOCAB, "seed": SEED,
                                "batches": batches}, separators=(",", ":")) + "\n")


def load(path: Path = FILE) -> list[Lengths]:
    """The committed batches' lengths."""
    return [(b["src"], b["tgt"]) for b in json.loads(path.read_text())["batches"]]


def padding(batches: list[Lengths]) -> dict:
    """Tokens a step, real and padded: ``source`` (real, padded), ``target`` (scored
    labels, padded inputs), and their shares."""
    src_real = sum(sum(s) for s, _ in batches)
    src_padded = sum(len(s) * max(s) for s, _ in batches)
    scored = sum(sum(t) - len(t) for _, t in batches)  # the labels: the target less BOS
    tgt_padded = sum(len(t) * (max(t) - 1) for _, t in batches)
    n = len(batches)
    return {"batches": n, "rows": sum(len(s) for s, _ in batches) / n,
            "source_real": src_real / n, "source_padded": src_padded / n,
            "target_scored": scored / n, "target_padded": tgt_padded / n,
            "source_padding": 1 - src_real / src_padded,
            "target_padding": 1 - scored / tgt_padded}


def tokens(lengths: Lengths, vocab: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(src [B, Ls], tgt [B, Lt])`` of random tokens with these lengths: the source ends
    in EOS, the target is BOS ... EOS, PAD after."""
    src_lengths, tgt_lengths = lengths
    rows = len(src_lengths)
    src = torch.randint(3, vocab, (rows, max(src_lengths)), generator=generator)
    tgt = torch.randint(3, vocab, (rows, max(tgt_lengths)), generator=generator)
    tgt[:, 0] = BOS
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[i, s - 1], src[i, s:] = EOS, PAD
        tgt[i, t - 1], tgt[i, t:] = EOS, PAD
    return src, tgt
