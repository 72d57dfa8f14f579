"""The rules on imports, plain names and definitions: the import allow-list, banned
built-ins, double-underscore names, special methods and metaclasses."""
from __future__ import annotations

import ast

from annotated_transformer.course.grading.source_rules.base import CheckerBase, clip
from annotated_transformer.course.grading.source_rules.rules import (
    ALLOWED_DUNDER_METHODS,
    ALLOWED_IMPORTS,
    BANNED_BUILTINS,
    BANNED_DUNDER_METHODS,
    BUILTIN_NAMES,
    FROM_ONLY,
    ONE_ARGUMENT_ONLY,
    is_dunder,
    module_problem,
)


class NameRules(CheckerBase):
    """Imports, names and definitions."""

    # -------------------------------------------------------------- imports

    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        """Only the allow-list's modules, because any other one is a way to files,
        processes or the interpreter (``os``, ``importlib``, ``sys.modules``...)."""
        if isinstance(node, ast.ImportFrom) and node.level:
            self.add(node, f"relative imports are not allowed in an exercise file: keep "
                           f"helpers in the chapter file; import only {ALLOWED_IMPORTS}")
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                problem = module_problem(alias.name)
                if problem:
                    self.add(node, f"`import {clip(alias.name)}` is not allowed in an "
                                   f"exercise file: {problem}")
            return
        module = node.module or ""
        problem = None if module in FROM_ONLY else module_problem(module)
        if problem:
            self.add(node, f"`from {clip(module)} import ...` is not allowed here: {problem}")
            return
        for alias in node.names:
            self.check_imported_name(node, module, alias.name)
            if (alias.name in ONE_ARGUMENT_ONLY and alias.asname is not None
                    and alias.asname != alias.name):
                self.add(node, f"`from {module} import {alias.name} as {clip(alias.asname)}` is "
                               f"not allowed in an exercise file: import it by its own name")

    def check_imported_name(self, node: ast.ImportFrom, module: str, name: str) -> None:
        """A name taken from a module is checked as that module's attribute would be."""
        if name == "*":
            self.add(node, f"`from {module} import *` is not allowed in an exercise file: "
                           f"name what you import")
        elif module in FROM_ONLY and name not in FROM_ONLY[module]:
            allowed = ", ".join(sorted(FROM_ONLY[module]))
            self.add(node, f"`from {module} import {name}` is not allowed in an exercise "
                           f"file: from {module} import only {allowed}")
        else:
            self.check_attribute_name(node, name, f"from {module} import {name}", None,
                                      parent=module)
            self.check_forbidden_name(node, name, f"from {module} import {name}")

    # -------------------------------------------------------------- names

    def check_name(self, node: ast.Name) -> None:
        """Built-ins that escape the rules, dunder names, names the file never binds, and
        an imported ``wraps`` or ``deepcopy`` beyond its plain use."""
        name = node.id
        if isinstance(node.ctx, ast.Load) and not is_dunder(name):
            self.check_free_name(node)
        if name in ONE_ARGUMENT_ONLY and name in self.imported:
            self.check_one_argument(node, name)
        if is_dunder(name):
            self.check_dunder_name(node)
        elif name in BANNED_BUILTINS and isinstance(node.ctx, ast.Load):
            call = self.parent.get(id(node))
            called = isinstance(call, ast.Call) and call.func is node
            if name == "type" and id(node) in self.annotations and not called:
                return  # ``type[nn.Module]`` in an annotation is a type, not a call
            if self.scopes.is_builtin(node):
                own = f" (or rename your own `{name}`)" if name in self.all_bound else ""
                self.add(node, f"`{name}` is not allowed in an exercise file: it "
                               f"{BANNED_BUILTINS[name]}{own}")

    def check_free_name(self, node: ast.Name) -> None:
        """A name must be a built-in or bound somewhere in the file (imported, assigned, a
        parameter, a def): ``os`` used but never imported can only come from code that
        changed the module's namespace behind the rules (``functools.update_wrapper(f, g,
        updated=("__globals__",))``)."""
        if node.id not in BUILTIN_NAMES and node.id not in self.all_bound:
            self.add(node, f"`{node.id}` is used but never defined in this file: import it, "
                           f"assign it or take it as a parameter (a name from nowhere is "
                           f"not allowed in an exercise file)")

    def check_dunder_name(self, node: ast.Name) -> None:
        """``__all__`` at module level and the ``__name__ == "__main__"`` guard only:
        ``__builtins__``, ``__file__``, ``__loader__``... reach the interpreter."""
        if node.id == "__all__" and self.scopes.module_level(node):
            return
        if node.id == "__name__" and self._in_main_guard(node):
            return
        self.add(node, f"`{node.id}` is not allowed in an exercise file: names with double "
                       f"underscores reach the interpreter's internals (only `__all__` and "
                       f"`if __name__ == \"__main__\":`)")

    def _in_main_guard(self, node: ast.Name) -> bool:
        """``__name__`` in ``if __name__ == "__main__":`` at module level."""
        compare = self.parent.get(id(node))
        statement = self.parent.get(id(compare))
        if not (isinstance(compare, ast.Compare) and isinstance(statement, ast.If)
                and statement.test is compare and self.scopes.module_level(statement)):
            return False
        sides = [compare.left, *compare.comparators]
        return (len(sides) == 2 and isinstance(compare.ops[0], ast.Eq)
                and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))

    # -------------------------------------------------------------- definitions

    def check_definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Dunder methods only inside a class, and none that runs behind the learner's back."""
        if not is_dunder(node.name):
            return
        in_class = isinstance(self.scopes.scope_of.get(id(node)), ast.ClassDef)
        if not in_class:
            self.add(node, f"`def {node.name}` is not allowed outside a class in an exercise "
                           f"file: give the function a plain name")
        elif node.name not in ALLOWED_DUNDER_METHODS:
            reason = BANNED_DUNDER_METHODS.get(
                node.name, "is a hook that Python, PyTorch or numpy call behind your back")
            self.add(node, f"`def {node.name}` is not allowed in an exercise file: it "
                           f"{reason}; write a plain method")

    def check_class(self, node: ast.ClassDef) -> None:
        """No metaclass: it runs code the learner does not call."""
        for keyword in node.keywords:
            given = keyword.arg or "**"
            self.add(node, f"`class {node.name}(..., {given}=...)` is not allowed in an "
                           f"exercise file: a metaclass changes how classes are built; derive "
                           f"from nn.Module or nothing")
