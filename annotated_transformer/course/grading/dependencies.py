"""What each exercise builds on, read from the graded test files, and what it means for a report.

Each graded test file declares, next to its tests, ``BUILDS_ON = {"5.4": ("3.3", "5.1", ...)}``:
the learner's earlier exercises whose code an exercise's code uses (directly; what those use
counts too). The files are read, never imported, as the grader reads ``FORBIDDEN``.

An exercise is graded with the grader's stand-ins for the earlier exercises it builds on
that have one (:mod:`.standins`, which ``BUILDS_ON`` chooses), and on the learner's own for
the others, so a later exercise can still fail because of one of those. When an exercise
does not pass, called such an earlier one while its tests ran (observed, :mod:`.calls`),
and that one was graded in the same run with wrong values, its message says so: "8.3 uses
your split_heads (3.1), which does not pass yet: fix 3.1 first.", after the learner's own
named mistake when the exercise's tests name one. A failed check of an error message or of
a structure blocks nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.layout import chapter_test_files

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


def order(exercise: str) -> tuple[int, int]:
    """Course order: 2.10 after 2.9."""
    return ExerciseId(exercise).order


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
    if isinstance(node, ast.Constant):
        return node.value
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
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


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
    :mod:`.calls`) whose values are wrong (``right``: the tests of their values failed) and
    that call no other such exercise themselves: the ones to fix first. A part whose values
    are right, or that was never called, is never blamed, whatever its other tests say."""
    failing = {p for p in called.get(exercise, set()) - {exercise} if right.get(p) is False}
    return sorted((p for p in failing if not (called.get(p, set()) - {p}) & failing),
                  key=order)


def blame(exercise: str, roots: list[str], declared: Declared) -> str:
    """``"8.3 uses your split_heads (3.1), which does not pass yet: fix 3.1 first."``"""
    named = [f"{declared.name(p)} ({p})" for p in roots[:SHOWN]]
    named += [f"{len(roots) - SHOWN} more"] if len(roots) > SHOWN else []
    if len(roots) == 1:
        return f"{exercise} uses your {named[0]}, which does not pass yet: fix {roots[0]} first."
    fix = _listed(roots) if len(roots) <= SHOWN else "those"
    return f"{exercise} uses your {_listed(named)}, which do not pass yet: fix {fix} first."


def _listed(items: list[str]) -> str:
    """``a, b and c``."""
    return f"{', '.join(items[:-1])} and {items[-1]}"
