"""How long a message may be, the id of the mistake it names, and how a message is shown as data:
one rule for the worker, the pytest plugin and the reports."""

from __future__ import annotations

import hmac
import re
import secrets
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


# A graded test that recognises a known mistake (tests/graded/mistakes.py) puts its id in the
# test's message, sealed with a secret of the grader's own process: the learner's code runs in
# another process (the worker) that never sees the secret, so nothing it raises or prints can
# name a mistake. The plugin takes the sealed id out of the message into the record's
# ``mistake`` field, and every report reads that field, never the text.
_SEAL = secrets.token_hex(16)
_SEALED_TAG = re.compile(r"\[mistake (\d+\.\d+/[a-z0-9][a-z0-9_-]*) ([0-9a-f]{32})\]")
# The id as readers see it (and as a learner's text may imitate it).
MISTAKE_TAG = re.compile(r"\[mistake (\d+\.\d+/[a-z0-9][a-z0-9_-]*)\]")


def mistake_tag(mistake: str) -> str:
    """The sealed tag that names ``mistake`` in a graded test's message."""
    return f"[mistake {mistake} {_SEAL}]"


def unseal(message: str) -> tuple[str, str]:
    """``(text, mistake)``: the message without the grader's sealed tags, and the id of the
    last one ("" for none). Text that only looks like a tag (``[mistake ID]`` written by the
    learner's code, or a tag with another seal) names nothing and is marked as not the
    grader's."""
    named = ""

    def take(match: re.Match[str]) -> str:
        nonlocal named
        if hmac.compare_digest(match.group(2), _SEAL):
            named = match.group(1)
            return ""
        return f"[not the grader's: mistake {match.group(1)}]"

    text = _SEALED_TAG.sub(take, message or "")
    text = MISTAKE_TAG.sub(lambda m: f"[not the grader's: mistake {m.group(1)}]", text)
    return text.rstrip(), named


# Characters a terminal or an editor obeys rather than shows: C0 and C1 controls (a carriage
# return, an escape, U+009B, the CSI), DEL, the line and paragraph separators, and the
# marks, embeddings, overrides and isolates that reorder bidirectional text (U+202E).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u2028\u2029\u200e\u200f"
                     "\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` on one line with every control character (a carriage return, an escape
    sequence, a line break) shown as its escape, so that it cannot move or restyle what a
    reader sees."""
    text = str(text).replace("\n", "\\n")
    return CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def markdown_code(text: str, table: bool = False) -> str:
    """``text`` as a Markdown code span (nothing in it is a heading, a link, HTML or
    emphasis), on one line; ``table``: inside a table's cell (its ``|`` escaped)."""
    text = visible(text)
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if table else span
