"""The rules on what a file defines and changes: special methods, metaclasses and Tensor
subclasses, and assignments to what is not the learner's."""
from __future__ import annotations

import ast

from annotated_transformer.course.grading.source_rules.base import CheckerBase
from annotated_transformer.course.grading.source_rules.expressions import root_name, value_expressions
from annotated_transformer.course.grading.source_rules.rules import (
    ALLOWED_DUNDER_METHODS,
    BANNED_BASES,
    BANNED_DUNDER_METHODS,
    SELF_NAMES,
    is_dunder,
)
from annotated_transformer.course.grading.source_rules.violations import snippet


class DefinitionRules(CheckerBase):
    """Definitions, classes and assignments."""

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
        """No metaclass and no Tensor subclass: both run code the learner does not call."""
        for keyword in node.keywords:
            given = keyword.arg or "**"
            self.add(node, f"`class {node.name}(..., {given}=...)` is not allowed in an "
                           f"exercise file: a metaclass changes how classes are built; derive "
                           f"from nn.Module or nothing")
        for base in node.bases:
            if self._banned_base(base):
                self.add(node, f"`class {node.name}({snippet(base)})` is not allowed in an "
                               f"exercise file: a Tensor subclass intercepts PyTorch's calls; "
                               f"derive from nn.Module or nothing")

    def _banned_base(self, base: ast.AST) -> bool:
        """Whether a base names Tensor or Parameter, also through ``from torch import Tensor
        as Base`` or ``Base = torch.Tensor`` (each name looked into once per file)."""
        if isinstance(base, ast.Attribute):
            return base.attr.endswith(BANNED_BASES)
        if not isinstance(base, ast.Name):
            return False
        if base.id not in self.base_verdicts:
            self.base_verdicts[base.id] = False  # a cycle of aliases reaches nothing new
            self.base_verdicts[base.id] = base.id.endswith(BANNED_BASES) or any(
                self._hands_on_banned_base(base.id, value)
                for value in self.values_of.get(base.id, ()))
        return self.base_verdicts[base.id]

    def _hands_on_banned_base(self, name: str, value: ast.AST) -> bool:
        """Whether one binding of ``name`` gives it a Tensor-like class."""
        if isinstance(value, ast.ImportFrom):
            return any(a.name.endswith(BANNED_BASES) for a in value.names
                       if (a.asname or a.name) == name)
        return not isinstance(value, ast.Import) and any(
            self._banned_base(inner) for inner in value_expressions(value))

    # -------------------------------------------------------------- assignments

    def check_store(self, node: ast.AST) -> None:
        """No assignment or ``del`` on an imported module or class (``torch.softmax = f``,
        ``nn.Module.__call__ = g``): that changes PyTorch for the grader too."""
        if not isinstance(node, (ast.Attribute, ast.Subscript)):
            return
        root = root_name(node)
        if root is None or root.id in SELF_NAMES:
            return
        if root.id in self.protected or self._unbound_builtin(root):
            self.add(node, f"`{snippet(node)}` is not allowed in an exercise file: it changes "
                           f"`{root.id}`, which is not yours; assign to your own objects "
                           f"(self.x = ...)")
