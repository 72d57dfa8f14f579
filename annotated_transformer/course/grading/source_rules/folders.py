"""Files and folders: every rule over source text, one file, or a learner's whole folder
(and anything else in it that Python could import)."""
from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES
from pathlib import Path

from annotated_transformer.course.grading.source_rules.checker import Checker
from annotated_transformer.course.grading.source_rules.reading import read_source
from annotated_transformer.course.grading.source_rules.violations import (
    SourceRejected,
    Violation,
    one_line,
)
from annotated_transformer.layout import CHAPTER_FILE


def _syntax_violation(path: str, name: str, error: SyntaxError) -> Violation:
    """One violation naming the file, the line and the text that does not parse."""
    text = " ".join((error.text or "").split())
    text = text if len(text) <= 60 else text[:57] + "..."
    line = error.lineno or 1
    shown = f" (`{text}`)" if text else ""
    return Violation(path, line, None, one_line(f"this line is not valid Python: "
                                                f"{error.msg}{shown}; fix it so the file runs"))


def check_source(source: str, path: str,
                 forbidden: Mapping[str, Sequence[str]] = {}) -> list[Violation]:  # noqa: B006
    """Every rule over source text (``path`` only labels the violations)."""
    name = Path(path).name
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as error:
        return [_syntax_violation(path, name, error)]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, deep nesting
        return [Violation(path, 1, None, one_line(f"{name} cannot be read as Python "
                                                  f"({error}); simplify the file"))]
    try:
        return Checker(tree, path, forbidden).run()
    except RecursionError:
        return [Violation(path, 1, None, f"{name} nests expressions too deeply to check; "
                                         f"split long expressions")]


def check_file(path: Path, forbidden: Mapping[str, Sequence[str]] = {}  # noqa: B006
               ) -> list[Violation]:
    """Every rule over one file. ``forbidden`` is ``{exercise id: names}``, e.g.
    ``{"2.1": ("softmax",), "6.2": ("label_smoothing=",)}``: attribute names (any attribute
    access or ``from m import name``) or keyword arguments (a trailing ``=``), forbidden
    anywhere in the file, each reported with its exercise. A plain name (the learner's own
    ``softmax``) and a part taken through the course (``active_parts().softmax``) are
    allowed. A file that does not parse, or cannot be read as UTF-8 Python, is one
    violation with exercise None."""
    try:
        source = read_source(Path(path))
    except SourceRejected as error:
        return [Violation(str(path), _line_of(str(error)), None, one_line(str(error)))]
    except OSError as error:
        return [Violation(str(path), 1, None, one_line(f"{Path(path).name} cannot be read: "
                                                       f"{error.strerror or error}"))]
    return check_source(source, str(path), forbidden)


def _line_of(message: str) -> int:
    """The line a :class:`SourceRejected` message names (1 when none)."""
    match = re.search(r"on line (\d+)", message)
    return int(match[1]) if match else 1


def _importable_non_source(path: Path) -> str | None:
    """Why a file that Python could import instead of a checked ``.py`` is refused."""
    name = path.name
    if any(name.endswith(s) for s in EXTENSION_SUFFIXES):
        return "is a compiled extension module"
    if any(name.endswith(s) for s in BYTECODE_SUFFIXES):
        if path.parent.name != "__pycache__":
            return "is compiled bytecode without its source"
        if _unchecked_pyc(path):
            return "is bytecode that Python would run without comparing it with its source"
    return None


def _unchecked_pyc(path: Path) -> bool:
    """A hash-based .pyc with check_source off (PEP 552) wins over the .py beside it."""
    try:
        with path.open("rb") as handle:
            header = handle.read(8)
    except OSError:
        return False
    flags = int.from_bytes(header[4:8], "little") if len(header) == 8 else 0
    return flags & 0b01 == 1 and flags & 0b10 == 0


def _files(folder: Path) -> Iterator[Path]:
    """Every file under folder, links included but not followed. A folder whose name is not
    a Python name (``.ipynb_checkpoints``, ``.git``) is skipped: no import can reach it."""
    for directory, subdirectories, names in os.walk(folder, followlinks=False):
        here = Path(directory)
        subdirectories[:] = sorted(d for d in subdirectories if d.isidentifier())
        for name in sorted(names) + [d for d in subdirectories if (here / d).is_symlink()]:
            yield here / name


def _chapter_of(path: Path, folder: Path) -> int | None:
    """The chapter a file belongs to: a ``chNN_*.py`` file at the top of the folder, or any
    file of a ``chNN_*`` package there (``import exercises.ch02_attention`` would load it)."""
    top = path.relative_to(folder).parts[0]
    match = CHAPTER_FILE.match(top) or (CHAPTER_FILE.match(top + ".py")
                                        if top != path.name else None)
    return int(match["chapter"]) if match else None


def _label(path: Path, folder: Path) -> str:
    """The path as the learner knows it: ``exercises/helper.py``."""
    return (Path(folder.name) / path.relative_to(folder)).as_posix()


def check_folder(folder: Path, forbidden_by_chapter: Mapping[
        int, Mapping[str, Sequence[str]]] = {}) -> dict[int | None, list[Violation]]:  # noqa: B006
    """Every ``.py`` file under ``folder`` (and anything else Python could import from it).
    Key: the chapter number for a ``chNN_*.py`` file at the top of the folder (or a file of a
    ``chNN_*`` package there), None for any other file: its violations concern every chapter,
    and every chapter's forbidden names apply to it. Paths read ``exercises/helper.py``."""
    folder = Path(folder)
    every_exercise = {ex: names for chapter in forbidden_by_chapter.values()
                      for ex, names in chapter.items()}
    found: dict[int | None, list[Violation]] = {}
    for path in _files(folder):
        label = _label(path, folder)
        key = _chapter_of(path, folder)
        if path.suffix == ".py" or path.is_symlink():
            forbidden = forbidden_by_chapter.get(key, {}) if key is not None else every_exercise
            violations = _check_labelled(path, label, forbidden)
        else:
            reason = _importable_non_source(path)
            message = f"{label} {reason}; keep only .py source files in the folder"
            violations = [Violation(label, 1, None, one_line(message))] if reason else []
        if violations:
            found.setdefault(key, []).extend(violations)
    return found


def _check_labelled(path: Path, label: str,
                    forbidden: Mapping[str, Sequence[str]]) -> list[Violation]:
    """``check_file`` with the violations' paths relabelled for the report."""
    violations = check_file(path, forbidden)
    return [Violation(label, v.line, v.exercise, v.message) for v in violations]
