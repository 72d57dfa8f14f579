"""Translation: a parallel corpus, a shared subword vocabulary, the corpus's own splits.

    task = TranslationTask("bentrevett/multi30k", "de", "en", vocab_size=8000)

The corpus (:mod:`~annotated_transformer.data.corpus`) is read when first needed, and the
byte-pair vocabulary (:mod:`~annotated_transformer.data.subword`) is trained on both
sides of its training split: one vocabulary for both languages, so that the model can
tie its embeddings and generator three ways (section 3.4). A checkpoint saves the
vocabulary; a task rebuilt from a checkpoint takes it from there and reads no corpus
until pairs are asked for, so decoding needs only the checkpoint.

Training pairs with more than ``max_length`` tokens on either side are left out (a few
very long sentences would set the size of every batch); a longer held-out source is cut
to ``max_length`` tokens for the model, while its reference stays whole. Training draws
from the ``train`` split, evaluation during training from ``validation`` (or ``test``
when the corpus has no validation split).
"""

from __future__ import annotations

from functools import cached_property

import torch

from annotated_transformer.data.corpus import Corpus, load_corpus
from annotated_transformer.data.subword import SubwordVocabulary
from annotated_transformer.data.task import Pair, Task
from annotated_transformer.data.tsv import DataError
from annotated_transformer.data.vocab import BOS, EOS


class TranslationTask(Task):
    """Pairs ``(source_lang sentence, target_lang sentence)`` of ``dataset``."""

    name = "translation"

    def __init__(self, dataset: str, source_lang: str = "de", target_lang: str = "en",
                 dataset_config: str | None = None, vocab_size: int = 8000,
                 max_length: int = 256) -> None:
        if max_length < 1:
            raise DataError(f"max_length must be at least 1, got {max_length}")
        self.dataset, self.dataset_config = dataset, dataset_config
        self.source_lang, self.target_lang = source_lang, target_lang
        self.vocab_size, self.max_length = vocab_size, max_length

    def spec(self) -> dict:
        return {"task": self.name, "dataset": self.dataset,
                "dataset_config": self.dataset_config, "source_lang": self.source_lang,
                "target_lang": self.target_lang, "vocab_size": self.vocab_size,
                "max_length": self.max_length}

    @cached_property
    def corpus(self) -> Corpus:
        """Every split's pairs, as read (see :func:`load_corpus`)."""
        return load_corpus(self.dataset, self.source_lang, self.target_lang,
                           self.dataset_config)

    @cached_property
    def vocab(self) -> SubwordVocabulary:
        """A byte-level BPE vocabulary of ``vocab_size`` tokens trained on both sides of
        the training split (replaced by the saved one when rebuilt from a checkpoint)."""
        try:
            return SubwordVocabulary.train(
                [text for pair in self.corpus["train"] for text in pair], self.vocab_size)
        except ValueError as error:
            raise DataError(f"--vocab-size: {error}") from None

    def split(self, name: str) -> list[Pair]:
        """The pairs of split ``name`` (``train``, ``validation`` or ``test``), whole."""
        if name not in self.corpus:
            raise DataError(f"{self.dataset} has no {name} split (it has "
                            f"{', '.join(self.corpus)})")
        return self.corpus[name]

    @cached_property
    def _training(self) -> tuple[list[Pair], int, int]:
        """The training pairs within ``max_length`` tokens a side, and the longest source
        and target among them in tokens."""
        pairs = self.corpus["train"]
        sources = self.vocab.encode_batch([s for s, _ in pairs])
        targets = self.vocab.encode_batch([t for _, t in pairs])
        keep = [i for i in range(len(pairs))
                if len(sources[i]) <= self.max_length and len(targets[i]) <= self.max_length]
        if not keep:
            raise DataError(f"{self.dataset}: every training pair is longer than "
                            f"max_length={self.max_length} tokens")
        return ([pairs[i] for i in keep], max(len(sources[i]) for i in keep),
                max(len(targets[i]) for i in keep))

    @property
    def train_pairs(self) -> list[Pair]:
        return self._training[0]

    @property
    def held_out_split(self) -> str:
        return "validation" if "validation" in self.corpus else "test"

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        pool = self.split(self.held_out_split) if held_out else self.train_pairs
        return [pool[i] for i in torch.randint(len(pool), (count,), generator=generator).tolist()]

    def held_out_pairs(self, size: int, seed: int = 1234) -> list[Pair]:
        """The first ``size`` pairs of the validation split, in the corpus's order."""
        return list(self.split(self.held_out_split)[:size])

    def source_ids(self, source: str) -> list[int]:
        """``source``'s tokens (at most ``max_length``) and EOS."""
        return self.vocab.encode(source)[:self.max_length] + [EOS]

    def target_ids(self, target: str) -> list[int]:
        """BOS, ``target``'s tokens (at most ``max_length``), EOS."""
        return [BOS] + self.vocab.encode(target)[:self.max_length] + [EOS]

    @property
    def max_source_len(self) -> int:
        return self._training[1] + 1

    @property
    def max_target_len(self) -> int:
        return self._training[2] + 2
