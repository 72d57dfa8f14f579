"""CONTRIBUTING.md stays true: every file, folder and name of the course it names exists,
and the docs start every command the one way it describes (``python -m
annotated_transformer <command>``). Its maps of the package are checked in
``tests/repository/test_package_layout.py``."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
SPANS = sorted(set(re.findall(r"`([^`\n]+)`", CONTRIBUTING)))

# Names in backquotes that are not the course's: Python's and PyTorch's, the notation of
# the exercise contract, a pattern (`add_X`), nbval's placeholder, launchers, the shell's
# PATH and the variables by which PyTorch and MKL choose their CPU kernels.
NOT_OURS = {"True", "TypeError", "ValueError", "isinstance", "with", "torch.bool",
            "nn.MultiheadAttention", "B", "L", "Lq", "Lk", "V", "D", "H", "add_X",
            "ROUNDING", "torchrun", "srun", "PATH", "./fast",
            "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"}


def tracked() -> list[str]:
    """The repository's files (git's list, new ones included) and every folder above one,
    as ``a/b/``."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    folders = {"/".join(f.split("/")[:i]) + "/" for f in files for i in range(1, f.count("/") + 1)}
    return files + sorted(folders)


def is_path(span: str) -> bool:
    return " " not in span and ("/" in span or bool(
        re.search(r"\.(py|toml|yml|sh|cfg|ipynb|md|json)$", span)))


def path_pattern(span: str) -> re.Pattern:
    """A file or folder CONTRIBUTING names, as a pattern for the end of a tracked path:
    ``chNN_topic.py`` is any chapter's, ``data/<name>.py`` any module of ``data/``,
    ``test_*.py`` any test file."""
    pattern = (re.escape(span).replace("chNN", r"ch\d\d").replace("NN", r"\d\d")
               .replace("_topic", r"_\w+").replace("<name>", r"\w+").replace(r"\*", "[^/]*"))
    return re.compile(r"(^|/)" + pattern + "$")


def unknown_paths(spans: list[str], paths: list[str]) -> list[str]:
    return [s for s in spans if is_path(s) and s not in NOT_OURS
            and not any(path_pattern(s).search(p) for p in paths)]


def defined_names(paths: list[str]) -> set[str]:
    """Every name the course's Python defines (functions, classes, assignments,
    attributes set, arguments) and every module's name."""
    names = set()
    for path in paths:
        if not path.endswith(".py"):
            continue
        names.add(Path(path).stem)
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names | {p.rstrip("/").rsplit("/", 1)[-1] for p in paths if p.endswith("/")}


def unknown_names(spans: list[str], names: set[str]) -> list[str]:
    """The dotted names among ``spans`` (``checks.trusted_state``, ``spec()``) whose last
    part the course does not define."""
    return [s for s in spans if not is_path(s) and s not in NOT_OURS
            and re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", s)
            and s.removesuffix("()").rsplit(".", 1)[-1] not in names]


def test_every_file_and_folder_it_names_exists():
    missing = unknown_paths(SPANS, tracked())
    assert not missing, f"CONTRIBUTING.md names files or folders that do not exist: {missing}"


def test_every_name_of_the_course_it_names_is_defined():
    paths = tracked()
    missing = unknown_names(SPANS, defined_names(paths))
    assert not missing, (f"CONTRIBUTING.md names what the course does not define: {missing} "
                         f"(renamed or removed? say what is true now)")


def test_the_checks_find_a_stale_path_and_name():
    paths = ["tests/graded/checks.py", "solutions/ch02_attention.py", "annotated_transformer/"]
    spans = ["tests/graded/checks.py", "solutions/chNN_topic.py", "course/grading/sandbox.py",
             "checks.trusted_state", "Learner", "spec()", "ValueError", "a sentence"]
    assert unknown_paths(spans, paths) == ["course/grading/sandbox.py"]
    assert unknown_names(spans, {"checks", "trusted_state", "spec"}) == ["Learner"]


# ---------------------------------------------------------------- one launch form

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "book").glob("*.md")),
        *sorted((ROOT / ".github" / "workflows").glob("*.yml")),
        *sorted((ROOT / "chapters").glob("*.ipynb")), *sorted((ROOT / "scripts").glob("*.sh"))]
# `python -m` on a module: only the old grade command, and on this page the two modules it
# shows stopping (tests/library/test_commands.py runs both and checks what they do).
MODULE_RUNS = {"grade"}
SHOWN_STOPPING = {"train", "bench"}


def module_runs(text: str) -> list[str]:
    """The package's modules that ``text`` starts with ``python -m`` (or ``-m``)."""
    return re.findall(r"-m\s+annotated_transformer\.([\w.]+\w)", text.replace('\\"', '"'))


def test_module_runs_are_found():
    assert module_runs("python -m annotated_transformer.train --task copy; "
                       "torchrun -m annotated_transformer train; srun python -m\n"
                       "annotated_transformer.bench") == ["train", "bench"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_docs_start_every_command_one_way(doc):
    allowed = MODULE_RUNS | (SHOWN_STOPPING if doc.name == "CONTRIBUTING.md" else set())
    other = sorted(set(module_runs(doc.read_text(encoding="utf-8"))) - allowed)
    assert not other, (f"{doc.relative_to(ROOT)} starts a command with `python -m "
                       f"annotated_transformer.{other[0]}`, which runs nothing: write "
                       f"`python -m annotated_transformer <command>`")


# ---------------------------------------------------------------- names of moved modules

SOURCES = sorted(p for folder in ("annotated_transformer", "tests", "scripts")
                 for p in (ROOT / folder).rglob("*.py") if p != Path(__file__).resolve())
EXAMPLE_PARTS = {"made_up", "gone", "x"}  # the checkers' own made-up modules
FILE_NAMED = re.compile(r"annotated_transformer/[\w/]+\.py")
MODULE_NAMED = re.compile(r"annotated_transformer(?:\.[A-Za-z_]\w*)+")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a name its module defines at the
    top or exports in ``__all__`` (then any attribute of that: ``model.Model.generate``),
    read without importing."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:end])
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if file.is_file():
            break
    else:
        return False
    if end == len(parts):
        return True
    if (ROOT.joinpath(*parts[:end]) / parts[end]).is_dir():
        return False  # a folder without __init__.py is not a module
    tree = ast.parse(file.read_text(encoding="utf-8"))
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            defined.update(n.id for n in ast.walk(node)
                           if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                 for t in node.targets)):
            defined.update(ast.literal_eval(node.value))  # exported, imported when asked for
    return parts[end] in defined


def stale_names(text: str) -> list[str]:
    """The package's files and dotted names that ``text`` names and that do not exist."""
    files = [f for f in FILE_NAMED.findall(text) if not (ROOT / f).is_file()]
    return files + [m for m in set(MODULE_NAMED.findall(text))
                    if not EXAMPLE_PARTS & set(m.split(".")) and not resolves(m)]


def test_a_stale_name_is_found():
    text = ("see annotated_transformer/course/grading/sandbox.py and "
            "annotated_transformer.course.grading.supervisor.CodeUnderTest.run, "
            "annotated_transformer.grading.report, annotated_transformer.made_up")
    assert sorted(stale_names(text)) == ["annotated_transformer.grading.report",
                                         "annotated_transformer/course/grading/sandbox.py"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_a_message_or_docstring_names_exists(path):
    """A failure message, a docstring or a comment that names one of the package's modules
    by its path or its dotted name names one that exists: a module moved leaves no
    message pointing at its old place."""
    stale = stale_names(path.read_text(encoding="utf-8"))
    assert not stale, f"{path.relative_to(ROOT)} names what does not exist: {sorted(stale)}"
