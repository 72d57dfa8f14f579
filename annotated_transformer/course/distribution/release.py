"""Write a student release of the course: the repository without its answers.

    python -m annotated_transformer release ../course-release                # grade.yml
    python -m annotated_transformer release ../course-template --workflow classroom

A release is what an instructor hands to learners: a GitHub Classroom template, or a
repository they copy privately. It holds the course's tracked files (as committed;
``--allow-dirty`` takes uncommitted edits too) except

- the answers: ``solutions/``, the fast parts (``annotated_transformer/fast_parts/``,
  the same answers on fused kernels) and ``tests/variants/`` (wrong and other right
  answers);
- the course's tests of itself: of ``tests/``, only ``tests/graded/`` is kept, whole
  (the graded tests, their helpers and the grading manifest);
- what only the course's maintainers run: ``.ci/``, ``CONTRIBUTING.md``, the book's
  deployment workflow, and one of the two grading workflows (``--workflow grade`` keeps
  ``grade.yml``, for a learner's own copy; ``--workflow classroom`` keeps
  ``classroom.yml``, for GitHub Classroom);

with ``exercises/`` written afresh from the solutions (whatever the maintainer's copy
holds), the README's course-only passages swapped for the release's (the HTML
comments ``<!-- course-only -->`` ... ``<!-- /course-only -->`` and
``<!-- release-only ... -->``), and ``course-release.json``, the record of what the release
is (its commit, exercises and points, and the hashes of its stubs, grading files and
workflow: :mod:`.release_record`), by which ``regrade`` grades a learner on the exercises
their release offered.

In a release, whatever the course takes from the reference comes from the learner's
``exercises/`` (see :mod:`annotated_transformer.parts`): each notebook runs up to the
first cell that needs an unfinished exercise, the command line trains the learner's
model once its parts are written, and grading reports every exercise ``not
implemented`` until then.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.distribution import release_record
from annotated_transformer.layout import (
    EXERCISES_DIR,
    GRADED_DIR,
    PARTS_PACKAGES,
    ROOT,
    SOLUTIONS_DIR,
    TESTS_DIR,
    VARIANTS_DIR,
    WORKFLOWS_DIR,
    folder_name,
    relative,
)

# Left out of every release (folders end with "/").
ANSWERS = tuple(folder_name(d) for d in (SOLUTIONS_DIR, *PARTS_PACKAGES.values(), VARIANTS_DIR))
# The course's own checks and tools, which need the reference or the variants, or would write
# the stubs' errors into the notebooks' committed outputs (execute_notebooks.sh).
MAINTAINERS_ONLY = (".ci/", "CONTRIBUTING.md", relative(WORKFLOWS_DIR / "book.yml"),
                    *(f"scripts/{name}" for name in (
                        "bench_grading.py", "execute_notebooks.sh",
                        "simulate_class.py", "worst_learner.py")))
WORKFLOWS = {name: relative(WORKFLOWS_DIR / f"{name}.yml") for name in ("grade", "classroom")}
TESTS, GRADED = folder_name(TESTS_DIR), folder_name(GRADED_DIR)
COURSE_ONLY = re.compile(r"^<!-- course-only -->\n.*?^<!-- /course-only -->\n",
                         re.MULTILINE | re.DOTALL)
RELEASE_ONLY = re.compile(r"^<!-- release-only\n(.*?)^-->\n", re.MULTILINE | re.DOTALL)


class ReleaseError(RuntimeError):
    """The release cannot be made (not a git clone, an output folder in the way, ...)."""


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise ReleaseError("a release is made from a git clone of the course; git is "
                           "not installed") from error
    if done.returncode != 0:
        raise ReleaseError(f"a release is made from a git clone of the course; `git "
                           f"{' '.join(args)}` in {ROOT} failed: {done.stderr.strip()}")
    return done.stdout


def _left_out(path: str, left_out: tuple[str, ...]) -> bool:
    """Whether ``path`` stays out: under (or equal to) one of ``left_out``, or a file of
    ``tests/`` outside ``tests/graded/``."""
    if any(path == prefix or (prefix.endswith("/") and path.startswith(prefix))
           for prefix in left_out):
        return True
    return path.startswith(TESTS) and not path.startswith(GRADED)


def release_readme(text: str) -> str:
    """The README of a release: course-only passages out, release-only ones in."""
    return RELEASE_ONLY.sub(r"\1", COURSE_ONLY.sub("", text))


def release_files(workflow: str = "grade") -> list[str]:
    """The tracked files (relative paths) that a release copies."""
    if workflow not in WORKFLOWS:
        raise ReleaseError(f"--workflow is one of {', '.join(WORKFLOWS)}, got {workflow!r}")
    other_workflows = tuple(p for name, p in WORKFLOWS.items() if name != workflow)
    left_out = (*ANSWERS, *MAINTAINERS_ONLY, *other_workflows)
    tracked = _git("ls-files", "-z").split("\0")
    return [path for path in tracked if path and (ROOT / path).is_file()
            and not _left_out(path, left_out)]


def write_release(out: Path, workflow: str = "grade", allow_dirty: bool = False) -> list[str]:
    """Write the release into the new (or empty) folder ``out``; return its files."""
    out = Path(out)
    if not SOLUTIONS_DIR.is_dir():
        raise ReleaseError(f"{ROOT} has no {folder_name(SOLUTIONS_DIR)}: a release is made "
                           f"from the course's repository, not from a release")
    top = Path(_git("rev-parse", "--show-toplevel").strip())
    if top.resolve() != ROOT.resolve():
        raise ReleaseError(f"{ROOT} is not the top folder of its git repository ({top}); a "
                           f"release is made from a git clone of the course")
    if out.resolve() == ROOT.resolve() or ROOT.resolve() in out.resolve().parents:
        raise ReleaseError(f"the release goes outside the course's folder, not to {out}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not an empty folder")
    changed = _git("status", "--porcelain", "--untracked-files=no").rstrip()
    if changed and not allow_dirty:
        raise ReleaseError("the course has uncommitted changes, which a release would "
                           "take along; commit them, or pass --allow-dirty:\n" + changed)
    files = release_files(workflow)
    for path in files:
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, target)
    readme = out / "README.md"
    if readme.is_file():
        readme.write_text(release_readme(readme.read_text()))
    exercises = out / relative(EXERCISES_DIR)
    for stale in exercises.glob("ch*.py"):
        stale.unlink()
    written = stubs.write_stubs(exercises, force=True)
    if not written:
        raise ReleaseError(f"no stubs were written to {exercises}")
    written.append(release_record.write(out, _git("rev-parse", "HEAD").strip(),
                                        uncommitted=bool(changed)))
    return sorted(set(files) | {p.relative_to(out).as_posix() for p in written})


def _summary(out: Path, files: Iterable[str], workflow: str) -> str:
    commit = _git("rev-parse", "HEAD").strip()
    dirty = " with uncommitted changes" if _git("status", "--porcelain",
                                                "--untracked-files=no").strip() else ""
    grading = ("GitHub Classroom (classroom.yml)" if workflow == "classroom"
               else "a learner's own copy (grade.yml)")
    return "\n".join([
        f"Wrote a student release of commit {commit[:12]}{dirty} to {out} "
        f"({len(list(files))} files), graded in CI for {grading}; "
        f"{release_record.RECORD} records what it is, for regrade.",
        f"Left out: {folder_name(SOLUTIONS_DIR)}, the fast parts, {folder_name(VARIANTS_DIR)} "
        f"and the course's own tests.",
        f"Set the variable COURSE_REF to {commit} where the release is graded, so that "
        f"CI grades with the tests it was made from (see the book's instructor page).",
        f"Next: cd {out} && git init && git add -A && git commit -m 'Course release', "
        f"then push it to a new private repository.",
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m annotated_transformer release",
        description="Write a student release of the course (no solutions, fresh stubs) "
                    "into a new folder.")
    parser.add_argument("out", type=Path, help="the new (or empty) folder to write")
    parser.add_argument("--workflow", choices=sorted(WORKFLOWS), default="grade",
                        help="the grading workflow to keep: grade (a learner's own copy, "
                             "the default) or classroom (GitHub Classroom)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="take uncommitted changes to tracked files along")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        files = write_release(args.out, args.workflow, args.allow_dirty)
        print(_summary(args.out, files, args.workflow))
    except (ReleaseError, stubs.StubError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0

