"""Where the course keeps what grading reads: the one module that knows the layout."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # annotated_transformer/
ROOT = PACKAGE_DIR.parent  # the course's repository (or a student release of it)
TESTS_DIR = ROOT / "tests"
SOLUTIONS_DIR = ROOT / "solutions"
EXERCISES_DIR = ROOT / "exercises"
WORKFLOWS_DIR = ROOT / ".github" / "workflows"
MANIFEST = "tests/grading_manifest.json"  # relative to ROOT
TEST_FILE = re.compile(r"^test_ch(?P<chapter>\d\d)_\w+\.py$")
CHAPTER_FILE = re.compile(r"^ch(?P<chapter>\d\d)_\w+\.py$")


def chapter_test_files(chapters: list[int] | None = None) -> dict[int, Path]:
    """``{chapter: graded test file}``, all of them or the ones asked for."""
    files = {int(m["chapter"]): p for p in sorted(TESTS_DIR.glob("test_ch*.py"))
             if (m := TEST_FILE.match(p.name))}
    if chapters:
        missing = sorted(set(chapters) - set(files))
        if missing:
            raise ValueError(f"no graded tests for chapter(s) {missing}; "
                             f"chapters with tests: {sorted(files)}")
        files = {c: files[c] for c in sorted(set(chapters))}
    return files
