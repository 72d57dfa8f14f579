"""The command line: ``python -m annotated_transformer <command> ...``.

    train      train a model on a task (copy, reverse, dates, addition, tsv)
    evaluate   held-out exact match and loss of a checkpoint
    translate  decode inputs with a checkpoint (greedy, beam search, sampling)
    attention  draw a checkpoint's attention maps for one input
    export     a smaller copy of a checkpoint, for evaluation only
    grade      run the graded tests, report points per exercise
    stubs      regenerate or check exercises/ from solutions/

``python -m annotated_transformer COMMAND --help`` describes each.
"""

from __future__ import annotations

import sys

from annotated_transformer import cli
from annotated_transformer.grading import grade, stubs

COMMANDS = {"grade": grade.main, "stubs": stubs.main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if not argv or argv[0] not in ("train", "evaluate", "translate", "attention", "export"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
