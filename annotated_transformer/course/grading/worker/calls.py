"""Which functions of the chapter files a probe's code entered: observed in the worker.

A later exercise is blamed on an earlier one only when it actually called it
(:mod:`~annotated_transformer.course.grading.dependencies`). While a probe runs, the worker
notes every function of a chapter file that was entered (``sys.settrace``, call events only: a
frame's lines are never traced), and sends ``file:qualified name`` back with its reply
(``ch02_attention.py:scaled_dot_product_attention``); the trusted side maps those names to
exercises (:mod:`annotated_transformer.course.grading.worker.calls`). What the learner's code does
to this record can only add or remove a "fix ... first" hint, never a point.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from annotated_transformer.course.grading.protocol import Reply
from annotated_transformer.layout import CHAPTER_FILE


class Observed:
    """A context in which every code object entered is noted (this thread only)."""

    def __init__(self, active: bool = True, settrace: Callable[[Any], None] = sys.settrace
                 ) -> None:
        self.codes: set[CodeType] = set()
        self.active = active  # off for an exercise that builds on no other: nothing to blame
        self.settrace = settrace  # the worker's, which its audit hook lets through

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        self.codes.add(frame.f_code)  # the global tracer sees "call" events only
        return None  # no tracing inside the frame

    def __enter__(self) -> Observed:
        if self.active:
            self.previous = sys.gettrace()
            self.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            self.settrace(self.previous)

    def names(self) -> list[str]:
        """``file:qualified name`` of every function of a chapter file entered, at most the
        names one reply may carry."""
        found = {f"{Path(code.co_filename).name}:{code.co_qualname}" for code in self.codes
                 if CHAPTER_FILE.match(Path(code.co_filename).name)}
        return sorted(found)[:Reply.NAMES]
