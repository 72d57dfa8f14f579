"""``python -m annotated_transformer <command> ...`` and the console script
``annotated-transformer``: one command tree, whose commands are listed in
:mod:`annotated_transformer.commands`. ``--help`` lists them; ``<command> --help``
describes one."""

from __future__ import annotations

import sys

from annotated_transformer.commands import COURSE_COMMANDS, all_commands, overview


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(overview(all_commands()))
        return 0
    if not argv:
        print(overview(all_commands()), file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    # The course's commands need no model code: found without building the model parser.
    command = next((c for c in COURSE_COMMANDS if c.name == name), None)
    if command is None:
        commands = all_commands()
        command = commands.get(name)
        if command is None:
            print(overview(commands), file=sys.stderr)
            print(f"\nerror: unknown command {name!r}; choose one of "
                  f"{', '.join(commands)}", file=sys.stderr)
            return 2
    return command.run(rest)


if __name__ == "__main__":
    sys.exit(main())
