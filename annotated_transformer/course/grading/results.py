"""A graded test's record and an exercise's result, each with its formats read back by its
pair. :class:`TestRecord`: what the grading plugin (:mod:`.plugin`) writes of one test and
the engine (:mod:`.engine`) reads back (JSON). :class:`ExerciseResult`: what the engine makes
of an exercise's records, the one shape the report (:mod:`.report`), the class's gradebook
and its summary (:mod:`annotated_transformer.course.instructor`) share: JSON (the report's
row), the gradebook's line (its JSON and CSV: all but what the code printed) and CSV, whose
learner text never runs as a formula.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.messages import CONTROL, cut
from annotated_transformer.course.grading.outcomes import Outcome

# The gradebook's line, in order (its CSV's header, its JSON rows' keys).
COLUMNS = ("learner", "exercise", "title", "points", "max_points", "status", "message", "flags",
           "seed", "mistake", "graded_at", "override", "blocked_by")
# What only a gradebook's result says (left out of the report's JSON while unset).
_IN_GRADEBOOK = {"learner": "", "flags": "", "seed": None, "graded_at": "", "override": ""}
# A cell that starts with one of these would be a formula (or, for "'", would lose that
# first character) in a spreadsheet: it is written after a "'" and read back without it.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


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
    calls: tuple[str, ...] = ()  # the chapters' functions its code entered (grading.calls)
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

    def to_row(self) -> dict[str, Any]:
        """The gradebook's line (:data:`COLUMNS`): every field but ``chapter`` (its id's)
        and ``printed`` (the report's alone)."""
        return {c: self.id if c == "exercise" else getattr(self, c) for c in COLUMNS}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ExerciseResult:
        """The result of a gradebook's line, from its JSON or its CSV (numbers as text);
        a column an older gradebook lacks is empty."""
        exercise = row["exercise"] or ""
        seed = row.get("seed")
        return cls(exercise, ExerciseId(exercise).chapter if exercise else 0,
                   row["title"] or "", _number(row["points"]), _number(row["max_points"]),
                   row["status"], row["message"] or "", mistake=row.get("mistake") or "",
                   blocked_by=row.get("blocked_by") or "", learner=row["learner"],
                   flags=row.get("flags") or "",
                   seed=None if seed is None or seed == "" else int(seed),
                   graded_at=row.get("graded_at") or "", override=row.get("override") or "")


def _number(value: Any) -> float:
    """A number as JSON gave it (a gradebook read again writes it as before), or of CSV's
    text."""
    return value if isinstance(value, (int, float)) else float(value)


def spreadsheet_safe(value: Any) -> Any:
    """A cell that a spreadsheet shows as text, never runs as a formula, and that a terminal
    shows on its own line as written: every control character, tab and line break (and the
    backslash, so that it reads back) as its escape, ``\\x1b``, ``\\x0a``, ``\\\\``."""
    if not isinstance(value, str):
        return value
    value = _UNSAFE.sub(_escape, value)
    return "'" + value if value.startswith(_FORMULA_START) else value


def spreadsheet_text(cell: str) -> str:
    """The text that :func:`spreadsheet_safe` wrote as ``cell``."""
    cell = cell[1:] if cell[:1] == "'" and cell[1:].startswith(_FORMULA_START) else cell
    return _ESCAPED.sub(_unescape, cell)


# a backslash, a tab, a line break, or a control character a terminal obeys
_UNSAFE = re.compile(r"[\\\t\n]|" + CONTROL.pattern)
_ESCAPED = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return "\\\\" if code == ord("\\") else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    return "\\" if code == "\\" else chr(int(code[1:], 16))


def csv_text(header: Iterable[str], lines: Iterable[Iterable[Any]]) -> str:
    """A CSV file whose every cell is :func:`spreadsheet_safe`."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for line in lines:
        writer.writerow([spreadsheet_safe(cell) for cell in line])
    return out.getvalue()


def to_csv(results: Iterable[ExerciseResult]) -> str:
    """The gradebook's CSV: one line a result (:meth:`ExerciseResult.to_row`)."""
    return csv_text(COLUMNS, (r.to_row().values() for r in results))


def from_csv(text: str) -> list[ExerciseResult]:
    """The results of a CSV that :func:`to_csv` wrote."""
    lines = list(csv.DictReader(io.StringIO(text)))
    return [ExerciseResult.from_row({k: spreadsheet_text(v) for k, v in line.items()})
            for line in lines]
