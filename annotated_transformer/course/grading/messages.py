"""How long a message may be, and the id of the mistake it names: one rule for the worker, the
pytest plugin and the reports."""

from __future__ import annotations

import re
from typing import Any

# The most characters of a message that travels or is reported (the marker of the cut included).
MESSAGE_LIMIT = 2000


def cut(text: Any, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` (made a string) of at most ``limit`` characters: a longer one keeps its
    beginning and ends with ``[... cut: N characters]``; a lone surrogate (which no file
    can hold) becomes its escape."""
    text = str(text)
    if any("\ud800" <= c <= "\udfff" for c in text[:limit * 2]):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    keep = limit - len(f" [... cut: {len(text)} characters]")
    return f"{text[:keep]} [... cut: {len(text) - keep} characters]"


# A message that names a known mistake ends with its id in this form (tests/graded/mistakes.py):
# the grader reads it back into the reports, and the instructor's class summary counts it.
MISTAKE_TAG = re.compile(r"\[mistake (\d+\.\d+/[a-z0-9][a-z0-9_-]*)\]")


def mistake_of(message: str) -> str:
    """The id of the mistake ``message`` names (its last ``[mistake ID]`` tag), "" for none."""
    found = MISTAKE_TAG.findall(message or "")
    return found[-1] if found else ""
