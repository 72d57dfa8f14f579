"""Tamper evidence: the sha256 hashes of the files that decide a grade.

    python -m annotated_transformer grade --write-manifest tests/graded/grading_manifest.json

The manifest holds the hash of each of :func:`graded_files` (the one list of them, which
the capstone's cache keys on too) and of the pytest settings in ``pyproject.toml``.
Verifying a repository against it names each of those files that differs (``changed``), is
gone (``missing``), or was added (``added``: another file in the graded folder, or a
``conftest.py`` or pytest configuration file where pytest would read it). Line endings do
not count, so a checkout on Windows verifies. Course maintainers rewrite the manifest after
changing any of these files; ``tests/grading/test_grading.py`` fails on a stale one.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from annotated_transformer.layout import (
    COURSE_TOOLS_DIR,
    GRADED_DIR,
    MANIFEST,
    PACKAGE_DIR,
    PARTS_PACKAGES,
    ROOT,
    TESTS_DIR,
    WORKFLOWS_DIR,
    relative,
)

MAX_WORKFLOWS = 5_000  # the most workflow files of a submission looked at

if TYPE_CHECKING:
    from annotated_transformer.course.grading.report import Integrity

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
    """The files of ``root`` that decide a grade (paths relative to it, with ``/``): the
    graded tests' folder whole (the manifest and caches aside), the grader, and the
    package's modules that either imports or the worker preloads, followed through their
    imports. The fast parts are left out: they hold answers, which a release leaves out,
    and a learner's grade never runs them."""
    graded = root / relative(GRADED_DIR)
    manifest = root / relative(MANIFEST)
    paths = [p for p in graded.rglob("*") if p != manifest and "__pycache__" not in p.parts]
    grader = sorted((root / relative(COURSE_TOOLS_DIR) / "grading").rglob("*.py"))
    seeds = [*grader, *(p for p in paths if p.suffix == ".py")]
    preloaded = {m for m in preloaded_modules() if m.split(".")[0] == PACKAGE_DIR.name}
    paths += imported_modules(root, seeds, preloaded)
    return sorted({relative(p, root) for p in paths if p.is_file()})


def preloaded_modules() -> tuple[str, ...]:
    """The grader's worker's ``PRELOADED``, read from its source, not imported: the grader
    never imports the worker's module, so that a worker that cannot start (a broken
    installation) is said in one line by the supervisor, not by a traceback here."""
    source = (Path(__file__).parent / "worker" / "process.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "PRELOADED" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise ValueError("the grader's worker/process.py defines no PRELOADED")


def imported_modules(root: Path, files: list[Path], names: set[str]) -> list[Path]:
    """The files of the package in ``root`` that ``files`` and the modules ``names``
    import, with the ones those import in turn (and each package's ``__init__.py`` on the
    way), read from the source, not run; the other implementations of the chapters (the
    fast parts) aside."""
    package = root / relative(PACKAGE_DIR)
    aside = [root / relative(folder) for folder in PARTS_PACKAGES.values()]
    found: set[Path] = set()
    todo = list(files) + [p for name in names for p in _module_files(package, name)]
    while todo:
        path = todo.pop()
        if path in found or any(a in path.parents for a in aside) or not path.is_file():
            continue
        found.add(path)
        for name in _imports(path, package):
            todo += _module_files(package, name)
    return sorted(found)


def _module_files(package: Path, name: str) -> list[Path]:
    """The files that importing ``name`` (``annotated_transformer.x.y``) runs: each
    package's ``__init__.py`` on the way and the module's own file."""
    parts = name.split(".")
    if parts[0] != package.name:
        return []
    folder, files = package, [package / "__init__.py"]
    for part in parts[1:]:
        folder = folder / part
        files += [folder / "__init__.py", folder.with_suffix(".py")]
    return [f for f in files if f.is_file()]


def _imports(path: Path, package: Path) -> set[str]:
    """The modules ``path`` imports anywhere in it; ``from a import b`` names ``a.b`` too
    (``b`` may be a module)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # unreadable (a learner's file can be built to be): its hash already says changed
        return set()
    inside = path.parent.relative_to(package.parent).parts if package in path.parents else ()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package up
                anchor = inside[: len(inside) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def unexpected_files(root: Path) -> list[str]:
    """Files through which pytest would change the grading: a ``conftest.py`` other than
    the graded folder's own (the package's tests' ``tests/conftest.py`` sits above the
    grader's ``--confcutdir``, which never reads it), and pytest settings anywhere but
    ``pyproject.toml``'s section."""
    tests = root / relative(TESTS_DIR)
    allowed = {root / relative(GRADED_DIR) / "conftest.py", tests / "conftest.py",
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
    changes = {path: "changed" if path in actual else "missing"
               for path in expected if actual.get(path) != expected[path]}
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


def integrity(path: Path, submission: Path) -> Integrity:
    """What ``--verify-manifest`` reports: the files of ``submission`` that differ from the
    manifest at ``path``. A manifest that cannot be read is a ``ValueError``; a submission
    whose files cannot be read is named as such (a learner's file, not the grader's)."""
    from annotated_transformer.course.grading.protocol import cut
    from annotated_transformer.course.grading.report import Integrity

    if not submission.is_dir():
        raise ValueError(f"--submission-root {submission} is not a folder")
    try:
        expected = load(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the manifest {path}: {error}") from None
    try:
        changes = verify(expected, submission)
    except (OSError, ValueError) as error:  # a file of the submission that cannot be read
        changes = {"(submission)": cut(f"unreadable: {type(error).__name__}: {error}", 300)}
    used = submission.resolve() == ROOT.resolve()
    return Integrity(str(path), str(submission), changes, used)


def file_sha256(path: Path) -> str | None:
    """The sha256 of a regular file (a symbolic link is not followed), else None."""
    try:
        if stat.S_ISREG(path.lstat().st_mode):
            found = hashlib.sha256()
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    found.update(chunk)
            return found.hexdigest()
    except OSError:
        pass
    return None


def workflow_changes(root: Path, course_dir: Path = WORKFLOWS_DIR) -> dict[str, str]:
    """``{file name: "changed" | "added"}`` for the submission's workflow files (``root``'s
    ``.github/workflows/*.yml``, as committed) that are not the course's copies: computed
    from the files themselves, never from a path a workflow names."""
    folder = root / relative(WORKFLOWS_DIR)
    if os.path.islink(folder.parent) or os.path.islink(folder):
        return {relative(WORKFLOWS_DIR): "a symbolic link"}
    if not folder.is_dir():
        return {}
    changes = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name)[:MAX_WORKFLOWS]:
        if entry.name.endswith((".yml", ".yaml")):
            ran, course = file_sha256(Path(entry.path)), file_sha256(course_dir / entry.name)
            if ran is None or ran != course:
                changes[entry.name] = "added" if course is None else "changed"
    return changes
