"""Scopes: which scope each node is evaluated in, so that a built-in's name can be told
from a local variable that shadows it."""
from __future__ import annotations

import ast
from collections.abc import Iterator

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (ast.Module, ast.ClassDef, *_FUNCTIONS, *_COMPREHENSIONS)


class Scopes:
    """Which scope each node is evaluated in and which names each scope binds, so that a
    built-in's name can be told from a parameter or local variable that shadows it."""

    def __init__(self, tree: ast.Module) -> None:
        self.scope_of: dict[int, ast.AST] = {}
        self.parent_scope: dict[int, ast.AST | None] = {id(tree): None}
        self.bound: dict[int, set[str]] = {}
        self.declared_global: dict[int, set[str]] = {}
        self._walk(tree)

    def _walk(self, tree: ast.Module) -> None:
        """Give every node its scope, top-down (iteratively: a deeply nested file cannot
        exhaust the grader's stack)."""
        stack: list[tuple[ast.AST, ast.AST]] = [(child, tree) for child in tree.body]
        while stack:
            node, scope = stack.pop()
            self.scope_of[id(node)] = scope
            self._bind(node, scope)
            stack.extend(self._children(node, scope))

    def _children(self, node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """Each child with the scope it is evaluated in (defaults, decorators, bases and a
        comprehension's first iterable belong to the enclosing scope)."""
        if isinstance(node, _SCOPES):
            self.parent_scope[id(node)] = scope
        if isinstance(node, _FUNCTIONS):
            outer = [*getattr(node, "decorator_list", []), *getattr(node, "type_params", []),
                     node.args]
            returns = getattr(node, "returns", None)
            if returns is not None:
                outer.append(returns)
            yield from ((child, scope) for child in outer)
            body: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else [*node.body]
            yield from ((child, node) for child in body)
            self._bind_arguments(node)
        elif isinstance(node, ast.ClassDef):
            outer = [*node.decorator_list, *getattr(node, "type_params", []), *node.bases,
                     *node.keywords]
            yield from ((child, scope) for child in outer)
            yield from ((child, node) for child in node.body)
        elif isinstance(node, _COMPREHENSIONS):
            first, *_ = node.generators
            yield first.iter, scope
            for child in ast.iter_child_nodes(node):
                if child is not first:
                    yield child, node
            yield from ((child, node) for child in (first.target, *first.ifs))
        else:
            yield from ((child, scope) for child in ast.iter_child_nodes(node))

    def _bind_arguments(self, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                        ) -> None:
        """A function's parameters are its locals."""
        args = function.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        self.bound.setdefault(id(function), set()).update(a.arg for a in every if a)

    def _bind(self, node: ast.AST, scope: ast.AST) -> None:
        """Record the names a node binds in the scope it is evaluated in."""
        names: list[str] = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names = [node.name]
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names = [node.rest]
        elif isinstance(node, ast.Nonlocal):
            names = list(node.names)
        elif isinstance(node, ast.Global):
            self.declared_global.setdefault(id(scope), set()).update(node.names)
        self.bound.setdefault(id(scope), set()).update(names)

    def is_builtin(self, node: ast.Name) -> bool:
        """Whether the name may reach the built-in of that name: it is not a parameter or
        local of an enclosing function (module and class bindings depend on the order the
        code runs in, so they do not count)."""
        scope = self.scope_of.get(id(node))
        while scope is not None and not isinstance(scope, ast.Module):
            if node.id in self.declared_global.get(id(scope), ()):
                return True
            local = isinstance(scope, (*_FUNCTIONS, *_COMPREHENSIONS))
            if local and node.id in self.bound.get(id(scope), ()):
                return False
            scope = self.parent_scope.get(id(scope))  # a class body's names do not count
        return True

    def module_level(self, node: ast.AST) -> bool:
        """Whether the node is evaluated in the module's own scope."""
        return isinstance(self.scope_of.get(id(node)), ast.Module)
