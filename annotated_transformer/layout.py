"""Where the course keeps its files: the one module that knows the repository's layout.

    annotated_transformer/      the library (layers 0 to 4) and, under course/, the tools
    solutions/chNN_*.py         the reference, one file per chapter (not in a release)
    exercises/chNN_*.py         the learner's files: stubs generated from solutions/
    tests/graded/               the graded tests, their conftest.py, helpers and manifest:
                                what a release ships and what the grader reads, whole
    tests/variants/             wrong and right answers that test the graded tests
                                (the course's own check; not in a release)
    tests/FOLDER/test_*.py      the package's own tests (not in a release), a folder by what
                                they test: library/, grading/, instructor/, distribution/
                                (the release, the workflows, the stubs, the hints) and
                                repository/ (the book, the notebooks, the docs, the layout)
    .github/workflows/          grade.yml, classroom.yml (generated), book.yml

Every other module reads these paths and patterns from here instead of spelling them.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # annotated_transformer/
ROOT = PACKAGE_DIR.parent  # the course's repository (or a student release of it)
SOLUTIONS_DIR = ROOT / "solutions"
EXERCISES_DIR = ROOT / "exercises"
FAST_PARTS_DIR = PACKAGE_DIR / "fast_parts"
# The course's other implementations of the chapters, by the source word that names them:
# packages of the package, imported as annotated_transformer.<folder>. The one table that
# the sources' words, the parts registry, the grader's boundary, the manifest and the release
# read: a learner's worker never sees them, a release leaves them out, and they are measured,
# never graded.
PARTS_PACKAGES = {"fast": FAST_PARTS_DIR}
COURSE_TOOLS_DIR = PACKAGE_DIR / "course"
TESTS_DIR = ROOT / "tests"
GRADED_DIR = TESTS_DIR / "graded"
VARIANTS_DIR = TESTS_DIR / "variants"
WORKFLOWS_DIR = ROOT / ".github" / "workflows"
MANIFEST = GRADED_DIR / "grading_manifest.json"

# ASCII only: int() reads other scripts' digits too ("ch٠٢_x.py" would be chapter 2).
CHAPTER_FILE = re.compile(r"^ch(?P<chapter>\d\d)_\w+\.py$", re.ASCII)  # ch05_layers.py
TEST_FILE = re.compile(r"^test_ch(?P<chapter>\d\d)_\w+\.py$", re.ASCII)  # test_ch05_layers.py


def relative(path: Path, root: Path = ROOT) -> str:
    """``path`` relative to ``root``, with ``/``: how manifests and releases name files."""
    return path.relative_to(root).as_posix()


def folder_name(folder: Path) -> str:
    """How messages, help texts and workflows name one of the course's folders:
    ``solutions/``, ``.github/workflows/``."""
    return relative(folder) + "/"


def chapter_test_files(chapters: list[int] | None = None,
                       graded_dir: Path = GRADED_DIR) -> dict[int, Path]:
    """``{chapter: graded test file}``, all of them or the ones asked for."""
    files = {int(m["chapter"]): p for p in sorted(graded_dir.glob("test_ch*.py"))
             if (m := TEST_FILE.match(p.name))}
    if chapters:
        missing = sorted(set(chapters) - set(files))
        if missing:
            raise ValueError(f"no graded tests for chapter(s) {missing}; "
                             f"chapters with tests: {sorted(files)}")
        files = {c: files[c] for c in sorted(set(chapters))}
    return files
