"""A class's roster, and its gradebook exported in the form each LMS imports.

The roster is a CSV with a line a learner: ``learner`` (the gradebook's name), and, as the
instructor has them, ``repository`` (a git URL or folder), ``branch``, ``lms_id`` (the
LMS's own id of the learner) and ``section``. ``regrade --roster FILE`` grades each line's
repository at its branch; ``regrade export`` reads it to name each learner as the LMS does.

Exports (``regrade export --out DIR --format F --roster FILE``), one column an assignment
(``--columns chapters``: one a chapter graded; ``total``: one for the course):

- ``canvas``: Canvas's gradebook CSV (Canvas LMS guides, "How do I import grades in the
  Gradebook?"): the columns ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``,
  ``Section``, then the assignments; the first line under the header is ``Points
  Possible``, which Canvas reads as each assignment's points. ``ID`` is the roster's
  ``lms_id`` (Canvas's user id), the login and user SIS ids the learner's name.
- ``moodle``: Moodle's "Import grades from CSV": a column that identifies the user
  (``ID number``, the roster's ``lms_id``) and one column a grade item. No other line:
  Moodle stops the whole import at a line whose user it cannot find, so there is no
  points-possible line, and a learner without an ``lms_id`` is left out (and named).
- ``csv``: ``learner``, ``lms_id``, ``section``, the assignments and ``possible``.

Each is written by the class folder's own CSV writer
(:func:`~annotated_transformer.course.instructor.spreadsheet.csv_text`): a name or id that
would start a formula (``=HYPERLINK(...)``, ``+``, ``-``, ``@``) is written after a ``'``,
so the LMS or a spreadsheet shows it as text; the points are numbers, written as they are.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from annotated_transformer.course.grading.exercise_id import ExerciseId, order
from annotated_transformer.course.instructor.spreadsheet import csv_text

ROSTER_COLUMNS = ("learner", "repository", "branch", "lms_id", "section")
FORMATS = ("canvas", "moodle", "csv")
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_ID = "ID number"


@dataclass(frozen=True)
class Enrolled:
    """One line of the roster."""

    learner: str
    repository: str = ""
    branch: str = ""
    lms_id: str = ""
    section: str = ""


def read_roster(path: Path) -> list[Enrolled]:
    """The roster's lines; a ``ValueError`` naming the line for a missing or repeated
    learner or an unknown column."""
    with path.open(newline="", encoding="utf-8") as handle:
        table = csv.DictReader(handle)
        unknown = sorted(set(table.fieldnames or ()) - set(ROSTER_COLUMNS))
        if "learner" not in (table.fieldnames or ()) or unknown:
            raise ValueError(f"{path}: the roster's columns are {', '.join(ROSTER_COLUMNS)} "
                             f"(learner required); got {', '.join(table.fieldnames or ())}")
        found: list[Enrolled] = []
        for number, line in enumerate(table, start=2):
            values = {c: (line.get(c) or "").strip() for c in ROSTER_COLUMNS}
            if not values["learner"]:
                raise ValueError(f"{path}, line {number}: no learner")
            if any(e.learner == values["learner"] for e in found):
                raise ValueError(f"{path}, line {number}: {values['learner']!r} is listed twice")
            found.append(Enrolled(**values))
    return found


def repositories_of(path: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """The roster's lines that name a repository: their repositories, learners and
    ``{learner: branch}`` where a branch is named; a ``ValueError`` for a roster with none."""
    enrolled = [e for e in read_roster(path) if e.repository]
    if not enrolled:
        raise ValueError(f"--roster {path} has no line with a repository")
    return ([e.repository for e in enrolled], [e.learner for e in enrolled],
            {e.learner: e.branch for e in enrolled if e.branch})


def assignments(totals: dict[str, dict[str, float]], possible: dict[str, float],
                columns: str) -> tuple[list[str], dict[str, dict[str, float]], dict[str, float]]:
    """The assignment columns: ``chapters`` (``Chapter N``) or ``total`` (``Transformer
    course``), each learner's points in them and their possible points. ``totals``:
    ``{learner: {exercise: points}}``; ``possible``: ``{exercise: points}``."""
    def column(exercise: str) -> str:
        if columns == "total":
            return "Transformer course"
        return f"Chapter {ExerciseId(exercise).chapter}"

    names = list(dict.fromkeys(column(e) for e in sorted(possible, key=order)))
    points = {who: {name: 0.0 for name in names} for who in totals}
    for who, earned in totals.items():
        for exercise, value in earned.items():
            points[who][column(exercise)] = round(points[who][column(exercise)] + value, 2)
    out_of = {name: 0.0 for name in names}
    for exercise, value in possible.items():
        out_of[column(exercise)] = round(out_of[column(exercise)] + value, 2)
    return names, points, out_of


def export(format_: str, totals: dict[str, dict[str, float]], possible: dict[str, float],
           roster: list[Enrolled], columns: str = "chapters") -> tuple[str, list[str]]:
    """The file's text and the learners left out of it (graded but without what the
    format needs to name them)."""
    if format_ not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {format_!r}")
    names, points, out_of = assignments(totals, possible, columns)
    enrolled = {e.learner: e for e in roster}
    left_out = [who for who in totals if format_ != "csv" and not enrolled.get(
        who, Enrolled(who)).lms_id]
    kept = [who for who in totals if who not in left_out]
    if format_ == "canvas":
        header = [*CANVAS_COLUMNS, *names]
        lines = [["    Points Possible", "", "", "", "", *(out_of[n] for n in names)]]
        for who in kept:
            e = enrolled[who]
            lines.append([who, e.lms_id, who, who, e.section, *(points[who][n] for n in names)])
    elif format_ == "moodle":
        header = [MOODLE_ID, *names]
        lines = [[enrolled[who].lms_id, *(points[who][n] for n in names)] for who in kept]
    else:
        header = ["learner", "lms_id", "section", *names, "possible"]
        lines = []
        for who in kept:
            e = enrolled.get(who, Enrolled(who))
            lines.append([who, e.lms_id, e.section, *(points[who][n] for n in names),
                          round(sum(out_of.values()), 2)])
    return csv_text(header, lines), left_out
