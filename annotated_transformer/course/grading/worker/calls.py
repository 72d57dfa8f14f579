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
from pathlib import Path
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any

from annotated_transformer.course.grading.protocol import Reply
from annotated_transformer.layout import CHAPTER_FILE


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
        """``file:qualified name`` of every function of a chapter file entered, at most the
        names one reply may carry. A class or function that its chapter module binds to
        another name as well (``LayerNorm = MyNorm``) is named by each: ``MyNorm.forward``
        is also ``LayerNorm.forward``, the name the parts know it by."""
        bound = bound_names()
        found = set()
        for code in self.codes:
            file, qualified = Path(code.co_filename).name, code.co_qualname
            if CHAPTER_FILE.match(file):
                found.add(f"{file}:{qualified}")
                for (where, own), names in bound.items():
                    if where == file and (qualified + ".").startswith(own + "."):
                        found |= {f"{file}:{name}{qualified[len(own):]}" for name in names}
        return sorted(found)[:Reply.NAMES]


def bound_names() -> dict[tuple[str, str], set[str]]:
    """``{(chapter file, the qualified name of a class or function defined there): the
    names its loaded chapter modules bind it to}``, read from the modules' namespaces
    without running any code of theirs (types and functions only, their names read through
    the types' own descriptors)."""
    bound: dict[tuple[str, str], set[str]] = {}
    for module in list(sys.modules.values()):
        if type(module) is not ModuleType:
            continue
        namespace = vars(ModuleType)["__dict__"].__get__(module)
        path = namespace.get("__file__")
        if type(path) is not str or not CHAPTER_FILE.match(Path(path).name):
            continue
        for name, value in list(namespace.items()):
            if type(name) is str and (type(value) is type or type(value) is FunctionType):
                own = (vars(type)["__qualname__"].__get__(value) if type(value) is type
                       else vars(FunctionType)["__qualname__"].__get__(value))
                if own != name:
                    bound.setdefault((Path(path).name, own), set()).add(name)
    return bound
