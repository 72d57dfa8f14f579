"""Tamper evidence: the sha256 hashes of the files that decide a grade.

    python -m annotated_transformer grade --write-manifest tests/graded/grading_manifest.json
    python -m annotated_transformer grade --verify-manifest tests/graded/grading_manifest.json \\
        --submission-root ../alice --parts ../alice/exercises

The manifest holds the hash of every file of the graded tests' folder (``tests/graded/``,
taken whole: the tests, their ``conftest.py`` and helpers), of the grader's modules
(``annotated_transformer/course/grading/``), of the modules the worker builds the parts
with and of the pytest settings in ``pyproject.toml``. Verifying a repository against it
names each of those files that differs (``changed``), is gone (``missing``), or was added
(``added``: another file in the graded folder, or a ``conftest.py`` or pytest
configuration file where pytest would read it). Line endings do not count, so a checkout
on Windows verifies. Course maintainers rewrite the manifest after changing any of these
files; ``tests/test_grading.py`` fails on a stale one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from annotated_transformer.layout import (
    COURSE_TOOLS_DIR,
    GRADED_DIR,
    MANIFEST,
    PACKAGE_DIR,
    ROOT,
    TESTS_DIR,
    relative,
)

# The modules, besides the grading subpackage, that the worker builds the parts with.
GRADER_MODULES = ("parts.py", "layout.py")
PYTEST_SETTINGS = "pyproject.toml [tool.pytest.ini_options]"
# Files from which pytest reads its settings; only pyproject.toml's section is the course's.
CONFIG_FILES = {"pytest.ini": "", ".pytest.ini": "", "tox.ini": "[pytest]",
                "setup.cfg": "[tool:pytest]", "pyproject.toml": "[tool.pytest"}


def digest(data: bytes) -> str:
    return hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest()


def pytest_settings(root: Path) -> bytes | None:
    """The ``[tool.pytest.ini_options]`` table of ``pyproject.toml``, as text, or None."""
    path = root / "pyproject.toml"
    if not path.is_file():
        return None
    text = path.read_text().replace("\r\n", "\n")
    match = re.search(r"^\[tool\.pytest\.ini_options\]\n(?:(?!\[).*\n?)*", text, re.MULTILINE)
    return match.group(0).strip().encode() if match else None


def _in(root: Path, folder: Path) -> Path:
    """``folder`` of the course, in the copy at ``root``."""
    return root / relative(folder)


def graded_files(root: Path) -> list[str]:
    """The files of ``root`` that decide a grade (paths relative to it, with ``/``): the
    graded tests' folder whole (the manifest and caches aside), the grader, the parts."""
    graded = _in(root, GRADED_DIR)
    manifest = _in(root, MANIFEST)
    paths = [_in(root, PACKAGE_DIR) / m for m in GRADER_MODULES]
    paths += sorted(_in(root, COURSE_TOOLS_DIR / "grading").rglob("*.py"))
    paths += [p for p in graded.rglob("*") if p != manifest and "__pycache__" not in p.parts]
    return sorted(relative(p, root) for p in paths if p.is_file())


def unexpected_files(root: Path) -> list[str]:
    """Files through which pytest would change the grading: a ``conftest.py`` other than
    the graded folder's own (the package's tests' ``tests/conftest.py`` sits above the
    grader's ``--confcutdir``, which never reads it), and pytest settings anywhere but
    ``pyproject.toml``'s section."""
    tests = _in(root, TESTS_DIR)
    allowed = {_in(root, GRADED_DIR) / "conftest.py", tests / "conftest.py",
               root / "pyproject.toml"}
    candidates = [root / "conftest.py", *tests.rglob("conftest.py")]
    for name in CONFIG_FILES:
        candidates += [root / name, *tests.rglob(name)]
    found = set()
    for path in candidates:
        if not path.is_file() or path in allowed:
            continue
        section = CONFIG_FILES.get(path.name, "")
        if not section or section in path.read_text(errors="replace"):
            found.add(relative(path, root))
    return sorted(found)


def compute(root: Path = ROOT) -> dict[str, Any]:
    """The manifest of ``root``: ``{"files": {path: sha256}}``."""
    files = {path: digest((root / path).read_bytes()) for path in graded_files(root)}
    settings = pytest_settings(root)
    if settings is not None:
        files[PYTEST_SETTINGS] = digest(settings)
    return {"about": "sha256 of the files that decide a grade; python -m "
                     "annotated_transformer grade --write-manifest " + relative(MANIFEST),
            "files": dict(sorted(files.items()))}


def verify(manifest: dict[str, Any], root: Path) -> dict[str, str]:
    """``{path: "changed" | "missing" | "added"}`` for ``root`` against ``manifest``."""
    expected: dict[str, str] = manifest["files"]
    actual = compute(root)["files"]
    changes = {path: "missing" for path in expected if path not in actual}
    changes |= {path: "changed" for path in expected
                if path in actual and actual[path] != expected[path]}
    changes |= {path: "added" for path in actual if path not in expected}
    changes |= {path: "added" for path in unexpected_files(root)}
    return dict(sorted(changes.items()))


def write(path: Path, root: Path = ROOT) -> None:
    path.write_text(json.dumps(compute(root), indent=1) + "\n")


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ValueError(f"{path} is not a grading manifest")
    return data
