"""Find calls an exercise may not make (the PyTorch op it asks the learner to write).

Each graded test file may declare ``FORBIDDEN = {"2.1": ("softmax",), ...}``: attribute
names (``torch.softmax``, ``F.softmax`` and ``x.softmax`` all end in ``.softmax``) or
keyword arguments (``"label_smoothing="``) that the exercise's code may not use. The
exercise's code is the functions that hold its ``# BEGIN SOLUTION N.M`` region in the
reference, looked up by name in the learner's file and read with ``ast``: nothing runs.
A learner's own function of the same name (``softmax(...)``, a plain name) and a part
looked up through the course (``active_parts().softmax``, ``parts.softmax``) are allowed.

No learner file, anywhere in it, may reach the reference solutions (:func:`reference_uses`):
the grader marks every exercise of such a file ``forbidden``. Both checks read the code;
they catch the plain ways, not a determined attempt to hide one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from annotated_transformer.grading.stubs import BEGIN, enclosing_names


def exercise_functions(solution_source: str) -> dict[str, set[str]]:
    """``{exercise id: qualified names of the functions holding its solution regions}``."""
    names = enclosing_names(solution_source)
    found: dict[str, set[str]] = {}
    for number, line in enumerate(solution_source.splitlines(), start=1):
        match = BEGIN.match(line)
        if match and number in names:
            found.setdefault(match["id"], set()).add(names[number])
    return found


def _functions(tree: ast.AST, wanted: set[str]) -> Iterable[ast.AST]:
    def visit(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if name in wanted and not isinstance(child, ast.ClassDef):
                    yield child
                yield from visit(child, name + ".")

    yield from visit(tree, "")


def _through_parts(base: ast.expr) -> bool:
    """``active_parts().x`` and ``parts.x`` are the course's own parts, not PyTorch's op."""
    if isinstance(base, ast.Call) and isinstance(base.func, ast.Name):
        return base.func.id == "active_parts"
    return isinstance(base, ast.Name) and base.id == "parts"


def forbidden_uses(learner_source: str, functions: set[str], forbidden: Iterable[str]) -> list[str]:
    """``"line N: .softmax"``-style findings of forbidden names in the given functions."""
    attributes = {f for f in forbidden if not f.endswith("=")}
    keywords = {f.removesuffix("=") for f in forbidden if f.endswith("=")}
    found = []
    for function in _functions(ast.parse(learner_source), functions):
        for node in ast.walk(function):
            if (isinstance(node, ast.Attribute) and node.attr in attributes
                    and not _through_parts(node.value)):
                found.append(f"line {node.lineno}: .{node.attr}")
            elif isinstance(node, ast.keyword) and node.arg in keywords:
                found.append(f"line {node.value.lineno}: {node.arg}=")
    return found


def check(learner_file: Path, solution_file: Path, exercise: str,
          forbidden: Iterable[str]) -> str | None:
    """A message naming the first forbidden use in ``exercise``'s code, or None."""
    functions = exercise_functions(solution_file.read_text()).get(exercise, set())
    try:
        uses = forbidden_uses(learner_file.read_text(), functions, forbidden)
    except SyntaxError:
        return None  # the import fails and says so on its own
    if not uses:
        return None
    return (f"Exercise {exercise} may not use {', '.join(forbidden)}: the exercise asks you "
            f"to write it yourself; found at {learner_file.name} {uses[0]}")


# ---------------------------------------------------------------- the reference, anywhere

# Modules that hold (or load) a reference: the solutions, the tests' variants of them, and
# the reference on PyTorch's fused kernels.
REFERENCE_MODULES = ("solutions", "variants", "annotated_transformer.fast_parts")
# A module name (``solutions.ch02_attention``) or a path with a ``solutions`` folder in it.
REFERENCE_STRING = re.compile(r"^solutions(\.\w+)*$|(^|[/\\])solutions([/\\]|$)|fast_parts")
DYNAMIC_IMPORTS = ("__import__", "import_module", "run_module", "run_path",
                   "spec_from_file_location", "SourceFileLoader")
# The course's ways to load a chapter from a source of one's choosing (``active_parts()``,
# the parts the grader chose, is the way a chapter file uses another chapter).
SOURCE_LOADERS = ("Parts", "load_chapter", "chapter_files")


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _is_reference_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in REFERENCE_MODULES)


def reference_uses(learner_source: str) -> list[str]:
    """``"line N: import solutions"``-style findings of the ways to the reference solutions
    in a whole learner file: importing them (or the tests' ``variants``, or the fused
    reference), naming them in a string (a module name for ``importlib``, a path for
    ``open`` or ``Path``), importing a computed name, and loading chapters from a source of
    one's choosing (``Parts(...)``, ``Parts.reference()``, ``load_chapter``). Docstrings may
    mention them; nothing runs."""
    tree = ast.parse(learner_source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                      if _is_reference_module(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_reference_module(node.module) or any(
                    _is_reference_module(f"{node.module}.{a.name}") for a in node.names):
                found.append(f"line {node.lineno}: from {node.module} import "
                             f"{', '.join(a.name for a in node.names)}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and REFERENCE_STRING.search(node.value)):
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Call) and _called_name(node) in DYNAMIC_IMPORTS and not (
                node.args and isinstance(node.args[0], ast.Constant)):
            found.append(f"line {node.lineno}: {_called_name(node)}() of a computed name")
        elif isinstance(node, ast.Call) and _called_name(node) in SOURCE_LOADERS:
            found.append(f"line {node.lineno}: {_called_name(node)}(...) (use active_parts())")
        elif isinstance(node, ast.Attribute) and (node.attr == "fast_parts" or (
                node.attr == "reference" and isinstance(node.value, ast.Name)
                and node.value.id == "Parts")):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda f: int(f.split(":")[0].removeprefix("line ")))


def check_reference(learner_file: Path, chapter: int) -> str | None:
    """A message naming the first way to the reference in a learner's file, or None."""
    try:
        uses = reference_uses(learner_file.read_text())
    except SyntaxError:
        return None  # the import fails and says so on its own
    if not uses:
        return None
    return (f"Chapter {chapter}'s file may not use the reference solutions (`solutions/`): "
            f"found at {learner_file.name} {uses[0]}. Write the exercises yourself; every "
            f"exercise of the file scores 0 while it reads the reference")
