"""The ``grade`` command: run the graded tests on a learner's parts and report points per
exercise (:func:`.engine.grade` grades), or list the points on offer, read back an earlier
report, or write the grading manifest.

    python -m annotated_transformer grade --chapter 1 --exercise 6.2 --parts solutions
    python -m annotated_transformer grade --verify-manifest tests/graded/grading_manifest.json
    python -m annotated_transformer grade --from-report report.json --exercise 2.1 --fail-under 100

Each option says what it does in ``--help``; what a grade means and what its report says
(statuses, seeds, the sandbox, stand-ins and blame, the capstone's cache, tamper evidence)
is the instructor page's "Grading a submission" and "Tampering" (``book/instructor.md``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from annotated_transformer.course.grading import boundary, cache, engine, manifest
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.limits import (
    AFTER_TIMEOUT_CPU_SECONDS,
    DEFAULT_CPU_SECONDS,
)
from annotated_transformer.course.grading.outcomes import GraderFault
from annotated_transformer.course.grading.report import (
    ExerciseResult,
    Report,
    WorkflowCheck,
    write_report,
)
from annotated_transformer.course.grading.runspec import RunSpec, described_folder
from annotated_transformer.layout import MANIFEST, ROOT, WORKFLOWS_DIR, folder_name, relative


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m annotated_transformer grade",
        description="Run the graded tests and report points per exercise.")
    parser.add_argument("--chapter", type=int, action="append",
                        help="grade this chapter (repeatable; default: every chapter)")
    parser.add_argument("--exercise", action="append", metavar="ID", type=exercise_id,
                        help="grade this exercise, e.g. 2.1 (repeatable): only its tests run "
                        "(with --chapter, that chapter's too)")
    parser.add_argument("--parts", default="exercises",
                        help="the parts to grade: exercises (default), solutions, or a folder "
                        "of chNN_*.py files")
    # The earlier name, which workflows in learners' copies still pass.
    parser.add_argument("--impl", dest="parts", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
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
    parser.add_argument("--timeout", type=float, default=DEFAULT_CPU_SECONDS, metavar="CPU_SECONDS",
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
                        f"whose {folder_name(WORKFLOWS_DIR)} every report compares with the "
                        "course's (default: the repository the grader runs from; workflows "
                        "unchecked)")
    parser.add_argument("--write-manifest", type=Path, metavar="PATH",
                        help="for course maintainers: write the manifest of this repository's "
                        f"grading files to PATH ({relative(MANIFEST)}), grade nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and dispatch: write the manifest, list the points, or grade
    (run the tests, or read an earlier report) and write the report's formats."""
    parser = build_parser()
    args = parser.parse_args(argv)
    chapters = _checked(args, parser)
    if args.write_manifest:
        manifest.write(args.write_manifest)
        print(f"wrote {args.write_manifest}")
        return 0
    if args.points:
        return _list_points(args, chapters, parser)
    found = _read_report(args, parser) if args.from_report else _run(args, chapters, parser)
    return _write(found, args)


def _checked(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int] | None:
    """Refuse options that do not go together or make no sense; the chapters to grade."""
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        parser.error(f"--fail-under must be a percentage from 0 to 100, got {args.fail_under}")
    if args.write_manifest:
        return None
    if args.submission_root and not args.verify_manifest:
        parser.error("--submission-root is the repository that --verify-manifest checks")
    if args.points and (args.from_report or args.junit or args.markdown
                        or args.fail_under is not None):
        parser.error("--points lists the points on offer; it takes --chapter, --exercise "
                     "and --json only")
    if args.from_report and args.verify_manifest:
        parser.error("--verify-manifest goes with the grading run; its report keeps the result")
    if args.from_report and args.junit:
        parser.error("--junit needs the graded tests; a report read with --from-report "
                     "has only the exercises")
    from_exercises = {ExerciseId(e).chapter for e in args.exercise or []}
    if args.chapter or from_exercises:
        return sorted(set(args.chapter or []) | from_exercises)
    return None


def _asked(args: argparse.Namespace, rows: list[ExerciseResult]) -> list[str] | None:
    """The exercises ``--exercise`` and ``--chapter`` ask for together, of ``rows`` (all
    the exercises on offer); None: every one."""
    if not args.exercise and not args.chapter:
        return None
    named = list(args.exercise or [])
    return [*named, *(r.id for r in rows if r.chapter in (args.chapter or [])
                      and r.id not in named)]


def exercise_id(text: str) -> ExerciseId:
    """``--exercise``'s value; argparse names the flag and says what is wrong."""
    try:
        return ExerciseId(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _list_points(args: argparse.Namespace, chapters: list[int] | None,
                 parser: argparse.ArgumentParser) -> int:
    try:
        rows = engine.exercise_points(chapters)
    except ValueError as error:
        parser.error(str(error))
    rows = _only(rows, _asked(args, rows), parser)
    offer = Report(rows, None)  # nothing graded
    print(offer.offer())
    if args.json:
        args.json.write_text(json.dumps(offer.to_json(), indent=2) + "\n")
    return 0


def _read_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Report:
    """The report an earlier ``--json`` wrote, cut to the chapters and exercises asked for."""
    try:
        found = Report.from_json(json.loads(args.from_report.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"no usable report at {args.from_report} (did the grading step run?): "
                     f"{error}")
    where = f"in the report {args.from_report}"
    missing = sorted(set(args.chapter or []) - {r.chapter for r in found.rows})
    if missing:
        parser.error(f"no exercise of chapter {', '.join(map(str, missing))} {where}; it "
                     f"holds {', '.join(r.id for r in found.rows) or 'none'}")
    found.rows = _only(found.rows, _asked(args, found.rows), parser, where)
    return found


def _run(args: argparse.Namespace, chapters: list[int] | None,
         parser: argparse.ArgumentParser) -> Report:
    """Grade now: the graded tests' records and the rows, with the checks asked for."""
    try:
        sandbox = boundary.decide(args.sandbox)
    except ValueError as error:
        parser.error(f"--sandbox {args.sandbox}: {error}")
    workflow = (WorkflowCheck(str(args.submission_root / relative(WORKFLOWS_DIR)),
                              manifest.workflow_changes(args.submission_root))
                if args.submission_root else None)
    try:
        integrity = (manifest.integrity(args.verify_manifest, args.submission_root or ROOT)
                     if args.verify_manifest else None)
        exercises = (_asked(args, engine.exercise_points(args.chapter))
                     if args.chapter and args.exercise else args.exercise)
        spec = RunSpec.new(args.parts, seed=args.seed, cpu_seconds=args.timeout,
                           sandbox=sandbox, exercises=exercises)
        if len(spec.sources) != 1:
            raise ValueError(f"--parts {args.parts}: grade reports on one source at a time, "
                             f"got {len(spec.sources)}; grade each on its own (or regrade "
                             f"several learners' folders into one gradebook)")
        graded = engine.grade(spec, chapters,
                              cache_dir=None if args.no_cache else cache.default_dir())
    except ValueError as error:
        parser.error(str(error))
    except (GraderFault, engine.ChecksOverBound) as fault:  # nothing to credit or blame
        raise SystemExit(f"grade: {fault}") from None
    return Report(graded.rows(), args.parts, integrity, spec.seed, workflow, graded.records,
                  boundary.describe(spec.sandbox == "bubblewrap"), args.show_output,
                  described_folder(spec.sources[0]))


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
        print(f"JUnit report written to {args.junit}")
    if args.markdown:
        write_report(args.markdown, found.markdown())
        print(f"Markdown report written to {args.markdown}")
    if args.fail_under is not None and found.percent < args.fail_under:
        print(f"\n{found.percent:.1f}% of the points, below --fail-under {args.fail_under:g}%")
        return 1
    return 0


def _only(rows: list[ExerciseResult], exercises: list[str] | None,
          parser: argparse.ArgumentParser, where: str = "") -> list[ExerciseResult]:
    """The rows of the exercises asked for (all of them for None)."""
    if exercises is None:
        return rows
    missing = sorted(set(exercises) - {r.id for r in rows})
    if missing:
        held = ", ".join(r.id for r in rows) or "none"
        parser.error(f"no graded exercise {', '.join(missing)}{f' {where}' if where else ''}; "
                     f"{'it holds' if where else 'exercises:'} {held}")
    return [r for r in rows if r.id in exercises]
