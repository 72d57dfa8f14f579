"""Re-grade a class into one gradebook: the grade an instructor can trust.

    python -m annotated_transformer regrade ~/subs/alice ~/subs/bob --out grades
    python -m annotated_transformer regrade https://github.com/org/t-alice.git \\
        https://github.com/org/t-bob.git --names alice,bob --out grades --chapter 1 \\
        --snapshot grades/snapshot-2026-12-01T225900+0000.json --jobs 2
    python -m annotated_transformer regrade snapshot URL ... --names alice,bob --out grades
    python -m annotated_transformer regrade merge shard-1 shard-2 --out grades

Each SUBMISSION is a folder or a git URL, cloned whole and checked out at its branch's
(``--branch``, or the roster's) head, or at the commit ``regrade snapshot`` saw on the
branch it recorded at the deadline (``--snapshot``, :mod:`.snapshot`; a roster or
``--branch`` that names another branch is refused; git's own dates are the learner's to set
and choose nothing) (:mod:`.repositories`). Each learner is graded on the exercises of the
release their repository records (``--release``, :mod:`.releases`). Of each submission,
only the course's regular exercise files are used; the release's own stub stands in for a
chapter it lacks, and its tests, grader, workflows and committed reports are only compared
with the release's, each difference a flag (:mod:`.submissions`, ``FLAGS``): a reason to
look, not a verdict. Every submission is graded by the course's tests and grader with the
same seed (drawn afresh each run, unless ``--seed``), ``--jobs`` at a time, its code inside
bubblewrap (:mod:`annotated_transformer.course.grading.boundary`; where bubblewrap cannot
start, ``--unsafe`` is needed).

The class's folder (``--out``) holds one gradebook however many runs fill it
(:mod:`.gradebook`): each learner's rows are written as soon as they are graded, replacing
only that learner's earlier rows; ``gradebook.csv`` and ``.json`` (a row per learner and
exercise, with its run's seed and time and the known mistake the grader named),
``grades-wide.csv`` (a row per learner, for an LMS), ``feedback/LEARNER.md`` (naming no
one else), ``flags.md`` (every learner's flags, the copy check's pairs among them: the
instructor's), and the class's summary rebuilt from the whole gradebook
(:mod:`.class_summary`). ``--overrides`` adds manual adjustments, shown in every output;
``--shard K/N`` grades a share of the class, and ``regrade merge`` puts the shares together.
A submission that cannot be cloned or graded gets one row with status ``error`` and 0
points, and the others go on. Exit status: 0, 1 when some submission got an ``error`` row,
2 (with one ``error:`` line) for bad arguments.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Container
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from annotated_transformer.course.distribution import release_record
from annotated_transformer.course.grading import boundary, engine, manifest
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.results import ExerciseResult
from annotated_transformer.course.grading.runspec import RunSpec, draw_seed
from annotated_transformer.course.instructor import (
    gradebook,
    lms,
    releases,
    repositories,
    snapshot,
)
from annotated_transformer.course.instructor.class_folder import (
    _Parser,
    export_main,
    flag_against_class,
    is_git_url,
    learner_names,
    merge_main,
    snapshot_main,
    warn_unmatched,
    write_all,
)
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.course.instructor.repositories import (
    SubmissionError,
    without_credentials,
)
from annotated_transformer.course.instructor.submissions import (
    check_reports,
    check_tests,
    check_workflows,
    collect_exercises,
    course_exercise_files,
    pristine_stub,
    real_dir,
)
from annotated_transformer.layout import (
    EXERCISES_DIR,
    MANIFEST,
    ROOT,
    WORKFLOWS_DIR,
    chapter_test_files,
    folder_name,
    relative,
)

FLAGS = {
    "workflow-changed": f"a {folder_name(WORKFLOWS_DIR)}*.yml differs from the course's copy, "
                        "or was added",
    "tests-changed": "a file that decides a grade (tests, grader, pytest settings) differs "
                     "from the course's manifest",
    "committed-report": "the submission holds a grade.json, grade.md or grade.xml (ignored)",
    "symlink": "a symbolic link where the grader looks (not followed, not used)",
    "oversized": "a file over 1 MB where the grader looks (not used)",
    "not-a-file": "something other than a regular file where an exercise file goes (not used)",
    "extra-file": f"an {folder_name(EXERCISES_DIR)}chNN_*.py that is not one of the course's "
                  "exercise files (not used)",
    "missing-chapter": "no usable file for a graded chapter (the release's stub graded instead)",
    "after-deadline": "commits pushed after the deadline's snapshot, with the dates they claim "
                      "(the commit the snapshot saw was graded)",
    "backdated": "a commit pushed after the snapshot that claims a date before the deadline",
    "dated-before-parent": "a commit that claims a date before its parent's (a clock set back)",
    "other-branch": "a branch holds commits the graded branch lacks (not graded)",
    "identical-file": "a chapter file the same as another learner's of the class, comments, "
                      "spacing and docstrings aside, shared by no more than a quarter of the "
                      "class (or two), with at least 8 lines of code beside the release's "
                      "stub (in the instructor's flags.md, never in a learner's feedback)",
    "release-unknown": f"the repository's {release_record.RECORD} names no release of the "
                       f"course's history (graded on the course as it is now)",
    "release-other": "graded against another release than most of the class (in the "
                     "instructor's flags.md, never in a learner's feedback)",
}


# ---------------------------------------------------------------- fetching a submission


# ---------------------------------------------------------------- grading


@dataclass
class Run:
    """What every submission of one ``regrade`` run shares."""

    chapters: list[int]
    seed: int
    expected: dict[str, Any]  # the course's grading manifest
    sandbox: str = "bubblewrap"
    branch: str | None = None
    snapshot: snapshot.Snapshot | None = None  # the heads seen at the deadline
    deadline: datetime | None = None  # what a backdated commit is compared with
    branches: dict[str, str] = field(default_factory=dict)  # a learner's own, from the roster
    release: str = releases.OWN  # --release: own, current, or the commit of one release


def grade_submission(who: Learner, source: str, run: Run) -> list[ExerciseResult]:
    """Fetch, check and grade one submission against what its learner was given (their
    release, :mod:`.releases`); its rows (``who`` gets the flags)."""
    with tempfile.TemporaryDirectory(prefix="regrade-") as tmp:
        seen = None
        if run.snapshot is not None:
            seen = run.snapshot.seen.get(who.learner)
            if seen is None:
                raise SubmissionError(f"{who.learner} is not in the snapshot of "
                                      f"{run.snapshot.taken_at}")
            if not seen.commit:
                raise SubmissionError(f"at the deadline's snapshot ({seen.seen_at}) its "
                                      f"repository could not be read: {seen.error}")
        # with a snapshot, the branch it recorded (a roster naming another was refused)
        branch = seen.branch if seen is not None else (run.branches.get(who.learner)
                                                       or run.branch)
        pinned = branch is not None or seen is not None
        if is_git_url(source) or (pinned and real_dir(Path(source) / ".git")):
            root = repositories.fetch(source, Path(tmp) / "clone", who, branch, seen,
                                      run.deadline, is_url=is_git_url(source))
        elif pinned:
            raise SubmissionError(f"{who.source} is not a git repository: --branch and "
                                  f"--snapshot need one")
        else:
            root = Path(source)
            if not real_dir(root):
                raise SubmissionError(f"{who.source} is not a folder (nor a git URL)")
        basis = releases.for_learner(root, run.release, who)
        graded = [e.id for e in engine.exercise_points(run.chapters)
                  if basis.exercises is None or e.id in basis.exercises]
        who.release, who.release_note = basis.commit, basis.note
        who.not_in_release = {e: why for e, why in basis.left_out.items()
                              if ExerciseId(e).chapter in run.chapters}
        compared = releases.workflows_folder(basis, Path(tmp) / "release-workflows")
        check_workflows(root, who, compared)
        check_tests(root, basis.grading_files or run.expected, who)
        check_reports(root, who)
        impl = Path(tmp) / EXERCISES_DIR.name
        impl.mkdir()
        collect_exercises(root, run.chapters, impl, who, basis.stubs)
        if not graded:
            return []
        spec = RunSpec.new(str(impl), seed=run.seed, sandbox=run.sandbox, exercises=graded)
        return engine.grade(spec, run.chapters).rows()  # GraderFault: not the learner's doing


def rows_for(who: Learner, results: list[ExerciseResult]) -> list[ExerciseResult]:
    """The gradebook's rows of one learner: their results, with whose they are and of
    which run (what the code printed stays in the learner's own report)."""
    who.points = round(sum(r.points for r in results), 2)
    who.max_points = round(sum(r.max_points for r in results), 2)
    return [replace(r, printed="", learner=who.learner, flags=";".join(sorted(who.flags)),
                    seed=who.seed, graded_at=who.graded_at) for r in results]


def error_row(who: Learner, error: BaseException, possible: float) -> ExerciseResult:
    """The one row of a submission that could not be graded: 0 points."""
    who.status, who.points, who.max_points = "error", 0, possible
    return ExerciseResult("", 0, "", 0, possible, Outcome.ERROR,
                          f"not graded: {type(error).__name__}: {error}",
                          learner=who.learner, flags=";".join(sorted(who.flags)),
                          seed=who.seed, graded_at=who.graded_at)


def grade_one(source: str, name: str, run: Run,
              position: str) -> tuple[Learner, list[ExerciseResult]]:
    """One learner's rows; a submission that cannot be graded gets one ``error`` row."""
    who = Learner(name, without_credentials(source), seed=run.seed)
    print(f"[{position}] grading {name} ({who.source})", flush=True)
    started = time.monotonic()
    try:
        results = grade_submission(who, source, run)
        who.graded_at, who.seconds = _now(), round(time.monotonic() - started, 1)
        return who, rows_for(who, results)
    except Exception as error:  # one submission must not stop the others
        who.graded_at, who.seconds = _now(), round(time.monotonic() - started, 1)
        return who, [error_row(who, error, _possible_points(run.chapters,
                                                           who.not_in_release))]


def regrade(sources: list[str], names: list[str], run: Run, jobs: int = 1,
            on_graded: Callable[[Learner, list[ExerciseResult]], None] | None = None,
            ) -> list[tuple[Learner, list[ExerciseResult]]]:
    """Grade every submission, ``jobs`` at a time (each in a process of its own, with its
    own worker and sandbox, all with the run's seed: the grader's checks parse Python, which
    threads of one interpreter cannot do safely at once); ``on_graded`` gets each learner's
    rows as soon as they are done (in this process, one at a time). A failure costs only
    its own rows."""
    tasks = [(source, name, run, f"{i}/{len(names)}")
             for i, (source, name) in enumerate(zip(sources, names, strict=True), 1)]
    done: list[tuple[Learner, list[ExerciseResult]]] = []

    def finished(who: Learner, rows: list[ExerciseResult]) -> None:
        done.append((who, rows))
        if on_graded is not None:
            on_graded(who, rows)
        print(summary_line(who), flush=True)

    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            finished(*grade_one(*task))
        return done
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=engine.die_with_parent) as pool:
        futures = {pool.submit(grade_one, *task): task for task in tasks}
        for future in as_completed(futures):
            try:
                finished(*future.result())
            except Exception as error:  # its process died (killed, out of memory)
                source, name = futures[future][:2]
                who = Learner(name, without_credentials(source), seed=run.seed,
                              graded_at=_now())
                finished(who, [error_row(who, RuntimeError(
                    f"the process grading this submission stopped ({error!r})"),
                    _possible_points(run.chapters))])
    return done


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _possible_points(chapters: list[int], left_out: Container[str] = ()) -> float:
    """The points on offer in these chapters, but for the exercises ``left_out`` (0 when
    even that cannot be read)."""
    try:
        return round(sum(r.max_points for r in engine.exercise_points(chapters)
                         if r.id not in left_out), 2)
    except Exception:  # only the error row's max_points depends on it
        return 0.0


def summary_line(who: Learner) -> str:
    """One line a learner for the terminal."""
    flags = f"  [{', '.join(sorted(who.flags))}]" if who.flags else ""
    state = "NOT GRADED (error)" if who.status == "error" else "points"
    return (f"{who.learner}: {who.points:g}/{who.max_points:g} {state} in {who.seconds:.0f} s"
            f"{flags}")


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m annotated_transformer regrade",
                     description="Grade many submissions with the course's own tests and "
                     "grader into one gradebook (CSV and JSON), a wide CSV for an LMS, a "
                     "feedback file per learner and the class's summary. A gradebook already "
                     "in --out is updated: the learners graded replace their own rows only. "
                     "'regrade snapshot URL ... --out DIR' records each repository's head "
                     "at a deadline (then --snapshot FILE); 'regrade merge DIR ... --out DIR' "
                     "merges gradebooks (shards); 'regrade export --out DIR' writes the "
                     "gradebook as the CSV an LMS imports.")
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help="a submission's folder or git URL (or --roster)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the class's folder: gradebook.csv, gradebook.json, "
                        "grades-wide.csv, feedback/, class-summary.md and .png (updated)")
    parser.add_argument("--roster", type=Path, metavar="FILE",
                        help="a CSV (learner, repository, branch, lms_id, section): grade each "
                        "line's repository at its branch, under its name")
    parser.add_argument("--chapter", type=int, action="append",
                        help="grade this chapter only (repeatable; default: every chapter)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="the seed of the tests' random inputs, the same for every "
                        "submission of this run (default: a fresh one each run; a learner's "
                        "feedback names their run's, so a later run must not reuse it)")
    parser.add_argument("--names", metavar="A,B,...",
                        help="the learners' names, one per submission, in order (default: "
                        "each folder's or repository's name)")
    parser.add_argument("--snapshot", type=Path, metavar="FILE",
                        help="grade each repository at the commit 'regrade snapshot' saw at "
                        "the deadline on the branch it recorded (a roster or --branch that "
                        "names another is refused; commits pushed later are flagged with "
                        "their dates)")
    parser.add_argument("--deadline", metavar="WHEN",
                        help="with --snapshot: the deadline, e.g. 2026-12-01T23:59+01:00, "
                        "that a later commit claiming an earlier date is flagged against "
                        "(default: the snapshot's)")
    parser.add_argument("--branch", metavar="NAME",
                        help="grade this branch of each repository (default: its default "
                        "branch)")
    parser.add_argument("--overrides", type=Path, metavar="FILE",
                        help="a CSV of manual adjustments (columns learner, exercise, points, "
                        "reason), kept in the gradebook and shown in every output")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="grade N learners at once (default: the number of cores)")
    parser.add_argument("--shard", metavar="K/N",
                        help="grade only the K-th of N shares of the submissions (1 <= K <= N), "
                        "to split a class over machines; then 'regrade merge'")
    parser.add_argument("--release", default=releases.OWN, metavar="WHICH",
                        help=f"what each learner is graded against: 'own' (default), the "
                        f"release their repository's {release_record.RECORD} names, read "
                        f"from the course's history (only its exercises graded; without the "
                        f"file, the course as it is now); 'current', every exercise of the "
                        f"course as it is now (a class moved to a newer release); or a "
                        f"commit or tag of the course, the release made from it, for every "
                        f"learner")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, metavar="PATH",
                        help=f"the manifest of the grading files that a learner graded on "
                        f"the course as it is now is compared with (default: the course's "
                        f"{relative(MANIFEST)}; a learner's release brings its own)")
    parser.add_argument("--unsafe", action="store_true",
                        help="grade without the sandbox where bubblewrap cannot start: the "
                        "learners' code then runs with your rights, and could read or change "
                        "your files (default: refuse)")
    return parser


def shard_of(text: str, count: int) -> list[int]:
    """The positions of the submissions in shard ``K/N``."""
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise ValueError(f"--shard must be K/N with 1 <= K <= N, got {text!r}")
    k, n = int(match[1]), int(match[2])
    return [i for i in range(count) if i % n == k - 1]


def about_run(seed: int, sandbox: str) -> dict[str, Any]:
    """What a gradebook says of the run that last wrote it."""
    return {"seed": seed, "course": {"root": str(ROOT), "commit": _course_commit()},
            "sandbox": boundary.describe(sandbox == "bubblewrap"), "flags": FLAGS}


def _course_commit() -> str | None:
    """The course's commit, when it is a git checkout."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip() if done.returncode == 0 else ""
    return commit or None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    if argv[:1] == ["snapshot"]:
        return snapshot_main(argv[1:])
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    branches: dict[str, str] = {}
    try:
        if args.roster is not None:
            if args.submissions or args.names:
                raise ValueError("--roster names the submissions and the learners: give no "
                                 "SUBMISSION and no --names with it")
            args.submissions, learners, branches = lms.repositories_of(args.roster)
            args.names = ",".join(learners)
        if not args.submissions:
            raise ValueError("give each SUBMISSION (a folder or a git URL), or --roster FILE")
        chapters = sorted(chapter_test_files(args.chapter))
        names = learner_names(args.submissions, args.names)
        expected = manifest.load(args.manifest)
        deadline = repositories.parse_deadline(args.deadline) if args.deadline else None
        if deadline is not None and args.snapshot is None:
            raise ValueError("--deadline alone cannot choose a commit: git's dates are the "
                             "learner's to set. Take 'regrade snapshot' at the deadline, then "
                             "grade with --snapshot FILE")
        taken = snapshot.load(args.snapshot) if args.snapshot is not None else None
        if taken is not None and deadline is None:
            deadline = repositories.parse_deadline(taken.deadline or taken.taken_at)
        if taken is not None:  # a branch graded must be the one the snapshot recorded
            snapshot.check_branches(taken, {n: branches.get(n) or args.branch for n in names})
        release = args.release
        if release not in (releases.OWN, releases.CURRENT):
            release = release_record.at_commit(release_record.resolve(release)).commit
        chosen = (shard_of(args.shard, len(names)) if args.shard
                  else list(range(len(names))))
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is not a folder")
        overrides = (gradebook.read_overrides(args.overrides) if args.overrides is not None
                     else [])
        for name in course_exercise_files().values():  # what a missing file is graded as
            pristine_stub(name)
    except (OSError, ValueError, RuntimeError) as error:
        parser.error(str(error))
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed must be 0 or more, got {args.seed}")
    if args.jobs < 1:
        parser.error(f"--jobs must be 1 or more, got {args.jobs}")
    try:
        sandbox = boundary.decide("auto" if args.unsafe else "bubblewrap")
    except ValueError as why:
        parser.error(f"regrade runs each learner's code in a sandbox, and bubblewrap cannot "
                     f"start here: {why}. Install it (Debian/Ubuntu: apt-get install "
                     f"bubblewrap), or pass --unsafe to grade without it (the learners' code "
                     f"then runs with your rights)")
    seed = args.seed if args.seed is not None else draw_seed()
    run = Run(chapters, seed, expected, sandbox, args.branch, taken, deadline, branches,
              release)
    try:
        with gradebook.locked(args.out):  # read, graded and written by this run alone
            try:
                book = gradebook.read(args.out)
            except (OSError, ValueError) as error:
                parser.error(str(error))
            book.add_overrides(overrides)
            return _regrade_into(book, args, run, [args.submissions[i] for i in chosen],
                                 [names[i] for i in chosen])
    except gradebook.FolderBusy as error:
        parser.error(str(error))


def _regrade_into(book: gradebook.Gradebook, args: argparse.Namespace, run: Run,
                  sources: list[str], names: list[str]) -> int:
    """Grade ``sources`` into ``book``, written to ``--out`` as each learner is done."""
    chapters, seed, sandbox = run.chapters, run.seed, run.sandbox
    book.chapters = sorted(set(book.chapters) | set(chapters))
    earlier = list(book.learners)
    about = about_run(seed, sandbox)
    print(f"Re-grading {len(names)} submission(s), chapters {chapters}, seed {seed}, "
          f"{args.jobs} at a time, sandbox: {sandbox}; writing to {args.out} as each "
          f"learner is done", flush=True)

    def keep(who: Learner, rows: list[ExerciseResult]) -> None:  # at once: a stop loses none
        book.put(who, rows, chapters)
        gradebook.write(args.out, book, about)

    graded = regrade(sources, names, run, args.jobs, on_graded=keep)
    book.order([*earlier, *names])
    flag_against_class(book)
    warn_unmatched(book, args.out)
    write_all(args.out, book, about)
    print(f"Gradebook: {args.out / 'gradebook.csv'}, {args.out / 'gradebook.json'}, "
          f"{args.out / 'grades-wide.csv'} and {args.out / 'feedback'}/")
    print(f"Class summary: {args.out / 'class-summary.md'} and {args.out / 'class-summary.png'}"
          f" ({len(book.learners)} learner(s))")
    return 1 if any(who.status == "error" for who, _ in graded) else 0
