"""The command line: ``python -m annotated_transformer <command> ...``.

    grade   run the graded tests, report points per exercise (annotated_transformer.grade)
    stubs   regenerate or check exercises/ from solutions/ (annotated_transformer.stubs)
"""

from __future__ import annotations

import sys

from annotated_transformer import grade, stubs

COMMANDS = {"grade": grade.main, "stubs": stubs.main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
