"""Tamper evidence: the sha256 hashes of the files that decide a grade.

    python -m annotated_transformer.grade --write-manifest tests/grading_manifest.json
    python -m annotated_transformer.grade --verify-manifest tests/grading_manifest.json \\
        --submission-root ../alice --parts ../alice/exercises

The manifest holds the hash of every graded test file and its helpers
(``tests/conftest.py``, ``tests/checks.py``, ``tests/test_chNN_*.py``), of the grader's
modules, and of the pytest settings in
``pyproject.toml``. Verifying a repository against it names each of those files that
differs (``changed``), is gone (``missing``), or was added (``added``: another graded
test file, or a ``conftest.py`` or pytest configuration file where pytest would read
it). Line endings do not count, so a checkout on Windows verifies. Course maintainers
rewrite the manifest after changing any of these files; ``tests/test_grading.py``
fails on a stale one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from annotated_transformer.grading.layout import MANIFEST, ROOT, TEST_FILE

# Every module of the grading subpackage, and the parts registry the worker builds with.
GRADER_MODULES = ("parts.py",)
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


def graded_files(root: Path) -> list[str]:
    """The files of ``root`` that decide a grade (paths relative to it, with ``/``)."""
    tests = root / "tests"
    paths = [root / "annotated_transformer" / m for m in GRADER_MODULES]
    paths += sorted((root / "annotated_transformer" / "grading").rglob("*.py"))
    paths += [tests / "conftest.py", tests / "checks.py", tests / "torch_models.py"]
    paths += [p for p in tests.glob("test_ch*.py") if TEST_FILE.match(p.name)]
    return sorted(p.relative_to(root).as_posix() for p in paths if p.is_file())


def unexpected_files(root: Path) -> list[str]:
    """Files through which pytest would change the grading: a ``conftest.py`` other than
    ``tests/conftest.py``, and pytest settings anywhere but ``pyproject.toml``'s section."""
    tests = root / "tests"
    candidates = [root / "conftest.py", *tests.rglob("conftest.py")]
    for name in CONFIG_FILES:
        candidates += [root / name, *tests.rglob(name)]
    found = set()
    for path in candidates:
        if not path.is_file() or path in (tests / "conftest.py", root / "pyproject.toml"):
            continue
        section = CONFIG_FILES.get(path.name, "")
        if not section or section in path.read_text(errors="replace"):
            found.add(path.relative_to(root).as_posix())
    return sorted(found)


def compute(root: Path = ROOT) -> dict[str, Any]:
    """The manifest of ``root``: ``{"files": {path: sha256}}``."""
    files = {path: digest((root / path).read_bytes()) for path in graded_files(root)}
    settings = pytest_settings(root)
    if settings is not None:
        files[PYTEST_SETTINGS] = digest(settings)
    return {"about": "sha256 of the files that decide a grade; python -m "
                     "annotated_transformer.grading.grade --write-manifest " + MANIFEST,
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
