"""Which exercises a probe's code called: observed in the worker, mapped on the trusted side.

A later exercise is blamed on an earlier one only when it actually called it
(:mod:`.dependencies`). While a probe runs, the worker notes every function of a chapter file
that was entered (``sys.settrace``, call events only: a frame's lines are never traced), and
sends ``file:qualified name`` back with its reply (``ch02_attention.py:scaled_dot_product_
attention``). The grader maps those names to the exercises of the graded test files by the
exercise's name (its title up to the colon); anything else the reply holds is ignored. What the
learner's code does to this record can only add or remove a "fix ... first" hint, never a point.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.layout import CHAPTER_FILE

LIMIT = 200  # names one reply may carry


class Observed:
    """A context in which every code object entered is noted (this thread only)."""

    def __init__(self, active: bool = True) -> None:
        self.codes: set[CodeType] = set()
        self.active = active  # off for an exercise that builds on no other: nothing to blame

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        self.codes.add(frame.f_code)  # the global tracer sees "call" events only
        return None  # no tracing inside the frame

    def __enter__(self) -> Observed:
        if self.active:
            self.previous = sys.gettrace()
            sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            sys.settrace(self.previous)

    def names(self) -> list[str]:
        """``file:qualified name`` of every function of a chapter file entered."""
        found = {f"{Path(code.co_filename).name}:{code.co_qualname}" for code in self.codes
                 if CHAPTER_FILE.match(Path(code.co_filename).name)}
        return sorted(found)[:LIMIT]


def exercises(names: Iterable[object], titles: dict[str, str]) -> set[str]:
    """The exercises of ``titles`` (``{"3.3": "MultiHeadAttention: ..."}``) whose code the
    observed ``names`` entered: a name of the exercise's chapter file whose qualified name
    starts with the exercise's own (``MultiHeadAttention.forward`` is 3.3's)."""
    by_name = {(ExerciseId(e).chapter, t.split(":")[0].strip()): e for e, t in titles.items()}
    found = set()
    for name in names:
        if not isinstance(name, str) or ":" not in name:
            continue
        file, qualified = name.split(":", 1)
        chapter = CHAPTER_FILE.match(file)
        if chapter is None:
            continue
        exercise = by_name.get((int(chapter[1]), qualified.split(".")[0]))
        if exercise is not None:
            found.add(exercise)
    return found
