"""The rules on attributes and calls: double-underscore and private attributes, what
``active_parts()`` is besides the parts, class patterns, string annotations and forbidden
keyword arguments."""
from __future__ import annotations

import ast

from annotated_transformer.course.grading.source_rules.base import CheckerBase, clip, snippet
from annotated_transformer.course.grading.source_rules.rules import (
    ONE_ARGUMENT_ONLY,
    PARTS_OWN,
    is_dunder,
    library_private_names,
)


class AttributeRules(CheckerBase):
    """Attributes, calls and keywords."""

    # -------------------------------------------------------------- attributes

    def check_attribute(self, node: ast.Attribute) -> None:
        """Dunder and private attributes, the banned names, Parts' own methods, and the
        exercise's forbidden names."""
        base, name = node.value, node.attr
        code = snippet(node)
        if is_dunder(name):
            self.check_dunder_attribute(node)
        elif name.startswith("_"):
            self.check_private(node, name, code, base)
        else:
            self.check_attribute_name(node, name, code, base)
        if name in ONE_ARGUMENT_ONLY:
            self.check_one_argument(node, name)
        if self._through_parts(base):
            if name in PARTS_OWN:
                self.add(node, f"`{code}` is not allowed in an exercise file: take a part by "
                               f"its name, e.g. `active_parts().softmax`")
            return
        self.check_forbidden_name(node, name, code)

    def check_private(self, node: ast.Attribute, name: str, code: str, base: ast.AST) -> None:
        """``self._name`` only: in a method, on its own ``self``/``cls``, a name that the
        file gives its own objects and that no library uses for its internals."""
        if name in library_private_names():
            self.add(node, f"`{code}` is not allowed in an exercise file: names starting with "
                           f"`_` are PyTorch's internals, and `{name}` is one of them (of "
                           f"PyTorch's, numpy's or Python's); if it is your own attribute, "
                           f"rename it")
        elif not self._self_based(base) or name not in self.own_private:
            self.add(node, f"`{code}` is not allowed in an exercise file: names starting with "
                           f"`_` are PyTorch's internals; use its public functions (only "
                           f"`self._name` in a method, for an attribute your class sets)")

    def check_dunder_attribute(self, node: ast.Attribute) -> None:
        """Only ``.__init__(...)`` called and a class's name (``self.__class__.__name__``,
        ``cls.__name__``, strings for messages): ``__class__`` otherwise, ``__dict__``,
        ``__globals__``, ``__subclasses__``... are the ways into the interpreter's internals."""
        parent = self.parent.get(id(node))
        if node.attr == "__init__" and isinstance(parent, ast.Call) and parent.func is node:
            return
        if self._class_name(node) or (isinstance(parent, ast.Attribute)
                                      and self._class_name(parent)):
            return
        self.add(node, f"`{snippet(node)}` is not allowed in an exercise file: attributes "
                       f"with double underscores reach the interpreter's internals (only "
                       f"`super().__init__(...)`)")

    def _class_name(self, node: ast.Attribute) -> bool:
        """``self.__class__.__name__`` or ``cls.__name__`` (``__qualname__`` too)."""
        if node.attr not in ("__name__", "__qualname__"):
            return False
        base = node.value
        if isinstance(base, ast.Attribute) and base.attr == "__class__":
            return isinstance(base.value, ast.Name) and base.value.id == "self"
        return isinstance(base, ast.Name) and base.id == "cls"

    def check_match_class(self, node: ast.MatchClass) -> None:
        """``case object(softmax=f):`` looks ``softmax`` up on the subject: each keyword of a
        class pattern is checked as the attribute it reads."""
        for name in node.kwd_attrs:
            code = f"case {snippet(node.cls)}({name}=...)"
            if name.startswith("_"):
                self.add(node, f"`{code}` is not allowed in an exercise file: it reads a "
                               f"private or double-underscore attribute")
            else:
                self.check_attribute_name(node, name, code, None)
                self.check_forbidden_name(node, name, code)

    def check_string_annotation(self, node: ast.Constant) -> None:
        """A string annotation is code that ``typing.get_type_hints`` would evaluate later:
        it may name types only (no calls, no double-underscore names)."""
        if not isinstance(node.value, str):
            return
        try:
            inner = ast.parse(node.value.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # not an expression: evaluating it would fail, it cannot run anything
        for part in ast.walk(inner):
            name = getattr(part, "id", None) or getattr(part, "attr", None) or ""
            if isinstance(part, (ast.Call, ast.Lambda)) or is_dunder(name):
                self.add(node, f"the annotation {clip(repr(node.value))} is not allowed in an "
                               f"exercise file: an annotation names types only")
                return

    # -------------------------------------------------------------- calls and keywords

    def check_keyword(self, node: ast.keyword) -> None:
        """A forbidden keyword argument (``label_smoothing=``), also hidden in ``**{...}``."""
        for exercise, names in self.keywords.items():
            used = {node.arg} if node.arg else self._unpacked_keys(node.value)
            for name in sorted(used & names):
                self.add(node.value, f"`{name}=` is not allowed in this file: exercise "
                                     f"{exercise} asks you to compute what it does yourself",
                         exercise)

    @staticmethod
    def _unpacked_keys(value: ast.AST) -> set[str]:
        """The keyword names a ``**{...}`` or ``**dict(...)`` argument passes."""
        if isinstance(value, ast.Dict):
            return {k.value for k in value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return {k.arg for k in value.keywords if k.arg}
        return set()
