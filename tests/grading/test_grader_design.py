"""The grader's design, checked: each word of its vocabulary is a type defined once and used
as that type, the two sides of the worker's channel import what they should, and a type
checker passes over the grader."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer.course.grading import outcomes, protocol
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.layout import ROOT

GRADING = ROOT / "annotated_transformer" / "course" / "grading"
PACKAGE = ROOT / "annotated_transformer"
# Where the learner's code runs: these modules may import nothing of the trusted side.
WORKER_SIDE = {"worker", "allowed_ops", "switches", "standins", "confinement", "protocol",
               "calls", "messages", "exercise_id"}
TRUSTED_ONLY = {"engine", "plugin", "grade", "report", "manifest", "cache", "supervisor",
                "runspec", "results", "boundary", "limits", "watch", "dependencies"}


def _imports(path: Path) -> set[str]:
    """The modules a file imports (``a.b`` for ``from a import b`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


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
    assert ExerciseId("5.10").chapter == 5 and ExerciseId("5.10").number == 10
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


def test_the_worker_side_imports_nothing_of_the_trusted_side():
    """What runs beside the learner's code (and what it imports) never imports the engine,
    the plugin or the supervisor: it could not be trusted there anyway, and a grading
    decision made inside the worker would be one the learner's code can change."""
    problems = []
    for name in WORKER_SIDE:
        for imported in _imports(GRADING / f"{name}.py"):
            module = imported.rsplit(".", 1)[-1]
            if imported.startswith("annotated_transformer.course.grading") and (
                    module in TRUSTED_ONLY):
                problems.append(f"{name}.py imports {imported}")
    assert not problems, problems


def test_the_files_that_decide_a_grade_import_no_instructor_tool():
    """The instructor's tools (regrade, the gradebook, the LMS exports) use the grader;
    nothing the grader runs uses them, so they stay out of the manifest."""
    problems = [f"{p.name} imports {m}" for p in GRADING.rglob("*.py") for m in _imports(p)
                if m.startswith("annotated_transformer.course.instructor")]
    assert not problems, problems


@pytest.mark.slow  # about 40 s: mypy reads the grader and what it imports (pinned)
def test_a_type_checker_passes_over_the_grader():
    done = subprocess.run([sys.executable, "-m", "mypy", str(GRADING.relative_to(ROOT))],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
