"""Grade the exercises: run the graded tests and report points per exercise.

    python -m annotated_transformer.grade                  # every chapter, your exercises/
    python -m annotated_transformer.grade --chapter 1      # one chapter (repeat for more)
    python -m annotated_transformer.grade --exercise 6.2   # only that exercise's tests
    python -m annotated_transformer.grade --parts solutions --json report.json
    python -m annotated_transformer.grade --points         # the points on offer, nothing run
    python -m annotated_transformer.grade --verify-manifest tests/grading_manifest.json
    python -m annotated_transformer.grade --from-report report.json --exercise 2.1 --fail-under 100

An exercise's points are the points of its tests that passed (partial credit);
its status is ``passed`` (every test passed), ``not implemented`` (a stub still
raises ``NotImplementedError``), ``failed`` (a test's check failed), ``error``
(your code raised), ``timeout``, or ``forbidden`` (it calls the PyTorch op the exercise
asks you to write). Passing tests is evidence, not a proof, that
the work is correct. The tests' random inputs come from a fresh seed each run, named in
the report (``--seed N`` repeats a run), so that an answer hard-coded for some inputs
fails. With ``--verify-manifest``, every report also names the files that
decide the grade (tests, grader, pytest settings) that differ from the course's
(see :mod:`annotated_transformer.grading.manifest`); grading runs all the same. With
``--workflow-file``, every report names the sha256 of the workflow file a CI job ran
beside the course's copy, and says ``WORKFLOW CHANGED`` when they differ. Every message
in a report is cut to ``MESSAGE_LIMIT`` characters, with a marker saying how much went.

An exercise that does not pass and builds on an earlier one that does not pass either (its
test file's ``BUILDS_ON``) says so first, naming the part to fix; the capstone runs only
when asked for or with its chapter, and on a learner's machine its result is reused while
its files are unchanged (``--no-cache`` turns that off; CI passes it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from annotated_transformer.grading.layout import (
    ROOT,
    TESTS_DIR,
    WORKFLOWS_DIR,
    chapter_test_files,
)
from annotated_transformer.grading.messages import MESSAGE_LIMIT, cut  # noqa: F401

# The worst outcome of an exercise's tests names its status.
PRIORITY = ("forbidden", "not implemented", "error", "timeout", "failed", "skipped", "passed",
            "collected")
# Characters that XML 1.0 cannot hold (JUnit), and control characters a terminal obeys.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def bounded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with every message cut (see :func:`cut`)."""
    return [{**r, "message": cut(r.get("message") or "")} for r in records]


def _first_line(message: str) -> str:
    """A message's first line for a one-line report, without control characters."""
    lines = cut(message).splitlines()
    return _CONTROL.sub("\ufffd", lines[0]) if lines else ""


@dataclass
class ExerciseResult:
    id: str
    chapter: int
    title: str
    points: float
    max_points: float
    status: str
    message: str


@dataclass
class Integrity:
    """How a submission's grading files compare with the course's manifest."""

    manifest: str  # the manifest's path, as given
    submission: str  # the repository that was compared with it
    changes: dict[str, str]  # {path: "changed" | "missing" | "added"}
    used: bool  # True: those files graded this run (the grader ran from the submission)

    @property
    def tampered(self) -> list[str]:
        return sorted(self.changes)

    def lines(self) -> list[str]:
        if not self.changes:
            return [f"Grading files: as in the course's manifest ({self.manifest})."]
        listed = cut(", ".join(f"{path} ({change})" for path, change in self.changes.items()))
        effect = ("These files graded this run: compare the submission with the course." if
                  self.used else "The course's own copies graded this run, not these.")
        return [f"TAMPERED: {len(self.changes)} grading file(s) differ from the course's "
                f"manifest ({self.manifest}): {listed}.", effect]


@dataclass
class WorkflowCheck:
    """The workflow file a CI job ran (the submission's copy) against the course's copy."""

    path: str  # as given to --workflow-file
    sha256: str | None  # None: no regular file there
    course_sha256: str | None  # the course's .github/workflows/<same name>; None: none
    changed: bool

    def lines(self) -> list[str]:
        """What every report says about it."""
        if not self.changed:
            return [f"Workflow: {self.path} is the course's (sha256 {self.sha256})."]
        ran = f"sha256 {self.sha256}" if self.sha256 else "not a regular file"
        course = (f"sha256 {self.course_sha256}" if self.course_sha256
                  else "the course has no file of that name")
        return [f"WORKFLOW CHANGED: {self.path} ({ran}) is not the course's copy ({course}).",
                "GitHub ran the submission's copy: this run may not be the course's grading; "
                "re-grade the submission to be sure."]


def file_sha256(path: Path) -> str | None:
    """The sha256 of a regular file (a symbolic link is not followed), else None."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


def check_workflow(path: Path, course_dir: Path = WORKFLOWS_DIR) -> WorkflowCheck:
    """Compare the workflow file at ``path`` with the course's file of the same name."""
    ran, course = file_sha256(path), file_sha256(course_dir / path.name)
    return WorkflowCheck(str(path), ran, course, ran is None or ran != course)


def _pytest_command(files: list[Path], parts: str, report: Path, timeout: float,
                    extra_args: tuple[str, ...]) -> list[str]:
    # Only the course's settings and plugins: pyproject.toml's section (not a pytest.ini),
    # tests/conftest.py (not one above it), pytest-timeout (not whatever else is installed).
    return [
        sys.executable, "-m", "pytest", *map(str, files), f"--parts={parts}",
        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
        "--confcutdir", str(TESTS_DIR), "-p", "pytest_timeout",
        "-p", "annotated_transformer.grading.plugin", f"--grade-report={report}",
        f"--timeout={timeout}", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *extra_args,
    ]


def run_tests(chapters: list[int] | None, parts: str, timeout: float = 60.0,
              extra_args: tuple[str, ...] = (), seed: int = 0,
              sandbox_user: str | None = None,
              exercises: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the graded tests in a fresh interpreter; one record a test (see grading.plugin).

    The tests run in that interpreter; the code under test only in the grading worker it
    starts (as ``sandbox_user`` when given: the grader must then run as root). Every test
    starts from ``seed`` (``--grade-seed``): 0 here, as in the course's own test suite; the
    command line draws a fresh one per run. With ``exercises``, only the graded tests of
    those exercises run (the files of their chapters are collected, nothing else runs).
    """
    if exercises is not None:
        chapters = sorted({int(e.split(".")[0]) for e in exercises})
        extra_args = (f"--grade-exercises={','.join(exercises)}", *extra_args)
    files = chapter_test_files(chapters)
    if parts not in ("solutions", "exercises", "variants") and Path(parts).exists():
        parts = str(Path(parts).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        worker = (f"--grade-seed={seed}", f"--grade-call-timeout={max(timeout - 5, 1):g}")
        if sandbox_user:
            worker += (f"--grade-user={sandbox_user}",)
        command = _pytest_command(list(files.values()), parts, report, timeout,
                                  (*worker, *extra_args))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
        if not report.exists():
            raise RuntimeError(f"the graded tests did not run:\n{process.stdout[-3000:]}"
                               f"{process.stderr[-3000:]}")
        return json.loads(report.read_text())


def exercise_points(chapters: list[int] | None = None) -> list[ExerciseResult]:
    """The points on offer per exercise, read from the graded tests without running them.

    One row an exercise, as :func:`summarize` gives, with ``points`` 0 and status
    ``"collected"``. The GitHub Classroom workflow takes its steps' points from here.
    """
    records = run_tests(chapters, "exercises", extra_args=("--collect-only",))
    if any(r["exercise"] is None for r in records):
        problem = next(r for r in records if r["exercise"] is None)
        raise RuntimeError(problem["message"])
    return summarize(records)


WITHHELD = ("the {points:g} point(s) for a clear error on bad input count once the tests on "
            "good input pass")


def summarize(records: list[dict[str, Any]]) -> list[ExerciseResult]:
    """One row an exercise: points earned, status from its worst test, that test's message.

    A test of a clear error on bad input (``errors=True``) pays only when every other test
    of its exercise passed: an exercise that raises one ``ValueError`` for everything earns
    nothing."""
    by_exercise: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["exercise"] is not None:
            by_exercise.setdefault(record["exercise"], []).append(record)
    rows = []
    for exercise in sorted(by_exercise, key=lambda e: tuple(map(int, e.split(".")))):
        tests = by_exercise[exercise]
        worst = min(tests, key=lambda r: PRIORITY.index(r["outcome"]))
        behaves = all(r["outcome"] == "passed" for r in tests if not r.get("errors"))
        paid = [r for r in tests if r["outcome"] == "passed" and (behaves or not r.get("errors"))]
        withheld = sum(r["points"] for r in tests if r["outcome"] == "passed") - sum(
            r["points"] for r in paid)
        message = cut(worst["message"] or "")
        if withheld > 1e-9:
            message = f"{message} ({WITHHELD.format(points=round(withheld, 2))})"
        rows.append(ExerciseResult(
            id=exercise, chapter=tests[0]["chapter"], title=tests[0]["title"],
            points=round(sum(r["points"] for r in paid), 2),
            max_points=round(sum(r["points"] for r in tests), 2),
            status=worst["outcome"], message=message,
        ))
    return rows


def grade(chapters: list[int] | None, parts: str, exercises: list[str] | None = None, *,
          timeout: float = 60.0, seed: int = 0, sandbox_user: str | None = None,
          cache_dir: Path | None = None) -> tuple[list[dict[str, Any]], list[ExerciseResult]]:
    """Grade the exercises asked for (``exercises``, else those of ``chapters``, else all):
    their records and rows.

    Only their graded tests run. A whole-course exercise (the capstone) whose files are
    unchanged since it last passed or failed is not run again when ``cache_dir`` is given
    (see :mod:`annotated_transformer.grading.cache`). An exercise that does not pass and
    builds on a part that does not pass either says so first; the parts it builds on that
    were not graded in this run are graded for that (and not reported).
    """
    from annotated_transformer.grading import dependencies

    chapter_test_files(chapters)  # a chapter without graded tests is a ValueError
    declared = dependencies.read()
    wanted = list(exercises) if exercises else declared.exercises(chapters)
    unknown = sorted(set(wanted) - set(declared.titles), key=dependencies.order)
    if unknown:
        raise ValueError(f"no graded exercise {', '.join(unknown)}; exercises: "
                         f"{', '.join(declared.exercises())}")
    kept, keys = _reused(wanted, parts, declared, cache_dir)
    to_run = [e for e in wanted if e not in kept]
    options = {"timeout": timeout, "seed": seed, "sandbox_user": sandbox_user}
    records = bounded(run_tests(None, parts, exercises=to_run, **options)) if to_run else []
    for exercise, entry in keys.items():
        if cache_dir is not None and exercise not in kept:
            _cache_store(cache_dir, exercise, entry, records)
    records += [r for exercise in wanted for r in kept.get(exercise, [])]
    records.sort(key=lambda r: r["chapter"] if r["chapter"] is not None else 0)
    rows = summarize(records)
    passing = {r.id: r.status == "passed" for r in rows}
    needed = sorted({p for r in rows if r.status not in ("passed", "forbidden")
                     for p in declared.closure(r.id)} - set(passing), key=dependencies.order)
    if needed:
        extra = summarize(bounded(run_tests(None, parts, exercises=needed, **options)))
        passing.update({r.id: r.status == "passed" for r in extra})
    return records, [_explained(r, passing, declared) for r in rows]


def _reused(wanted: list[str], parts: str, declared, cache_dir: Path | None):
    """``({exercise: kept records}, {exercise: cache key})`` for the whole-course exercises
    asked for (nothing without ``cache_dir``)."""
    from annotated_transformer.grading import cache

    kept: dict[str, list[dict[str, Any]]] = {}
    keys: dict[str, str] = {}
    if cache_dir is None:
        return kept, keys
    files = chapter_test_files()
    for exercise in (e for e in wanted if e in declared.integration):
        chapter = declared.chapter_of(exercise)
        chapters = {declared.chapter_of(p) for p in declared.closure(exercise)} | {chapter}
        entry = cache.key(parts, chapters, files[chapter])
        if entry is None:
            continue
        keys[exercise] = entry
        found = cache.load(cache_dir, exercise, entry)
        if found is not None:
            kept[exercise] = bounded(cache.reused(*found))
    return kept, keys


def _cache_store(cache_dir: Path, exercise: str, entry: str,
                 records: list[dict[str, Any]]) -> None:
    from annotated_transformer.grading import cache

    cache.store(cache_dir, exercise, entry, [r for r in records if r["exercise"] == exercise])


def _explained(row: ExerciseResult, passing: dict[str, bool], declared) -> ExerciseResult:
    """``row``, whose message first names the parts it builds on that do not pass."""
    from annotated_transformer.grading import dependencies

    # A stub's own message already names the exercise that is not written yet.
    if row.status in ("passed", "forbidden", "not implemented"):
        return row
    roots = dependencies.failing_roots(row.id, passing, declared)
    if not roots:
        return row
    message = f"{dependencies.blame(row.id, roots, declared)} {row.message}".strip()
    return ExerciseResult(**{**asdict(row), "message": cut(message)})


def _points(value: float) -> str:
    return f"{round(value, 2):g}"


def _graded(parts: str, seed: int | None, markdown: bool = False) -> str:
    where = f"`--parts {parts}`" if markdown else f"--parts {parts}"
    if seed is None:
        return f"Graded: {where}"
    option = f"`--seed {seed}`" if markdown else f"--seed {seed}"
    return f"Graded: {where}, random inputs from seed {seed} (the same again: {option})"


def format_table(rows: list[ExerciseResult], parts: str,
                 integrity: Integrity | None = None, seed: int | None = None,
                 workflow: WorkflowCheck | None = None) -> str:
    """The table for the terminal: one line an exercise, what to look at, the total."""
    lines = [_graded(parts, seed), ""]
    width = max([len(r.title) for r in rows] + [5])
    lines.append(f"{'id':<5} {'exercise':<{width}} {'points':>7}  status")
    for row in rows:
        score = f"{_points(row.points)}/{_points(row.max_points)}"
        lines.append(f"{row.id:<5} {row.title:<{width}} {score:>7}  {row.status}")
        if row.status != "passed" or row.message:
            lines.append(f"{'':<5} -> {_first_line(row.message)}")
    total, possible = sum(r.points for r in rows), sum(r.max_points for r in rows)
    lines += ["", f"Total: {_points(total)}/{_points(possible)} points "
              f"({sum(r.status == 'passed' for r in rows)}/{len(rows)} exercises with all "
              f"tests passed)"]
    if integrity is not None:
        lines += ["", *integrity.lines()]
    if workflow is not None:
        lines += ["", *workflow.lines()]
    return "\n".join(lines)


def report(rows: list[ExerciseResult], parts: str,
           integrity: Integrity | None = None, seed: int | None = None,
           workflow: WorkflowCheck | None = None) -> dict[str, Any]:
    """The JSON report: the rows, the totals, and (null when not checked) the grading files
    that differ from the course's manifest and the workflow file the CI job ran."""
    return {
        "tampered": integrity.tampered if integrity else None,
        "integrity": asdict(integrity) if integrity else None,
        "workflow": asdict(workflow) if workflow else None,
        "parts": parts,
        "seed": seed,
        "exercises": [{**asdict(r), "message": cut(r.message)} for r in rows],
        "points": sum(r.points for r in rows),
        "max_points": sum(r.max_points for r in rows),
        "chapters": {
            str(c): {"points": sum(r.points for r in rows if r.chapter == c),
                     "max_points": sum(r.max_points for r in rows if r.chapter == c)}
            for c in sorted({r.chapter for r in rows})
        },
    }


def rows_from_report(data: dict[str, Any]) -> list[ExerciseResult]:
    """The rows of a JSON report written by ``--json``."""
    return [ExerciseResult(**{**row, "message": cut(row["message"])})
            for row in data["exercises"]]


def integrity_from_report(data: dict[str, Any]) -> Integrity | None:
    return Integrity(**data["integrity"]) if data.get("integrity") else None


def workflow_from_report(data: dict[str, Any]) -> WorkflowCheck | None:
    """The workflow check of a JSON report (None when the run had no --workflow-file)."""
    return WorkflowCheck(**data["workflow"]) if data.get("workflow") else None


def format_score(rows: list[ExerciseResult], integrity: Integrity | None = None,
                 workflow: WorkflowCheck | None = None) -> str:
    """The total on one line, with what a reader must not miss (tampering, the workflow)."""
    total, possible = sum(r.points for r in rows), sum(r.max_points for r in rows)
    score = (f"{_points(total)}/{_points(possible)} points from passed tests "
             f"({sum(r.status == 'passed' for r in rows)}/{len(rows)} exercises with every test "
             f"passed)")
    if integrity and integrity.changes:
        score += f"; TAMPERED: {cut(', '.join(integrity.tampered))}"
    if workflow and workflow.changed:
        score += f"; WORKFLOW CHANGED: {workflow.path}"
    return score


def format_points(rows: list[ExerciseResult]) -> str:
    """The points on offer: one line an exercise, the chapter totals and the course's."""
    width = max([len(r.title) for r in rows] + [5])
    lines = [f"{'id':<5} {'exercise':<{width}} {'points':>6}"]
    for chapter in sorted({r.chapter for r in rows}):
        chapter_rows = [r for r in rows if r.chapter == chapter]
        lines += [f"{r.id:<5} {r.title:<{width}} {_points(r.max_points):>6}" for r in chapter_rows]
        total = _points(sum(r.max_points for r in chapter_rows))
        lines.append(f"{'':<5} {f'chapter {chapter}':>{width}} {total:>6}")
    lines += ["", f"Total: {_points(sum(r.max_points for r in rows))} points"]
    return "\n".join(lines)


def format_markdown(rows: list[ExerciseResult], parts: str,
                    integrity: Integrity | None = None, seed: int | None = None,
                    workflow: WorkflowCheck | None = None) -> str:
    """The table as Markdown (for a CI job summary)."""
    total, possible = sum(r.points for r in rows), sum(r.max_points for r in rows)
    lines = [f"### Grading: {_points(total)}/{_points(possible)} points (tests passed)", "",
             _graded(parts, seed, markdown=True), "",
             "| id | exercise | points | status | what to look at |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        message = _first_line(row.message).replace("|", "\\|").replace("<", "&lt;")
        lines.append(f"| {row.id} | {row.title} | {_points(row.points)}/"
                     f"{_points(row.max_points)} | {row.status} | {message} |")
    if integrity is not None:
        warning = " ".join(integrity.lines())
        lines += ["", f"> **{warning}**" if integrity.changes else warning]
    if workflow is not None:
        warning = " ".join(workflow.lines())
        lines += ["", f"> **{warning}**" if workflow.changed else warning]
    return "\n".join(lines) + "\n"


def format_junit(records: list[dict[str, Any]], integrity: Integrity | None = None,
                 seed: int | None = None, workflow: WorkflowCheck | None = None) -> str:
    """JUnit XML: one test case per graded test, grouped in one suite per chapter, and with
    ``integrity`` or ``workflow`` one more suite whose test cases fail when grading files or
    the workflow file were changed. Messages are cut and hold only what XML can."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites", name="annotated_transformer.grading.grade")
    suites: dict[Any, ET.Element] = {}
    for record in bounded(records):
        record["message"] = _NOT_XML.sub("\ufffd", record["message"])
        chapter = record["chapter"]
        if chapter not in suites:
            suites[chapter] = ET.SubElement(root, "testsuite", name=f"chapter {chapter}")
        case = ET.SubElement(suites[chapter], "testcase", name=record["test"],
                             classname=f"exercise {record['exercise']}")
        outcome = record["outcome"]
        if outcome == "skipped":
            ET.SubElement(case, "skipped", message=record["message"])
        elif outcome == "error":
            ET.SubElement(case, "error", message=record["message"], type=outcome)
        elif outcome != "passed":
            ET.SubElement(case, "failure", message=record["message"], type=outcome)
    if integrity is not None or workflow is not None:
        suite = suites["integrity"] = ET.SubElement(root, "testsuite", name="integrity")
    if integrity is not None:
        case = ET.SubElement(suite, "testcase", name="the grading files are the course's",
                             classname=integrity.manifest)
        if integrity.changes:
            message = _NOT_XML.sub("\ufffd", cut(" ".join(integrity.lines())))
            ET.SubElement(case, "failure", message=message, type="tampered")
    if workflow is not None:
        case = ET.SubElement(suite, "testcase", name="the workflow is the course's",
                             classname=workflow.path)
        if workflow.changed:
            ET.SubElement(case, "failure", message=" ".join(workflow.lines()),
                          type="workflow-changed")
    for suite in suites.values():
        cases = list(suite)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
        suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
        suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
        if seed is not None:
            properties = ET.Element("properties")
            ET.SubElement(properties, "property", name="seed", value=str(seed))
            suite.insert(0, properties)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m annotated_transformer.grade",
        description="Run the graded tests and report points per exercise.")
    parser.add_argument("--chapter", type=int, action="append",
                        help="grade this chapter only (repeatable; default: every chapter)")
    parser.add_argument("--exercise", action="append", metavar="ID",
                        help="grade this exercise only, e.g. 2.1 (repeatable): only its tests "
                        "run (and, when it does not pass, those of the parts it builds on)")
    parser.add_argument("--parts", default="exercises",
                        help="the parts to grade: exercises (default), solutions, or a folder "
                        "of chNN_*.py files")
    # The earlier name, which workflows in learners' copies still pass.
    parser.add_argument("--impl", dest="parts", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--junit", type=Path, metavar="PATH",
                        help="also write JUnit XML, one test case per graded test")
    parser.add_argument("--markdown", type=Path, metavar="PATH",
                        help="also write the table as Markdown")
    parser.add_argument("--fail-under", type=float, metavar="PCT",
                        help="exit 1 when the total is below PCT percent of the points")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="the seed of the tests' random inputs (default: a fresh one each "
                        "run, printed with the report)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a single test may take (default 60)")
    parser.add_argument("--no-cache", action="store_true",
                        help="always run the capstone, never reuse its result from an earlier "
                        "run with the same files (CI and re-grades pass this)")
    parser.add_argument("--sandbox-user", metavar="USER",
                        help="run the code under test as USER (e.g. nobody), to whom the course "
                        "and the reports are read-only; the grader must run as root")
    parser.add_argument("--from-report", type=Path, metavar="PATH",
                        help="run nothing: read the JSON report that an earlier --json wrote "
                        "(with --exercise and --fail-under, one CI step per exercise)")
    parser.add_argument("--score", action="store_true",
                        help="print the total only, one line (in GitHub Actions also as a "
                        "notice on the run's page)")
    parser.add_argument("--points", action="store_true",
                        help="run nothing: list the points on offer per exercise and chapter")
    parser.add_argument("--verify-manifest", type=Path, metavar="PATH",
                        help="name, in every report, the grading files (tests, grader, pytest "
                        "settings) of --submission-root that differ from this manifest")
    parser.add_argument("--submission-root", type=Path, metavar="DIR",
                        help="the learner's repository that --verify-manifest checks "
                        "(default: the repository the grader runs from)")
    parser.add_argument("--workflow-file", type=Path, metavar="PATH",
                        help="in CI: the submission's copy of the workflow file the job ran "
                        "(e.g. ../.github/workflows/grade.yml); every report names its sha256 "
                        "beside the course's and says WORKFLOW CHANGED when they differ")
    parser.add_argument("--write-manifest", type=Path, metavar="PATH",
                        help="for course maintainers: write the manifest of this repository's "
                        "grading files to PATH (tests/grading_manifest.json), grade nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        parser.error(f"--fail-under must be a percentage from 0 to 100, got {args.fail_under}")
    if args.sandbox_user:
        import pwd

        if os.geteuid() != 0:
            parser.error("--sandbox-user needs the grader to run as root (it switches the "
                         "worker to that user)")
        try:
            pwd.getpwnam(args.sandbox_user)
        except KeyError:
            parser.error(f"--sandbox-user: no user named {args.sandbox_user!r}")
    if args.exercise:
        bad = [e for e in args.exercise if not re.fullmatch(r"\d+\.\d+", e)]
        if bad:
            parser.error(f"an exercise is named by its number, like 2.1; got {bad}")
    chapters = args.chapter
    if chapters and args.exercise:
        chapters = sorted(set(chapters) | {int(e.split(".")[0]) for e in args.exercise})
    elif args.exercise:
        chapters = sorted({int(e.split(".")[0]) for e in args.exercise})

    if args.write_manifest:
        from annotated_transformer.grading import manifest

        manifest.write(args.write_manifest)
        print(f"wrote {args.write_manifest}")
        return 0
    if args.submission_root and not args.verify_manifest:
        parser.error("--submission-root is the repository that --verify-manifest checks")

    if args.points:
        if args.from_report or args.junit or args.markdown or args.fail_under is not None:
            parser.error("--points lists the points on offer; it takes --chapter, --exercise "
                         "and --json only")
        try:
            rows = _only(exercise_points(chapters), args.exercise, parser)
        except ValueError as error:
            parser.error(str(error))
        print(format_points(rows))
        if args.json:
            data = report(rows, "points")
            args.json.write_text(json.dumps(data, indent=2) + "\n")
        return 0

    records: list[dict[str, Any]] | None = None
    integrity: Integrity | None = None
    if args.from_report and (args.verify_manifest or args.workflow_file):
        parser.error("--verify-manifest and --workflow-file go with the grading run; its "
                     "report keeps the result")
    if args.verify_manifest:
        integrity = _verify(args.verify_manifest, args.submission_root or ROOT, parser)
    workflow = check_workflow(args.workflow_file) if args.workflow_file else None
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    if args.from_report:
        if args.junit:
            parser.error("--junit needs the graded tests; a report read with --from-report "
                         "has only the exercises")
        try:
            data = json.loads(args.from_report.read_text())
            rows, parts = rows_from_report(data), data["parts" if "parts" in data else "impl"]
            integrity = integrity_from_report(data)
            workflow = workflow_from_report(data)
            seed = data.get("seed")
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"no usable report at {args.from_report} (did the grading step run?): "
                         f"{error}")
        if chapters:
            rows = [r for r in rows if r.chapter in chapters]
    else:
        parts = args.parts
        from annotated_transformer.grading import cache

        try:
            records, rows = grade(chapters, parts, args.exercise, timeout=args.timeout,
                                  seed=seed, sandbox_user=args.sandbox_user,
                                  cache_dir=None if args.no_cache else cache.default_dir())
        except ValueError as error:
            parser.error(str(error))
    rows = _only(rows, args.exercise, parser)
    if records is not None and args.exercise:
        records = [r for r in records if r["exercise"] in args.exercise]

    print(format_score(rows, integrity, workflow) if args.score
          else format_table(rows, parts, integrity, seed, workflow))
    if args.score and os.environ.get("GITHUB_ACTIONS") == "true":
        alarm = (integrity and integrity.changes) or (workflow and workflow.changed)
        print(f"::{'warning' if alarm else 'notice'} title=Grade::"
              f"{format_score(rows, integrity, workflow)}")
    if args.json:
        data = report(rows, parts, integrity, seed, workflow)
        write_report(args.json, json.dumps(data, indent=2) + "\n")
        print(f"\nJSON report written to {args.json}")
    if args.junit and records is not None:
        write_report(args.junit, format_junit(records, integrity, seed, workflow))
    if args.markdown:
        write_report(args.markdown, format_markdown(rows, parts, integrity, seed, workflow))
    possible = sum(r.max_points for r in rows)
    percent = 100 * sum(r.points for r in rows) / possible if possible else 0.0
    if args.fail_under is not None and percent < args.fail_under:
        print(f"\n{percent:.1f}% of the points, below --fail-under {args.fail_under:g}%")
        return 1
    return 0


def write_report(path: Path, text: str) -> None:
    """Write a report whole or not at all: a partial file first, renamed into place."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _verify(path: Path, submission: Path, parser: argparse.ArgumentParser) -> Integrity:
    from annotated_transformer.grading import manifest

    if not submission.is_dir():
        parser.error(f"--submission-root {submission} is not a folder")
    try:
        expected = manifest.load(path)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the manifest {path}: {error}")
    try:
        changes = manifest.verify(expected, submission)
    except (OSError, ValueError) as error:  # a file of the submission that cannot be read
        changes = {"(submission)": cut(f"unreadable: {type(error).__name__}: {error}", 300)}
    used = submission.resolve() == ROOT.resolve()
    return Integrity(str(path), str(submission), changes, used)


def _only(rows: list[ExerciseResult], exercises: list[str] | None,
          parser: argparse.ArgumentParser) -> list[ExerciseResult]:
    """The rows of the exercises asked for (all of them without --exercise)."""
    if not exercises:
        return rows
    missing = sorted(set(exercises) - {r.id for r in rows})
    if missing:
        parser.error(f"no graded exercise {', '.join(missing)}; exercises: "
                     f"{', '.join(r.id for r in rows)}")
    return [r for r in rows if r.id in exercises]


if __name__ == "__main__":
    sys.exit(main())
