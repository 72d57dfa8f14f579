"""The checker, over source text, one file, or a learner's folder.

The grader reads exactly what the worker runs: a folder's chapter files (``chNN_*.py`` at
its top, the only files :func:`annotated_transformer.parts.load_chapter` loads, from their
bytes), parsed from their bytes as ``compile`` decodes them (a coding cookie, a BOM)."""
from __future__ import annotations

import ast
import stat
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from annotated_transformer.course.grading.source_rules.attributes import AttributeRules
from annotated_transformer.course.grading.source_rules.base import Violation, one_line
from annotated_transformer.course.grading.source_rules.names import NameRules
from annotated_transformer.course.grading.source_rules.rules import MAX_SOURCE_BYTES, MAX_VIOLATIONS
from annotated_transformer.layout import CHAPTER_FILE


class Checker(NameRules, AttributeRules):
    """Reads one parsed file and collects its violations."""

    # -------------------------------------------------------------- running the rules

    def run(self) -> list[Violation]:
        """Every rule over every node; the violations in line order, at most MAX_VIOLATIONS."""
        for node in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
            elif isinstance(node, ast.Name):
                self.check_name(node)
            elif isinstance(node, ast.Attribute):
                self.check_attribute(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.check_definition(node)
            elif isinstance(node, ast.ClassDef):
                self.check_class(node)
            elif isinstance(node, ast.keyword):
                self.check_keyword(node)
            elif isinstance(node, ast.MatchClass):
                self.check_match_class(node)
            elif id(node) in self.annotations and isinstance(node, ast.Constant):
                self.check_string_annotation(node)
        found = sorted(set(self.found), key=lambda v: (v.line, v.exercise or "", v.message))
        if len(found) <= MAX_VIOLATIONS:
            return found
        kept, rest = found[: MAX_VIOLATIONS - 1], found[MAX_VIOLATIONS - 1:]
        more = Violation(self.path, rest[0].line, None,
                         f"{len(rest)} more things not allowed from line {rest[0].line} on "
                         f"are not listed; fix the ones above first")
        return [*kept, more]


def check_source(source: str | bytes, path: str,
                 forbidden: Mapping[str, Sequence[str]] = {}) -> list[Violation]:  # noqa: B006
    """Every rule over source text or bytes (``path`` only labels the violations)."""
    name = Path(path).name
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as error:
        text = " ".join((error.text or "").split())
        shown = f" (`{text if len(text) <= 60 else text[:57] + '...'}`)" if text else ""
        return [Violation(path, error.lineno or 1, None, one_line(
            f"this line is not valid Python: {error.msg}{shown}; fix it so the file runs"),
            unreadable=True)]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, deep nesting
        return [Violation(path, 1, None, one_line(f"{name} cannot be read as Python "
                                                  f"({error}); simplify the file"),
                          unreadable=True)]
    try:
        return Checker(tree, path, forbidden).run()
    except RecursionError:
        return [Violation(path, 1, None, f"{name} nests expressions too deeply to check; "
                                         f"split long expressions")]


def _unreadable(path: Path) -> str | None:
    """Why a file is not read: a link may point at /proc or the reference, a FIFO would
    block the grader forever, a huge file would exhaust it."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"{path.name} is a symbolic link; put the file itself in the folder"
    if not stat.S_ISREG(info.st_mode):
        return f"{path.name} is not a regular file"
    if info.st_size > MAX_SOURCE_BYTES:
        return (f"{path.name} has {info.st_size:,} bytes; an exercise file must be under "
                f"{MAX_SOURCE_BYTES:,}")
    return None


def check_file(path: Path, forbidden: Mapping[str, Sequence[str]] = {}  # noqa: B006
               ) -> list[Violation]:
    """Every rule over one file. ``forbidden`` is ``{exercise id: names}``, e.g.
    ``{"2.1": ("softmax",), "6.2": ("label_smoothing=",)}``: attribute names (any attribute
    access or ``from m import name``) or keyword arguments (a trailing ``=``), forbidden
    anywhere in the file, each reported with its exercise. A plain name (the learner's own
    ``softmax``) and a part taken through the course (``active_parts().softmax``) are
    allowed. A file that cannot be read or does not parse is one violation with exercise
    None."""
    path = Path(path)
    try:
        why = _unreadable(path)
        data = path.read_bytes() if why is None else b""
    except OSError as error:
        return [Violation(str(path), 1, None, one_line(
            f"{path.name} cannot be read: {error.strerror or error}"), unreadable=True)]
    if why is not None:
        return [Violation(str(path), 1, None, one_line(why))]
    return check_source(data, str(path), forbidden)


def check_folder(folder: Path, forbidden_by_chapter: Mapping[
        int, Mapping[str, Sequence[str]]] = {}) -> dict[int, list[Violation]]:  # noqa: B006
    """Every chapter file of ``folder`` (a link among them is refused, not followed), keyed
    by its chapter, with that chapter's forbidden names; paths read
    ``exercises/ch02_attention.py``. No other file is read: nothing loads it (an exercise
    file may import only the modules of the allow-list)."""
    folder = Path(folder)
    found: dict[int, list[Violation]] = {}
    for path in sorted(folder.glob("ch*.py")):
        match = CHAPTER_FILE.match(path.name)
        if match is None:
            continue
        chapter = int(match["chapter"])
        label = f"{folder.name}/{path.name}"
        violations = [replace(v, path=label)
                      for v in check_file(path, forbidden_by_chapter.get(chapter, {}))]
        if violations:
            found[chapter] = violations
    return found
