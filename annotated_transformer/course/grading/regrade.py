"""Re-grade many submissions into one gradebook: the grade an instructor can trust.

    python -m annotated_transformer regrade ~/subs/alice ~/subs/bob --out grades
    python -m annotated_transformer regrade https://github.com/org/t-alice.git \\
        https://github.com/org/t-bob.git --names alice,bob --out grades --chapter 1 --seed 7

Each SUBMISSION is a folder or a git URL (cloned with ``git clone --depth 1``). Of each,
only the regular files ``exercises/chNN_*.py`` that carry the name of one of the course's
exercise files are copied, none larger than 1 MB and no symbolic link followed, into a fresh
folder; the course's own stub stands in for a chapter the submission lacks. That folder is
graded by the course's tests and grader, one submission after the other, every one with the
same seed (drawn once, unless ``--seed``, and written to the gradebook). Nothing else of a
submission runs: its tests, grader, workflows and committed reports are only compared with
the course's, and each difference is a flag (see ``FLAGS``). A flag is a reason to look,
not a verdict; the points come from the learner's exercise files alone. The learners' code
runs inside bubblewrap (see :mod:`~annotated_transformer.course.grading.boundary`): it sees
its own exercise files and the grader's package and probes, read-only, and nothing else
(not the course's reference or ``.git``, not the other submissions, not the gradebook), and
nothing it starts outlives it. Where bubblewrap cannot start, ``--unsafe`` is needed.

Writes ``DIR/gradebook.csv`` and ``DIR/gradebook.json``, one row per learner and exercise
(with the id of the known mistake the grader named, if any), and the class's summary beside
them: ``DIR/class-summary.md`` and ``DIR/class-summary.png``, per exercise how many learners
pass and the named mistakes with how many learners made each, most common first (see
:mod:`~annotated_transformer.course.grading.class_summary`).
A submission that cannot be cloned or graded gets one row with status ``error`` and 0
points, and the others go on. Exit status: 0, 1 when some submission got an ``error`` row,
2 (with one ``error:`` line) for bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading import boundary, class_summary, grade, manifest
from annotated_transformer.course.grading.report import ExerciseResult, write_report
from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    MANIFEST,
    PACKAGE_DIR,
    ROOT,
    TESTS_DIR,
    WORKFLOWS_DIR,
    chapter_test_files,
    relative,
)

MAX_BYTES = 1_000_000  # the largest file copied out of a submission (1 MB)
MAX_FILES = 5_000  # the most files of a submission looked at for one check
CLONE_TIMEOUT = 300  # seconds
REPORT_NAMES = ("grade.json", "grade.md", "grade.xml")
FLAGS = {
    "workflow-changed": "a .github/workflows/*.yml differs from the course's copy, or was added",
    "tests-changed": "a file that decides a grade (tests, grader, pytest settings) differs "
                     "from the course's manifest",
    "committed-report": "the submission holds a grade.json, grade.md or grade.xml (ignored)",
    "symlink": "a symbolic link where the grader looks (not followed, not used)",
    "oversized": "a file over 1 MB where the grader looks (not used)",
    "not-a-file": "something other than a regular file where an exercise file goes (not used)",
    "extra-file": "an exercises/chNN_*.py that is not one of the course's exercise files "
                  "(not used)",
    "missing-chapter": "no usable file for a graded chapter (the course's stub graded instead)",
}
COLUMNS = ("learner", "exercise", "title", "points", "max_points", "status", "message", "flags",
           "seed", "mistake")


class SubmissionError(RuntimeError):
    """A submission that cannot be fetched or read; its learner gets an ``error`` row."""


@dataclass
class Learner:
    """One submission: who, from where, and what its checks found (flag: [what, ...])."""

    learner: str
    source: str
    flags: dict[str, list[str]] = field(default_factory=dict)
    status: str = "graded"  # or "error"
    points: float = 0
    max_points: float = 0

    def flag(self, name: str, what: str) -> None:
        """Record one finding of the check ``name``."""
        self.flags.setdefault(name, []).append(what)


@dataclass
class Row:
    """One line of the gradebook: a learner's exercise."""

    learner: str
    exercise: str
    title: str
    points: float
    max_points: float
    status: str
    message: str
    flags: str  # the learner's flags, joined with ";"
    seed: int
    mistake: str = ""  # the id of the known mistake the grader named (tests/graded/mistakes.py)


# ---------------------------------------------------------------- fetching a submission


def is_git_url(text: str) -> bool:
    """Whether ``text`` names a repository to clone rather than a folder."""
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text)
                or re.match(r"^[\w.-]+@[\w.-]+:", text))


def without_credentials(source: str) -> str:
    """A URL as the gradebook may show it: no user or token before the host."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", source)


def default_name(source: str) -> str:
    """A learner's name from the submission: the folder's or the repository's name."""
    if is_git_url(source):
        tail = re.split(r"[/:]", source.rstrip("/"))[-1]
        return tail.removesuffix(".git") or "submission"
    return Path(source).resolve().name or "submission"


def clone(url: str, dest: Path) -> None:
    """``git clone --depth 1`` of ``url`` into ``dest``, without prompting for a password."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1"}
    command = ["git", "-c", "protocol.ext.allow=never", "clone", "--depth", "1", "--quiet",
               "--", url, str(dest)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=CLONE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SubmissionError(f"cannot clone {without_credentials(url)}: {error}") from error
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"git exited {done.returncode}"])[-1]
        raise SubmissionError(f"cannot clone {without_credentials(url)}: {why}")


# ---------------------------------------------------------------- reading it without trusting it


def read_regular(path: Path, limit: int = MAX_BYTES) -> bytes | str:
    """The bytes of a regular file of at most ``limit`` bytes, else the flag that says why
    not (``symlink``, ``not-a-file``, ``oversized``). A link is never followed."""
    try:
        if stat.S_ISLNK(path.lstat().st_mode):
            return "symlink"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "not-a-file"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return "not-a-file"
        data = handle.read(limit + 1)
    return "oversized" if len(data) > limit else data


def real_dir(path: Path) -> bool:
    """Whether ``path`` is a folder and not a link to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def course_exercise_files() -> dict[int, str]:
    """``{chapter: file name}`` of the course's exercise files."""
    return {int(m["chapter"]): p.name for p in sorted(EXERCISES_DIR.glob("ch*.py"))
            if (m := CHAPTER_FILE.match(p.name))}


def collect_exercises(root: Path, chapters: list[int], dest: Path, who: Learner) -> None:
    """Copy the submission's usable exercise files into ``dest``; the course's stub for any
    other chapter. Flags what was left out, and each graded chapter without a usable file."""
    names = course_exercise_files()
    folder = root / relative(EXERCISES_DIR)
    copied: set[str] = set()
    if os.path.islink(folder):
        who.flag("symlink", relative(EXERCISES_DIR) + "/")
    elif real_dir(folder):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name)[:MAX_FILES]:
            if not CHAPTER_FILE.match(entry.name):
                continue
            if entry.name not in names.values():
                who.flag("extra-file", relative(EXERCISES_DIR / entry.name))
                continue
            data = read_regular(Path(entry.path))
            if isinstance(data, str):
                who.flag(data, relative(EXERCISES_DIR / entry.name))
                continue
            (dest / entry.name).write_bytes(data)
            copied.add(entry.name)
    for chapter, name in names.items():
        if name not in copied:
            shutil.copyfile(EXERCISES_DIR / name, dest / name)
            if chapter in chapters:
                who.flag("missing-chapter", f"chapter {chapter} ({name})")


def stage_grading_files(root: Path, dest: Path, who: Learner) -> None:
    """Copy into ``dest`` the files of ``root`` that the manifest check reads (Python files
    and pytest settings of the tests and the package, the repository's top), regular files
    of at most 1 MB only; a link or a larger file is flagged and left out (so it shows as
    changed)."""
    wanted = {"pyproject.toml", "conftest.py", *manifest.CONFIG_FILES}
    places = [(root, False), (root / relative(TESTS_DIR), True),
              (root / relative(PACKAGE_DIR), True)]
    seen = 0
    for top, recursive in places:
        if not real_dir(top):
            continue
        for folder, dirs, files in os.walk(top):
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            for link in links if recursive else []:
                who.flag("symlink", Path(folder, link).relative_to(root).as_posix() + "/")
            dirs[:] = sorted(d for d in dirs if recursive and d not in links)
            for name in sorted(files):
                if not (name.endswith(".py") or name in wanted) or seen >= MAX_FILES:
                    continue
                if top == root and name not in wanted:
                    continue
                seen += 1
                path = Path(folder, name)
                inside = path.relative_to(root)
                data = read_regular(path)
                if isinstance(data, str):
                    who.flag(data, inside.as_posix())
                    continue
                (dest / inside).parent.mkdir(parents=True, exist_ok=True)
                (dest / inside).write_bytes(data)
            if not recursive:
                break


def check_tests(root: Path, expected: dict[str, Any], who: Learner) -> None:
    """Flag ``tests-changed`` for each grading file that differs from the course's manifest."""
    with tempfile.TemporaryDirectory(prefix="regrade-staged-") as staged:
        stage_grading_files(root, Path(staged), who)
        try:
            changes = manifest.verify(expected, Path(staged))
        except (OSError, ValueError) as error:
            changes = {"(submission)": grade.cut(f"unreadable: {error}", 300)}
    for path, change in changes.items():
        who.flag("tests-changed", f"{path} ({change})")


def check_workflows(root: Path, who: Learner) -> None:
    """Flag ``workflow-changed`` for each workflow file that is not the course's copy."""
    for name, how in grade.workflow_changes(root).items():
        path = name if "/" in name else relative(WORKFLOWS_DIR / name)
        who.flag("workflow-changed", f"{path} ({how})")


def check_reports(root: Path, who: Learner) -> None:
    """Flag ``committed-report`` for each grade.json/.md/.xml in the submission."""
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in sorted(files):
            seen += 1
            if name in REPORT_NAMES:
                who.flag("committed-report", Path(folder, name).relative_to(root).as_posix())
        if seen > 20 * MAX_FILES:
            break


# ---------------------------------------------------------------- grading


def grade_submission(who: Learner, chapters: list[int], seed: int,
                     expected: dict[str, Any], sandbox: str) -> list[ExerciseResult]:
    """Fetch, check and grade one submission; its rows (``who`` gets the flags)."""
    with tempfile.TemporaryDirectory(prefix="regrade-") as tmp:
        if is_git_url(who.source):
            root = Path(tmp) / "clone"
            clone(who.source, root)
        else:
            root = Path(who.source)
            if not real_dir(root):
                raise SubmissionError(f"{who.source} is not a folder (nor a git URL)")
        check_workflows(root, who)
        check_tests(root, expected, who)
        check_reports(root, who)
        impl = Path(tmp) / EXERCISES_DIR.name
        impl.mkdir()
        collect_exercises(root, chapters, impl, who)
        rows = grade.grade(chapters, str(impl), seed=seed, cache_dir=None, sandbox=sandbox)[1]
        fault = next((r for r in rows if r.status == "grader error"), None)
        if fault is not None:  # not the learner's doing: no row of points from this run
            raise RuntimeError(fault.message)
        return rows


def rows_for(who: Learner, results: list[ExerciseResult], seed: int) -> list[Row]:
    """The gradebook's rows of one learner."""
    flags = ";".join(sorted(who.flags))
    who.points = round(sum(r.points for r in results), 2)
    who.max_points = round(sum(r.max_points for r in results), 2)
    return [Row(who.learner, r.id, r.title, r.points, r.max_points, r.status,
                grade.cut(r.message), flags, seed, r.mistake) for r in results]


def error_row(who: Learner, error: BaseException, seed: int, possible: float) -> Row:
    """The one row of a submission that could not be graded: 0 points."""
    who.status, who.points, who.max_points = "error", 0, possible
    message = grade.cut(f"not graded: {type(error).__name__}: {error}")
    return Row(who.learner, "", "", 0, possible, "error", message,
               ";".join(sorted(who.flags)), seed)


def regrade(sources: list[str], names: list[str], chapters: list[int], seed: int,
            expected: dict[str, Any], sandbox: str = "bubblewrap",
            ) -> tuple[list[Learner], list[Row]]:
    """Grade every submission, one after the other; a failure costs only its own rows."""
    learners, rows = [], []
    possible: float | None = None
    for source, name in zip(sources, names, strict=True):
        who = Learner(name, without_credentials(source))
        learners.append(who)
        try:
            results = grade_submission(who, chapters, seed, expected, sandbox)
            rows += rows_for(who, results, seed)
            possible = who.max_points
        except Exception as error:  # one submission must not stop the others
            if possible is None:
                possible = _possible_points(chapters)
            rows.append(error_row(who, error, seed, possible))
        print(summary_line(who), flush=True)
    return learners, rows


def _possible_points(chapters: list[int]) -> float:
    """The points on offer in these chapters (0 when even that cannot be read)."""
    try:
        return round(sum(r.max_points for r in grade.exercise_points(chapters)), 2)
    except Exception:  # only the error row's max_points depends on it
        return 0.0


def summary_line(who: Learner) -> str:
    """One line a learner for the terminal."""
    flags = f"  [{', '.join(sorted(who.flags))}]" if who.flags else ""
    state = "NOT GRADED (error)" if who.status == "error" else "points"
    return f"{who.learner}: {who.points:g}/{who.max_points:g} {state}{flags}"


# ---------------------------------------------------------------- the gradebook


def spreadsheet_safe(value: Any) -> Any:
    """A cell that a spreadsheet shows as text, never runs as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def gradebook_csv(rows: list[Row]) -> str:
    """The gradebook as CSV: a header, then one line a learner's exercise."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([spreadsheet_safe(getattr(row, c)) for c in COLUMNS])
    return out.getvalue()


def gradebook_json(learners: list[Learner], rows: list[Row], chapters: list[int],
                   seed: int, sandbox: str = "bubblewrap") -> dict[str, Any]:
    """The gradebook as JSON: the seed, the course, each learner's total and flags, the rows."""
    return {
        "seed": seed,
        "chapters": chapters,
        "course": {"root": str(ROOT), "commit": _course_commit()},
        "sandbox": boundary.describe(sandbox == "bubblewrap"),
        "flags": FLAGS,
        "learners": [asdict(who) for who in learners],
        "rows": [asdict(row) for row in rows],
    }


def _course_commit() -> str | None:
    """The course's commit, when it is a git checkout."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip() if done.returncode == 0 else ""
    return commit or None


def write_gradebook(out: Path, learners: list[Learner], rows: list[Row], chapters: list[int],
                    seed: int, sandbox: str = "bubblewrap") -> None:
    """Write ``gradebook.csv`` and ``gradebook.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "gradebook.csv", gradebook_csv(rows))
    data = gradebook_json(learners, rows, chapters, seed, sandbox)
    write_report(out / "gradebook.json", json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``error:`` line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m annotated_transformer regrade",
                     description="Grade many submissions with the course's own tests and "
                     "grader into one gradebook (CSV and JSON).")
    parser.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                        help="a submission's folder or git URL (cloned with --depth 1)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="where to write gradebook.csv, gradebook.json and the class "
                        "summary (class-summary.md, class-summary.png)")
    parser.add_argument("--chapter", type=int, action="append",
                        help="grade this chapter only (repeatable; default: every chapter)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="the seed of the tests' random inputs, the same for every "
                        "submission (default: one drawn for this run, written to the gradebook)")
    parser.add_argument("--names", metavar="A,B,...",
                        help="the learners' names, one per submission, in order (default: "
                        "each folder's or repository's name)")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, metavar="PATH",
                        help=f"the manifest of the grading files (default: the course's "
                        f"{relative(MANIFEST)})")
    parser.add_argument("--unsafe", action="store_true",
                        help="grade without the sandbox where bubblewrap cannot start: the "
                        "learners' code then runs with your rights, and could read or change "
                        "your files (default: refuse)")
    return parser


def learner_names(sources: list[str], names: str | None) -> list[str]:
    """One distinct name per submission: those given, else each one's own (numbered when
    two are alike)."""
    if names is not None:
        given = [n.strip() for n in names.split(",")]
        if len(given) != len(sources):
            raise ValueError(f"--names gives {len(given)} name(s) for {len(sources)} "
                             f"submission(s)")
        if not all(given) or len(set(given)) != len(given):
            raise ValueError(f"--names must be distinct and not empty, got {names!r}")
        return given
    found: list[str] = []
    for source in sources:
        name, number = default_name(source), 2
        while name in found:
            name, number = f"{default_name(source)}-{number}", number + 1
        found.append(name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        chapters = sorted(chapter_test_files(args.chapter))
        names = learner_names(args.submissions, args.names)
        expected = manifest.load(args.manifest)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed must be 0 or more, got {args.seed}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is not a folder")
    why = boundary.unavailable()
    if why and not args.unsafe:
        parser.error(f"regrade runs each learner's code in a sandbox, and bubblewrap cannot "
                     f"start here: {why}. Install it (Debian/Ubuntu: apt-get install "
                     f"bubblewrap), or pass --unsafe to grade without it (the learners' code "
                     f"then runs with your rights)")
    sandbox = "none" if why else "bubblewrap"
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    print(f"Re-grading {len(names)} submission(s), chapters {chapters}, seed {seed}, "
          f"sandbox: {sandbox}", flush=True)
    learners, rows = regrade(args.submissions, names, chapters, seed, expected, sandbox)
    write_gradebook(args.out, learners, rows, chapters, seed, sandbox)
    print(f"Gradebook: {args.out / 'gradebook.csv'} and {args.out / 'gradebook.json'}")
    summary = class_summary.write(args.out, rows, len(learners))
    print(f"Class summary: {' and '.join(map(str, summary))}")
    return 1 if any(who.status == "error" for who in learners) else 0


if __name__ == "__main__":
    sys.exit(main())
