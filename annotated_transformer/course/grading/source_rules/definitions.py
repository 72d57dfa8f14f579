"""The rules on what a file defines and changes: special methods, metaclasses and Tensor
subclasses, and assignments to what is not the learner's."""
from __future__ import annotations

import ast
import functools

from annotated_transformer.course.grading.source_rules.base import CheckerBase
from annotated_transformer.course.grading.source_rules.expressions import (
    root_name,
    value_expressions,
)
from annotated_transformer.course.grading.source_rules.rules import (
    ALLOWED_DUNDER_METHODS,
    BANNED_BASES,
    BANNED_DUNDER_METHODS,
    SELF_NAMES,
    is_dunder,
)
from annotated_transformer.course.grading.source_rules.violations import snippet

# Methods that change a dict, list or set in place.
MUTATORS = frozenset("update setdefault pop popitem clear append extend insert remove add "
                     "discard".split())
_CHANGES = ("`{code}` is not allowed in an exercise file: it changes an object that "
            "`{root}` reaches in PyTorch or Python's library, not one you built; build your "
            "own (self.x = ..., or a new tensor)")


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

    # -------------------------------------------------------------- objects not the file's

    @functools.cached_property
    def reached(self) -> tuple[set[str], set[str]]:
        """``(library, read)``: names bound to an object of PyTorch or of Python's library
        (what an expression built from an import or a built-in gives: ``w =
        functools.wraps(f)``, ``x = torch.zeros(3)``, and what those hand on), and names bound
        to an attribute read of something not ``self``'s (``kw = w.keywords``): the objects
        that a file reaches through names it may use, rather than builds itself."""
        library = set(self.protected)
        read: set[str] = set()
        pairs = [(name, inner) for name, value in self.bindings if value is not None
                 and not isinstance(value, (ast.Import, ast.ImportFrom))
                 for inner in value_expressions(value)]
        for name, value in pairs:
            root = root_name(value)
            if isinstance(value, ast.Attribute) and not (root is not None
                                                         and root.id in SELF_NAMES):
                read.add(name)
        changed = True
        while changed:  # a name bound to what a library name gives is a library object
            changed = False
            for name, value in pairs:
                root = root_name(value)
                if name not in library and root is not None and (
                        root.id in library or self._unbound_builtin(root)):
                    library.add(name)
                    changed = True
        return library, read

    def changes_a_reached_object(self, node: ast.AST, store: bool) -> str | None:
        """The name through which ``node`` (a store target, or the receiver of a method
        that changes it in place) reaches an object not the file's, or None: an object
        reached through an attribute of a library object (``w.keywords[...] = ...``), or
        anything of a name bound to an attribute read (``kw[...] = ...``). A tensor's own
        items and fields (``x[i] = 0``, ``x.requires_grad = True``) and the learner's
        ``self`` are the file's to change."""
        root = root_name(node)
        if root is None or root.id in SELF_NAMES:
            return None
        library, read = self.reached
        through_attribute = False
        part = node.value if store and isinstance(node, (ast.Attribute, ast.Subscript)) else node
        while isinstance(part, (ast.Attribute, ast.Subscript, ast.Call)):
            through_attribute |= isinstance(part, ast.Attribute)
            part = part.func if isinstance(part, ast.Call) else part.value
        if root.id in read or (through_attribute and root.id in library):
            return root.id
        return None

    def check_mutation(self, node: ast.Attribute) -> None:
        """``obj.update(...)``, ``obj.append(...)``... on an object reached, not built: a
        store by another spelling (``functools.wraps(f).keywords.update(...)``)."""
        call = self.parent.get(id(node))
        if not (node.attr in MUTATORS and isinstance(call, ast.Call) and call.func is node):
            return
        receiver = node.value
        if isinstance(receiver, ast.Name):
            through = receiver.id if receiver.id in self.reached[1] else None
        else:
            through = self.changes_a_reached_object(receiver, store=False)
        if through is not None:
            self.add(node, _CHANGES.format(code=snippet(call), root=through))

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
            return
        through = self.changes_a_reached_object(node, store=True)
        if through is not None:
            self.add(node, _CHANGES.format(code=snippet(node), root=through))
