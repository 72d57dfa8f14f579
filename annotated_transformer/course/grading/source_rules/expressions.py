"""What the checker reads out of expressions: which names a binding binds, the fields of
a format string."""
from __future__ import annotations

import ast
import string
from collections.abc import Iterator


def target_names(node: ast.AST) -> Iterator[str]:
    """The plain names an assignment target binds (``a, *b = ...``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from target_names(element)
    elif isinstance(node, ast.Starred):
        yield from target_names(node.value)


def other_binding(node: ast.AST) -> list[str]:
    """Names bound where no value is written: ``x += 1``, ``except E as x``, ``case x:``,
    ``case {**x}``, ``type X = ...``."""
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    type_alias = getattr(ast, "TypeAlias", None)  # Python 3.12
    if type_alias is not None and isinstance(node, type_alias):
        return [node.name.id]
    return []


def format_fields(text: str) -> Iterator[str]:
    """Every replacement field's name in a format string, nested ones included."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return
    for _, field, spec, _ in parsed:
        if field is not None:
            yield field
        if spec:
            yield from format_fields(spec)
