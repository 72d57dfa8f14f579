"""The checker's base: what a violation is, what the checker knows about one parsed file
(its scopes, bindings, imports) and how it records a violation."""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from annotated_transformer.course.grading.source_rules.rules import (
    MAX_MESSAGE,
    ONE_ARGUMENT_ONLY,
    SELF_NAMES,
    attribute_problem,
)
from annotated_transformer.course.grading.source_rules.scopes import Scopes


@dataclass(frozen=True)
class Violation:
    """One thing a learner's file may not do, at one line."""

    path: str  # the file's path as given (check_file) or from the folder's name (check_folder)
    line: int
    exercise: str | None  # "2.1" for a forbidden name of that exercise, else None
    message: str  # one line: what is not allowed and what to do instead
    unreadable: bool = False  # the file cannot be read as Python at all (the learner's error)

    def told(self) -> str:
        """What the learner reads: ``file, line N: message``."""
        return f"{Path(self.path).name}, line {self.line}: {self.message}"


def clip(text: str, width: int = 40) -> str:
    """The text, cut to ``width`` characters with a visible marker."""
    return text if len(text) <= width else text[: width - 3] + "..."


def snippet(node: ast.AST, width: int = 40) -> str:
    """The node's code, shortened for a one-line message."""
    try:
        text = " ".join(ast.unparse(node).split())
    except (RecursionError, ValueError):
        text = type(node).__name__
    return clip(text, width)


def one_line(message: str) -> str:
    """A message as one line of at most MAX_MESSAGE characters."""
    message = " ".join(message.split())
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


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


class CheckerBase:
    """One parsed file: what the rules need to know about it, the violations found so far,
    and the checks that several rules share."""

    def __init__(self, tree: ast.Module, path: str,
                 forbidden: Mapping[str, Sequence[str]]) -> None:
        self.path = path
        self.scopes = Scopes(tree)
        self.nodes = list(ast.walk(tree))
        self.parent = {id(child): node for node in self.nodes
                       for child in ast.iter_child_nodes(node)}
        self.attributes = {ex: {n for n in names if not n.endswith("=")}
                           for ex, names in forbidden.items()}
        self.keywords = {ex: {n[:-1] for n in names if n.endswith("=")}
                         for ex, names in forbidden.items()}
        self.imported = {name for node in self.nodes
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for name in self._import_binds(node)}
        self.bindings = list(self._bindings())
        self.all_bound = {name for name, _ in self.bindings}
        self.course_parts = self._active_parts_is_the_course()
        self.annotations = self._annotation_nodes()
        self.parts_names = self._parts_aliases()
        self.own_private = self._own_private_names()
        self.found: list[Violation] = []

    # -------------------------------------------------------------- bookkeeping

    @staticmethod
    def _import_binds(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        """The names an import statement binds (``import torch.nn`` binds ``torch``)."""
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0]

    def _annotation_nodes(self) -> set[int]:
        """Every node inside an annotation (of a parameter, a return or a variable)."""
        roots = [n.annotation for n in self.nodes if isinstance(n, (ast.arg, ast.AnnAssign))
                 and n.annotation is not None]
        roots += [n.returns for n in self.nodes
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
        return {id(inner) for root in roots for inner in ast.walk(root)}

    def _bindings(self) -> Iterator[tuple[str, ast.AST | None]]:
        """``(name, value)`` for each binding of a name; value None when it is not a plain
        assignment (a parameter, a loop target, an import, a def)."""
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    value = node.value if isinstance(target, ast.Name) else None
                    for name in target_names(target):
                        yield name, value
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(
                    node.target, ast.Name):
                yield node.target.id, node.value
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                for name in target_names(node.target):
                    yield name, node.iter  # the loop hands on the elements of iter
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                for name in target_names(node.optional_vars):
                    yield name, None
            elif isinstance(node, ast.arg):
                yield node.arg, None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield node.name, None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in self._import_binds(node):
                    yield name, node
            else:
                yield from ((name, None) for name in other_binding(node))

    def _parts_aliases(self) -> set[str]:
        """Names bound only to ``active_parts()`` (``parts = active_parts()``), when
        ``active_parts`` is only ever the course's."""
        if not self.course_parts:
            return set()
        values: dict[str, list[ast.AST | None]] = {}
        for name, value in self.bindings:
            values.setdefault(name, []).append(value)
        return {name for name, vs in values.items()
                if all(v is not None and self._is_active_parts_call(v) for v in vs)}

    def _active_parts_is_the_course(self) -> bool:
        """Whether ``active_parts`` is only ever the course's own import."""
        for name, value in self.bindings:
            if name == "active_parts" and not (
                    isinstance(value, ast.ImportFrom)
                    and value.module == "annotated_transformer.parts"):
                return False
        return True

    @staticmethod
    def _is_active_parts_call(node: ast.AST) -> bool:
        """``active_parts()`` exactly."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "active_parts" and not node.args and not node.keywords)

    def _through_parts(self, base: ast.AST) -> bool:
        """``active_parts().x`` and ``parts.x`` are the course's parts, not PyTorch's op."""
        if self._is_active_parts_call(base):
            return self.course_parts
        return isinstance(base, ast.Name) and base.id in self.parts_names

    def add(self, node: ast.AST, message: str, exercise: str | None = None) -> None:
        """Record a violation at the node's line, its message cut to one short line."""
        self.found.append(Violation(self.path, getattr(node, "lineno", 1), exercise,
                                    one_line(message)))

    # -------------------------------------------------------------- shared checks

    def _self_based(self, base: ast.AST) -> bool:
        """Whether an attribute's base is a method's own ``self`` or ``cls``: the first
        parameter of a function written directly in a class body, never rebound in it (a
        name alone is never enough: ``def f(self)`` may be given any object)."""
        if not (isinstance(base, ast.Name) and base.id in SELF_NAMES):
            return False
        function = self.parent.get(id(base))
        while function is not None and not isinstance(function, (ast.FunctionDef,
                                                                   ast.AsyncFunctionDef)):
            function = self.parent.get(id(function))
        if function is None or not isinstance(self.parent.get(id(function)), ast.ClassDef):
            return False
        arguments = [*function.args.posonlyargs, *function.args.args]
        if not arguments or arguments[0].arg != base.id:
            return False
        return not any(isinstance(n, ast.Name) and n.id == base.id
                       and isinstance(n.ctx, (ast.Store, ast.Del)) for n in ast.walk(function))

    def _own_private_names(self) -> frozenset[str]:
        """The ``_names`` the file gives its own objects: ``self._x = ...``, ``cls._x = ...``
        and what a class body binds (methods, class attributes)."""
        names = {n.attr for n in self.nodes if isinstance(n, ast.Attribute)
                 and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                 and n.value.id in SELF_NAMES}
        for node in self.nodes:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(n for t in targets for n in target_names(t))
        return frozenset(n for n in names if n.startswith("_"))

    def check_attribute_name(self, node: ast.AST, name: str, code: str,
                             base: ast.AST | None, parent: str | None = None) -> None:
        """Banned attribute names, and standard modules that PyTorch and friends re-export
        (``torch.os``), unless an attribute of the learner's own ``self``."""
        if base is not None and self._names_module(base, "torch.nn"):
            parent = "torch.nn"
        problem = attribute_problem(name, parent=parent)
        if problem:
            self.add(node, f"`{code}` is not allowed in an exercise file: {problem}")

    def _names_module(self, node: ast.AST, module: str) -> bool:
        """Whether ``node`` is that module for sure: a name bound only by importing it
        (``from torch import nn``, ``import torch.nn as nn``), or an attribute chain of such a
        name (``torch.nn``)."""
        if isinstance(node, ast.Attribute):
            above, _, last = module.rpartition(".")
            return node.attr == last and bool(above) and self._names_module(node.value, above)
        if not isinstance(node, ast.Name):
            return False
        values = [v for n, v in self.bindings if n == node.id]
        return bool(values) and all(self._imports_as(v, node.id, module) for v in values)

    @staticmethod
    def _imports_as(value: ast.AST | None, name: str, module: str) -> bool:
        """Whether the binding ``value`` of ``name`` is an import of ``module`` as ``name``."""
        if isinstance(value, ast.ImportFrom):
            return any(f"{value.module}.{a.name}" == module and (a.asname or a.name) == name
                       for a in value.names if (a.asname or a.name) == name)
        if isinstance(value, ast.Import):
            return any(a.name == module and (a.asname or a.name) == name
                       for a in value.names if (a.asname or a.name.split(".")[0]) == name)
        return False

    def check_forbidden_name(self, node: ast.AST, name: str, code: str) -> None:
        """The op an exercise asks the learner to write, by any attribute or import."""
        for exercise, names in self.attributes.items():
            if name in names:
                self.add(node, f"`{code}` is not allowed: exercise {exercise} asks you to "
                               f"write {name} yourself; call your own function or "
                               f"`active_parts().{name}`", exercise)

    def check_one_argument(self, node: ast.AST, name: str) -> None:
        """A function of ``ONE_ARGUMENT_ONLY`` (``wraps``, ``deepcopy``) only called where it
        is named, with one plain argument: never handed on, nor given its other arguments."""
        call = self.parent.get(id(node))
        plain = (isinstance(call, ast.Call) and call.func is node and len(call.args) == 1
                 and not isinstance(call.args[0], ast.Starred) and not call.keywords)
        if not plain:
            write, why = ONE_ARGUMENT_ONLY[name]
            self.add(node, f"this use of `{name}` is not allowed in an exercise file: write "
                           f"{write} ({why})")
