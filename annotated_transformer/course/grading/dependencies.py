"""What each exercise builds on: declared next to its tests, observed while they run, and
what that means for a report.

Each graded test file declares ``BUILDS_ON = {"5.4": ("3.3", "5.1", ...)}``: the earlier
exercises whose code an exercise's code uses directly (what those use counts too), read,
never imported. While an exercise's tests run, the earlier ones it builds on that have a
stand-in are the grader's (:meth:`Declared.stand_ins`), so its points are its own code's;
the capstones run on the learner's parts alone. A failing exercise is blamed on an earlier
one only when its code called it (:meth:`Declared.called`, from what the worker observed)
and that one's values are wrong (:func:`failing_roots`): what the learner's code does to
that record can add or remove a note, never a point. The instructor page
(``book/instructor.md``, "Grading a submission") shows the notes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading.exercise_id import ExerciseId, order
from annotated_transformer.course.grading.protocol import STAND_IN, STAND_INS
from annotated_transformer.layout import CHAPTER_FILE, chapter_test_files

SHOWN = 3  # the most parts a message names


@dataclass(frozen=True)
class Declared:
    """What the graded test files declare: titles, dependencies, whole-course exercises."""

    titles: dict[str, str] = field(default_factory=dict)  # {"3.3": "MultiHeadAttention: ..."}
    builds_on: dict[str, tuple[str, ...]] = field(default_factory=dict)
    integration: frozenset[str] = frozenset()  # graded by a whole-course test (the capstone)

    def chapter_of(self, exercise: str) -> int:
        return ExerciseId(exercise).chapter

    def exercises(self, chapters: Iterable[int] | None = None) -> list[str]:
        """Every declared exercise, or those of ``chapters``, in course order."""
        wanted = None if chapters is None else set(chapters)
        return sorted((e for e in self.titles if wanted is None or self.chapter_of(e) in wanted),
                      key=order)

    def closure(self, exercise: str) -> list[str]:
        """Every exercise that ``exercise`` builds on, directly or through another, in order."""
        found: set[str] = set()
        stack = list(self.builds_on.get(exercise, ()))
        while stack:
            part = stack.pop()
            if part not in found:
                found.add(part)
                stack.extend(self.builds_on.get(part, ()))
        found.discard(exercise)
        return sorted(found, key=order)

    def name(self, exercise: str) -> str:
        """The part's name in the syllabus: its title up to the colon (``MultiHeadAttention``)."""
        return self.titles.get(exercise, exercise).split(":")[0].strip()

    def stand_ins(self, exercise: str | None) -> tuple[str, ...]:
        """The earlier exercises that ``exercise``'s tests run on the grader's stand-ins
        (:data:`~.protocol.STAND_INS`, built by :mod:`.worker.standins`): every one it builds
        on that has one; none for a capstone, whose question is whether the learner's own
        parts work together."""
        if exercise is None or exercise in self.integration:
            return ()
        return tuple(e for e in self.closure(exercise) if e in STAND_INS)

    def called(self, names: Iterable[object]) -> set[str]:
        """The exercises whose code the worker observed a probe's code enter (``names``, from
        :mod:`.worker.calls`): ``file:qualified name`` of a chapter file whose qualified name
        starts with the exercise's name (``MultiHeadAttention.forward`` is 3.3's), or its
        stand-in's ``stand-in:3.3``. Anything else the reply holds is ignored."""
        by_name = {(self.chapter_of(e), self.name(e)): e for e in self.titles}
        found = set()
        for name in names:
            if not isinstance(name, str) or ":" not in name:
                continue
            file, qualified = name.split(":", 1)  # a stand-in's: "stand-in", "3.3"
            chapter = CHAPTER_FILE.match(file)
            if name.startswith(STAND_IN):
                exercise = qualified
            elif chapter is not None:
                exercise = by_name.get((int(chapter[1]), qualified.split(".")[0]), "")
            else:
                continue
            if exercise in self.titles:
                found.add(exercise)
        return found


def constants(tree: ast.Module) -> dict[str, Any]:
    """The module's top-level names bound to literals: constants, tuples, lists, sets and
    dicts of them, names bound so earlier, ``*`` unpacking (``(*SOFTMAX_NAMES, "x")``)."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            try:
                found[node.targets[0].id] = _literal(node.value, found)
            except ValueError:
                continue
    return found


def _literal(node: ast.AST, names: dict[str, object]) -> object:
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items: list[object] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                items.extend(_literal(element.value, names))  # type: ignore[arg-type]
            else:
                items.append(_literal(element, names))
        container = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
        return container(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k, names): _literal(v, names)  # type: ignore[arg-type]
                for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)  # a constant, else a ValueError


def points_offered(files: Mapping[int, Path] | None = None) -> dict[str, float]:
    """``{exercise: points}`` read from the graded test files without running them: each
    test function's ``@pytest.mark.grade("N.M", points=P)`` (``points`` 1 when not given;
    a function's points are shared by its parametrized cases, so they add up as they are)."""
    offered: dict[str, float] = {}
    for path in (files or chapter_test_files()).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == "grade" and decorator.args
                        and isinstance(decorator.args[0], ast.Constant)):
                    exercise = str(decorator.args[0].value)
                    points = next((k.value.value for k in decorator.keywords
                                   if k.arg == "points" and isinstance(k.value, ast.Constant)),
                                  1)
                    offered[exercise] = offered.get(exercise, 0.0) + float(points)
    return offered


def read(files: Mapping[int, Path] | None = None) -> Declared:
    """``EXERCISES``, ``BUILDS_ON`` and ``INTEGRATION`` of every graded test file."""
    titles: dict[str, str] = {}
    builds_on: dict[str, tuple[str, ...]] = {}
    integration: set[str] = set()
    for path in (files or chapter_test_files()).values():
        found = constants(ast.parse(path.read_text(encoding="utf-8")))
        titles.update(found.get("EXERCISES") or {})
        builds_on.update({e: tuple(p) for e, p in (found.get("BUILDS_ON") or {}).items()})
        integration.update(found.get("INTEGRATION") or ())
    return Declared(titles, builds_on, frozenset(integration))


def failing_roots(exercise: str, right: Mapping[str, bool | None],
                  called: Mapping[str, set[str]]) -> list[str]:
    """The exercises ``exercise`` called (``called``: observed while its tests ran,
    :meth:`Declared.called`) whose values are wrong (``right``: the tests of their values
    failed) and that call no other such exercise themselves: the ones to fix first. A part
    whose values are right, or that was never called, is never blamed, whatever its other
    tests say."""
    failing = {p for p in called.get(exercise, set()) - {exercise} if right.get(p) is False}
    return sorted((p for p in failing if not (called.get(p, set()) - {p}) & failing),
                  key=order)


def blame(exercise: str, roots: list[str], declared: Declared) -> str:
    """``"6.6 uses your MultiHeadAttention (3.3), which does not pass yet: fix 3.3 first."``"""
    named = [f"{declared.name(p)} ({p})" for p in roots[:SHOWN]]
    named += [f"{len(roots) - SHOWN} more"] if len(roots) > SHOWN else []
    if len(roots) == 1:
        return f"{exercise} uses your {named[0]}, which does not pass yet: fix {roots[0]} first."
    fix = _listed(roots) if len(roots) <= SHOWN else "those"
    return f"{exercise} uses your {_listed(named)}, which do not pass yet: fix {fix} first."


def _listed(items: list[str]) -> str:
    """``a, b and c``."""
    return f"{', '.join(items[:-1])} and {items[-1]}"
