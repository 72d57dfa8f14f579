"""annotated_transformer: the Transformer of "Attention Is All You Need", built chapter by chapter.

Parts come from the reference (``solutions``), the learner's work (``exercises``)
or a mix: see :mod:`annotated_transformer.parts`.

Every command runs as ``python -m annotated_transformer <command>``; ``python -m`` on one of
the package's modules (``python -m annotated_transformer.train``) would import it and do
nothing, so it stops here with the command to run instead (:func:`_refuse_module_runs`).
"""

def __getattr__(name: str):
    """``Parts``, ``active_parts`` and ``use_parts``, imported when first asked for (they
    import PyTorch, which a command such as ``grade --points`` does not need)."""
    if name in __all__:
        from annotated_transformer import parts

        return getattr(parts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Parts", "active_parts", "use_parts"]
__version__ = "0.1.0"


def _module_run() -> str | None:
    """The module that ``python -m`` is looking for while it imports this package, or None
    (Python sets ``sys.argv[0]`` to ``"-m"`` only then)."""
    import sys

    if sys.argv[:1] != ["-m"]:
        return None
    argv = getattr(sys, "orig_argv", [])[1:]
    while argv:
        arg = argv.pop(0)
        if arg == "--check-hash-based-pycs":  # the one long option with an argument
            argv[:1] = []
            continue
        if arg.startswith("--"):
            continue
        if not arg.startswith("-") or arg == "-":
            return None  # a script or standard input
        # A cluster of short options (`-Im`, `-Wignore`, `-OOm`): after one that takes an
        # argument, the rest of the cluster (or the next word) is that argument.
        for i, flag in enumerate(arg[1:], 2):
            if flag in "mcWX":
                value = arg[i:] or (argv.pop(0) if argv else "")
                if flag == "m":
                    return value or None
                if flag == "c":
                    return None
                break
    return None


# The modules ``python -m`` may run: the command tree, and ``grade`` for learners' older
# grading workflows (until the end of the 2026/27 course year: the book's instructor page).
RUNNABLE = ("__main__", "grade")


def _refuse_module_runs() -> None:
    """Exit with status 2 and the command to run when ``python -m`` runs one of this
    package's modules other than :data:`RUNNABLE`."""
    import sys

    name = _module_run()
    if not name or not name.startswith(__name__ + ".") or name.split(".", 1)[1] in RUNNABLE:
        return
    last = name.rsplit(".", 1)[-1]
    print(f"error: `python -m {name}` runs no command. Every command is `python -m "
          f"{__name__} <command> [options]` (here perhaps `python -m {__name__} {last}`); "
          f"`python -m {__name__} --help` lists them.", file=sys.stderr)
    raise SystemExit(2)


_refuse_module_runs()
