"""Generate ``exercises/`` from ``solutions/``: every solution region becomes a stub.

A region is the lines from ``# BEGIN SOLUTION <id>`` to ``# END SOLUTION``. In the
stub it becomes a ``TODO`` naming the exercise and
``raise NotImplementedError("Exercise <id>: <name> is not implemented yet")``,
indented like the markers; everything else (imports, signatures, docstrings with
their shapes, math and hints) is kept as it is.

    python -m annotated_transformer.stubs            # regenerate exercises/
    python -m annotated_transformer.stubs --check    # exit 1 if a committed stub is stale
    python -m annotated_transformer.stubs --out DIR  # write fresh stubs elsewhere

Each generated file records a digest of its own text, so that regenerating never
overwrites a learner's edits by accident (``--force`` does, on purpose).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from pathlib import Path

from annotated_transformer.grading.layout import EXERCISES_DIR, ROOT, SOLUTIONS_DIR

CHAPTER_FILE = re.compile(r"^ch\d\d_\w+\.py$")
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<id>\d+\.\d+)\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
DIGEST = re.compile(r"^# stub-digest: (?P<digest>[0-9a-f]{16})\n", re.MULTILINE)


class StubError(ValueError):
    """A solutions file whose markers cannot be turned into stubs."""


def enclosing_names(source: str) -> dict[int, str]:
    """Map each line number to the qualified name of the innermost function holding it."""
    names: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    for line in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                        names[line] = qualname
                visit(child, qualname + ".")

    visit(ast.parse(source), "")
    return names


def make_stub(source: str, filename: str = "<solutions>") -> str:
    """Return ``source`` with every solution region replaced by a stub (digest line not added)."""
    names = enclosing_names(source)
    out: list[str] = []
    region: tuple[int, str] | None = None  # (line where it began, exercise id)
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if region is None:
            if end:
                raise StubError(f"{filename}:{number}: '# END SOLUTION' without a BEGIN")
            if not begin:
                out.append(line)
                continue
            exercise, indent = begin["id"], begin["indent"]
            name = names.get(number)
            if name is None:
                raise StubError(f"{filename}:{number}: a solution region must be inside a function")
            region = (number, exercise)
            out.append(f"{indent}# TODO Exercise {exercise}: write {name} (see its docstring).\n")
            out.append(
                f'{indent}raise NotImplementedError("Exercise {exercise}: '
                f'{name} is not implemented yet")\n'
            )
        elif begin:
            raise StubError(f"{filename}:{number}: BEGIN SOLUTION inside the region opened at "
                            f"line {region[0]}")
        elif end:
            region = None
    if region is not None:
        raise StubError(f"{filename}:{region[0]}: BEGIN SOLUTION {region[1]} is never closed")
    return "".join(out)


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def render(solution_path: Path) -> str:
    """The complete text of the exercise file generated from ``solution_path``."""
    inside = solution_path.is_relative_to(ROOT)
    relative = solution_path.relative_to(ROOT) if inside else solution_path
    chapter = int(solution_path.name[2:4])
    body = make_stub(solution_path.read_text(), str(relative))
    header = (
        "# Your work goes here: replace each `raise NotImplementedError(...)` with your code.\n"
        f"# Grade it: python -m annotated_transformer.grade --chapter {chapter}\n"
        f"# Generated from {relative.as_posix()} by `python -m annotated_transformer.stubs`.\n"
    )
    return header + f"# stub-digest: {_digest(header + body)}\n" + body


def is_untouched(text: str) -> bool:
    """True when an exercise file is exactly as generated (its digest still matches)."""
    match = DIGEST.search(text)
    return bool(match) and match["digest"] == _digest(DIGEST.sub("", text, count=1))


def solution_files(solutions_dir: Path = SOLUTIONS_DIR) -> list[Path]:
    return sorted(p for p in solutions_dir.glob("ch*.py") if CHAPTER_FILE.match(p.name))


def stale_files(
    solutions_dir: Path = SOLUTIONS_DIR, exercises_dir: Path = EXERCISES_DIR
) -> list[str]:
    """Exercise files that are missing, or differ from what the generator produces."""
    problems = []
    for path in solution_files(solutions_dir):
        target = exercises_dir / path.name
        if not target.exists():
            problems.append(f"{target}: missing")
        elif target.read_text() != render(path):
            problems.append(f"{target}: differs from the stub generated from {path}")
    return problems


def write_stubs(
    out_dir: Path, force: bool = False, solutions_dir: Path = SOLUTIONS_DIR
) -> list[Path]:
    """Write a stub for every solutions file into ``out_dir``; return the files written.

    Refuses (``FileExistsError``) to overwrite a file that a learner has edited,
    unless ``force`` is true.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stubs = {out_dir / path.name: render(path) for path in solution_files(solutions_dir)}
    edited = [
        target for target, text in stubs.items()
        if target.exists() and target.read_text() != text and not is_untouched(target.read_text())
    ]
    if edited and not force:
        raise FileExistsError(
            "these exercise files hold edits that regenerating would discard: "
            + ", ".join(map(str, edited))
            + " (use --out DIR to write the stubs elsewhere, or --force to discard the edits)"
        )
    for target, text in stubs.items():
        target.write_text(text)
    return list(stubs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m annotated_transformer.stubs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 naming every stale or missing stub")
    parser.add_argument("--out", type=Path, default=EXERCISES_DIR,
                        help="folder to write the stubs to (default: exercises/)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite exercise files even when they hold edits")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale_files(exercises_dir=args.out)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("regenerate with: python -m annotated_transformer.stubs", file=sys.stderr)
            return 1 if problems else 0
        for path in write_stubs(args.out, force=args.force):
            print(f"wrote {path}")
    except (StubError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
