"""The grader's design, checked: each word of its vocabulary is a type defined once and used
as that type, the two sides of the worker's channel import what they should (read from the
folders: ``grading/worker/`` is the learner's process, ``grading/protocol.py`` the door, the
rest the trusted side), and a type checker passes over the grader."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer.course.grading import outcomes, protocol, supervisor
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.worker import process, standins
from annotated_transformer.course.grading.worker.process import PRELOADED
from annotated_transformer.layout import ROOT

GRADING = ROOT / "annotated_transformer" / "course" / "grading"
PACKAGE = ROOT / "annotated_transformer"
COURSE = "annotated_transformer.course"
GRADER = f"{COURSE}.grading"
WORKER = f"{GRADER}.worker"  # the worker's room: what the learner's process imports
DOOR = {f"{GRADER}.protocol"}  # the one module of the grader that both rooms import
# Imported on the way to a module of the worker (their ``__init__``, a docstring each).
ON_THE_WAY = {"annotated_transformer", COURSE, GRADER}
# What a module of the worker or the door may import besides the package: the standard
# library, PyTorch, and ``variants`` (tests/variants, on the worker's path for the course's
# own code only: a right or wrong version of an exercise, in place of a learner's file).
OUTSIDE = {*sys.stdlib_module_names, "torch", "variants"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The modules a file imports, at the top or inside a function (``a.b`` for ``from a
    import b`` too), except under ``if TYPE_CHECKING:``, which never runs."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _runs(imported: set[str]) -> set[str]:
    """The package's modules that importing ``imported`` runs: each one and every package
    on its way (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    names = {".".join(m.split(".")[:i]) for m in imported
             for i in range(1, len(m.split(".")) + 1)}
    return {m for m in names if m in MODULES}


GRAPH = {name: _runs(_imports(path)) - {name} for name, path in MODULES.items()}


def _in_worker(name: str) -> bool:
    return name == WORKER or name.startswith(f"{WORKER}.")


def _worker_side_problems(graph: dict[str, set[str]], direct: dict[str, set[str]],
                          preloaded: set[str]) -> list[str]:
    """What the worker's modules reach that they may not, walking ``graph`` (``{module:
    the package's modules it imports}``) from each of them, and ``preloaded`` (what the
    worker imports by name before any learner code) with them: of the course, only the
    worker's room, the door and the packages on their way; outside the package (``direct``:
    each module's own imports), only :data:`OUTSIDE`. The library outside the course
    (``annotated_transformer.parts``, ``model``, ``train``...) is what the learner's code
    builds with: the worker may import it, and it is walked too, so a library module that
    imported the trusted side would be caught."""
    problems = []
    starts = [m for m in graph if _in_worker(m)]
    for start in starts:
        todo = [(start, [start])] + [(m, [start, m]) for m in preloaded if m in graph
                                     and start == f"{WORKER}.process"]
        seen: set[str] = set()
        while todo:
            name, way = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name.startswith(COURSE) and not (
                    _in_worker(name) or name in DOOR or name in ON_THE_WAY):
                problems.append(" -> ".join(way))
                continue
            todo += [(m, [*way, m]) for m in graph[name]]
    for name in [*starts, *DOOR]:
        strangers = {m.split(".")[0] for m in direct[name]} - OUTSIDE - {"annotated_transformer"}
        problems += [f"{name} imports {m}" for m in sorted(strangers)]
    return problems


def _trusted_side_problems(graph: dict[str, set[str]]) -> list[str]:
    """The modules outside the worker's room (the trusted side, the library, the
    instructor's tools) that import one inside it."""
    return [f"{name} imports {m}" for name, imports in graph.items() if not _in_worker(name)
            for m in sorted(imports) if _in_worker(m)]


def _definitions(pattern: str) -> list[str]:
    """The files of the package whose text matches ``pattern`` (a definition)."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if re.search(pattern, p.read_text(), re.MULTILINE))


def test_each_word_of_the_vocabulary_is_defined_once():
    assert _definitions(r"^class Outcome\b") == ["course/grading/outcomes.py"]
    assert _definitions(r"^class ExerciseId\b") == ["course/grading/exercise_id.py"]
    assert _definitions(r"^class Reply\b") == ["course/grading/protocol.py"]
    assert _definitions(r"^class Source\b") == ["sources.py"]
    assert _definitions(r"^class RunSpec\b") == ["course/grading/runspec.py"]


def test_the_outcomes_are_ordered_by_priority_and_each_exception_carries_its_own():
    order = list(outcomes.Outcome)
    assert order[0] is outcomes.Outcome.GRADER_ERROR and order[-1] is outcomes.Outcome.COLLECTED
    assert [o.priority for o in order] == list(range(len(order)))
    for error in outcomes.RAISED:
        assert isinstance(error.outcome, outcomes.Outcome), error
    assert outcomes.MachineBusy.outcome is outcomes.Outcome.BUSY
    assert outcomes.GraderFault.outcome is outcomes.Outcome.GRADER_ERROR
    # A record read back is typed; a word that is no outcome is refused.
    record = TestRecord.from_json({"test": "t", "exercise": "1.1", "chapter": 1, "title": "x",
                                   "points": 1, "outcome": "passed"})
    assert record.outcome is outcomes.Outcome.PASSED
    with pytest.raises(ValueError):
        TestRecord("t", "1.1", 1, "x", 1, "passd")


def test_an_exercise_id_is_read_once_and_orders_the_course():
    assert ExerciseId("5.10").chapter == 5 and ExerciseId("5.10").order == (5, 10)
    assert sorted(["5.10", "5.9", "10.1"], key=lambda e: ExerciseId(e).order) == [
        "5.9", "5.10", "10.1"]
    for bad in ("5", "5.x", " 5.1", "5.1.2", ""):
        with pytest.raises(ValueError, match="CHAPTER.NUMBER"):
            ExerciseId(bad)


def test_a_reply_is_checked_on_arrival_whatever_the_worker_sent():
    sent = protocol.Reply(protocol.Ended.RAISED, message="boom", types=("ValueError",),
                          where="ch01.py:3", called=("softmax",))
    assert protocol.Reply.from_wire(protocol.decode(protocol.encode(sent.to_wire()))) == sent
    good = sent.to_wire()
    for bad in ({**good, "ended": "won"}, {**good, "types": "ValueError"},
                {**good, "stub": 1}, {**good, "extra": True}, {"ok": True, "value": 1},
                [good], {**good, "called": [3]}):
        with pytest.raises(protocol.ProtocolError):
            protocol.Reply.from_wire(bad)
    long = protocol.Reply.from_wire({**good, "message": "x" * 10**6, "called": ["f"] * 10**4})
    assert len(long.message) == protocol.Reply.MESSAGE and len(long.called) == 200


def test_a_request_and_a_worker_config_are_checked_on_arrival(tmp_path):
    request = protocol.Request("probe.py", "Probe.run", 2, "solutions", "2.1", {"x": 1.5},
                               ("_softmax",), 7, True, ("1.2",))
    assert protocol.Request.from_wire(protocol.decode(protocol.encode(
        request.to_wire()))) == request
    good = request.to_wire()
    for bad in ({**good, "chapter": "2"}, {**good, "chapter": True}, {**good, "extra": 1},
                {**good, "forbid_ops": "_softmax"}, {**good, "standins": ["9.9"]},
                {**good, "kwargs": {1: 2}}, {k: v for k, v in good.items() if k != "seed"},
                [good], None):
        with pytest.raises(protocol.ProtocolError):
            protocol.Request.from_wire(bad)
    config = protocol.WorkerConfig("exercises", tmp_path, tmp_path / "graded", tmp_path,
                                   {3: "ch03 imports os"}, "nobody", 2**30, False)
    assert protocol.WorkerConfig.from_wire(config.to_wire()) == config
    assert config.blocked == {3: "ch03 imports os"}, "a chapter is a number on both sides"
    good_config = json.loads(config.to_wire())
    for text in ("{", "[]", json.dumps({**good_config, "blocked": {"three": "x"}}),
                 json.dumps({**good_config, "memory_bytes": "1"}),
                 json.dumps({**good_config, "learner_dir": 3}),
                 json.dumps({**good_config, "user": None, "more": 1})):
        with pytest.raises(protocol.ProtocolError):
            protocol.WorkerConfig.from_wire(text)


def test_only_the_built_in_not_implemented_error_of_a_chapter_file_is_a_stub():
    """A stub is what the release's stub raises; a learner's exception that subclasses
    ``NotImplementedError`` or is named so is an error of its own, and so is PyTorch's."""
    words = "Exercise 2.1: softmax is not implemented yet"
    own = type("NotImplementedError", (Exception,), {})
    mine = type("Unfinished", (NotImplementedError,), {})
    assert process.is_stub(NotImplementedError(words), "/x/ch02_attention.py")
    assert not process.is_stub(mine(words), "/x/ch02_attention.py")
    assert not process.is_stub(own(words), "/x/ch02_attention.py")
    assert not process.is_stub(NotImplementedError("no"), "/x/ch02_attention.py")
    assert not process.is_stub(NotImplementedError(words), "/torch/functional.py")


# What crosses between the rooms, by the names of its fields: only its type's own methods
# (protocol.py) write them as a dict, and only the wire's own functions carry them.
CROSSING = {f.name for t in (protocol.Request, protocol.WorkerConfig, protocol.Reply)
            for f in dataclasses.fields(t)}
WIRE_CALLS = {"frame", "write_frame"}


def _untyped_crossings(tree: ast.AST) -> list[str]:
    """What a module does with a crossing other than through its types: a dict written with
    two or more of :data:`CROSSING`'s keys, a value read from one by such a key
    (``request["chapter"]``, ``config.get("user")``), a frame sent of anything but a
    ``to_wire()`` or :data:`~.protocol.READY`, or a frame read without its ``from_wire``."""
    found, wrapped = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "from_wire"):
            wrapped.update(id(a) for a in node.args)
    for node in ast.walk(tree):
        at = getattr(node, "lineno", 0)
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & CROSSING) > 1:
                found.append(f"{at}: a dict of {sorted(keys & CROSSING)}")
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and (
                node.slice.value in CROSSING - {"value"}):
            found.append(f"{at}: [{node.slice.value!r}]")
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            sent = node.args[-1] if node.args else None
            if name == "get" and node.args and isinstance(node.args[0], ast.Constant) and (
                    node.args[0].value in CROSSING - {"value"}):
                found.append(f"{at}: .get({node.args[0].value!r})")
            elif name in WIRE_CALLS and not (
                    isinstance(sent, ast.Call) and isinstance(sent.func, ast.Attribute)
                    and sent.func.attr == "to_wire"
                    or isinstance(sent, ast.Attribute) and sent.attr == "READY"):
                found.append(f"{at}: {name}() of something that is not a to_wire()")
            elif name == "read_frame" and id(node) not in wrapped:
                found.append(f"{at}: read_frame() without a from_wire")
    return found


def test_the_request_and_the_worker_config_cross_only_as_their_types():
    """The supervisor and the worker make and read what crosses between them (the worker's
    configuration, each request, each reply) as :mod:`.protocol`'s types, checked where they
    arrive: none of their modules writes or reads one as a dict of its fields."""
    sides = [GRADING / "supervisor.py", *sorted((GRADING / "worker").glob("*.py"))]
    problems = [f"{p.relative_to(ROOT)}:{problem}" for p in sides
                for problem in _untyped_crossings(ast.parse(p.read_text()))]
    assert not problems, problems
    planted = ast.parse(
        'request = {"file": f, "chapter": 2}\nprotocol.frame(request)\n'
        'config = json.loads(text)\nconfig["learner_dir"], request.get("exercise")\n'
        'protocol.read_frame(fd)\nprotocol.write_frame(out, reply.to_wire())\n'
        'Request.from_wire(protocol.read_frame(fd))')
    assert sorted(p.split(": ", 1)[1] for p in _untyped_crossings(planted)) == sorted([
        "a dict of ['chapter', 'file']", "frame() of something that is not a to_wire()",
        "['learner_dir']", ".get('exercise')", "read_frame() without a from_wire"])


def test_the_worker_side_imports_nothing_of_the_trusted_side():
    """What runs beside the learner's code imports, of the grader, only the worker's room
    (``grading/worker/``) and the door (``grading/protocol.py``), directly or through any
    other module of the package: never the engine, the plugin or the supervisor. It could
    not be trusted there anyway, and a grading decision made inside the worker would be one
    the learner's code can change."""
    direct = {name: _imports(path) for name, path in MODULES.items()}
    assert [m for m in MODULES if _in_worker(m)], "no worker's room found"
    problems = _worker_side_problems(GRAPH, direct, set(PRELOADED))
    assert not problems, problems


def test_the_worker_side_check_finds_a_trusted_module_on_the_way():
    """The walk above can fail: a worker module that reaches the trusted side, directly or
    through a library module, is named with the way it took; one that imports a third
    party is named too."""
    graph = {f"{WORKER}.process": {f"{WORKER}.calls", "annotated_transformer.layout"},
             f"{WORKER}.calls": {f"{GRADER}.protocol"}, f"{GRADER}.protocol": set(),
             "annotated_transformer.layout": {f"{GRADER}.engine"}, f"{GRADER}.engine": set()}
    direct = {name: {"torch"} for name in graph}
    direct[f"{WORKER}.calls"] = {"requests"}
    assert _worker_side_problems(graph, direct, set()) == [
        f"{WORKER}.process -> annotated_transformer.layout -> {GRADER}.engine",
        f"{WORKER}.calls imports requests"]
    graph["annotated_transformer.layout"] = set()
    assert _worker_side_problems(graph, {n: set() for n in graph}, set()) == []


def test_the_trusted_side_starts_the_worker_by_its_module_name_only():
    """No module outside ``grading/worker/`` imports one inside it (the AST of each, at the
    top or inside a function); the worker is started by ``supervisor.WORKER_BOOT``, the code
    its fresh interpreter runs, read here: it imports ``main`` from the room's
    ``process``."""
    assert not _trusted_side_problems(GRAPH), _trusted_side_problems(GRAPH)
    assert _trusted_side_problems({f"{GRADER}.engine": {f"{WORKER}.calls"}}) == [
        f"{GRADER}.engine imports {WORKER}.calls"]
    booted = [node for node in ast.walk(ast.parse(supervisor.WORKER_BOOT))
              if isinstance(node, ast.ImportFrom)]
    assert [(node.module, [a.name for a in node.names]) for node in booted] == [
        (f"{WORKER}.process", ["main"])]
    assert callable(process.main)


def test_the_worker_builds_every_stand_in_a_request_may_ask_for():
    """The door's :data:`~.protocol.STAND_INS` is what the trusted side hands a test and
    what the worker builds, each under the name it replaces in the chapter module."""
    made, revoke = standins.build({}, lambda exercise: None, lambda kept: None, "5.5")
    revoke()
    assert {e: s.__name__ for e, s in made.items()} == protocol.STAND_INS


def test_the_files_that_decide_a_grade_import_no_instructor_tool():
    """The instructor's tools (regrade, the gradebook, the LMS exports) use the grader;
    nothing the grader runs uses them, so they stay out of the manifest."""
    problems = [f"{p.name} imports {m}" for p in GRADING.rglob("*.py") for m in _imports(p)
                if m.startswith("annotated_transformer.course.instructor")]
    assert not problems, problems


# Names whose values are words of the grader's vocabulary (an Outcome, a StopReason, how a
# reply Ended): compared with a member, never with a string.
VOCABULARY_NAMES = {"status", "outcome", "reason", "ended", "word"}


def _compared_with_a_string(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of each comparison of a vocabulary name (``row.status``, ``reason``)
    with a string literal (``==``, ``!=``, ``in`` a tuple or set of them)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [n.attr if isinstance(n, ast.Attribute) else n.id for n in sides
                 if isinstance(n, (ast.Attribute, ast.Name))
                 and (n.attr if isinstance(n, ast.Attribute) else n.id) in VOCABULARY_NAMES]
        strings = [n for n in sides if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   or isinstance(n, (ast.Tuple, ast.Set, ast.List)) and any(
                       isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts)]
        if named and strings:
            found.append((node.lineno, named[0]))
    return found


def test_no_status_reason_or_source_is_compared_with_a_string():
    """Every status, stop reason and way a reply ended is a member of its enumeration
    (``Outcome``, ``outcomes.StopReason``, ``protocol.Ended``), and the grader compares them as
    members: a word's spelling lives in one place."""
    problems = [f"{p.relative_to(ROOT)}:{line} compares {name} with a string"
                for p in sorted(GRADING.rglob("*.py"))
                for line, name in _compared_with_a_string(ast.parse(p.read_text()))]
    assert not problems, problems
    planted = ast.parse("if row.status == 'passed' or reason in ('cpu', 'busy'): pass")
    assert [name for _, name in _compared_with_a_string(planted)] == ["status", "reason"]


# mypy reads the grader and what it imports (pinned): 9 CPU seconds without its cache
def test_a_type_checker_passes_over_the_grader():
    done = subprocess.run([sys.executable, "-m", "mypy", str(GRADING.relative_to(ROOT))],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
