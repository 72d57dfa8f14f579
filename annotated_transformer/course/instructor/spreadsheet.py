"""The gradebook's line of an exercise's result, and the CSV it is written to, whose learner
text never runs as a formula.

A :class:`~annotated_transformer.course.grading.results.ExerciseResult` is one line of the
class's gradebook (:data:`COLUMNS`: all but what the code printed), in its JSON and in its
CSV (:func:`to_csv`, read back by :func:`from_csv`); every CSV the instructor's tools write
goes through :func:`csv_text`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from typing import Any

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.messages import CONTROL
from annotated_transformer.course.grading.results import ExerciseResult

# The gradebook's line, in order (its CSV's header, its JSON rows' keys).
COLUMNS = ("learner", "exercise", "title", "points", "max_points", "status", "message", "flags",
           "seed", "mistake", "graded_at", "override", "blocked_by")
# A cell that starts with one of these would be a formula (or, for "'", would lose that
# first character) in a spreadsheet: it is written after a "'" and read back without it.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


def to_row(result: ExerciseResult) -> dict[str, Any]:
    """The gradebook's line (:data:`COLUMNS`): every field but ``chapter`` (its id's) and
    ``printed`` (the report's alone)."""
    return {c: result.id if c == "exercise" else getattr(result, c) for c in COLUMNS}


def from_row(row: dict[str, Any]) -> ExerciseResult:
    """The result of a gradebook's line, from its JSON or its CSV (numbers as text); a
    column an older gradebook lacks is empty."""
    exercise = row["exercise"] or ""
    seed = row.get("seed")
    return ExerciseResult(
        exercise, ExerciseId(exercise).chapter if exercise else 0, row["title"] or "",
        _number(row["points"]), _number(row["max_points"]), row["status"],
        row["message"] or "", mistake=row.get("mistake") or "",
        blocked_by=row.get("blocked_by") or "", learner=row["learner"],
        flags=row.get("flags") or "", seed=None if seed is None or seed == "" else int(seed),
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
    """A CSV file (RFC 4180: ``\\r\\n`` between lines) whose every cell, the header's
    too, is :func:`spreadsheet_safe`: text (a learner's name, a message, a roster's id) is
    escaped, a number the tools computed (``int``, ``float``: ``-1.5``) is written as
    itself. The one writer of every CSV of the class's folder and of the LMS exports."""
    out = io.StringIO()
    writer = csv.writer(out)
    for line in (header, *lines):
        writer.writerow([spreadsheet_safe(cell) for cell in line])
    return out.getvalue()


def to_csv(results: Iterable[ExerciseResult]) -> str:
    """The gradebook's CSV: one line a result (:func:`to_row`)."""
    return csv_text(COLUMNS, (to_row(r).values() for r in results))


def from_csv(text: str) -> list[ExerciseResult]:
    """The results of a CSV that :func:`to_csv` wrote."""
    lines = list(csv.DictReader(io.StringIO(text)))
    return [from_row({k: spreadsheet_text(v) for k, v in line.items()}) for line in lines]
