"""Which exercises a probe's code called: the names the worker observed, mapped to exercises.

A later exercise is blamed on an earlier one only when it actually called it
(:mod:`.dependencies`). The worker sends back, with each reply, ``file:qualified name`` of
every function of a chapter file the probe's code entered (:mod:`.worker.calls`), and
``stand-in:EXERCISE`` for each of the grader's stand-ins it called; here those names are
mapped to the exercises of the graded test files by the exercise's name (its title up to
the colon), and anything else the reply holds is ignored. What the learner's code does to
this record can only add or remove a note ("fix ... first", "graded with the grader's
..."), never a point.
"""

from __future__ import annotations

from collections.abc import Iterable

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.protocol import STAND_IN
from annotated_transformer.layout import CHAPTER_FILE


def exercises(names: Iterable[object], titles: dict[str, str]) -> set[str]:
    """The exercises of ``titles`` (``{"3.3": "MultiHeadAttention: ..."}``) whose code the
    observed ``names`` entered: a name of the exercise's chapter file whose qualified name
    starts with the exercise's own (``MultiHeadAttention.forward`` is 3.3's), or the name of
    its stand-in (``stand-in:3.3``)."""
    by_name = {(ExerciseId(e).chapter, t.split(":")[0].strip()): e for e, t in titles.items()}
    found = set()
    for name in names:
        if not isinstance(name, str) or ":" not in name:
            continue
        if name.startswith(STAND_IN):
            if name[len(STAND_IN):] in titles:
                found.add(name[len(STAND_IN):])
            continue
        file, qualified = name.split(":", 1)
        chapter = CHAPTER_FILE.match(file)
        if chapter is None:
            continue
        exercise = by_name.get((int(chapter[1]), qualified.split(".")[0]))
        if exercise is not None:
            found.add(exercise)
    return found
