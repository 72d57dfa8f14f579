"""A submission read without trusting it: only the course's regular exercise files are
copied out of it (no link followed, none over 1 MB), the release's own stub stands in for a
chapter it lacks, and everything else that could change a grade (tests, grader, workflows,
committed reports) is only compared with the course's (or the learner's release's), each
difference a flag. What the copy check compares of each chapter file is kept too."""

from __future__ import annotations

import ast
import hashlib
import os
import stat
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import manifest
from annotated_transformer.course.grading.protocol import cut
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    PACKAGE_DIR,
    SOLUTIONS_DIR,
    TESTS_DIR,
    WORKFLOWS_DIR,
    relative,
)

MAX_BYTES = 1_000_000  # the largest file copied out of a submission (1 MB)
MAX_FILES = 5_000  # the most files of a submission looked at for one check
REPORT_NAMES = ("grade.json", "grade.md", "grade.xml")



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


def pristine_stub(name: str) -> str:
    """The release's stub of the exercise file ``name``: made again from the reference where
    the course has one, else the course's own file if it is still exactly as generated
    (never an edited ``exercises/`` of the checkout the instructor grades in)."""
    solution = SOLUTIONS_DIR / name
    if solution.is_file():
        return stubs.render(solution)
    text = (EXERCISES_DIR / name).read_text()
    if not stubs.is_untouched(text):
        raise RuntimeError(f"{relative(EXERCISES_DIR / name)} of the course is not the "
                           f"release's stub (was it edited?), and there is no "
                           f"{relative(SOLUTIONS_DIR)}/ to make it again: restore it "
                           f"(git checkout -- {relative(EXERCISES_DIR / name)})")
    return text


def collect_exercises(root: Path, chapters: list[int], dest: Path, who: Learner,
                      release_stubs: Mapping[str, str] | None = None) -> None:
    """Copy the submission's usable exercise files into ``dest``; the course's stub for any
    other chapter. Flags what was left out, and each graded chapter without a usable file.
    Records, for the copy check, the :func:`code_of` each graded chapter file whose code of
    its own (beside the stub of the learner's release, ``release_stubs``, and the course's)
    is at least :data:`MIN_OWN_LINES` lines."""
    names = course_exercise_files()
    folder = root / relative(EXERCISES_DIR)
    copied: set[str] = set()
    if os.path.islink(folder):
        who.flag("symlink", relative(EXERCISES_DIR) + "/")
    elif real_dir(folder):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name)[:MAX_FILES]:
            named = CHAPTER_FILE.match(entry.name)
            if not named:
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
            if int(named["chapter"]) in chapters:
                stubs = [pristine_stub(entry.name), (release_stubs or {}).get(entry.name, "")]
                digest = own_code(data, stubs)
                if digest is not None:
                    who.fingerprints[entry.name] = digest
    for chapter, name in names.items():
        if name not in copied:
            (dest / name).write_text(pristine_stub(name))
            if chapter in chapters:
                who.flag("missing-chapter", f"chapter {chapter} ({name})")


MIN_OWN_LINES = 8  # fewer lines of code of its own than this: too short for the copy check


def own_code(data: bytes, stubs: list[str]) -> str | None:
    """The digest of ``data``'s code (:func:`code_of`) when it is none of ``stubs`` and
    holds at least :data:`MIN_OWN_LINES` lines that the stub it is closest to lacks; else
    None (an untouched stub, a few one-line answers, a file that does not parse)."""
    digest, lines = code_of(data)
    if digest is None:
        return None
    own = len(lines)
    for stub in filter(None, stubs):
        stub_digest, stub_lines = code_of(stub.encode())
        if digest == stub_digest:
            return None
        own = min(own, sum((Counter(lines) - Counter(stub_lines)).values()))
    return digest if own >= MIN_OWN_LINES else None


def code_of(data: bytes) -> tuple[str | None, list[str]]:
    """A digest of a Python file's syntax tree without its docstrings (module, class and
    function) or any other string that stands alone as a statement, and the lines of that
    code as Python writes it back; ``(None, [])`` for a file that does not parse. Two files
    share the digest when their statements, names, operators and literal values are the
    same: comments, spacing, line breaks, quotes and docstrings do not count, a renamed
    variable or a reordered statement does."""
    try:
        tree = ast.parse(data)
        for node in ast.walk(tree):
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list):
                    setattr(node, name, [s for s in block if not _lone_string(s)])
        dumped = ast.dump(tree)
        lines = [line.strip() for line in ast.unparse(tree).splitlines() if line.strip()]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, []
    return hashlib.sha256(dumped.encode()).hexdigest()[:16], lines


def _lone_string(statement: object) -> bool:
    """Whether ``statement`` is a string alone (a docstring, or one that does nothing)."""
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def rare_enough(holders: int, learners: int) -> bool:
    """Whether a file shared by ``holders`` of a class of ``learners`` is rare enough to
    flag: by two, or by no more than a quarter of the class (a file most learners share is
    the course's template or the one obvious answer, not a copy)."""
    return 2 <= holders <= max(2, learners // 4)


def same_files(learners: dict[str, Learner]) -> dict[str, list[str]]:
    """``{learner: ["chNN_x.py is the same as bob's (shared by 2 of 40), comments, spacing
    and docstrings aside", ...]}``: each chapter file whose code (:func:`code_of`, the
    release's stubs and files too short aside: :func:`collect_exercises`) another learner's
    file has too, where the file is :func:`rare_enough` in the class."""
    holders: dict[tuple[str, str], list[str]] = {}
    for name, who in learners.items():
        for file, digest in who.fingerprints.items():
            holders.setdefault((file, digest), []).append(name)
    found: dict[str, list[str]] = {}
    for (file, _), names in sorted(holders.items()):
        if not rare_enough(len(names), len(learners)):
            continue
        for name in names:
            others = ", ".join(n for n in names if n != name)
            found.setdefault(name, []).append(
                f"{file} is the same as {others}'s (shared by {len(names)} of "
                f"{len(learners)}), comments, spacing and docstrings aside")
    return found


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
            changes = {"(submission)": cut(f"unreadable: {error}", 300)}
    for path, change in changes.items():
        who.flag("tests-changed", f"{path} ({change})")


def check_workflows(root: Path, who: Learner, course_dir: Path = WORKFLOWS_DIR) -> None:
    """Flag ``workflow-changed`` for each workflow file that is not the copy in
    ``course_dir`` (the course's, or the learner's release's)."""
    for name, how in manifest.workflow_changes(root, course_dir).items():
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
