"""The ``--parts`` language, parsed in one place: where chapter files come from.

A *source* is one word of ``--parts``, with one meaning wherever it is used (``train``,
``evaluate``, ``bench``, ``grade``, ``regrade``, the graded tests, the parts registry):

- ``solutions``: the reference (``solutions/``; in a student release, which has none, the
  learner's ``exercises/`` instead);
- ``exercises``: the learner's own files (``exercises/``);
- ``fast``: the reference on PyTorch's fused kernels (the package
  :mod:`annotated_transformer.fast_parts`), never a folder named ``fast``;
- ``variants``: every wrong and right variant of the graded tests (``tests/variants/``),
  for the course's own check of its tests: the graded tests only;
- ``variant:NAME``: one of those variants (what a graded test runs on in that check);
- anything else: a folder of ``chNN_*.py`` files (a submission elsewhere, fresh stubs). A
  folder whose name is one of the words above is written with its path: ``./fast``.

The grader and the graded tests take a comma list (``solutions,../alice/exercises``), each
graded on its own: :func:`parse_sources`. The model commands take one: :meth:`Source.parse`.
What a source means to the grader (whose code it is, which folder it grades) is the
grader's: :mod:`annotated_transformer.course.grading.runspec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from annotated_transformer.layout import PARTS_PACKAGES

WORDS = ("solutions", "exercises", *PARTS_PACKAGES, "variants")  # any other is a folder
VARIANT = "variant:"  # the prefix of one variant's name


class Word(str, Enum):
    """What a source is: a word of :data:`WORDS`, a folder, or one variant. Equal to its
    text, and hashed as its text, so a table keyed by the words finds it."""

    SOLUTIONS = "solutions"
    EXERCISES = "exercises"
    FAST = "fast"
    VARIANTS = "variants"
    FOLDER = "folder"
    VARIANT = "variant"

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True)
class Source:
    """One source: ``word`` is one of :data:`WORDS`, ``"folder"`` with ``folder`` set
    (resolved), or ``"variant"`` with ``variant`` its name."""

    word: Word
    folder: Path | None = None
    variant: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "word", Word(self.word))  # a ValueError for another word

    @classmethod
    def of_variant(cls, name: str) -> Source:
        """The source of one variant of the graded tests (``tests/variants``)."""
        if not name.isidentifier():
            raise ValueError(f"a variant's name is a Python name, got {name!r}")
        return cls(Word.VARIANT, variant=name)

    @classmethod
    def parse(cls, text: str) -> Source:
        """The source ``text`` names; a ``ValueError`` naming what was wrong otherwise (a
        folder that does not exist, an empty word)."""
        text = text.strip()
        if text in WORDS:
            return cls(Word(text))
        if text.startswith(VARIANT):
            return cls.of_variant(text.removeprefix(VARIANT))
        if not text:
            raise ValueError("a parts source is empty (write solutions, exercises, fast, "
                             "variants or a folder)")
        path = Path(text).expanduser()
        if not path.is_dir():
            raise ValueError(
                f"a parts source is 'solutions', 'exercises', 'fast', 'variants' or a folder "
                f"of chNN_*.py files; got {text!r}, which is none of them")
        return cls(Word.FOLDER, path.resolve())

    def __str__(self) -> str:
        """The word again, a folder as its absolute path: parsed again, the same source."""
        if self.variant is not None:
            return f"{VARIANT}{self.variant}"
        return str(self.folder) if self.folder is not None else self.word.value

    @property
    def label(self) -> str:
        """A short name for a test's id: the word, a folder's name, a variant's text."""
        return self.folder.name if self.folder is not None else str(self)


def parse_sources(text: str) -> tuple[Source, ...]:
    """The sources of a comma list (``solutions,exercises``), in order, each once."""
    found: list[Source] = []
    for word in text.split(","):
        source = Source.parse(word)
        if source not in found:
            found.append(source)
    return tuple(found)

