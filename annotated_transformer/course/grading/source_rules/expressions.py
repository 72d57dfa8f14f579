"""What the checker reads out of expressions: where an attribute chain starts, which
objects an expression hands on, which names a binding binds."""
from __future__ import annotations

import ast
import string
from collections.abc import Iterator


def root_name(node: ast.AST) -> ast.Name | None:
    """The name an attribute chain starts from: ``torch`` in ``torch.nn.Softmax().x[0]``."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return node if isinstance(node, ast.Name) else None


def value_expressions(node: ast.AST) -> Iterator[ast.AST]:
    """The expressions whose object an expression may hand on (the elements of a tuple, the
    branches of ``a if c else b``...)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from value_expressions(element)
    elif isinstance(node, ast.IfExp):
        yield from value_expressions(node.body)
        yield from value_expressions(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from value_expressions(value)
    elif isinstance(node, (ast.Starred, ast.NamedExpr)):
        yield from value_expressions(node.value)
    else:
        yield node


def value_roots(node: ast.AST) -> Iterator[ast.Name]:
    """Names whose object an expression hands on unchanged (``T = torch.Tensor``,
    ``T, U = nn.Module, F``); a call makes a new object and is not followed."""
    for value in value_expressions(node):
        while isinstance(value, (ast.Attribute, ast.Subscript)):
            value = value.value
        if isinstance(value, ast.Name):
            yield value


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


def argument_defaults(arguments: ast.arguments) -> Iterator[tuple[str, ast.expr]]:
    """``(parameter, default)`` pairs: a default hands its object on to the parameter."""
    positional = [*arguments.posonlyargs, *arguments.args]
    with_default = positional[len(positional) - len(arguments.defaults):]
    yield from ((a.arg, d) for a, d in zip(with_default, arguments.defaults, strict=True))
    yield from ((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                           strict=True) if d is not None)


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
