"""A graded test's record (:class:`TestRecord`: the plugin writes it, the engine reads it
back) and an exercise's result (:class:`ExerciseResult`: the one shape the report, the
gradebook and the class's summary share), each with the JSON that reads back what it wrote
(the gradebook's line and CSV: :mod:`annotated_transformer.course.instructor.spreadsheet`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.protocol import cut

# What only a gradebook's result says (left out of the report's JSON while unset).
_IN_GRADEBOOK = {"learner": "", "flags": "", "seed": None, "graded_at": "", "override": ""}


@dataclass(frozen=True)
class TestRecord:
    """One graded test's outcome; its message is never longer than :func:`~.messages.cut`
    allows."""

    __test__ = False  # a record, not a class of tests for pytest to collect

    test: str  # pytest's id of the test
    exercise: str | None  # "2.1"; None for tests that could not be collected
    chapter: int | None
    title: str | None
    points: float  # its share of its test function's points
    outcome: Outcome
    message: str = ""  # the first message a learner should read
    values: bool = False  # it compares the values the code computes with the right ones
    errors: bool = False  # it checks a clear error on bad input
    parts: str | None = None  # the source it ran against (--parts; "variant:NAME")
    mistake: str = ""  # the id of the known mistake its message names (tests/graded/mistakes.py)
    calls: tuple[str, ...] = ()  # the chapters' functions its code entered (grading.worker.calls)
    printed: str = ""  # the end of what the code under test printed in it

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # a ValueError if none
        object.__setattr__(self, "message", cut(self.message))
        object.__setattr__(self, "calls", tuple(self.calls))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestRecord:
        """The record that :meth:`to_json` wrote (a ``TypeError`` for what is none)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class ExerciseResult:
    """One exercise's grade; its message is never longer than :func:`~.messages.cut` allows."""

    id: str  # "2.1"; "" for a submission that could not be graded (a gradebook's error line)
    chapter: int
    title: str
    points: float
    max_points: float
    status: Outcome  # its worst test's outcome
    message: str
    printed: str = ""  # what the code under test printed in the test that names the status
    mistake: str = ""  # the id of the known mistake the message names (tests/graded/mistakes.py)
    blocked_by: str = ""  # the exercises it called whose values are wrong ("3.3,2.2"), if any
    # In a gradebook: whose result, that run's flags (";"-joined), seed and time (UTC, ISO
    # 8601), and a manual adjustment applied to it, with its reason.
    learner: str = ""
    flags: str = ""
    seed: int | None = None
    graded_at: str = ""
    override: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Outcome(self.status))  # a ValueError if none
        object.__setattr__(self, "message", cut(self.message))

    def to_json(self) -> dict[str, Any]:
        """The report's row: every field (a gradebook's only where set)."""
        return {k: v for k, v in asdict(self).items()
                if k not in _IN_GRADEBOOK or v != _IN_GRADEBOOK[k]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExerciseResult:
        """The result that :meth:`to_json` wrote."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
