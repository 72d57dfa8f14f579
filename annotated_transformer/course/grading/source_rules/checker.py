"""The checker: every rule over every node of one parsed file."""
from __future__ import annotations

import ast

from annotated_transformer.course.grading.source_rules.attributes import AttributeRules
from annotated_transformer.course.grading.source_rules.names import NameRules
from annotated_transformer.course.grading.source_rules.rules import MAX_VIOLATIONS
from annotated_transformer.course.grading.source_rules.violations import Violation


class Checker(NameRules, AttributeRules):
    """Reads one parsed file and collects its violations."""

    # -------------------------------------------------------------- running the rules

    def run(self) -> list[Violation]:
        """Every rule over every node; the violations in line order, at most MAX_VIOLATIONS."""
        for node in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
            elif isinstance(node, ast.Name):
                self.check_name(node)
            elif isinstance(node, ast.Attribute):
                self.check_attribute(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.check_definition(node)
            elif isinstance(node, ast.ClassDef):
                self.check_class(node)
            elif isinstance(node, ast.keyword):
                self.check_keyword(node)
            elif isinstance(node, ast.MatchClass):
                self.check_match_class(node)
            elif id(node) in self.annotations and isinstance(node, ast.Constant):
                self.check_string_annotation(node)
        found = sorted(set(self.found), key=lambda v: (v.line, v.exercise or "", v.message))
        if len(found) <= MAX_VIOLATIONS:
            return found
        kept, rest = found[: MAX_VIOLATIONS - 1], found[MAX_VIOLATIONS - 1:]
        more = Violation(self.path, rest[0].line, None,
                         f"{len(rest)} more things not allowed from line {rest[0].line} on "
                         f"are not listed; fix the ones above first")
        return [*kept, more]
