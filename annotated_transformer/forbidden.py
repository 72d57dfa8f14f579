"""Find calls an exercise may not make (the PyTorch op it asks the learner to write).

Each graded test file may declare ``FORBIDDEN = {"2.1": ("softmax",), ...}``: attribute
names (``torch.softmax``, ``F.softmax`` and ``x.softmax`` all end in ``.softmax``) or
keyword arguments (``"label_smoothing="``) that the exercise's code may not use. The
exercise's code is the functions that hold its ``# BEGIN SOLUTION N.M`` region in the
reference, looked up by name in the learner's file and read with ``ast``: nothing runs.
A learner's own function of the same name (``softmax(...)``, a plain name) and a part
looked up through the course (``active_parts().softmax``, ``parts.softmax``) are allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from annotated_transformer.stubs import BEGIN, enclosing_names


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
