"""The grader, both ways: the reference passes everything, fresh stubs are 'not implemented',
every wrong variant is caught and every other correct answer passes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from annotated_transformer import grade, stubs

import variants

CHAPTERS = sorted(grade.chapter_test_files())


def test_the_reference_passes_every_graded_test():
    rows = grade.summarize(grade.run_tests(None, "solutions"))
    assert {r.chapter for r in rows} == set(CHAPTERS)
    failing = [f"{r.id}: {r.status}: {r.message}" for r in rows if r.status != "passed"]
    assert not failing, failing
    assert all(r.points == r.max_points > 0 for r in rows)


def test_fresh_stubs_are_not_implemented_everywhere(tmp_path):
    stubs.write_stubs(tmp_path)
    rows = grade.summarize(grade.run_tests(None, str(tmp_path)))
    assert rows
    # The points on offer, read without running anything, are the points that grading gives.
    offered = {r.id: r.max_points for r in grade.exercise_points()}
    assert offered == {r.id: r.max_points for r in rows}
    for row in rows:
        assert row.status == "not implemented", f"{row.id}: {row.status}: {row.message}"
        assert row.points == 0
        # An exercise names itself; the capstone names the first part still missing.
        assert re.match(r"Exercise \d+\.\d+: ", row.message), row.message


def test_wrong_variants_fail_and_right_variants_pass():
    records = grade.run_tests(None, "variants")
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record["impl"]:  # tests no variant stands for (the capstone) have no implementation
            by_variant[record["impl"].removeprefix("variant:")].append(record)
    problems = []
    for chapter in CHAPTERS:
        for variant in variants.for_chapter(chapter):
            outcomes = [r["outcome"] for r in by_variant[variant.name]]
            if not outcomes:
                problems.append(f"{variant.name}: no test of exercise {variant.exercise} ran")
            elif variant.correct and set(outcomes) != {"passed"}:
                bad = next(r for r in by_variant[variant.name] if r["outcome"] != "passed")
                problems.append(f"right answer {variant.name} ({variant.why}) fails "
                                f"{bad['test']}: {bad['message']}")
            elif not variant.correct and "passed" in outcomes and len(set(outcomes)) == 1:
                problems.append(f"wrong answer {variant.name} ({variant.why}) passes every "
                                f"test of exercise {variant.exercise}")
            elif not variant.correct:
                failed = [r for r in by_variant[variant.name] if r["outcome"] != "passed"]
                assert all(r["message"] for r in failed), "a failure without a message"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_tests_and_wrong_and_right_variants(chapter):
    test_file = grade.chapter_test_files([chapter])[chapter]
    tree = ast.parse(test_file.read_text())
    declared = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "EXERCISES")
    graded = set(re.findall(r'@pytest\.mark\.grade\("(\d+\.\d+)"', test_file.read_text()))
    solution = next(stubs.SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py")).read_text()
    regions = set(re.findall(r"# BEGIN SOLUTION (\d+\.\d+)", solution))
    integration = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                        and getattr(n.targets[0], "id", "") == "INTEGRATION"), set())
    assert set(declared) == graded == regions | integration, (declared, graded, regions)
    for exercise in set(declared) - integration:
        kinds = {v.correct for v in variants.for_chapter(chapter) if v.exercise == exercise}
        assert kinds == {True, False}, f"exercise {exercise} needs wrong and right variants"


def test_an_unimportable_file_is_an_error_naming_the_line(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text() + "\ndef broken(:\n")
    rows = grade.summarize(grade.run_tests([1], str(tmp_path)))
    assert {r.status for r in rows} == {"error"}
    assert all("SyntaxError" in r.message and "line" in r.message for r in rows)


def test_an_exercise_that_raises_is_an_error_naming_the_place(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    text = target.read_text().replace(
        'raise NotImplementedError("Exercise 1.1: positional_encoding is not implemented yet")',
        "return torch.ones(2, 3) @ torch.ones(2, 3)")
    target.write_text(text)
    rows = {r.id: r for r in grade.summarize(grade.run_tests([1], str(tmp_path)))}
    assert rows["1.1"].status == "error"
    assert "RuntimeError" in rows["1.1"].message and target.name in rows["1.1"].message
    assert rows["1.2"].status == "not implemented"


def test_command_line_table_and_json(tmp_path):
    path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "annotated_transformer.grade", "--chapter", "1",
                           "--impl", "solutions", "--json", str(path)],
                          capture_output=True, text=True, check=True)
    assert "1.1" in done.stdout and "passed" in done.stdout and "Total:" in done.stdout
    data = json.loads(path.read_text())
    assert set(data) >= {"exercises", "points", "max_points", "chapters"}
    row = data["exercises"][0]
    assert set(row) == {"id", "chapter", "title", "points", "max_points", "status", "message"}
    assert data["points"] == data["max_points"] > 0
    usage = subprocess.run([sys.executable, "-m", "annotated_transformer.grade", "--chapter", "99"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and "chapter" in usage.stderr


def test_reports_and_fail_under(tmp_path):
    from xml.etree import ElementTree as ET

    stubs.write_stubs(tmp_path / "stubs")
    command = [sys.executable, "-m", "annotated_transformer.grade", "--chapter", "1",
               "--impl", str(tmp_path / "stubs"), "--junit", str(tmp_path / "r.xml"),
               "--markdown", str(tmp_path / "r.md")]
    assert subprocess.run(command, capture_output=True).returncode == 0, "grading exits 0"
    failing = subprocess.run(command + ["--fail-under", "50"], capture_output=True, text=True)
    assert failing.returncode == 1 and "below --fail-under" in failing.stdout
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert cases and int(suite.get("tests")) == len(cases)
    assert all(c.find("failure") is not None for c in cases), "stubs fail every test case"
    assert "| 1.1 |" in (tmp_path / "r.md").read_text()
    bad = subprocess.run([sys.executable, "-m", "annotated_transformer.grade", "--fail-under",
                          "120"], capture_output=True)
    assert bad.returncode == 2, "a usage error exits 2"


def test_an_endless_exercise_is_stopped_and_reported(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text().replace(
        'raise NotImplementedError("Exercise 1.4: relative_position_matrix is not implemented '
        'yet")', "while True:\n        pass"))
    rows = {r.id: r for r in grade.summarize(grade.run_tests([1], str(tmp_path), timeout=1))}
    assert rows["1.4"].status == "timeout", (rows["1.4"].status, rows["1.4"].message)
    assert rows["1.1"].status == "not implemented"


def test_calling_the_op_to_write_is_forbidden(tmp_path):
    reference = stubs.SOLUTIONS_DIR / "ch02_attention.py"
    text = reference.read_text()
    start = text.index("    # BEGIN SOLUTION 2.1")
    end = text.index("    # END SOLUTION", start)
    (tmp_path / reference.name).write_text(
        text[:start] + "    return torch.softmax(x, dim=dim).nan_to_num(0.0)\n" + text[end:])
    rows = {r.id: r for r in grade.summarize(grade.run_tests([2], str(tmp_path)))}
    assert rows["2.1"].status == "forbidden" and rows["2.1"].points == 0
    assert "softmax" in rows["2.1"].message and "line" in rows["2.1"].message
    assert rows["2.2"].status == rows["2.3"].status == "passed", "the rest is graded as usual"


def test_one_exercise_from_an_earlier_report(tmp_path):
    """The GitHub Classroom steps: one exercise each, read from the one grading run's JSON."""
    rows = [grade.ExerciseResult("1.1", 1, "first", 7, 7, "passed", ""),
            grade.ExerciseResult("1.2", 1, "second", 3, 9, "failed", "expected 1, got 2")]
    path = tmp_path / "grade.json"
    path.write_text(json.dumps(grade.report(rows, "exercises")))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "annotated_transformer.grade",
                               "--from-report", str(path), *args], capture_output=True, text=True)

    passed = run("--exercise", "1.1", "--fail-under", "100")
    assert passed.returncode == 0 and "1.1" in passed.stdout and "1.2" not in passed.stdout
    failed = run("--exercise", "1.2", "--fail-under", "100")
    assert failed.returncode == 1 and "expected 1, got 2" in failed.stdout
    assert "10/16 points from passed tests" in run("--score").stdout
    assert run("--exercise", "3.1").returncode == 2, "an exercise the report does not have"
    assert run("--junit", str(tmp_path / "x.xml")).returncode == 2, "JUnit needs the tests"
    path.unlink()
    missing = run("--exercise", "1.1")
    assert missing.returncode == 2 and "did the grading step run" in missing.stderr
