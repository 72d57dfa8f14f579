"""Every command of ``python -m annotated_transformer <command>`` (and of the console script
``annotated-transformer``), written once: its name, its one line of help, and where its
code is.

The model commands (train, evaluate, ...) are those of :data:`annotated_transformer.cli.COMMANDS`,
with the help each gives its own parser: a command added there appears here too. The
course's commands (grading, authoring, distribution, the benchmark) are listed in
:data:`COURSE_COMMANDS`; each keeps its own parser, reached as
``python -m annotated_transformer <command> --help``. This is the one way to launch them.

A command's code is imported only when it runs, so that ``grade`` never loads the model
code and ``--help`` never loads the grader.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Any

from annotated_transformer.layout import EXERCISES_DIR, SOLUTIONS_DIR, folder_name

PROG = "python -m annotated_transformer"


@dataclass(frozen=True)
class Command:
    """One command: ``entry`` is ``"module:function"``, a function that takes the
    command's arguments (a list of strings) and returns the exit status; with
    ``takes_name`` it takes the command's name first (the model commands share one
    parser)."""

    name: str
    help: str
    entry: str
    takes_name: bool = False
    maintainers: bool = False  # the course's own tool: a student release does not list it

    def run(self, argv: list[str]) -> int:
        module, _, function = self.entry.partition(":")
        main = getattr(importlib.import_module(module), function)
        return main([self.name, *argv] if self.takes_name else argv)


COURSE_COMMANDS = (
    Command("grade", "run the graded tests, report points per exercise",
            "annotated_transformer.course.grading.grade:main"),
    Command("stubs", f"regenerate or check {folder_name(EXERCISES_DIR)} from "
            f"{folder_name(SOLUTIONS_DIR)}",
            "annotated_transformer.course.authoring.stubs:main", maintainers=True),
    Command("release", "write a student release of the course: the repository without its "
            "answers", "annotated_transformer.course.distribution.release:main",
            maintainers=True),
    Command("classroom", "write the GitHub Classroom workflow, one step per exercise",
            "annotated_transformer.course.distribution.classroom:main"),
    Command("regrade", "re-grade many submissions into one gradebook (for instructors)",
            "annotated_transformer.course.instructor.regrade:main"),
    Command("hint", "the next hint for an exercise: the idea, the approach, the tricky line",
            "annotated_transformer.course.hints:main"),
    Command("bench", "how fast the course's Transformer trains, beside PyTorch's own",
            "annotated_transformer.bench.command:main", maintainers=True),
)


class _Listing:
    """Stands in for the subparsers of :func:`annotated_transformer.cli.build_parser`:
    notes each command's name and help as ``add_X`` adds it (and builds its parser)."""

    def __init__(self) -> None:
        self.found: list[Command] = []
        self._subparsers = argparse.ArgumentParser(prog=PROG).add_subparsers()

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        self.found.append(Command(name, kwargs.get("help") or "",
                                  "annotated_transformer.cli:main", takes_name=True))
        return self._subparsers.add_parser(name, **kwargs)


def model_commands() -> tuple[Command, ...]:
    """The commands of the model command line (:mod:`annotated_transformer.cli`), in its
    order, each with the help it gives there."""
    from annotated_transformer import cli

    listing = _Listing()
    for add in cli.COMMANDS:
        add(listing)
    return tuple(listing.found)


def all_commands() -> dict[str, Command]:
    """``{name: Command}``: the model commands, then the course's."""
    return {c.name: c for c in (*model_commands(), *COURSE_COMMANDS)}


def overview(commands: dict[str, Command]) -> str:
    """The top-level help: every command and its line."""
    width = max(len(name) for name in commands)
    course = {c.name for c in COURSE_COMMANDS}
    lines = [f"usage: {PROG} <command> [options]   (or: annotated-transformer <command> ...)",
             "", "The Transformer from first principles: the models, and the course's tools.",
             "", "models:"]
    lines += [f"  {c.name:<{width}}  {c.help}" for c in commands.values() if c.name not in course]
    lines += ["", "the course:"]
    listed = SOLUTIONS_DIR.is_dir()  # the course's repository, not a student release
    lines += [f"  {c.name:<{width}}  {c.help}" for c in commands.values()
              if c.name in course and (listed or not c.maintainers)]
    lines += ["", f"`{PROG} <command> --help` describes each."]
    return "\n".join(lines)
