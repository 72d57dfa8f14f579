"""How big the package is: a report, never a gate. Each module's lines, the longest first;
the grader's by room (the worker's ``worker/``, the door ``protocol.py``, the trusted rest)
and its source rules; every count split into code, docstrings, comments and blank lines.

    python scripts/code_size.py              # the grader's rooms, then the 15 longest modules
    python scripts/code_size.py --top 40     # more modules

A module that outgrows the guide of :data:`GUIDE` lines is marked, not refused: split it by
its jobs when it holds more than one (CONTRIBUTING.md, "Small files with one job").
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

from annotated_transformer.layout import COURSE_TOOLS_DIR, PACKAGE_DIR

GUIDE = 500  # lines of a module with one job, as a rule of thumb
GRADING = COURSE_TOOLS_DIR / "grading"
KINDS = ("code", "docstrings", "comments", "blank")


def counted(path: Path) -> Counter[str]:
    """``{kind: lines}`` of one Python file, each line counted once, by :data:`KINDS`."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    kind = ["blank" if not line.strip() else "comments" if line.strip().startswith("#")
            else "code" for line in lines]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            for number in range(body[0].lineno - 1, body[0].end_lineno or body[0].lineno):
                kind[number] = "docstrings"
    return Counter({"lines": len(lines), **Counter(kind)})


def room(path: Path) -> str:
    """Where a module of the grader runs: beside the learner's code, at the door, or not."""
    inside = path.relative_to(GRADING).parts
    if inside[0] == "worker":
        return "worker (beside the learner's code)"
    if inside[0] == "protocol.py":
        return "door (both processes)"
    return "trusted (never imports worker/)"


def row(name: str, counts: Counter[str], width: int) -> str:
    cells = "".join(f"{counts[k]:>12,}" for k in ("lines", *KINDS))
    return f"{name:<{width}}{cells}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="how many modules to list")
    args = parser.parse_args(argv)
    modules = {path: counted(path) for path in sorted(PACKAGE_DIR.rglob("*.py"))}
    width = 4 + max(len(str(p.relative_to(PACKAGE_DIR.parent))) for p in modules)
    header = f"{'':<{width}}" + "".join(f"{k:>12}" for k in ("lines", *KINDS))

    rooms: dict[str, Counter[str]] = {}
    for path, counts in modules.items():
        if path.is_relative_to(GRADING):
            rooms.setdefault(room(path), Counter()).update(counts)
    grading = sum(rooms.values(), Counter())
    print(f"The grader ({GRADING.relative_to(PACKAGE_DIR.parent)}/), by room")
    print(header)
    for name, counts in sorted(rooms.items()):
        print(row(name, counts, width))
    print(row("all of it", grading, width))
    print(row("of which the source rules (source_rules.py)", modules[GRADING / "source_rules.py"],
              width))

    longest = sorted(modules.items(), key=lambda item: -item[1]["lines"])[:args.top]
    print(f"\nThe {len(longest)} longest of the package's {len(modules)} modules "
          f"(* over {GUIDE} lines)")
    print(header)
    for path, counts in longest:
        mark = "*" if counts["lines"] > GUIDE else " "
        print(row(f"{mark} {path.relative_to(PACKAGE_DIR.parent)}", counts, width))
    print(row("the whole package", sum(modules.values(), Counter()), width))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
