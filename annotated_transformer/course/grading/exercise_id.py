"""An exercise's id, read once: :class:`ExerciseId`."""

from __future__ import annotations

import re

_FORM = re.compile(r"(\d+)\.(\d+)", re.ASCII)


class ExerciseId(str):
    """An exercise's id, ``"5.3"``: chapter 5's third exercise. It is the text it was made
    from (a key of JSON and of dicts, as written); :attr:`chapter` and :attr:`order` read
    it. Anything but ``CHAPTER.NUMBER`` is a ``ValueError``."""

    __slots__ = ()

    def __new__(cls, text: str) -> ExerciseId:
        if isinstance(text, ExerciseId):
            return text
        if not isinstance(text, str) or not _FORM.fullmatch(text):
            raise ValueError(f"an exercise is written CHAPTER.NUMBER, such as 5.3; got {text!r}")
        return super().__new__(cls, text)

    @property
    def chapter(self) -> int:
        return self.order[0]

    @property
    def order(self) -> tuple[int, int]:
        """``(chapter, number)``, its place in the course: ``5.10`` comes after ``5.9``."""
        chapter, number = self.split(".")
        return int(chapter), int(number)


def order(exercise: str) -> tuple[int, int]:
    """The sort key of an exercise's id given as text."""
    return ExerciseId(exercise).order
