"""A plain-text file as a character-level language model's corpus (Chapter 8).

Every character of the file is a token (the vocabulary: the file's characters, sorted,
after ``PAD``, ``BOS`` and ``EOS``). The split is by position, fixed: the first
``1 - held_out`` of the characters are for training, the rest is held out, so no
character is in both parts. An example is a window of ``context`` consecutive characters:
the prompt is ``BOS`` alone and the answer is the window with no ``EOS`` (a window stops
mid-text, the text does not end there), so the decoder-only model reads ``BOS c_1 ...
c_{C-1}`` and every one of the ``C`` characters is scored, each from the ones before it
in its window. Training windows start anywhere in the training part; the held-out set is
the held-out part cut into windows one after another (:meth:`TextTask.held_out_set`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from annotated_transformer.data.task import Pair, Task
from annotated_transformer.data.tsv import DataError
from annotated_transformer.data.vocab import BOS, Vocabulary

TINY_SHAKESPEARE = "chapters/data/tiny-shakespeare/input.txt"  # in the course's repository


def read_text(path: str | Path) -> str:
    """The text of ``path`` (UTF-8); :class:`DataError` naming the file when it is missing,
    not text or empty."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not text:
        raise DataError(f"{path}: the file is empty")
    return text


@dataclass(frozen=True)
class TextTask(Task):
    """Windows of ``context`` characters of the text of ``path`` (see the module).

    ``text`` is the file's text, ``ids [N]`` the same as token ids; ``split`` is the index
    of its first held-out character. :class:`DataError` when either part is no longer
    than one window."""

    path: str
    context: int = 64
    held_out: float = 0.1
    name = "text"
    decoder_only = True
    judged_by_decoding = False  # scored by perplexity (every character), not exact match
    vocab: Vocabulary = field(init=False, repr=False, compare=False)
    text: str = field(init=False, repr=False, compare=False)
    split: int = field(init=False, repr=False, compare=False)
    _encoded: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.context < 2:
            raise DataError(f"context must be at least 2 characters, got {self.context}")
        if not 0.0 < self.held_out < 1.0:
            raise DataError(f"held_out must be a share in (0, 1), got {self.held_out}")
        text = read_text(self.path)
        split = round(len(text) * (1.0 - self.held_out))
        if min(split, len(text) - split) <= self.context:
            raise DataError(f"{self.path}: {len(text)} characters are too few for windows of "
                            f"{self.context} in both parts (training {split}, held out "
                            f"{len(text) - split}); give a longer text or a shorter context")
        object.__setattr__(self, "vocab", Vocabulary.build([text], "char"))
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "split", split)

    @property
    def ids(self) -> Tensor:
        """The whole text as ids ``[N]`` in the task's vocabulary (encoded again when a
        checkpoint's vocabulary replaces it; ``VocabularyError`` for a character it lacks)."""
        if self._encoded.get("vocab") is not self.vocab:
            self._encoded.update(vocab=self.vocab, ids=torch.tensor(
                self.vocab.encode(self.text), dtype=torch.long))
        return self._encoded["ids"]

    # ---------------------------------------------------------------- the two parts

    def part(self, held_out: bool) -> Tensor:
        """The token ids of the training part ``[split]`` or of the held-out part."""
        return self.ids[self.split:] if held_out else self.ids[:self.split]

    def windows(self, count: int, generator: torch.Generator, held_out: bool = False
                ) -> Tensor:
        """``count`` windows ``[count, context]`` starting at random places of one part."""
        part = self.part(held_out)
        starts = torch.randint(len(part) - self.context + 1, (count,), generator=generator)
        return part[starts[:, None] + torch.arange(self.context)]

    def as_example(self, windows: Tensor) -> tuple[Tensor, Tensor]:
        """Windows ``[B, C]`` as ``(src, tgt)``: the prompt ``BOS`` ``[B, 1]`` and the
        window as the answer (no EOS)."""
        return torch.full((windows.size(0), 1), BOS, dtype=torch.long), windows

    def sample(self, batch_size: int, generator: torch.Generator,
               held_out: bool = False) -> tuple[Tensor, Tensor]:
        return self.as_example(self.windows(batch_size, generator, held_out))

    def held_out_set(self, size: int, seed: int = 1234) -> tuple[Tensor, Tensor]:
        """The first ``size`` windows of the held-out part, one after another (every one
        when there are fewer): the same at every call, whatever ``seed``."""
        part = self.part(held_out=True)
        count = min(size, len(part) // self.context)
        return self.as_example(part[:count * self.context].view(count, self.context))

    # ---------------------------------------------------------------- as text pairs

    def target_ids(self, target: str) -> list[int]:
        """A window's ids: no EOS, the text goes on."""
        return self.vocab.encode(target)

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        """``("", window)`` text pairs (for batches by token budget)."""
        return [("", self.vocab.decode(w)) for w in self.windows(count, generator, held_out)
                .tolist()]

    def held_out_pairs(self, size: int, seed: int = 1234) -> list[Pair]:
        return [("", self.vocab.decode(w)) for w in self.held_out_set(size)[1].tolist()]

    def spec(self) -> dict:
        return {"task": self.name, "path": str(self.path), "context": self.context,
                "held_out": self.held_out}

    @property
    def max_source_len(self) -> int:
        return 1  # BOS

    @property
    def max_target_len(self) -> int:
        return self.context
