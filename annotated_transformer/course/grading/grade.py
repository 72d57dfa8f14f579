"""Grade the exercises: run the graded tests and report points per exercise.

    python -m annotated_transformer grade                  # every chapter, your exercises/
    python -m annotated_transformer grade --chapter 1      # one chapter (repeat for more)
    python -m annotated_transformer grade --exercise 6.2   # only that exercise's tests
    python -m annotated_transformer grade --parts solutions --json report.json
    python -m annotated_transformer grade --points         # the points on offer, nothing run
    python -m annotated_transformer grade --verify-manifest tests/graded/grading_manifest.json
    python -m annotated_transformer grade --from-report report.json --exercise 2.1 --fail-under 100

An exercise's points are the points of its tests that passed (partial credit);
its status is ``passed`` (every test passed), ``not implemented`` (a stub still
raises ``NotImplementedError``), ``failed`` (a test's check failed), ``error``
(your code raised), ``timeout``, or ``forbidden`` (it calls the PyTorch op the exercise
asks you to write). Passing tests is evidence, not a proof, that
the work is correct. The tests' random inputs come from a fresh seed each run, named in
the report (``--seed N`` repeats a run), so that an answer hard-coded for some inputs
fails. With ``--verify-manifest``, every report also names the files that
decide the grade (tests, grader, pytest settings) that differ from the course's
(see :mod:`annotated_transformer.course.grading.manifest`); grading runs all the same. With
``--submission-root``, every report also says which of the submission's workflow files
differ from the course's (``WORKFLOW CHANGED``): GitHub runs the learner's copy, so a
learner's CI grade is advisory. Your code runs in a separate process inside bubblewrap where
it can start (the report names the boundary; ``--sandbox none`` grades without it), limited
in CPU seconds (``--timeout``), so a busy machine costs it nothing. Every message
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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.messages import MESSAGE_LIMIT, cut  # noqa: F401
from annotated_transformer.course.grading.report import (
    ExerciseResult,
    Integrity,
    Report,
    WorkflowCheck,
    bounded,
    format_points,
    write_report,
)
from annotated_transformer.course.grading.sandbox import (
    AFTER_TIMEOUT_CPU_SECONDS,
    DEFAULT_CPU_SECONDS,
)
from annotated_transformer.layout import (
    GRADED_DIR,
    ROOT,
    WORKFLOWS_DIR,
    chapter_test_files,
    relative,
)

MAX_WORKFLOWS = 5_000  # the most workflow files of a submission looked at
# The worst outcome of an exercise's tests names its status.
PRIORITY = ("grader error", "busy", "forbidden", "not implemented", "error", "timeout", "failed",
            "skipped", "passed", "collected")
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


def workflow_changes(root: Path, course_dir: Path = WORKFLOWS_DIR) -> dict[str, str]:
    """``{file name: "changed" | "added"}`` for the submission's workflow files (``root``'s
    ``.github/workflows/*.yml``, as committed) that are not the course's copies: computed
    from the files themselves, never from a path a workflow names."""
    folder = root / relative(WORKFLOWS_DIR)
    if os.path.islink(folder.parent) or os.path.islink(folder):
        return {relative(WORKFLOWS_DIR): "a symbolic link"}
    if not folder.is_dir():
        return {}
    changes = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name)[:MAX_WORKFLOWS]:
        if entry.name.endswith((".yml", ".yaml")):
            ran, course = file_sha256(Path(entry.path)), file_sha256(course_dir / entry.name)
            if ran is None or ran != course:
                changes[entry.name] = "added" if course is None else "changed"
    return changes


def _pytest_command(files: list[Path], parts: str, report: Path,
                    extra_args: tuple[str, ...]) -> list[str]:
    # Only the course's settings and plugins: pyproject.toml's section (not a pytest.ini),
    # tests/graded/conftest.py (not one above it), pytest-timeout (not whatever else is installed).
    return [
        sys.executable, "-m", "pytest", *map(str, files), f"--parts={parts}",
        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
        "--confcutdir", str(GRADED_DIR), "-p", "pytest_timeout",
        "-p", "annotated_transformer.course.grading.plugin", f"--grade-report={report}",
        # No wall-clock limit on a test: each call of the code under test has its CPU budget
        # and its own backstop (grading.sandbox).
        "--timeout=0", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *extra_args,
    ]


def run_tests(chapters: list[int] | None, parts: str, timeout: float = DEFAULT_CPU_SECONDS,
              extra_args: tuple[str, ...] = (), seed: int = 0,
              sandbox: str = "auto",
              exercises: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the graded tests in a fresh interpreter; one record a test (see grading.plugin).

    The tests run in that interpreter; the code under test only in the grading worker it
    starts (``sandbox``: ``bubblewrap``, ``none`` or ``auto``, see grading.boundary; as the
    user nobody when the grader runs as root), which may use
    ``timeout`` CPU seconds a call (a test's ``cpu_seconds`` marker may give more). Every test
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
        worker = (f"--grade-seed={seed}", f"--grade-cpu-seconds={timeout:g}",
                  f"--grade-sandbox={sandbox}")
        command = _pytest_command(list(files.values()), parts, report, (*worker, *extra_args))
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


WITHHELD = ("the {points:g} point(s) of its other checks (shapes, devices, properties, a clear "
            "error on bad input) count once the tests on good input pass")


def value_tests(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tests of one exercise that compare its values with the right ones (``values=True``);
    an exercise that marks none counts every test but those of errors on bad input."""
    marked = [r for r in tests if r.get("values")]
    return marked or [r for r in tests if not r.get("errors")]


def values_right(records: list[dict[str, Any]]) -> dict[str, bool | None]:
    """``{exercise: whether every test of its values passed}``: what a later exercise that
    calls it can rely on (a failed check of an error message or of a structure is not).
    ``None`` for the release's stub, which is never to blame: code that called it and still
    ran caught its ``NotImplementedError`` (the package's own fallbacks do)."""
    return {e: None if all(r["outcome"] == "not implemented" for r in tests)
            else all(r["outcome"] == "passed" for r in value_tests(tests))
            for e, tests in _by_exercise(records).items()}


def unsure_names(records: list[dict[str, Any]]) -> dict[str, str]:
    """``{exercise: the message of a failed test of its values that names no mistake}`` for
    each exercise whose failed tests of values do not all name one and the same mistake: a
    name that one input supports and another contradicts (an exercise that calls a wrong
    part computes what a mistake of its own would, on some inputs only)."""
    unsure = {}
    for exercise, tests in _by_exercise(records).items():
        failed = [r for r in value_tests(tests) if r["outcome"] != "passed"]
        if len({r.get("mistake") or "" for r in failed}) > 1:
            unsure[exercise] = next((r["message"] or "" for r in failed
                                     if not r.get("mistake")), "")
    return unsure


def _by_exercise(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_exercise: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["exercise"] is not None:
            by_exercise.setdefault(record["exercise"], []).append(record)
    return by_exercise


def summarize(records: list[dict[str, Any]]) -> list[ExerciseResult]:
    """One row an exercise: points earned, status from its worst test, that test's message
    and the known mistake it names (a test of that outcome that names one first).

    Only behaviour pays: a test that a wrong answer can pass too (a shape, a device, a
    property, a clear error on bad input) pays only when every test of the exercise's values
    passed, and a test of a clear error (``errors=True``) only when every other test of its
    exercise passed: an exercise that raises one ``ValueError`` for everything, or a skeleton
    that returns zeros of the right shape, earns nothing."""
    by_exercise = _by_exercise(records)
    rows = []
    for exercise in sorted(by_exercise, key=lambda e: tuple(map(int, e.split(".")))):
        tests = by_exercise[exercise]
        values = value_tests(tests)
        right = all(r["outcome"] == "passed" for r in values)
        # The worst outcome; among its tests, one that names a known mistake.
        worst = min(tests, key=lambda r: (PRIORITY.index(r["outcome"]), not r.get("mistake")))
        behaves = all(r["outcome"] == "passed" for r in tests if not r.get("errors"))
        paid = [r for r in tests if r["outcome"] == "passed" and (
            any(r is v for v in values) or (right and (behaves or not r.get("errors"))))]
        withheld = sum(r["points"] for r in tests if r["outcome"] == "passed") - sum(
            r["points"] for r in paid)
        message = cut(worst["message"] or "")
        if withheld > 1e-9:
            message = f"{message} ({WITHHELD.format(points=round(withheld, 2))})"
        printed = (worst.get("printed") if worst["outcome"] != "passed"
                   else "".join(r.get("printed", "") for r in tests)[-2000:])
        rows.append(ExerciseResult(
            id=exercise, chapter=tests[0]["chapter"], title=tests[0]["title"],
            points=round(sum(r["points"] for r in paid), 2),
            max_points=round(sum(r["points"] for r in tests), 2),
            status=worst["outcome"], message=message,
            printed=printed or "", mistake=worst.get("mistake") or "",
        ))
    return rows


def grade(chapters: list[int] | None, parts: str, exercises: list[str] | None = None, *,
          timeout: float = DEFAULT_CPU_SECONDS, seed: int = 0, sandbox: str = "auto",
          cache_dir: Path | None = None) -> tuple[list[dict[str, Any]], list[ExerciseResult]]:
    """Grade the exercises asked for (``exercises``, else those of ``chapters``, else all):
    their records and rows.

    Only their graded tests run. A whole-course exercise (the capstone) whose files are
    unchanged since it last passed or failed is not run again when ``cache_dir`` is given
    (see :mod:`annotated_transformer.course.grading.cache`). An exercise that does not pass and
    called a part whose values are wrong says so; the parts it called that were not graded
    in this run are graded for that (and not reported).
    """
    from annotated_transformer.course.grading import dependencies

    chapter_test_files(chapters)  # a chapter without graded tests is a ValueError
    declared = dependencies.read()
    wanted = list(exercises) if exercises else declared.exercises(chapters)
    unknown = sorted(set(wanted) - set(declared.titles), key=dependencies.order)
    if unknown:
        raise ValueError(f"no graded exercise {', '.join(unknown)}; exercises: "
                         f"{', '.join(declared.exercises())}")
    kept, keys = _reused(wanted, parts, declared, cache_dir)
    to_run = [e for e in wanted if e not in kept]
    options = {"timeout": timeout, "seed": seed, "sandbox": sandbox}
    records = bounded(run_tests(None, parts, exercises=to_run, **options)) if to_run else []
    for exercise, entry in keys.items():
        if cache_dir is not None and exercise not in kept:
            _cache_store(cache_dir, exercise, entry, records)
    records += [r for exercise in wanted for r in kept.get(exercise, [])]
    records.sort(key=lambda r: r["chapter"] if r["chapter"] is not None else 0)
    rows = summarize(records)
    right, called = values_right(records), calls_of(records, declared)
    needed = sorted({p for r in rows if r.status not in ("passed", "forbidden")
                     for p in called.get(r.id, ())} - set(right), key=dependencies.order)
    if needed:
        extra = bounded(run_tests(None, parts, exercises=needed, **options))
        right.update(values_right(extra))
        called.update({e: c for e, c in calls_of(extra, declared).items() if e not in called})
    unsure = unsure_names(records)
    return records, [_explained(r, right, called, declared, unsure) for r in rows]


def calls_of(records: list[dict[str, Any]], declared) -> dict[str, set[str]]:
    """``{exercise: the exercises its code called while its tests ran}`` (observed)."""
    from annotated_transformer.course.grading import calls

    return {e: calls.exercises((n for r in tests for n in r.get("calls") or ()),
                               declared.titles)
            for e, tests in _by_exercise(records).items()}


def _reused(wanted: list[str], parts: str, declared, cache_dir: Path | None):
    """``({exercise: kept records}, {exercise: cache key})`` for the whole-course exercises
    asked for (nothing without ``cache_dir``)."""
    from annotated_transformer.course.grading import cache

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
    from annotated_transformer.course.grading import cache

    cache.store(cache_dir, exercise, entry, [r for r in records if r["exercise"] == exercise])


def _explained(row: ExerciseResult, right: dict[str, bool | None],
               called: dict[str, set[str]], declared,
               unsure: dict[str, str] | None = None) -> ExerciseResult:
    """``row``, whose message names the parts it called whose values are wrong: first, or
    after the learner's own mistake when its tests name one. A mistake that some of its
    tests of values do not name is dropped there (with the message of one that names none):
    the wrong part may explain it."""
    from annotated_transformer.course.grading import dependencies

    # A stub's own message already names the exercise that is not written yet.
    if row.status in ("passed", "forbidden", "not implemented"):
        return row
    roots = dependencies.failing_roots(row.id, right, called)
    if not roots:
        return row
    blame = dependencies.blame(row.id, roots, declared)
    if row.mistake and row.id in (unsure or {}):
        row = replace(row, mistake="", message=cut(unsure[row.id]) or row.message)
    if row.mistake:  # the learner's own mistake first, whole; the blame after it
        message = f"{cut(row.message, MESSAGE_LIMIT - len(blame) - 1)} {blame}"
    else:
        message = cut(f"{blame} {row.message}".strip())
    return ExerciseResult(**{**asdict(row), "message": message, "blocked_by": ",".join(roots)})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m annotated_transformer grade",
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
    parser.add_argument("--timeout", type=float, default=DEFAULT_CPU_SECONDS,
                        metavar="CPU_SECONDS",
                        help=f"CPU seconds one call of your code may use in a test (default "
                        f"{DEFAULT_CPU_SECONDS:g}; once one call of an exercise ran out of "
                        f"them, its later calls get {AFTER_TIMEOUT_CPU_SECONDS:g}; "
                        "the capstone allows more): a busy machine does not count against it")
    parser.add_argument("--no-cache", action="store_true",
                        help="always run the capstone, never reuse its result from an earlier "
                        "run with the same files (CI and re-grades pass this)")
    parser.add_argument("--sandbox", choices=("auto", "bubblewrap", "none"), default="auto",
                        help="the boundary your code runs in while graded: bubblewrap (its own "
                        "processes, no network, only the files it needs, read-only), none, or "
                        "auto (default: bubblewrap where it can start); the report says which")
    parser.add_argument("--show-output", action="store_true",
                        help="show what your code printed in every exercise (it is always "
                        "shown, its last lines, under an exercise that did not pass)")
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
                        help="the learner's repository that --verify-manifest checks, and "
                        "whose .github/workflows every report compares with the course's "
                        "(default: the repository the grader runs from; workflows unchecked)")
    parser.add_argument("--write-manifest", type=Path, metavar="PATH",
                        help="for course maintainers: write the manifest of this repository's "
                        "grading files to PATH (tests/graded/grading_manifest.json), grade nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and dispatch: write the manifest, list the points, or grade
    (run the tests, or read an earlier report) and write the report's formats."""
    parser = build_parser()
    args = parser.parse_args(argv)
    chapters = _checked(args, parser)
    if args.write_manifest:
        from annotated_transformer.course.grading import manifest

        manifest.write(args.write_manifest)
        print(f"wrote {args.write_manifest}")
        return 0
    if args.points:
        return _list_points(args, chapters, parser)
    found = (_read_report(args, chapters, parser) if args.from_report
             else _run(args, chapters, parser))
    return _write(found, args)


def _checked(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int] | None:
    """Refuse options that do not go together or make no sense; the chapters to grade."""
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        parser.error(f"--fail-under must be a percentage from 0 to 100, got {args.fail_under}")
    if args.exercise:
        bad = [e for e in args.exercise if not re.fullmatch(r"\d+\.\d+", e)]
        if bad:
            parser.error(f"an exercise is named by its number, like 2.1; got {bad}")
    if args.write_manifest:
        return None
    if args.submission_root and not args.verify_manifest:
        parser.error("--submission-root is the repository that --verify-manifest checks")
    if args.points and (args.from_report or args.junit or args.markdown
                        or args.fail_under is not None):
        parser.error("--points lists the points on offer; it takes --chapter, --exercise "
                     "and --json only")
    if args.from_report and args.verify_manifest:
        parser.error("--verify-manifest goes with the grading run; its report keeps the "
                     "result")
    if args.from_report and args.junit:
        parser.error("--junit needs the graded tests; a report read with --from-report "
                     "has only the exercises")
    from_exercises = {int(e.split(".")[0]) for e in args.exercise or []}
    if args.chapter or from_exercises:
        return sorted(set(args.chapter or []) | from_exercises)
    return None


def _list_points(args: argparse.Namespace, chapters: list[int] | None,
                 parser: argparse.ArgumentParser) -> int:
    try:
        rows = _only(exercise_points(chapters), args.exercise, parser)
    except ValueError as error:
        parser.error(str(error))
    print(format_points(rows))
    if args.json:
        args.json.write_text(json.dumps(Report(rows, "points").to_json(), indent=2) + "\n")
    return 0


def _read_report(args: argparse.Namespace, chapters: list[int] | None,
                 parser: argparse.ArgumentParser) -> Report:
    """The report an earlier ``--json`` wrote, cut to the chapters and exercises asked for."""
    try:
        found = Report.from_json(json.loads(args.from_report.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"no usable report at {args.from_report} (did the grading step run?): "
                     f"{error}")
    if chapters:
        found.rows = [r for r in found.rows if r.chapter in chapters]
    found.rows = _only(found.rows, args.exercise, parser)
    return found


def _run(args: argparse.Namespace, chapters: list[int] | None,
         parser: argparse.ArgumentParser) -> Report:
    """Grade now: the graded tests' records and the rows, with the checks asked for."""
    from annotated_transformer.course.grading import cache

    integrity = (_verify(args.verify_manifest, args.submission_root or ROOT, parser)
                 if args.verify_manifest else None)
    workflow = (WorkflowCheck(str(args.submission_root / relative(WORKFLOWS_DIR)),
                              workflow_changes(args.submission_root))
                if args.submission_root else None)
    sandbox = _sandbox(args.sandbox, parser)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    try:
        records, rows = grade(chapters, args.parts, args.exercise, timeout=args.timeout,
                              seed=seed, sandbox=sandbox,
                              cache_dir=None if args.no_cache else cache.default_dir())
    except ValueError as error:
        parser.error(str(error))
    faults = [r for r in records if r["outcome"] == "grader error"]
    if faults:  # no learner code ran: nothing to credit or blame
        raise SystemExit(f"grade: {faults[0]['message']}")
    if args.exercise:
        records = [r for r in records if r["exercise"] in args.exercise]
    return Report(_only(rows, args.exercise, parser), args.parts, integrity, seed, workflow,
                  records, boundary.describe(sandbox == "bubblewrap"), args.show_output)


def _sandbox(wanted: str, parser: argparse.ArgumentParser) -> str:
    """The boundary to grade in: ``bubblewrap`` or ``none`` (``auto``: bubblewrap where it
    can start, else none, which the report says)."""
    why = boundary.unavailable() if wanted != "none" else None
    if wanted == "bubblewrap" and why:
        parser.error(f"--sandbox bubblewrap: {why}")
    return "none" if wanted == "none" or why else "bubblewrap"


def _write(found: Report, args: argparse.Namespace) -> int:
    """Print the table (or the score) and write the formats asked for; the exit status."""
    print(found.score() if args.score else found.table())
    if args.score and os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::{'warning' if found.alarm else 'notice'} title=Grade::{found.score()}")
    if args.json:
        write_report(args.json, json.dumps(found.to_json(), indent=2) + "\n")
        print(f"\nJSON report written to {args.json}")
    if args.junit and found.records is not None:
        write_report(args.junit, found.junit())
    if args.markdown:
        write_report(args.markdown, found.markdown())
    if args.fail_under is not None and found.percent < args.fail_under:
        print(f"\n{found.percent:.1f}% of the points, below --fail-under {args.fail_under:g}%")
        return 1
    return 0


def _verify(path: Path, submission: Path, parser: argparse.ArgumentParser) -> Integrity:
    from annotated_transformer.course.grading import manifest

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
