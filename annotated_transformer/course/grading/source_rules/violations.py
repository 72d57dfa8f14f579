"""What a violation is, and how its one-line message is shaped."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from annotated_transformer.course.grading.source_rules.rules import MAX_MESSAGE


@dataclass(frozen=True)
class Violation:
    """One thing a learner's file may not do, at one line."""

    path: str  # the file's path as given (check_file) or from the folder's name (check_folder)
    line: int
    exercise: str | None  # "2.1" for a forbidden name of that exercise, else None
    message: str  # one line: what is not allowed and what to do instead


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
