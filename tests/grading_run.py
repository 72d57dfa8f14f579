"""The course's own tests grade through the grader's one entry, ``engine.grade``: a run as
they make it (seed 0, the sandbox where it can start)."""

from __future__ import annotations

from annotated_transformer.course.grading import boundary, engine
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.course.grading.supervisor import DEFAULT_CPU_SECONDS


def grade_run(chapters: list[int] | None, parts: str, *, timeout: float = DEFAULT_CPU_SECONDS,
           seed: int = 0, exercises: list[str] | None = None) -> engine.Graded:
    """``parts`` graded on ``exercises`` (else those of ``chapters``, else all)."""
    spec = RunSpec.new(parts, seed=seed, cpu_seconds=timeout, sandbox=boundary.decide("auto"),
                       exercises=exercises)
    return engine.grade(spec, chapters)
