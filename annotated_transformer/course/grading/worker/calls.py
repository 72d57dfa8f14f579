"""Which functions of the chapter files a probe's code entered: observed in the worker.

A later exercise is blamed on an earlier one only when it actually called it
(:mod:`~annotated_transformer.course.grading.dependencies`). While a probe runs, the worker
notes every function of a chapter file that was entered (``sys.settrace``, call events only: a
frame's lines are never traced), and sends ``file:qualified name`` back with its reply
(``ch02_attention.py:scaled_dot_product_attention``); the trusted side maps those names to
exercises (``dependencies.Declared.called``). What the learner's code does
to this record can only add or remove a "fix ... first" hint, never a point.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any

from annotated_transformer.course.grading.protocol import Reply
from annotated_transformer.layout import CHAPTER_FILE


class Observed:
    """A context in which every code object entered is noted (this thread only), and for a
    method of a chapter file, the class of the object it was called on."""

    def __init__(self, active: bool = True, settrace: Callable[[Any], None] = sys.settrace
                 ) -> None:
        self.codes: set[CodeType] = set()
        self.methods: set[CodeType] = set()  # of the codes, a chapter file's with a ``self``
        self.receivers: set[tuple[CodeType, type]] = set()
        self.active = active  # off for an exercise that builds on no other: nothing to blame
        self.settrace = settrace  # the worker's, which its audit hook lets through

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code  # the global tracer sees "call" events only
        if code not in self.codes:
            self.codes.add(code)
            if (code.co_argcount and code.co_varnames[0] == "self"
                    and CHAPTER_FILE.match(Path(code.co_filename).name)):
                self.methods.add(code)
        if code in self.methods:
            self.receivers.add((code, type(frame.f_locals.get("self"))))  # never raises
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
        names one reply may carry; each also by the names its loaded chapter module binds
        it to: a function bound to another name (``softmax = my_softmax``), and a method by
        each name bound to the class of an object it ran on or to one of that class's bases
        (``LayerNorm = MyNorm``: ``MyNorm.forward``, or a base's ``forward`` run on a
        ``MyNorm``, is also ``LayerNorm.forward``, the name the parts know it by)."""
        functions, classes = bindings()
        found = set()
        for code in self.codes:
            file = Path(code.co_filename).name
            if CHAPTER_FILE.match(file):
                found.add(f"{file}:{code.co_qualname}")
                found |= {f"{where}:{name}" for where, name in functions.get(code, ())}
        for code, receiver in self.receivers:
            for cls in vars(type)["__mro__"].__get__(receiver):
                found |= {f"{where}:{name}.{code.co_name}"
                          for where, name in classes.get(id(cls), ())}
        return sorted(found)[:Reply.NAMES]


def bindings() -> tuple[dict[CodeType, set[tuple[str, str]]], dict[int, set[tuple[str, str]]]]:
    """What the loaded chapter modules bind their names to: ``({a function's code: {(file,
    name)}}, {id(class): {(file, name)}})``, read from the modules' namespaces without
    running any code of theirs (functions and classes of ``type`` only, read through the
    types' own descriptors)."""
    functions: dict[CodeType, set[tuple[str, str]]] = {}
    classes: dict[int, set[tuple[str, str]]] = {}
    for module in list(sys.modules.values()):
        if type(module) is not ModuleType:
            continue
        namespace = vars(ModuleType)["__dict__"].__get__(module)
        path = namespace.get("__file__")
        if type(path) is not str or not CHAPTER_FILE.match(Path(path).name):
            continue
        for name, value in list(namespace.items()):
            if type(name) is not str:
                continue
            if type(value) is FunctionType:
                code = vars(FunctionType)["__code__"].__get__(value)
                functions.setdefault(code, set()).add((Path(path).name, name))
            elif type(value) is type:
                classes.setdefault(id(value), set()).add((Path(path).name, name))
    return functions, classes
