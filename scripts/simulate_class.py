"""Simulate a class and re-grade it: the class summary an instructor would see.

    python scripts/simulate_class.py --learners 30 --seed 0 --chapter 2 --chapter 4 \\
        --out /tmp/class --copy-to book/images [--jobs 2]
    python scripts/simulate_class.py --learners 60 --all --shards 3 --jobs 2 --out /tmp/c60

Each simulated learner answers every exercise of the chapters asked for: with probability
``--wrong`` (0.35) by one of its wrong variants (``tests/variants/``; not those that take a
road the rules refuse, which fails the whole chapter file), drawn uniformly, else by
the reference or one of its right variants. A learner's chapter file is the reference's text
with the chapter's variants module appended (its ``right``/``wrong`` decorators made no-ops)
and each answered name bound to the variant drawn, so the grader sees an ordinary file. The
submissions (``OUT/submissions/learner-NN/exercises/``) are then re-graded as an instructor
would, ``python -m annotated_transformer regrade ... --out OUT``, which writes the gradebook
and ``class-summary.md``/``class-summary.png``; ``--copy-to`` copies those two there.
``--all`` answers and grades the whole course, capstones included. ``--shards N`` grades
the class as N machines would, one ``regrade --shard K/N`` after another (each into
``OUT/shard-K``), then puts them together with ``regrade merge``; it prints each shard's
wall time and the learners an hour it stands for. Everything drawn comes from ``--seed``;
the grading seed is ``--seed`` too.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, installed or not

from annotated_transformer.course.grading import manifest  # noqa: E402
from annotated_transformer.layout import (  # noqa: E402
    EXERCISES_DIR,
    ROOT,
    SOLUTIONS_DIR,
    VARIANTS_DIR,
    chapter_test_files,
    relative,
)

sys.path.insert(0, str(VARIANTS_DIR.parent))  # tests/: its variants package
import variants  # noqa: E402  (tests/variants: the right and wrong answers)

NO_OP_DECORATORS = ("def wrong(*args, **kwargs):\n    return lambda obj: obj\n\n\n"
                    "right = wrong\n")


def chapter_file(chapter: int) -> Path:
    return next(SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py"))


class _AsLearnerCode(ast.NodeTransformer):
    """What an exercise file may not hold, rewritten: an import of the same chapter's
    reference (its names are the file's own) is dropped, one of another chapter's becomes
    ``name = active_parts().name`` (the learner's own parts), and ``type(name, bases, {})``
    becomes a class statement before the statement that held it."""

    def __init__(self, chapter_module: str) -> None:
        self.chapter_module = chapter_module
        self.hoisted: list[ast.stmt] = []

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | list[ast.stmt] | None:
        if node.module == f"{SOLUTIONS_DIR.name}.{self.chapter_module}":
            return ast.Pass()
        if node.module == "__future__":
            return None
        if node.module and node.module.startswith(f"{SOLUTIONS_DIR.name}."):
            # another chapter's reference: a learner's file reaches it through the parts
            return [ast.ImportFrom(module="annotated_transformer.parts",
                                   names=[ast.alias(name="active_parts")], level=0),
                    *(ast.Assign(targets=[ast.Name(id=alias.asname or alias.name,
                                                   ctx=ast.Store())],
                                 value=ast.Attribute(value=ast.Call(
                                     func=ast.Name(id="active_parts", ctx=ast.Load()),
                                     args=[], keywords=[]), attr=alias.name, ctx=ast.Load()),
                                 lineno=0)
                      for alias in node.names)]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3
                and isinstance(node.args[0], ast.Constant)):
            name = node.args[0].value
            self.hoisted.append(ast.ClassDef(name=name, bases=list(node.args[1].elts),
                                             keywords=[], body=[ast.Pass()],
                                             decorator_list=[], type_params=[]))
            return ast.Name(id=name, ctx=ast.Load())
        return node


def variants_source(chapter: int) -> str:
    """The chapter's variants module, ready to append to that chapter's file."""
    text = (VARIANTS_DIR / f"ch{chapter:02d}.py").read_text()
    text = re.sub(r"^from variants import right, wrong\n", NO_OP_DECORATORS, text, flags=re.M)
    text = text.replace("nn.LayerNorm(", "LayerNorm(")  # 5.3 to 5.5 on the learner's own 5.1
    rewrite = _AsLearnerCode(chapter_file(chapter).stem)
    body = []
    for statement in ast.parse(text).body:
        statement = rewrite.visit(statement)
        if statement is not None:
            body += [*rewrite.hoisted,
                     *(statement if isinstance(statement, list) else [statement])]
            rewrite.hoisted = []
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])))


def _needed(body: list[ast.stmt], names: set[str]) -> list[ast.stmt]:
    """The statements of ``body`` that ``names`` need (imports always), in their order: an
    exercise file is refused whole for one forbidden call, so no other variant comes along."""
    defines = {}
    for index, statement in enumerate(body):
        targets = ([statement.name] if isinstance(statement, (ast.FunctionDef, ast.ClassDef))
                   else [t.id for t in getattr(statement, "targets", [])
                         if isinstance(t, ast.Name)])
        for target in targets:
            defines.setdefault(target, []).append(index)
    keep = {i for i, s in enumerate(body) if isinstance(s, (ast.Import, ast.ImportFrom))}
    todo = list(names)
    while todo:
        for index in defines.get(todo.pop(), []):
            if index not in keep:
                keep.add(index)
                todo += [n.id for n in ast.walk(body[index]) if isinstance(n, ast.Name)]
    return [s for i, s in enumerate(body) if i in keep]


def learner_file(chapter: int, answers: dict[str, str]) -> str:
    """The reference chapter with ``{name in the chapter: variant}`` bound after it (only the
    variants drawn and what they need)."""
    text = chapter_file(chapter).read_text()
    if not answers:
        return text
    body = _needed(ast.parse(variants_source(chapter)).body, {"wrong", *answers.values()})
    bindings = "".join(f"{name} = {variant}\n" for name, variant in sorted(answers.items()))
    return (f"{text}\n\n# ---- this learner's own answers\n"
            f"{ast.unparse(ast.Module(body=body, type_ignores=[]))}\n{bindings}")


def draw_class(learners: int, chapters: list[int], wrong: float, rng: random.Random
               ) -> list[dict[int, dict[str, str]]]:
    """Per learner, per chapter: ``{name replaced: variant}`` (the reference where absent)."""
    drawn = []
    for _ in range(learners):
        mine: dict[int, dict[str, str]] = {}
        for chapter in chapters:
            by_exercise: dict[str, list[variants.Variant]] = {}
            for v in variants.for_chapter(chapter):
                by_exercise.setdefault(v.exercise, []).append(v)
            answers = {}
            for exercise in sorted(by_exercise):
                options = by_exercise[exercise]
                # a road the rules refuse (says=) fails the whole chapter file, which
                # tells nothing about the other exercises: not drawn
                wrongs = [v for v in options if not v.correct and not v.says]
                rights = [v for v in options if v.correct]
                if wrongs and rng.random() < wrong:
                    pick = rng.choice(wrongs)
                else:
                    pick = rng.choice([None, *rights])  # None: the reference itself
                if pick is not None:
                    answers[pick.replaces] = pick.name
            mine[chapter] = answers
        drawn.append(mine)
    return drawn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chapter", type=int, action="append",
                        help="a chapter to answer and grade (repeatable; default 2, 4 and 5)")
    parser.add_argument("--all", action="store_true",
                        help="answer and grade every chapter, the capstones included")
    parser.add_argument("--shards", type=int, default=1,
                        help="grade in this many shards, one after another, then merge them")
    parser.add_argument("--wrong", type=float, default=0.35,
                        help="the chance that a learner answers an exercise wrongly")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copy-to", type=Path, help="copy class-summary.md and .png here")
    parser.add_argument("--jobs", type=int,
                        help="grade this many learners at once (default: regrade's, the cores)")
    args = parser.parse_args()
    chapters = sorted(chapter_test_files()) if args.all else sorted(args.chapter or [2, 4, 5])
    rng = random.Random(args.seed)
    submissions = args.out / "submissions"
    if submissions.exists():
        shutil.rmtree(submissions)
    folders = []
    for number, answers in enumerate(draw_class(args.learners, chapters, args.wrong, rng), 1):
        folder = submissions / f"learner-{number:02d}"
        for path in [*manifest.graded_files(ROOT), "pyproject.toml"]:  # as a learner's copy
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, folder / path)
        exercises = folder / relative(EXERCISES_DIR)
        exercises.mkdir(parents=True, exist_ok=True)
        for chapter in sorted(chapter_test_files()):  # the other chapters: the reference
            target = exercises / chapter_file(chapter).name
            target.write_text(learner_file(chapter, answers.get(chapter, {})))
        folders.append(str(folder))
    common = ["--seed", str(args.seed), *([] if args.all else [f"--chapter={c}" for c in chapters]),
              *([f"--jobs={args.jobs}"] if args.jobs else [])]
    regrade = [sys.executable, "-m", "annotated_transformer", "regrade"]
    shards = [args.out] if args.shards <= 1 else [args.out / f"shard-{k}"
                                                  for k in range(1, args.shards + 1)]
    for k, out in enumerate(shards, 1):
        command = [*regrade, *folders, "--out", str(out), *common,
                   *([f"--shard={k}/{args.shards}"] if args.shards > 1 else [])]
        print(" ".join(command[1:4]), f"<{len(folders)} submissions>",
              *command[len(folders) + 4:], flush=True)
        started = time.monotonic()
        done = subprocess.run(command, cwd=ROOT)
        seconds = time.monotonic() - started
        graded = len(folders) if args.shards <= 1 else sum(
            1 for i in range(len(folders)) if i % args.shards == k - 1)
        print(f"shard {k}/{max(args.shards, 1)}: {graded} learners in {seconds:.0f} s, "
              f"{3600 * graded / seconds:.0f} learners an hour", flush=True)
        if done.returncode != 0:
            return done.returncode
    if args.shards > 1:
        done = subprocess.run([*regrade, "merge", *map(str, shards), "--out", str(args.out)],
                              cwd=ROOT)
        if done.returncode != 0:
            return done.returncode
    if args.copy_to:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        for name in ("class-summary.md", "class-summary.png"):
            shutil.copy(args.out / name, args.copy_to / name)
            print(f"copied {name} to {args.copy_to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
