"""The one shape of a test's record and of an exercise's result: every format reads back what
it wrote, and learner text stays data (a cell that never runs as a formula)."""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import FrozenInstanceError, replace

import pytest

from annotated_transformer.course.grading.protocol import MESSAGE_LIMIT
from annotated_transformer.course.grading.report import Report
from annotated_transformer.course.grading.results import ExerciseResult, TestRecord
from annotated_transformer.course.instructor import gradebook, spreadsheet
from annotated_transformer.course.instructor.gradebook import Gradebook, Learner

# Text a learner's code can put in a message: formulas, quotes, separators, line breaks,
# control characters, markup, a forged mistake tag, other scripts.
PIECES = ["=1+1", "+", "-", "@", "'", "''=", "\t", "\r", "\n", "\r\n", ",", '"', "|", "`", "#",
          "<b>", "[mistake 2.1/x]", "é", "注意", "\x1b[31m", " ", "expected 1, got 2", ""]
STATUSES = ("passed", "failed", "not implemented", "forbidden", "error", "timeout", "busy")
# What only a record may hold: a lone surrogate, a NUL, a message far over the limit.
RAW = ["", "\ud800", "\x00", "x" * (3 * MESSAGE_LIMIT)]


def text(rng: random.Random, longest: int = 6) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, longest)))


def some_result(rng: random.Random, in_gradebook: bool) -> ExerciseResult:
    chapter = rng.randint(1, 8)
    exercise = f"{chapter}.{rng.randint(1, 5)}"
    graded = rng.random() < 0.9  # else a submission that could not be graded
    context = {}
    if in_gradebook:
        context = {"learner": text(rng) or "ann", "flags": text(rng),
                   "seed": rng.choice([None, 0, rng.randint(1, 2**31)]),
                   "graded_at": text(rng), "override": text(rng)}
    return ExerciseResult(
        exercise if graded else "", chapter if graded else 0, text(rng) if graded else "",
        rng.choice([0, 0.5, 1.25, round(rng.uniform(-3, 10), 2)]), rng.choice([1, 2.5, 7.0]),
        rng.choice(STATUSES), text(rng, 12), printed="" if in_gradebook else text(rng),
        mistake=rng.choice(["", f"{exercise}/swapped-axes"]),
        blocked_by=rng.choice(["", "3.3", "3.3,2.2"]), **context)


def some_record(rng: random.Random) -> TestRecord:
    chapter = rng.randint(1, 8)
    exercise = f"{chapter}.{rng.randint(1, 5)}"
    collected = rng.random() < 0.9  # else tests that could not be collected
    return TestRecord(
        f"tests/graded/test_ch0{chapter}.py::test_{text(rng)}[{text(rng)}]",
        exercise if collected else None, chapter if collected else None,
        text(rng) if collected else None, rng.choice([0, 1, 0.5, 1 / 3, 7]),
        rng.choice((*STATUSES, "skipped", "grader error", "collected")),
        text(rng, 12) + rng.choice(RAW), values=rng.random() < 0.5, errors=rng.random() < 0.2,
        parts=rng.choice([None, "solutions", "variant:x", text(rng)]),
        mistake=rng.choice(["", f"{exercise}/swapped-axes"]),
        calls=tuple(text(rng) for _ in range(rng.randint(0, 3))),
        printed=text(rng, 12) + rng.choice(RAW[:3]))


@pytest.mark.parametrize("seed", range(5))
def test_a_test_record_reads_back_from_the_json_the_plugin_writes(seed):
    rng = random.Random(seed)
    records = [some_record(rng) for _ in range(60)]
    written = json.dumps([r.to_json() for r in records], indent=1)  # the plugin's file
    assert [TestRecord.from_json(data) for data in json.loads(written)] == records
    assert all(len(r.message) <= MESSAGE_LIMIT for r in records)
    with pytest.raises(FrozenInstanceError):
        records[0].outcome = "passed"  # type: ignore[misc]
    with pytest.raises(TypeError):  # a record without its outcome is none
        TestRecord.from_json({"test": "t", "exercise": "1.1", "chapter": 1, "title": "t",
                              "points": 1})


@pytest.mark.parametrize("seed", range(5))
def test_json_reads_back_every_result(seed):
    rng = random.Random(seed)
    for in_gradebook in (False, True):
        for result in (some_result(rng, in_gradebook) for _ in range(40)):
            data = json.loads(json.dumps(result.to_json()))
            assert ExerciseResult.from_json(data) == result


@pytest.mark.parametrize("seed", range(5))
def test_csv_reads_back_every_result_and_no_cell_is_a_formula(seed):
    rng = random.Random(seed)
    found = [some_result(rng, in_gradebook=True) for _ in range(60)]
    written = spreadsheet.to_csv(found)
    assert spreadsheet.from_csv(written) == found
    cells = [cell for line in csv.reader(io.StringIO(written)) for cell in line]
    assert not any(cell.startswith(("=", "+", "@", "\t", "\r")) for cell in cells)
    assert not any(cell.startswith("-") and not _number(cell) for cell in cells)


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_a_gradebook_line_leaves_out_only_what_the_code_printed():
    result = ExerciseResult("2.1", 2, "attention", 1, 2, "failed", "x", printed="hello",
                            learner="ann", seed=3)
    assert spreadsheet.from_row(spreadsheet.to_row(result)) == replace(result, printed="")


def test_the_report_s_rows_hold_no_gradebook_fields_and_read_back():
    rng = random.Random(7)
    rows = [some_result(rng, in_gradebook=False) for _ in range(30)]
    report = Report(rows, "solutions", seed=11, sandbox="bubblewrap")
    data = json.loads(json.dumps(report.to_json()))
    assert all(set(row) == {"id", "chapter", "title", "points", "max_points", "status",
                            "message", "printed", "mistake", "blocked_by"}
               for row in data["exercises"])
    assert Report.from_json(data).rows == rows



def test_a_report_of_the_points_on_offer_grades_no_parts():
    """``grade --points --json``: nothing was graded, so the report's parts are None (not a
    word that a folder named so could also be), and it reads back so."""
    rows = [some_result(random.Random(3), in_gradebook=False)]
    data = json.loads(json.dumps(Report(rows, None).to_json()))
    assert data["parts"] is None
    back = Report.from_json(data)
    assert back.parts is None and back.rows == rows
    assert "Nothing graded" in back.table() and "--parts" not in back.table()
    offered = Report([replace(rows[0], id="2.1", chapter=2, max_points=4.5),
                      replace(rows[0], id="1.1", chapter=1, max_points=3)], None).offer()
    assert "chapter 2" in offered and offered.endswith("Total: 7.5 points")
    assert Report.from_json({**data, "parts": "points"}).parts == "points"  # a folder

def test_a_gradebook_reads_back_through_its_json(tmp_path):
    rng = random.Random(3)
    book = Gradebook(chapters=[1, 2])
    for name in ("ann", "=ben", "'cy"):
        rows = [replace(some_result(rng, in_gradebook=True), learner=name, override="")
                for _ in range(6)]
        book.put(Learner(name, f"/subs/{name}", seed=1), rows)
    gradebook.write(tmp_path, book, {"seed": 1})
    first = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert gradebook.read(tmp_path).rows == book.rows
    gradebook.write(tmp_path, gradebook.read(tmp_path), {"seed": 1})  # read again: the same
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == first
    with (tmp_path / "gradebook.csv").open(newline="") as handle:  # a "\r" in a cell kept
        assert spreadsheet.from_csv(handle.read()) == book.rows


def test_a_message_is_never_longer_than_the_limit_and_a_result_never_changes():
    result = ExerciseResult("1.1", 1, "t", 0, 1, "failed", "x" * (3 * MESSAGE_LIMIT))
    assert len(result.message) == MESSAGE_LIMIT and result.message.endswith("characters]")
    assert ExerciseResult.from_json(result.to_json()) == result
    with pytest.raises(FrozenInstanceError):
        result.points = 1  # type: ignore[misc]


def test_no_csv_cell_holds_what_a_terminal_obeys_and_every_cell_reads_back():
    """A learner's message with a carriage return, escape sequences, a line break, the C1
    CSI and a backslash: in the CSV each is written as its escape (the file has one line a
    result, nothing in it moves the cursor), and reads back as it was."""
    hostile = "\r\x1b[?7h\x1b[2Kmallory,1.2,passed\n,\x9b31m\u2028\u202e C:\\x41\\"
    found = [replace(some_result(random.Random(0), in_gradebook=True), message=hostile)]
    written = spreadsheet.to_csv(found)
    assert spreadsheet.from_csv(written) == found
    assert written.count("\n") == 2 and written.count("\r") == 2  # the writer's "\r\n" only
    assert not any(c in written for c in ("\x1b", "\x9b", "\u2028", "\u202e"))
