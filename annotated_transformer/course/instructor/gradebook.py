"""The class's gradebook: its rows, the files it is written to, and how runs add up.

One gradebook a class, in one folder, however many runs fill it: ``regrade`` reads the
gradebook already there, replaces the rows of each learner it grades (every row records its
run's seed and time) and keeps everyone else's; shards graded on other machines are merged
the same way (``regrade merge``). Manual adjustments (``--overrides``) are kept beside the
rows and applied to every output: the long CSV and JSON, the wide CSV an LMS imports, and
each learner's feedback file. A learner's feedback names no one else: the flags that compare
a learner with classmates (the copy check's pairs) are in the instructor's ``flags.md``
only. A learner's text (the messages, quoting their code) is data
in every format: a code span in Markdown, a cell that never runs as a formula in CSV.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading import dependencies
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.messages import markdown_code
from annotated_transformer.course.grading.report import write_report
from annotated_transformer.course.grading.results import ExerciseResult
from annotated_transformer.course.instructor.spreadsheet import csv_text, from_row, to_csv, to_row

OVERRIDE_COLUMNS = ("learner", "exercise", "points", "reason")
# Flags that compare a learner with classmates, and may name them: the instructor's report
# (flags.md, the gradebook) shows them, a learner's feedback never does.
CLASS_FLAGS = ("identical-file", "release-other")
NOT_IN_RELEASE = "not in your release"
LOCK = ".regrade.lock"  # in the class's folder, held by the run that writes there


class FolderBusy(Exception):
    """Another run holds the class's folder."""


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the class's folder for one run (an exclusive ``flock`` on its lock file): a
    second run into the same folder stops at once rather than read a gradebook the first is
    rewriting and write over its rows. The lock ends with the process, however it ends."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process"
            raise FolderBusy(f"another regrade is writing to {out} ({holder}): wait for it to "
                             f"finish and run again, or give another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}\n")
        handle.flush()
        yield


@dataclass
class Learner:
    """One submission: who, from where, what was graded and what its checks found (flag:
    [what, ...])."""

    learner: str
    source: str
    flags: dict[str, list[str]] = field(default_factory=dict)
    status: str = "graded"  # or "error"
    points: float = 0
    max_points: float = 0
    commit: str = ""  # the commit graded, for a repository
    commit_time: str = ""  # its committer date (ISO 8601)
    graded_at: str = ""  # when this learner was graded (UTC, ISO 8601)
    seed: int | None = None
    seconds: float = 0.0  # how long fetching, checking and grading took
    # {chapter file: digest of its code, comments, spacing and docstrings aside}
    # (submissions.code_of: the identical-file flag)
    fingerprints: dict[str, str] = field(default_factory=dict)
    release: str = ""  # the commit of the release graded against; "" for the course now
    release_note: str = ""  # what the learner's feedback says of it
    # {exercise of the chapters graded: why it is not graded}: not in the learner's release
    not_in_release: dict[str, str] = field(default_factory=dict)

    def flag(self, name: str, what: str) -> None:
        """Record one finding of the check ``name``."""
        self.flags.setdefault(name, []).append(what)


@dataclass
class Override:
    """A manual adjustment: ``learner``'s ``exercise`` is worth ``points``, because ``reason``."""

    learner: str
    exercise: str
    points: float
    reason: str


@dataclass
class Gradebook:
    """Every learner graded so far, their rows, and the manual adjustments."""

    learners: dict[str, Learner] = field(default_factory=dict)
    rows: list[ExerciseResult] = field(default_factory=list)  # each with its learner's name
    overrides: list[Override] = field(default_factory=list)
    chapters: list[int] = field(default_factory=list)

    def put(self, who: Learner, rows: list[ExerciseResult],
            chapters: list[int] | None = None) -> None:
        """Add ``who`` with ``rows``, replacing only that learner's earlier rows of
        ``chapters`` (default: all of them; an error row replaces all of them too)."""
        self.learners[who.learner] = who

        def replaced(row: ExerciseResult) -> bool:
            if row.learner != who.learner:
                return False
            if chapters is None or not row.id or any(not r.id for r in rows):
                return True
            return row.chapter in chapters

        self.rows = [r for r in self.rows if not replaced(r)] + rows

    def order(self, names: list[str]) -> None:
        """Learners (and their rows) in the order of ``names``, each at its first place
        (a run's learners finish in any order; the gradebook does not depend on it)."""
        place = {name: i for i, name in reversed(list(enumerate(names)))}
        last = len(place)
        self.learners = dict(sorted(self.learners.items(),
                                    key=lambda item: place.get(item[0], last)))
        self.rows.sort(key=lambda row: place.get(row.learner, last))  # stable: exercises kept

    def merge(self, other: Gradebook) -> None:
        """Add every learner of ``other`` (theirs replace ours) and its overrides."""
        for name, who in other.learners.items():
            self.put(who, [r for r in other.rows if r.learner == name])
        self.add_overrides(other.overrides)
        self.chapters = sorted(set(self.chapters) | set(other.chapters))

    def add_overrides(self, overrides: list[Override]) -> None:
        """Keep ``overrides``; a later one for the same learner and exercise replaces it."""
        keyed = {(o.learner, o.exercise): o for o in [*self.overrides, *overrides]}
        self.overrides = list(keyed.values())

    def unmatched_overrides(self) -> list[Override]:
        """The adjustments that name no learner's exercise in the gradebook (a typo, or a
        learner who could not be graded): kept, applied to nothing."""
        rows = {(r.learner, r.id) for r in self.rows}
        return [o for o in self.overrides if (o.learner, o.exercise) not in rows]

    def effective_rows(self) -> list[ExerciseResult]:
        """The rows with the overrides applied (the graded points kept in ``override``)."""
        keyed = {(o.learner, o.exercise): o for o in self.overrides}
        rows = []
        for row in self.rows:
            found = keyed.get((row.learner, row.id))
            if found is not None:
                row = replace(row, points=found.points, override=(
                    f"{found.points:g} instead of {row.points:g}: {found.reason}"))
            rows.append(row)
        return rows

    def totals(self) -> dict[str, tuple[float, float]]:
        """``{learner: (points, possible)}`` with the overrides applied."""
        found: dict[str, tuple[float, float]] = {name: (0.0, 0.0) for name in self.learners}
        for row in self.effective_rows():
            points, possible = found.get(row.learner, (0.0, 0.0))
            found[row.learner] = (round(points + row.points, 2),
                                  round(possible + row.max_points, 2))
        return found

    def to_json(self, about: dict[str, Any]) -> dict[str, Any]:
        """The gradebook as JSON (``about``: what every run shares: the course, the sandbox)."""
        totals = self.totals()
        learners = [{**asdict(who), "points": totals[name][0]}
                    for name, who in self.learners.items()]
        rows = [{**to_row(r), **({"graded_points": g.points} if r.override else {})}
                for r, g in zip(self.effective_rows(), self.rows, strict=True)]
        return {**about, "chapters": self.chapters, "learners": learners, "rows": rows,
                "overrides": [asdict(o) for o in self.overrides]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gradebook:
        """Read back what :meth:`to_json` wrote (rows with their graded points)."""
        book = cls(chapters=list(data.get("chapters") or []))
        names = {f.name for f in fields(Learner)}
        for entry in data.get("learners", []):
            who = Learner(**{k: v for k, v in entry.items() if k in names})
            book.learners[who.learner] = who
        for entry in data.get("rows", []):
            row = from_row(entry)
            book.rows.append(replace(row, points=entry.get("graded_points", row.points),
                                     override=""))
        book.overrides = [Override(**o) for o in data.get("overrides", [])]
        return book


def read(folder: Path) -> Gradebook:
    """The gradebook in ``folder`` (an empty one where there is none yet)."""
    path = folder / "gradebook.json"
    if not path.exists():
        return Gradebook()
    try:
        return Gradebook.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise ValueError(f"{path} is not a gradebook this course wrote: {error}") from error


def read_overrides(path: Path) -> list[Override]:
    """The adjustments of a CSV file with the columns learner, exercise, points, reason."""
    with path.open(newline="") as handle:
        table = list(csv.DictReader(handle))
    found = []
    for number, line in enumerate(table, start=2):
        missing = [c for c in OVERRIDE_COLUMNS if not (line.get(c) or "").strip()]
        if missing:
            raise ValueError(f"{path}, line {number}: no {', '.join(missing)} (the columns "
                             f"are {', '.join(OVERRIDE_COLUMNS)})")
        try:
            points = float(line["points"])
        except ValueError:
            raise ValueError(f"{path}, line {number}: points must be a number, got "
                             f"{line['points']!r}") from None
        found.append(Override(line["learner"].strip(), line["exercise"].strip(), points,
                              line["reason"].strip()))
    return found


# ---------------------------------------------------------------- the files


def wide_csv(book: Gradebook) -> str:
    """The LMS's table: one line a learner, a column an exercise and a chapter, the total;
    the second line gives each column's possible points (the ``Points Possible`` line that
    LMS imports such as Canvas's read). An exercise not in a learner's release is blank."""
    rows = book.effective_rows()
    exercises = sorted({r.id for r in rows if r.id}, key=dependencies.order)
    chapters = sorted({ExerciseId(e).chapter for e in exercises})
    possible = {r.id: r.max_points for r in rows if r.id}
    header = ["learner", *exercises, *(f"chapter {c}" for c in chapters), "total"]
    chapter_possible = [round(sum(p for e, p in possible.items()
                                  if ExerciseId(e).chapter == c), 2) for c in chapters]
    lines = [["Points Possible", *(possible[e] for e in exercises), *chapter_possible,
              round(sum(possible.values()), 2)]]
    for name in sorted(book.learners):
        mine = {r.id: r.points for r in rows if r.learner == name and r.id}
        absent = book.learners[name].not_in_release  # blank: neither points nor a zero
        per_chapter = [round(sum(p for e, p in mine.items() if ExerciseId(e).chapter == c), 2)
                       for c in chapters]
        lines.append([name, *("" if e in absent else mine.get(e, 0) for e in exercises),
                      *per_chapter, round(sum(mine.values()), 2)])
    return csv_text(header, lines)


def feedback(book: Gradebook, name: str) -> str:
    """One learner's feedback as Markdown: what was graded, their total, every exercise with
    its points, status, named mistake and message (as data), the exercises not in their
    release, the adjustments and their own flags (never :data:`CLASS_FLAGS`, which may name
    a classmate)."""
    who = book.learners[name]
    rows = [r for r in book.effective_rows() if r.learner == name]
    points, possible = book.totals()[name]
    lines = [f"# Feedback: {markdown_code(name)}", "",
             f"**{points:g}/{possible:g} points.**", ""]
    if who.commit:
        lines.append(f"Graded commit {markdown_code(who.commit)} of {who.commit_time or '?'}.")
    lines += [f"Graded at {who.graded_at or '?'} (seed {who.seed})."]
    lines += [who.release_note, ""] if who.release_note else [""]
    if who.status == "error":
        lines += ["Your submission could not be graded:", "",
                  markdown_code(rows[0].message if rows else "?"), ""]
    else:
        lines += ["| exercise | points | status | named mistake | what the grader saw |",
                  "| --- | --- | --- | --- | --- |"]
        for row in rows:
            mistake = f"`{row.mistake}`" if row.mistake else ""
            message = markdown_code(row.message, table=True) if row.message else ""
            lines.append(f"| {row.id} {row.title.replace('|', '/')} | "
                         f"{row.points:g}/{row.max_points:g} | {row.status} | {mistake} | "
                         f"{message} |")
        titles = dependencies.read().titles if who.not_in_release else {}
        for exercise, why in sorted(who.not_in_release.items(),
                                    key=lambda item: dependencies.order(item[0])):
            title = titles.get(exercise, "").replace("|", "/")
            lines.append(f"| {exercise} {title} | - | {NOT_IN_RELEASE} | | {why} |")
    adjusted = [r for r in rows if r.override]
    if adjusted:
        lines += ["", "## Adjusted by your instructor", ""]
        lines += [f"- {r.id}: {markdown_code(r.override)}" for r in adjusted]
    own = {flag: what for flag, what in who.flags.items() if flag not in CLASS_FLAGS}
    if own:
        lines += ["", "## What the checks noticed (a reason to look, not a verdict)", ""]
        lines += [f"- {flag}: {markdown_code('; '.join(what))}"
                  for flag, what in sorted(own.items())]
    return "\n".join(lines) + "\n"


def flags_report(book: Gradebook) -> str:
    """The instructor's report of every learner's flags as Markdown, the copy check's pairs
    with them: for the instructor alone, since it names classmates."""
    lines = ["# What the checks noticed, learner by learner", "",
             "For you, not for the learners: the copy check names classmates, and no "
             "learner's feedback shows it. Each flag is a reason to look, not a verdict "
             "(gradebook.json's `flags` says what each means).", ""]
    flagged = [(name, who) for name, who in book.learners.items() if who.flags]
    for name, who in flagged:
        lines += [f"## {markdown_code(name)}", ""]
        lines += [f"- {flag}: {markdown_code('; '.join(what))}"
                  for flag, what in sorted(who.flags.items())]
        lines.append("")
    if not flagged:
        lines.append("No flag.")
    return "\n".join(lines).rstrip("\n") + "\n"


def feedback_name(name: str) -> str:
    """A file name for a learner's feedback: their name where it is only letters, digits,
    ``.``, ``_`` and ``-``; else those characters of it and a digest of the whole name, so
    that two names never share a file."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    if safe == name and safe:
        return safe
    return f"{safe or 'learner'}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def write(out: Path, book: Gradebook, about: dict[str, Any]) -> list[Path]:
    """Write the gradebook (JSON, long and wide CSV), a feedback file a learner and the
    instructor's report of the flags."""
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "gradebook.json", json.dumps(book.to_json(about), indent=2) + "\n")
    write_report(out / "gradebook.csv", to_csv(book.effective_rows()))
    write_report(out / "grades-wide.csv", wide_csv(book))
    folder = out / "feedback"
    folder.mkdir(exist_ok=True)
    unmatched = book.unmatched_overrides()
    if unmatched:
        write_report(out / "overrides-unmatched.csv", csv_text(list(OVERRIDE_COLUMNS), [
            [getattr(o, c) for c in OVERRIDE_COLUMNS] for o in unmatched]))
    elif (out / "overrides-unmatched.csv").exists():
        (out / "overrides-unmatched.csv").unlink()
    for name in book.learners:
        write_report(folder / f"{feedback_name(name)}.md", feedback(book, name))
    write_report(out / "flags.md", flags_report(book))
    return [out / "gradebook.json", out / "gradebook.csv", out / "grades-wide.csv", folder,
            out / "flags.md"]
