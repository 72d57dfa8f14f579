"""Hints that teach in steps: ``python -m annotated_transformer hint 2.1``.

Every graded exercise has three hints in ``hints.toml`` beside this module: level 1 the
idea, level 2 the approach, level 3 the tricky line. Each call prints the next level of one
exercise; which levels a learner has seen is kept in ``.hints-seen.json`` in the current
folder. ``--level N`` prints level N (and counts it as seen), ``--reset`` starts again.

The book's page of hints (``book/hints.md``) is written from the same file by
:func:`book_page` (``python scripts/hints_page.py``); ``tests/distribution/test_hints.py``
checks that they agree and that no hint holds a line of the reference solution.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import tomllib

from annotated_transformer.course.grading.exercise_id import ExerciseId, order

HINTS_FILE = Path(__file__).with_name("hints.toml")
SEEN_FILE = ".hints-seen.json"
LEVELS = ("idea", "approach", "tricky")
LEVEL_NAMES = {1: "the idea", 2: "the approach", 3: "the tricky line"}
PROG = "python -m annotated_transformer hint"


@dataclass(frozen=True)
class Hint:
    exercise: str  # "2.1"
    title: str
    levels: tuple[str, str, str]  # the idea, the approach, the tricky line

    @property
    def chapter(self) -> int:
        return ExerciseId(self.exercise).chapter



def load_hints(path: Path = HINTS_FILE) -> dict[str, Hint]:
    """``{exercise id: Hint}`` in the course's order; a missing level is an error naming it."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    hints = {}
    for exercise in sorted(data, key=order):
        entry = data[exercise]
        missing = [key for key in ("title", *LEVELS) if not str(entry.get(key, "")).strip()]
        if missing:
            raise ValueError(f"{path}: exercise {exercise} has no {', '.join(missing)}")
        hints[exercise] = Hint(exercise, entry["title"], tuple(entry[key] for key in LEVELS))
    return hints


def _read_seen(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    try:
        seen = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(seen, dict) and all(isinstance(v, int) for v in seen.values()):
            return seen
    except (ValueError, UnicodeDecodeError):
        pass
    raise ValueError(f"{path} is not a record of hints seen; delete it, or run "
                     f"`{PROG} --reset` to start again")


def _write_seen(path: Path, seen: dict[str, int]) -> None:
    path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def format_hint(hint: Hint, level: int) -> str:
    text = textwrap.fill(hint.levels[level - 1], width=88)
    lines = [f"Hint {hint.exercise}, level {level} of 3 ({LEVEL_NAMES[level]}): {hint.title}",
             "", text, ""]
    if level < 3:
        lines.append(f"(run `{PROG} {hint.exercise}` again for level {level + 1})")
    else:
        lines.append("(that was the last level; the docstring holds the contract)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Print the next hint for an exercise: level 1 the idea, "
        "2 the approach, 3 the tricky line. What you have seen is kept in "
        f"{SEEN_FILE} in the current folder.")
    parser.add_argument("exercise", nargs="?", help="the exercise, e.g. 2.1")
    parser.add_argument("--level", type=int, choices=(1, 2, 3),
                        help="print this level (and count it as seen)")
    parser.add_argument("--reset", action="store_true",
                        help="forget the hints seen (of this exercise, or of all without one)")
    args = parser.parse_args(argv)
    hints = load_hints()
    if args.exercise is not None and args.exercise not in hints:
        print(f"error: no exercise {args.exercise!r}; the exercises are "
              f"{', '.join(hints)}", file=sys.stderr)
        return 2
    seen_path = Path.cwd() / SEEN_FILE
    if args.reset:
        try:
            seen = _read_seen(seen_path) if args.exercise is not None else {}
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        seen.pop(args.exercise, None)
        _write_seen(seen_path, seen)
        print(f"hints of {args.exercise or 'every exercise'} start again at level 1")
        return 0
    if args.exercise is None:
        parser.error("name an exercise, e.g. `hint 2.1` (or use --reset)")
    try:
        seen = _read_seen(seen_path)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    shown = seen.get(args.exercise, 0)
    level = args.level or shown + 1
    if level > 3:
        print(f"no more hints for {args.exercise}: you have seen all 3 levels. "
              f"`{PROG} {args.exercise} --level N` shows one again; --reset starts again.")
        return 0
    print(format_hint(hints[args.exercise], level))
    seen[args.exercise] = max(shown, level)
    _write_seen(seen_path, seen)
    return 0


def book_page(hints: dict[str, Hint] | None = None) -> str:
    """The book's page of hints (``book/hints.md``), one collapsed block per level."""
    hints = load_hints() if hints is None else hints
    lines = ["# Hints", "",
             "<!-- Written from annotated_transformer/course/hints.toml by "
             "`python scripts/hints_page.py`: edit that file, not this page. -->", "",
             "Stuck on an exercise? Each one has three hints, each hidden until you open it: "
             "**level 1**, the idea; **level 2**, the approach; **level 3**, the tricky line. "
             "Open one level at a time and go back to your code in between. No hint holds "
             "the solution's code; the exercise's docstring keeps the contract (shapes, math, "
             "errors).", "",
             "The same hints come one level at a time on the command line:", "",
             "```bash", f"{PROG} 2.1            # the next level for exercise 2.1",
             f"{PROG} 2.1 --level 3  # one given level",
             f"{PROG} 2.1 --reset    # start again at level 1", "```", ""]
    chapter = None
    for hint in hints.values():
        if hint.chapter != chapter:
            chapter = hint.chapter
            lines += [f"## Chapter {chapter}", ""]
        lines += [f"### {hint.exercise} {hint.title}", ""]
        for level, text in enumerate(hint.levels, start=1):
            lines += [f":::{{dropdown}} Level {level}: {LEVEL_NAMES[level]}", text, ":::", ""]
    return "\n".join(lines)
