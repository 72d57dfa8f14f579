"""A subword vocabulary: byte-pair encoding (BPE) trained with Hugging Face ``tokenizers``.

Sennrich et al. (2016) split rare words into frequent pieces, so that a fixed vocabulary
of a few thousand tokens spells every word; the paper uses one such vocabulary of about
37,000 tokens shared by English and German (section 5.1), which lets one matrix serve as
both embeddings and the generator (section 3.4). This one works on bytes (byte-level
BPE): the 256 byte values are the first pieces, so any text is encoded without an
unknown token, and decoding gives back the exact text, spaces included.

Ids 0, 1, 2 are PAD, BOS, EOS, as in :class:`~annotated_transformer.data.vocab.Vocabulary`,
whose interface this has: ``encode(text) -> ids`` (no special tokens),
``decode(ids) -> text`` (stops at EOS), ``len``, ``to_dict``/``from_dict``. ``to_dict``
holds the tokenizer's own JSON, so a checkpoint needs nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cached_property

from annotated_transformer.data.optional import require
from annotated_transformer.data.vocab import BOS, EOS, PAD, SPECIALS

LEVEL = "bpe"  # a vocabulary's level: "char" and "word" (vocab.LEVELS), or this


class SubwordVocabulary:
    """A trained byte-level BPE tokenizer with the :class:`Vocabulary` interface."""

    level = LEVEL

    def __init__(self, tokenizer) -> None:
        ids = [tokenizer.token_to_id(t) for t in SPECIALS]
        if ids != [PAD, BOS, EOS]:
            raise ValueError(f"a subword vocabulary has {SPECIALS} as ids 0, 1, 2; got {ids}")
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2
              ) -> SubwordVocabulary:
        """BPE merges learnt from ``texts`` until ``vocab_size`` tokens (specials and the
        256 bytes included) or no pair occurs ``min_frequency`` times."""
        tokenizers = require("tokenizers")
        if vocab_size < len(SPECIALS) + 256:
            raise ValueError(f"a byte-level vocabulary has at least {len(SPECIALS) + 256} "
                             f"tokens (3 special, 256 bytes); got vocab_size={vocab_size}")
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
        tokenizer.normalizer = tokenizers.normalizers.NFC()
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False)
        texts = list(texts)
        tokenizer.train_from_iterator(_chunks(texts), trainer, length=len(texts))
        return cls(tokenizer)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (no special tokens)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of every text (in parallel threads)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: stops at the first EOS, skips PAD and BOS."""
        kept = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i not in (PAD, BOS):
                kept.append(i)
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    @cached_property
    def tokens(self) -> tuple[str, ...]:
        """The text of each id alone (a piece of a multi-byte character shows as U+FFFD)."""
        return SPECIALS + tuple(self.tokenizer.decode([i]) for i in range(len(SPECIALS),
                                                                           len(self)))

    def to_dict(self) -> dict:
        return {"level": LEVEL, "tokenizer": self.tokenizer.to_str()}

    @classmethod
    def from_dict(cls, data: dict) -> SubwordVocabulary:
        tokenizers = require("tokenizers")
        return cls(tokenizers.Tokenizer.from_str(data["tokenizer"]))


def _chunks(texts: list[str], size: int = 1000) -> Iterator[list[str]]:
    for start in range(0, len(texts), size):
        yield texts[start:start + size]
