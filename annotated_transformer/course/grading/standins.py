"""Stand-ins: the grader's own version of an exercise, so that a later one is graded alone.

Exercise 5.5 (``DecoderLayer``) builds on 3.3, 5.1, 5.2 and 5.3. Graded on the learner's own
earlier parts, a correct 5.5 would fail when their LayerNorm is wrong, and be named for a
mistake it did not make. So while the tests of an exercise run, the earlier exercises it
builds on that have one (:data:`~.protocol.STAND_INS`) are the grader's stand-ins: PyTorch's
own op where PyTorch has one, else the formula the exercise's docstring states. Its points
and its named mistake then depend on its own code alone. Whether the learner's parts work
together is the capstones' question (6.6, 8.6 run on the learner's parts only) and each
report's line "uses your 5.1, whose values are wrong" (:mod:`.engine`).

Here is which stand-ins a test is handed (:func:`stand_ins_for`), read without PyTorch; the
worker builds them for the request that names them, and revokes them when it ends
(:mod:`.worker.standins`).
"""

from __future__ import annotations

from typing import Any

from annotated_transformer.course.grading.protocol import STAND_INS


def stand_ins_for(exercise: str | None, declared: Any) -> tuple[str, ...]:
    """The earlier exercises that ``exercise``'s tests run on stand-ins: every one it builds
    on (``declared``: :class:`~.dependencies.Declared`) that has one; none for a capstone,
    whose question is whether the learner's own parts work together."""
    if exercise is None or exercise in declared.integration:
        return ()
    return tuple(e for e in declared.closure(exercise) if e in STAND_INS)
