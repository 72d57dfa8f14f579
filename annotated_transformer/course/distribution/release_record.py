"""What a student release is, written into the release, and read again from the course.

``python -m annotated_transformer release DIR`` writes :data:`RECORD` at the release's top:
the course's commit it was made from (and whether uncommitted changes went along), each
exercise with its title and points, and the sha256 of each stub, of each file that decides
a grade (the grading manifest's list) and of the grading workflow. A learner's repository
carries it from the template on, and ``regrade`` grades the learner on what that release
offered.

The learner can edit that file, so ``regrade`` takes nothing from it but the commit:
:func:`at_commit` reads the release again from the course's own history at that commit
(its graded tests, stubs, grading files and workflows), which the learner cannot change. A
commit the course's history lacks is not a release of this course.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading import dependencies, manifest
from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    GRADED_DIR,
    PACKAGE_DIR,
    ROOT,
    WORKFLOWS_DIR,
    chapter_test_files,
    relative,
)

RECORD = "course-release.json"  # at the top of a release
FORMAT = 1
GIT_TIMEOUT = 120  # seconds for one git command on the course's history
# What a release is read from, at a commit of the course: the package (the grader and what
# it imports), the graded tests, the stubs, the workflows and the pytest settings.
READ_FROM = (relative(PACKAGE_DIR), relative(GRADED_DIR), relative(EXERCISES_DIR),
             relative(WORKFLOWS_DIR), "pyproject.toml")


@dataclass(frozen=True)
class Release:
    """One release of the course, read from its files."""

    commit: str
    titles: dict[str, str]  # {exercise: title}, every exercise it offered
    points: dict[str, float]  # {exercise: points on offer}
    stubs: dict[str, str]  # {chapter file name: the stub's text}
    grading_files: dict[str, Any]  # the grading manifest of its files ({"files": ...})
    workflows: dict[str, bytes]  # {workflow file name: its bytes}


def read_tree(root: Path, commit: str) -> Release:
    """The release whose files are in ``root`` (a release, or the course at ``commit``)."""
    files = chapter_test_files(graded_dir=root / relative(GRADED_DIR))
    if not files:
        raise ValueError(f"no graded tests in {relative(GRADED_DIR)}")
    exercises = root / relative(EXERCISES_DIR)
    workflows = root / relative(WORKFLOWS_DIR)
    return Release(
        commit=commit,
        titles=dict(dependencies.read(files).titles),
        points=dependencies.points_offered(files),
        stubs={p.name: p.read_text(encoding="utf-8") for p in sorted(exercises.glob("ch*.py"))
               if CHAPTER_FILE.match(p.name)},
        grading_files=manifest.compute(root),
        workflows={p.name: p.read_bytes() for p in sorted(workflows.glob("*.y*ml"))
                   if p.is_file()})


def describe(root: Path, commit: str, uncommitted: bool) -> dict[str, Any]:
    """The record of the release written in ``root`` from the course's ``commit``
    (``uncommitted``: whether uncommitted changes went along)."""
    release = read_tree(root, commit)

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    return {
        "about": "What this release of the course is, written by 'python -m "
                 "annotated_transformer release'. The instructor's regrade reads the commit "
                 "and grades the exercises this release offered.",
        "format": FORMAT,
        "commit": commit,
        "uncommitted_changes": uncommitted,
        "exercises": {e: {"title": release.titles.get(e, e), "points": p}
                      for e, p in sorted(release.points.items(),
                                         key=lambda item: dependencies.order(item[0]))},
        "stubs": {relative(EXERCISES_DIR / name): sha(text.encode())
                  for name, text in release.stubs.items()},
        "grading_files": release.grading_files["files"],
        "workflows": {relative(WORKFLOWS_DIR / name): sha(data)
                      for name, data in release.workflows.items()},
    }


def write(root: Path, commit: str, uncommitted: bool) -> Path:
    """Write the record of the release in ``root``; its path."""
    path = root / RECORD
    path.write_text(json.dumps(describe(root, commit, uncommitted), indent=1) + "\n")
    return path


def commit_of(data: bytes) -> str:
    """The course's commit a record names (its text ``data``, a learner's copy); a
    ``ValueError`` that says what is wrong with it."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{RECORD} is not JSON ({error})") from None
    commit = record.get("commit") if isinstance(record, dict) else None
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"{RECORD} names no commit (40 hexadecimal digits)")
    return commit


def _git(course: Path, *args: str) -> bytes:
    """git's output on the course's history; a ``ValueError`` with git's last line."""
    try:
        done = subprocess.run(["git", "-C", str(course), *args], capture_output=True,
                              timeout=GIT_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ValueError(f"git {args[0]} failed: {error}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(why[-1] if why else f"git {args[0]} exited {done.returncode}")
    return done.stdout


def resolve(name: str, course: Path = ROOT) -> str:
    """The full id of the course's commit ``name`` (a commit, a tag, a branch); a
    ``ValueError`` that says why not (not a git clone, a shallow one, no such commit)."""
    if not (course / ".git").exists():
        raise ValueError(f"the course in {course} is not a git clone, so its releases cannot "
                         f"be read")
    try:
        return _git(course, "rev-parse", "--verify", "--quiet",
                    f"{name}^{{commit}}").decode().strip()
    except ValueError:
        shallow = _git(course, "rev-parse", "--is-shallow-repository").decode().strip()
        hint = (" (this clone is shallow: git fetch --unshallow)" if shallow == "true"
                else "")
        raise ValueError(f"the course's history in {course} has no commit {name[:40]!r}"
                         f"{hint}") from None


@functools.lru_cache(maxsize=8)
def at_commit(commit: str, course: Path = ROOT) -> Release:
    """The release made from the course's ``commit``, read from the course's own history
    (``git archive`` of what a release is read from, in a temporary folder); a
    ``ValueError`` when the history lacks it or its files cannot be read."""
    commit = resolve(commit, course)
    listed = _git(course, "ls-tree", "--name-only", commit, "--", *READ_FROM).decode().split()
    with tempfile.TemporaryDirectory(prefix="course-release-") as tmp:
        archive = _git(course, "archive", "--format=tar", commit, "--", *listed)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        try:
            return read_tree(Path(tmp), commit)
        except (OSError, ValueError, SyntaxError) as error:
            raise ValueError(f"the course at {commit[:12]} holds no release that can be "
                             f"read: {error}") from None
