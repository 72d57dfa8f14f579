"""The files that decide a grade (``manifest.graded_files``, which the manifest and the
capstone's cache both use) are complete: every module of the package that the graded
tests, their helpers, the grader or the worker load is in it.

The list is derived by reading the files' imports; this test checks it another way, by
importing what the grading imports (the graded tests' folder, every module they import
inside a function, the grader's command, plugin and worker and what it preloads, each
chapter's reference) in a fresh
interpreter and asking Python which of the package's files it ran.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache

from annotated_transformer.course.grading import manifest
from annotated_transformer.layout import FAST_PARTS_DIR, GRADED_DIR, PACKAGE_DIR, ROOT, relative

LOADER = """
import importlib, json, sys
sys.path.insert(0, {graded!r})
from annotated_transformer.course.grading.worker.process import PRELOADED
from annotated_transformer.layout import chapter_test_files
from annotated_transformer.parts import Parts, has_reference
grader = ["annotated_transformer.course.grading." + m for m in ("grade", "plugin", "worker")]
for name in [*{modules!r}, *grader, *PRELOADED]:
    importlib.import_module(name)
if has_reference():
    for chapter in chapter_test_files():
        Parts("solutions").module(chapter)
files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
print(json.dumps(sorted(f for f in files if f and f.startswith({package!r}))))
"""


def inner_imports() -> list[str]:
    """The package's modules that the graded folder's files import inside a function
    (a probe runs them in the worker), besides those files themselves."""
    names = [p.stem for p in sorted(GRADED_DIR.glob("*.py"))]
    for path in sorted(GRADED_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    PACKAGE_DIR.name):
                names.append(node.module)
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names if a.name.startswith(PACKAGE_DIR.name)]
    return names


@cache
def loaded_files() -> tuple[str, ...]:
    """The package's files (relative to the course) that grading loads, as Python saw it."""
    script = LOADER.format(graded=str(GRADED_DIR), modules=inner_imports(),
                           package=str(PACKAGE_DIR))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    fast = relative(FAST_PARTS_DIR) + "/"
    return tuple(f for f in (relative(ROOT / p) for p in json.loads(done.stdout))
                 if not f.startswith(fast))


def missing_from(listed: set[str]) -> list[str]:
    return [f for f in loaded_files() if f not in listed]


def test_every_module_that_grading_loads_decides_a_grade():
    missing = missing_from(set(manifest.graded_files(ROOT)))
    assert not missing, (
        f"grading loads {missing}, which manifest.graded_files leaves out: a change to them "
        f"could change a grade unnoticed. graded_files follows the imports of the graded "
        f"tests, the grader and the worker's PRELOADED; import the module from one of them "
        f"(or name it there), then rewrite the manifest")


def test_the_check_fails_for_a_module_left_out():
    """The check above can fail: leave out the capstone's training loop, and it names it."""
    listed = set(manifest.graded_files(ROOT))
    assert "annotated_transformer/train.py" in listed
    assert missing_from(listed - {"annotated_transformer/train.py"}) == [
        "annotated_transformer/train.py"]


def test_the_capstone_and_the_parts_decide_a_grade():
    listed = set(manifest.graded_files(ROOT))
    for path in ("annotated_transformer/train.py", "annotated_transformer/model.py",
                 "annotated_transformer/data/copy.py", "annotated_transformer/parts.py",
                 "annotated_transformer/layout.py", "tests/graded/conftest.py"):
        assert path in listed
    assert not any(p.startswith(relative(FAST_PARTS_DIR)) for p in listed)
