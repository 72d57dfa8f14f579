"""The package's layers (CONTRIBUTING.md, "A map of the package"): imports go one way.

Every module of ``annotated_transformer`` belongs to a layer; a module imports only from
its own layer or lower ones, and no module imports one that imports it back (directly or
through others), whether the import is at the top of the file or inside a function.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "annotated_transformer"

# {module or subpackage: layer}. A subpackage's entry covers its modules; the package's own
# entry ("annotated_transformer", its __init__) covers nothing else, so a new top-level
# module has no layer until it is given one here.
LAYERS = {
    "annotated_transformer": 0,  # the package's __init__: Parts and friends
    "annotated_transformer.layout": 0,  # where the course keeps its files
    "annotated_transformer.parts": 0,  # which code each chapter's parts come from
    "annotated_transformer.sources": 0,  # the --parts language, parsed once
    "annotated_transformer.student_release": 0,  # the reference missing: exercises/ instead
    "annotated_transformer.batch": 0,  # the batch type chapter 6 builds (chapter files import it)
    "annotated_transformer.data": 1,  # tasks, vocabularies, batches: tokens only
    "annotated_transformer.plots": 1,
    "annotated_transformer.machine": 1,  # the matrix-product rate a run measures at its start
    "annotated_transformer.distributed": 1,
    "annotated_transformer.glue": 1,  # numbers for the book's prose
    "annotated_transformer.fast_parts": 1,  # the reference on fused kernels
    "annotated_transformer.teacher_forcing": 1,  # LabelledInputs: what a model reads of a batch
    "annotated_transformer.sampling": 1,  # completing a prompt: greedy or sampled
    "annotated_transformer.incremental": 1,  # decoding with the keys and values kept
    "annotated_transformer.model": 2,  # the models, built from parts
    "annotated_transformer.decode": 3,  # what runs a model: decoding, training, files
    "annotated_transformer.train": 3,
    "annotated_transformer.training_runtime": 3,  # how a run executes: compile, bf16, metrics
    "annotated_transformer.time_budget": 3,  # how many steps fit before a deadline
    "annotated_transformer.checkpoint": 3,
    "annotated_transformer.average": 3,
    "annotated_transformer.metrics": 3,
    "annotated_transformer.recipes": 3,
    "annotated_transformer.recipe_fit": 3,  # --model auto: the rung this machine trains enough
    "annotated_transformer.inspect_attention": 3,
    "annotated_transformer.interactive": 3,  # the book's figures to play with (plotly)
    "annotated_transformer.language_model": 3,  # chapter 8's capstone: a small language learnt
    "annotated_transformer.text_model": 3,  # chapter 8 on real text: perplexity, writing
    "annotated_transformer.cli": 4,  # the command line and the tools beside the library
    "annotated_transformer.commands": 4,
    "annotated_transformer.__main__": 4,
    "annotated_transformer.bench": 4,
    # The course's tools, in layers of their own: distribution above grading above its rules.
    "annotated_transformer.course": 4,  # its __init__: the map of the tools
    "annotated_transformer.course.authoring": 4,  # the stubs
    "annotated_transformer.course.hints": 4,  # hints in three levels, for the command and the book
    "annotated_transformer.course.grading.source_rules": 4,  # what an exercise file may do
    "annotated_transformer.course.grading.exercise_id": 4,  # an exercise's id, read once
    "annotated_transformer.course.grading": 5,  # the grader and its worker
    "annotated_transformer.course.distribution": 6,  # the release and the Classroom workflow
    "annotated_transformer.course.instructor": 6,  # regrade: a class graded, its gradebook
    "annotated_transformer.grade": 6,  # python -m annotated_transformer.grade, for old workflows
}
PACKAGE_NAME = "annotated_transformer"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str, layers: dict[str, int] = LAYERS) -> int | None:
    """The layer of ``name``: its own entry, or that of the subpackage it is inside."""
    matches = [entry for entry in layers if name == entry
               or (entry != PACKAGE_NAME and name.startswith(entry + "."))]
    return layers[max(matches, key=len)] if matches else None


def without_a_layer(names, layers: dict[str, int] = LAYERS) -> list[str]:
    return [name for name in names if layer_of(name, layers) is None]


def imports_of(name: str) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its file (at the top or in
    a function) except under ``if TYPE_CHECKING:``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):  # imports for annotations only never run: leave them out
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_layer():
    missing = without_a_layer(MODULES)
    assert not missing, (f"{missing}: give each a layer in LAYERS here and a place in "
                         f"CONTRIBUTING.md's map of the package")


def test_a_made_up_module_without_a_layer_fails_the_check():
    """The check above can fail: a new top-level module is not layer 0 by default, and a
    module inside a subpackage takes the subpackage's layer."""
    assert without_a_layer(["annotated_transformer.made_up"]) == ["annotated_transformer.made_up"]
    assert layer_of("annotated_transformer.course.grading.made_up") == 5
    assert layer_of("annotated_transformer.course.distribution.made_up") == 6
    assert layer_of("annotated_transformer") == 0



def test_the_course_tools_have_layers_of_their_own():
    """course/ is not one layer: what goes to learners (distribution) stands on the grader,
    and the grader on its rules of what an exercise file may do, never the other way."""
    rules = layer_of("annotated_transformer.course.grading.source_rules")
    grading = layer_of("annotated_transformer.course.grading.engine")
    distribution = layer_of("annotated_transformer.course.distribution.release")
    assert rules < grading < distribution
    assert layer_of("annotated_transformer.course.authoring.stubs") < grading
    assert layer_of("annotated_transformer.train") < rules  # the library below every tool

def test_every_entry_is_a_module_of_the_package():
    """No stale entry: each names a module or subpackage that exists."""
    assert [entry for entry in LAYERS if entry not in MODULES] == []


def test_contributing_maps_every_module_with_its_layer():
    """CONTRIBUTING.md's map names each top-level module and subpackage in its layer's row."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            rows.setdefault(int(cells[0]), []).append(cells[1])
    wrong = []
    for entry, layer in LAYERS.items():
        if entry == PACKAGE_NAME:
            shown = "`__init__.py`"
        else:
            path = MODULES[entry]
            shown = f"`{entry.split('.')[-1]}/`" if path.name == "__init__.py" else f"`{path.name}`"
        if not any(shown in cell for cell in rows.get(layer, [])):
            wrong.append(f"add {shown} to the modules of the row `| {layer} |`")
    assert not wrong, f"CONTRIBUTING.md's map of the package: {'; '.join(wrong)}"


# ---------------------------------------------------------------- each package's own map

def package_maps() -> dict[str, list[str]]:
    """``{subpackage's __init__.py: its modules and subpackages}`` (``__main__``, private
    ``_x`` modules and, where the docstring names them as ``chNN_*``, chapter files aside)."""
    from annotated_transformer.layout import CHAPTER_FILE

    maps = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent == PACKAGE:
            continue  # the package's own map is CONTRIBUTING.md's, checked above
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        names = [p.stem for p in init.parent.glob("*.py")
                 if p.name != "__init__.py" and not p.name.startswith("_")
                 and not (CHAPTER_FILE.match(p.name) and "chNN_" in doc)]
        names += [p.parent.name for p in init.parent.glob("*/__init__.py")]
        maps[init.relative_to(PACKAGE.parent).as_posix()] = sorted(names)
    return maps


def unmapped(doc: str, names: list[str]) -> list[str]:
    """The names that ``doc`` does not name as a module: ``.name``, ``name``, ``name.py``
    or ``name/`` in backquotes."""
    return [n for n in names if not re.search(rf"[`.]{re.escape(n)}(\.py|/)?`", doc)]


def test_the_map_checker_finds_an_unnamed_module():
    doc = "- :mod:`.supervisor`: the trusted side\n- ``worker``: the worker\nreports points"
    assert unmapped(doc, ["supervisor", "worker", "report"]) == ["report"]


@pytest.mark.parametrize("init", sorted(package_maps()))
def test_each_package_docstring_maps_its_modules(init):
    """Each subpackage's ``__init__.py`` says what its modules are: a new module gets a line
    there (CONTRIBUTING.md's map names the top-level ones, checked above)."""
    doc = ast.get_docstring(ast.parse((PACKAGE.parent / init).read_text(encoding="utf-8")))
    missing = unmapped(doc or "", package_maps()[init])
    assert not missing, (
        f"{init}'s docstring, the map of its package, does not name "
        f"{', '.join(m + '.py' for m in missing)}: add a line for each, such as "
        f"`- :mod:`.{missing[0]}`: what it does`, beside the others")


MOD_REFERENCE = re.compile(r":mod:`~?([\w.]+)`")


def module_references(name: str, text: str) -> list[str]:
    """The modules that ``text``, the source of the module ``name``, names with ``:mod:``
    (``.supervisor`` and ``~.shapes`` inside its own package, or a full name)."""
    path = MODULES.get(name)
    package = name if path is None or path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for target in MOD_REFERENCE.findall(text):
        if target.startswith("."):
            up = len(target) - len(target.lstrip("."))
            base = package.split(".")[: len(package.split(".")) - up + 1]
            target = ".".join([*base, target.lstrip(".")] if target.lstrip(".") else base)
        found.append(target)
    return found


def test_the_reference_checker_resolves_relative_names():
    text = ("- :mod:`.supervisor`: the trusted side\n- :mod:`~.gone`\n"
            ":mod:`annotated_transformer.layout`")
    assert module_references("annotated_transformer.course.grading", text) == [
        "annotated_transformer.course.grading.supervisor",
        "annotated_transformer.course.grading.gone", "annotated_transformer.layout"]
    assert [m for m in module_references("annotated_transformer.course.grading", text)
            if m not in MODULES] == ["annotated_transformer.course.grading.gone"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_a_map_or_docstring_names_exists(name):
    """The other way round from the maps' test: a subpackage's map (and any docstring)
    names with ``:mod:`` only modules that exist, so a module moved or removed leaves no
    line behind."""
    stale = [m for m in module_references(name, MODULES[name].read_text(encoding="utf-8"))
             if m not in MODULES]
    assert not stale, f"{name} names modules that do not exist: {stale}"


def test_contributing_maps_only_modules_with_that_layer():
    """The other way round from the check above: every module a row of CONTRIBUTING.md's
    map names is one of the package's, in that layer."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    shown = {}
    for entry, layer in LAYERS.items():
        path = MODULES[entry]
        name = ("`__init__.py`" if entry == PACKAGE_NAME else
                f"`{entry.split('.')[-1]}/`" if path.name == "__init__.py" else f"`{path.name}`")
        shown.setdefault(layer, set()).add(name)
    wrong = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            for name in re.findall(r"`[^`]+`", cells[1]):
                if name not in shown.get(int(cells[0]), set()):
                    wrong.append(f"{name} in the row `| {cells[0]} |`")
    assert not wrong, f"CONTRIBUTING.md's map names what is not in that layer: {wrong}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_the_layers(name):
    upward = sorted(m for m in GRAPH[name] if layer_of(m) > layer_of(name))
    assert not upward, (f"{name} (layer {layer_of(name)}) imports {upward} from a higher "
                        f"layer; move the shared code down, or the caller up")


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert cycles() == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a made-up loop between two real modules is found."""
    saved = {name: set(deps) for name, deps in GRAPH.items()}
    try:
        GRAPH["annotated_transformer.parts"].add("annotated_transformer.model")
        assert ["annotated_transformer.model", "annotated_transformer.parts"] in cycles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


# ---------------------------------------------------------------- paths from layout only

# The first folder of each of layout.py's paths: code joins them from there, never itself.
LAYOUT_NAMES = {".github", "workflows", "solutions", "exercises", "tests", "graded",
                "variants", "fast_parts", "course"}
CODE = [p for p in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "scripts").rglob("*.py")])
        if p.name != "layout.py"]


# One of those folders named as a path in a string of code (a message, a help text, a
# workflow's text): what ``layout.folder_name`` and ``layout.relative`` give instead. A
# bare ``"solutions"`` or ``"exercises"`` is a word of the --parts language, not a path.
PATH_IN_TEXT = re.compile(r"(?<!\w)(\.github/workflows|(solutions|exercises|fast_parts)/"
                          r"|\.\./(solutions|exercises)\b|tests/(graded|variants)\b)")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (prose: they may name any folder)."""
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)):
            found.add(id(node.body[0].value))
    return found


def spelled_paths(source: str) -> list[str]:
    """Where ``source`` builds one of the course's paths itself: ``x / "solutions"``, an
    f-string that starts with ``.github/workflows/``, or a string of code (not a
    docstring) that names ``solutions/``, ``../exercises``, ``tests/graded``, ..."""
    found = []
    tree = ast.parse(source)
    prose = docstrings(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant) and isinstance(node.right.value, str)
                and node.right.value.split("/")[0] in LAYOUT_NAMES):
            found.append(f"line {node.lineno}: / {node.right.value!r}")
        if (isinstance(node, ast.JoinedStr) and node.values
                and isinstance(node.values[0], ast.Constant)
                and str(node.values[0].value).split("/")[0] in LAYOUT_NAMES
                and "/" in str(node.values[0].value)):
            found.append(f"line {node.lineno}: f{node.values[0].value!r}...")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in prose and (match := PATH_IN_TEXT.search(node.value))):
            found.append(f"line {node.lineno}: {match[0]!r} in {node.value[:60]!r}")
    return found


def test_the_path_checker_finds_a_spelled_path():
    source = ('"""Reads solutions/ and .github/workflows/ (prose)."""\n'
              'a = ROOT / "solutions"\nb = f".github/workflows/{name}"\nc = SOLUTIONS_DIR / "x"\n'
              'd = "rm -rf .course/solutions/ .course/tests/variants/"\n'
              'e = f"grade --parts ../exercises --out {out}"\n'
              'f = "solutions"  # a --parts word\n'
              'g = f"a {folder_name(WORKFLOWS_DIR)}*.yml differs"\n')
    assert sorted({q.split(":")[0] for q in spelled_paths(source)}) == [
        "line 2", "line 3", "line 5", "line 6"]


@pytest.mark.parametrize("path", CODE, ids=lambda p: p.relative_to(PACKAGE.parent).as_posix())
def test_code_reads_the_course_paths_from_layout(path):
    """``annotated_transformer/layout.py`` is the one module that knows the course's paths:
    every other module and script joins, formats and names them from there."""
    spelled = spelled_paths(path.read_text(encoding="utf-8"))
    assert not spelled, (f"{path.name} spells a path of the course itself: {spelled}; "
                         f"use annotated_transformer.layout's (SOLUTIONS_DIR, "
                         f"WORKFLOWS_DIR, ..., relative(...) under another root, "
                         f"folder_name(...) in a message)")


def test_every_file_of_the_package_that_is_not_python_is_installed():
    """A wheel holds only the ``.py`` files unless pyproject names the others: each file of
    the package folder (``hints.toml``, ...) is listed in ``[tool.setuptools.package-data]``."""
    import fnmatch

    import tomllib

    declared = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"][
        "setuptools"].get("package-data", {})
    data = [p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    missing = []
    for path in data:
        package = ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in declared.get(package, [])):
            missing.append(str(path.relative_to(PACKAGE.parent)))
    assert data and not missing, f"not in pyproject's package-data: {missing}"


def test_the_size_report_counts_every_line_of_the_grader_once():
    """``scripts/code_size.py`` (a report: a long module is marked, never refused), run as a
    maintainer runs it: the grader's rooms add up to its files' lines, each split by kind."""
    import subprocess
    import sys

    script = PACKAGE.parent / "scripts" / "code_size.py"
    printed = subprocess.run([sys.executable, str(script), "--top", "3"], capture_output=True,
                             text=True, check=True, cwd=PACKAGE.parent).stdout
    grading = PACKAGE / "course" / "grading"
    lines = sum(len(p.read_text().splitlines()) for p in grading.rglob("*.py"))
    rooms = {line.split("  ")[0]: [int(n.replace(",", "")) for n in line.split()[-5:]]
             for line in printed.splitlines() if line.startswith(("door", "trusted", "worker",
                                                                  "all of it"))}
    assert set(rooms) == {"door (both processes)", "trusted (never imports worker/)",
                          "worker (beside the learner's code)", "all of it"}, printed
    assert rooms["all of it"][0] == lines == sum(r[0] for n, r in rooms.items() if n != "all of it")
    assert all(counts[0] == sum(counts[1:]) for counts in rooms.values()), printed
