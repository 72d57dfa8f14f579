"""Other ways to answer each exercise: wrong ones the tests must catch, right ones they must pass.

Each chapter's module (``variants/chNN.py``) decorates functions or classes with
:func:`wrong` or :func:`right`. A variant is the reference chapter file with one
name replaced, so it behaves like a learner's file that answers that exercise
its own way. ``pytest --parts variants`` grades every variant against the tests of
its exercise; ``tests/grading/test_grading.py`` checks the verdicts. A wrong variant may name, with
``mistake="2.2/divided-by-d_k"``, the known mistake it makes (an id of the table in
``tests/graded/mistakes.py``, which holds the message the learner reads): the grader must
name that id for its exercise.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from annotated_transformer.parts import chapter_files


@dataclass(frozen=True)
class Variant:
    name: str  # unique within its chapter: the decorated object's __name__
    chapter: int
    exercise: str  # "1.1"
    replaces: str  # the name in the chapter file it stands in for
    correct: bool
    why: str
    obj: Any
    mistake: str | None = None  # the id the grader must name (tests/graded/mistakes.py)
    says: str | None = None  # a phrase the exercise's message must hold (a refused road)


_REGISTRY: dict[tuple[int, str], Variant] = {}


def _register(exercise: str, replaces: str, correct: bool, why: str,
              mistake: str | None = None, says: str | None = None) -> Callable[[Any], Any]:
    chapter = int(exercise.split(".")[0])

    def decorate(obj: Any) -> Any:
        key = (chapter, obj.__name__)
        if key in _REGISTRY:
            raise ValueError(f"two variants of chapter {chapter} are named {obj.__name__!r}")
        _REGISTRY[key] = Variant(obj.__name__, chapter, exercise, replaces, correct, why, obj,
                                 mistake, says)
        return obj

    return decorate


def wrong(exercise: str, replaces: str, why: str, mistake: str | None = None,
          says: str | None = None) -> Callable[[Any], Any]:
    """A plausible mistake: some test of ``exercise`` must fail on it; with ``mistake``, the
    grader must name that known mistake's id for the exercise; with ``says`` (a road to a
    refused op), the exercise's message must hold that phrase."""
    return _register(exercise, replaces, False, why, mistake, says)


def right(exercise: str, replaces: str, why: str) -> Callable[[Any], Any]:
    """Another correct answer: every test of ``exercise`` must pass on it."""
    return _register(exercise, replaces, True, why)


def for_chapter(chapter: int) -> list[Variant]:
    """Every variant of a chapter (importing its variants module registers them)."""
    try:
        importlib.import_module(f"variants.ch{chapter:02d}")
    except ModuleNotFoundError as error:
        if error.name != f"variants.ch{chapter:02d}":
            raise
    return [v for (c, _), v in sorted(_REGISTRY.items()) if c == chapter]


@cache
def load(chapter: int, name: str) -> ModuleType:
    """A fresh copy of the reference chapter module with the variant's name replaced."""
    variant = next(v for v in for_chapter(chapter) if v.name == name)
    path = chapter_files("solutions")[chapter]
    spec = importlib.util.spec_from_file_location(f"_variant_ch{chapter:02d}_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    setattr(module, variant.replaces, variant.obj)
    return module
