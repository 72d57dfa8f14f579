"""The command line for models: train, evaluate, translate, attention, export, average.

    python -m annotated_transformer train --task dates --out runs/dates
    python -m annotated_transformer evaluate --checkpoint runs/dates/checkpoint.pt --json
    python -m annotated_transformer translate --checkpoint runs/dates/checkpoint.pt "3 May 98"
    python -m annotated_transformer attention --checkpoint runs/dates/checkpoint.pt "3 mai 1998" \
        --out maps.png
    python -m annotated_transformer export --checkpoint runs/dates/checkpoint.pt --out dates.pt
    python -m annotated_transformer train --task translation --dataset bentrevett/multi30k \
        --source-lang de --target-lang en --out runs/multi30k --keep-last 5
    python -m annotated_transformer average --last 5 runs/multi30k --out runs/multi30k/avg.pt
    python -m annotated_transformer evaluate --checkpoint runs/multi30k/avg.pt   # BLEU, chrF

One module per group of commands: ``training`` (train), ``checkpoints`` (evaluate,
translate, attention, export, average), ``translation`` (the translation task's options and
scores), ``common`` (what they share). A new command is an ``add_X(sub)`` named in
:func:`build_parser`'s list. Bad arguments and bad data end with a one-line message and
exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import warnings

from annotated_transformer import checkpoint
from annotated_transformer.cli.checkpoints import (
    add_attention,
    add_average,
    add_evaluate,
    add_export,
    add_translate,
)
from annotated_transformer.cli.common import UsageError, parse_parts, pick_device
from annotated_transformer.cli.training import add_train
from annotated_transformer.data import DataError, VocabularyError
from annotated_transformer.layout import EXERCISES_DIR, folder_name
from annotated_transformer.parts import has_reference
from annotated_transformer.student_release import RELEASE_NOTE

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "parse_parts", "pick_device"]


COMMANDS = (add_train, add_evaluate, add_translate, add_attention, add_export, add_average)
"""One ``add_X(subparsers)`` per command, in the order ``--help`` lists them."""


def build_parser(prog: str = "python -m annotated_transformer") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            # A student release, where the reference was asked for: a line of its own.
            warnings.showwarning = functools.partial(release_note, warnings.showwarning)
            return args.run(args)
    except (UsageError, DataError, VocabularyError, checkpoint.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except NotImplementedError as error:  # a stub of the parts the model is built from
        print(f"error: {unfinished(error)}", file=sys.stderr)
        return 1
    except SyntaxError as error:  # a chapter file of the parts that does not parse
        print(f"error: {not_python(error)}", file=sys.stderr)
        return 1


def release_note(show, message, category, filename, lineno, file=None, line=None) -> None:
    """Print the release's note (the reference replaced by exercises/) as ``note: ...``."""
    if str(message) == RELEASE_NOTE:
        print(f"note: {RELEASE_NOTE}", file=sys.stderr)
    else:
        show(message, category, filename, lineno, file, line)


def not_python(error: SyntaxError) -> str:
    """A file of the parts that does not parse, in one line: where, what, the line's text."""
    text = " ".join((error.text or "").split())
    shown = f" (`{text if len(text) <= 60 else text[:57] + '...'}`)" if text else ""
    return (f"{error.filename}, line {error.lineno}: this line is not valid Python: "
            f"{error.msg}{shown}; fix it so the file runs")


def unfinished(error: NotImplementedError) -> str:
    """What to do when the model needs an exercise that is still a stub."""
    match = re.match(r"Exercise (\d+\.\d+)", str(error))
    check = f" --exercise {match[1]}" if match else ""
    other = ", or train with other --parts" if has_reference() else ""
    return (f"{error}: the model is built from parts that include this stub (the first one "
            f"met while building it). Write it in {folder_name(EXERCISES_DIR)} (`python -m "
            f"annotated_transformer grade{check}` checks it; without --exercise it lists "
            f"every unfinished one){other}")

