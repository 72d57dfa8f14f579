"""How long a message may be: one rule for the worker, the pytest plugin and the reports."""

from __future__ import annotations

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
