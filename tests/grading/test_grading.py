"""The grader, both ways: the reference passes everything, fresh stubs are 'not implemented',
every wrong variant is caught and every other correct answer passes."""

from __future__ import annotations

import ast
import json
import re
import runpy
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace

import pytest
from grading_run import grade_run

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import (
    cache,
    dependencies,
    engine,
    grade,
    manifest,
    messages,
    outcomes,
)
from annotated_transformer.course.grading.report import ExerciseResult, Integrity, Report
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.layout import GRADED_DIR, chapter_test_files
from annotated_transformer.sources import Source

import variants

CHAPTERS = sorted(chapter_test_files())
# The one table of the mistakes the graded tests name: {id: message}.
MISTAKES = runpy.run_path(str(GRADED_DIR / "mistakes.py"))["MISTAKES"]


@pytest.fixture
def busy_machine():
    """Two processes that keep both cores of a 2-core machine busy while a test runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


@pytest.mark.slow
@pytest.mark.alone  # keeps the cores busy on purpose
def test_the_reference_passes_every_graded_test_on_a_busy_machine(tmp_path, busy_machine):
    """The reference, as a learner's folder (in the sandbox where one can start), earns every
    point while two other processes keep the cores busy: limits count CPU seconds."""
    for path in stubs.SOLUTIONS_DIR.glob("ch*.py"):
        shutil.copy(path, tmp_path / path.name)
    rows = grade_run(None, str(tmp_path)).rows()
    assert {r.chapter for r in rows} == set(CHAPTERS)
    failing = [f"{r.id}: {r.status}: {r.message}" for r in rows if r.status != "passed"]
    assert not failing, failing
    assert all(r.points == r.max_points > 0 for r in rows)


def test_fresh_stubs_are_not_implemented_everywhere(tmp_path):
    stubs.write_stubs(tmp_path)
    rows = grade_run(None, str(tmp_path)).rows()
    assert rows
    # The points on offer, read without running anything, are the points that grading gives.
    offered = {r.id: r.max_points for r in engine.exercise_points()}
    assert offered == {r.id: r.max_points for r in rows}
    for row in rows:
        assert row.status == "not implemented", f"{row.id}: {row.status}: {row.message}"
        assert row.points == 0
        # An exercise names itself; the capstone says what it is and names the first stub
        # it met.
        assert re.search(r"Exercise \d+\.\d+: ", row.message), row.message
        if row.id == "6.6":
            assert row.message.startswith("the capstone builds and trains"), row.message


# The runs whose random inputs the variants are graded on: a wrong answer must fail, and a
# named mistake be named, whatever the seed (fixed cases beside the random ones see to it).
SEEDS = (0, 1, 2)


@pytest.mark.slow  # every variant of every chapter graded, once a seed: minutes
@pytest.mark.parametrize("seed", SEEDS)
def test_wrong_variants_fail_and_right_variants_pass(seed):
    records = grade_run(None, "variants", seed=seed).records
    by_variant: dict[str, list[TestRecord]] = defaultdict(list)
    for record in records:
        if record.parts:  # tests no variant stands for (the capstone) have no implementation
            by_variant[record.parts.removeprefix("variant:")].append(record)
    problems = []
    for chapter in CHAPTERS:
        for variant in variants.for_chapter(chapter):
            outcomes = [r.outcome for r in by_variant[variant.name]]
            if not outcomes:
                problems.append(f"{variant.name}: no test of exercise {variant.exercise} ran")
            elif variant.correct and set(outcomes) != {"passed"}:
                bad = next(r for r in by_variant[variant.name] if r.outcome != "passed")
                problems.append(f"right answer {variant.name} ({variant.why}) fails "
                                f"{bad.test} (seed {seed}): {bad.message}")
            elif not variant.correct and "passed" in outcomes and len(set(outcomes)) == 1:
                problems.append(f"wrong answer {variant.name} ({variant.why}) passes every "
                                f"test of exercise {variant.exercise} (seed {seed})")
            elif not variant.correct:
                failed = [r for r in by_variant[variant.name] if r.outcome != "passed"]
                assert all(r.message for r in failed), "a failure without a message"
    assert not problems, "\n".join(problems)


# Wrong answers that pass every check a wrong answer can pass (shapes, devices, properties):
# they earn nothing, since those checks pay only with the values.
EARN_NOTHING = {"only_first_key": "4.1", "allows_every_key": "4.1", "identity_mask": "4.2",
                "identity_plus_first_key": "4.3", "causal_only": "4.3",
                "SkeletonWithoutAttention": "3.3"}


@pytest.mark.slow  # four exercises' variants graded
def test_answers_right_only_in_shape_and_properties_earn_nothing():
    run = grade_run(None, ",".join(f"variant:{name}" for name in EARN_NOTHING),
                    exercises=sorted(set(EARN_NOTHING.values())))
    for name, exercise in EARN_NOTHING.items():
        mine = [r for r in run.records if r.parts == f"variant:{name}"]
        assert {r.exercise for r in mine} == {exercise}, name
        assert any(r.outcome == "passed" for r in mine), f"{name} passes no check at all"
        [row] = [r for r in run.rows(Source.of_variant(name)) if r.id == exercise]
        assert row.points == 0, f"{name}: {row.points} points for a wrong answer"
        assert "count once the tests on good input pass" in row.message, row.message


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_tests_and_wrong_and_right_variants(chapter):
    test_file = chapter_test_files([chapter])[chapter]
    tree = ast.parse(test_file.read_text())
    declared = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "EXERCISES")
    graded = set(re.findall(r'@pytest\.mark\.grade\("(\d+\.\d+)"', test_file.read_text()))
    solution = next(stubs.SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py")).read_text()
    regions = set(re.findall(r"# BEGIN SOLUTION (\d+\.\d+)", solution))
    integration = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                        and getattr(n.targets[0], "id", "") == "INTEGRATION"), set())
    assert set(declared) == graded == regions | integration, (declared, graded, regions)
    # Every exercise has tests of its values, on which its other tests' points wait.
    valued = set(re.findall(r'@pytest\.mark\.grade\("(\d+\.\d+)"[^)]*values=True',
                            test_file.read_text()))
    assert valued == set(declared), f"exercises without a test of values=True: " \
        f"{sorted(set(declared) - valued)}"
    for exercise in set(declared) - integration:
        kinds = {v.correct for v in variants.for_chapter(chapter) if v.exercise == exercise}
        assert kinds == {True, False}, f"exercise {exercise} needs wrong and right variants"


def test_an_unimportable_file_is_an_error_naming_the_line(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text() + "\ndef broken(:\n")
    rows = grade_run([1], str(tmp_path)).rows()
    assert {r.status for r in rows} == {"error"}
    assert all("SyntaxError" in r.message and "line" in r.message for r in rows)
    assert all(r.message.count(target.name) == 1 for r in rows), rows[0].message  # named once


def test_an_exercise_that_raises_is_an_error_naming_the_place(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    text = target.read_text().replace(
        'raise NotImplementedError("Exercise 1.1: positional_encoding is not implemented yet")',
        "return torch.ones(2, 3) @ torch.ones(2, 3)")
    target.write_text(text)
    rows = {r.id: r for r in grade_run([1], str(tmp_path)).rows()}
    assert rows["1.1"].status == "error"
    assert "RuntimeError" in rows["1.1"].message and target.name in rows["1.1"].message
    assert rows["1.2"].status == "not implemented"


def test_an_exercise_that_returns_a_numpy_array_is_told_to_return_a_tensor(tmp_path):
    """In the learner's words: what to return, never the grader's words for what it can
    send between its processes."""
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text().replace(
        'raise NotImplementedError("Exercise 1.1: positional_encoding is not implemented yet")',
        "import numpy\n    return numpy.zeros((max_len, d_model))", 1))
    [row] = grade_run([1], str(tmp_path), exercises=["1.1"]).rows()
    assert row.status == "error"
    assert "returned a NumPy array (numpy.ndarray) where a torch.Tensor is expected" in (
        row.message), row.message
    assert "plain data" not in row.message, row.message


@pytest.mark.parametrize("raised, means", [
    ("element 0 of tensors does not require grad and does not have a grad_fn",
     "not connected to autograd's graph"),
    ("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.",
     "NumPy is outside autograd's graph"),
    ("Tensor on device cpu is not on the expected device meta!", "on another device"),
    ("expected m1 and m2 to have the same dtype, but got: float != double", "dtype=x.dtype"),
    ("The size of tensor a (2) must match the size of tensor b (4) at non-singleton "
     "dimension 0", "sizes 2 and 4 at dimension 0"),
    ("mat1 and mat2 shapes cannot be multiplied (2x5 and 3x4)", "5 against 3"),
    ("Expected size for first two dimensions of batch2 tensor to be: [12, 4] but got: "
     "[12, 7].", "should start [12, 4]"),
    ("view size is not compatible with input tensor's size and stride", ".reshape(...)"),
    ("Sizes of tensors must match except in dimension 1. Expected size 3 but got size 1 for "
     "tensor number 1 in the list.", "joins tensors along dimension 1"),
    ("shape '[2, 5, 4, 3]' is invalid for input of size 96", "to [2, 5, 4, 3]"),
    ("one of the variables needed for gradient computation has been modified by an inplace "
     "operation", "in-place operation"),
])
def test_a_pytorch_error_says_what_it_means_for_the_exercise(raised, means):
    """PyTorch's message and where it was raised, then what it means for the exercise."""
    told = str(outcomes.LearnerRaised(["RuntimeError"], raised, "ch02_attention.py:40"))
    assert told.startswith(f"RuntimeError: {raised} (at ch02_attention.py:40). What it means "
                           f"here: "), told
    assert means in told, told


def test_a_message_that_names_a_mistake_is_told_as_it_is():
    """A test's own words (a named mistake) already say what to do."""
    message = f"The size of tensor a (2) must match ...: {messages.mistake_tag('2.1/dim-ignored')}"
    assert "What it means" not in str(outcomes.LearnerRaised(["RuntimeError"], message, ""))


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_command_line_table_and_json(tmp_path):
    path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--chapter", "1",
                           "--parts", "solutions", "--json", str(path)],
                          capture_output=True, text=True, check=True)
    assert "1.1" in done.stdout and "passed" in done.stdout and "Total:" in done.stdout
    data = json.loads(path.read_text())
    assert set(data) >= {"exercises", "points", "max_points", "chapters", "seed"}
    # A fresh seed each run, reported so that the run can be repeated.
    assert isinstance(data["seed"], int) and f"--seed {data['seed']}" in done.stdout
    row = data["exercises"][0]
    assert set(row) == {"id", "chapter", "title", "points", "max_points", "status", "message",
                        "printed", "mistake", "blocked_by"}
    assert data["points"] == data["max_points"] > 0
    usage = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--chapter",
                            "99"], capture_output=True, text=True)
    assert usage.returncode == 2 and "chapter" in usage.stderr


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_reports_and_fail_under(tmp_path):
    from xml.etree import ElementTree as ET

    stubs.write_stubs(tmp_path / "stubs")
    command = [sys.executable, "-m", "annotated_transformer", "grade", "--chapter", "1",
               "--parts", str(tmp_path / "stubs"), "--junit", str(tmp_path / "r.xml"),
               "--markdown", str(tmp_path / "r.md"), "--seed", "7"]
    assert subprocess.run(command, capture_output=True).returncode == 0, "grading exits 0"
    failing = subprocess.run(command + ["--fail-under", "50"], capture_output=True, text=True)
    assert failing.returncode == 1 and "below --fail-under" in failing.stdout
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert cases and int(suite.get("tests")) == len(cases)
    assert all(c.find("failure") is not None for c in cases), "stubs fail every test case"
    assert "| 1.1 |" in (tmp_path / "r.md").read_text()
    assert "seed 7" in (tmp_path / "r.md").read_text()
    assert suite.find("properties/property[@name='seed']").get("value") == "7"
    bad = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--fail-under",
                          "120"], capture_output=True)
    assert bad.returncode == 2, "a usage error exits 2"


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_an_endless_exercise_is_stopped_and_reported(tmp_path):
    stubs.write_stubs(tmp_path)
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text().replace(
        'raise NotImplementedError("Exercise 1.4: relative_position_matrix is not implemented '
        'yet")', "while True:\n        pass"))
    run = grade_run([1], str(tmp_path), timeout=3)
    records, rows = run.records, {r.id: r for r in run.rows()}
    assert rows["1.4"].status == "timeout", (rows["1.4"].status, rows["1.4"].message)
    assert rows["1.1"].status == "not implemented"
    # The first call has its budget and names the looping line (the exercise's message);
    # the exercise's later calls get 1 CPU second each; the stack asked for is not shown as
    # printed.
    looped = [r for r in records if r.exercise == "1.4"]
    assert "more than 3 CPU seconds" in looped[0].message
    assert f"{target.name}:" in looped[0].message and f"{target.name}:" in rows["1.4"].message
    assert all("more than 1 CPU second " in r.message for r in looped[1:]), looped
    assert not any("most recent call first" in r.printed for r in looped)


def test_calling_the_op_to_write_is_forbidden(tmp_path):
    reference = stubs.SOLUTIONS_DIR / "ch02_attention.py"
    text = reference.read_text()
    start = text.index("    # BEGIN SOLUTION 2.1")
    end = text.index("    # END SOLUTION", start)
    (tmp_path / reference.name).write_text(
        text[:start] + "    return torch.softmax(x, dim=dim).nan_to_num(0.0)\n" + text[end:])
    rows = {r.id: r for r in grade_run([2], str(tmp_path)).rows()}
    assert rows["2.1"].status == "forbidden" and rows["2.1"].points == 0
    assert "softmax" in rows["2.1"].message and "line" in rows["2.1"].message
    # 2.2 builds on that softmax: torch.softmax anywhere in the file is forbidden there too.
    assert rows["2.2"].status == "forbidden" and rows["2.2"].points == 0
    assert rows["2.3"].status == "passed", "the rest is graded as usual"


def test_a_namespace_merged_by_update_wrapper_is_refused(tmp_path):
    """The exercise module's namespace widened by ``functools.update_wrapper`` (attribute
    names as strings), then a module it never imported (``os``) used by name: the file is
    never run, and every exercise of its chapter is forbidden."""
    reference = stubs.SOLUTIONS_DIR / "ch02_attention.py"
    text = reference.read_text()
    start = text.index("    # BEGIN SOLUTION 2.1")
    end = text.index("    # END SOLUTION", start)
    attack = ("import functools\n\n\ndef _anchor():\n    pass\n\n\n"
              "functools.update_wrapper(_anchor, torch.cuda.is_available, assigned=(),\n"
              "                         updated=('__glo' + 'bals__',))\n")
    body = ("    os.environ.get('HOME')\n"
            "    return torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)\n")
    (tmp_path / reference.name).write_text(text[:start] + body + text[end:] + attack)
    rows = {r.id: r for r in grade_run([2], str(tmp_path)).rows()}
    assert {r.status for r in rows.values()} == {"forbidden"}, rows
    assert all(r.points == 0 for r in rows.values())
    assert "update_wrapper" in rows["2.1"].message or "`os`" in rows["2.1"].message


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_one_exercise_from_an_earlier_report(tmp_path):
    """The GitHub Classroom steps: one exercise each, read from the one grading run's JSON."""
    rows = [ExerciseResult("1.1", 1, "first", 7, 7, "passed", ""),
            ExerciseResult("1.2", 1, "second", 3, 9, "failed", "expected 1, got 2")]
    path = tmp_path / "grade.json"
    path.write_text(json.dumps(Report(rows, "exercises").to_json()))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "annotated_transformer", "grade",
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


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_file_that_reads_the_reference_is_forbidden_in_all_its_chapter(tmp_path):
    for path in stubs.SOLUTIONS_DIR.glob("ch0[1-6]_*.py"):
        shutil.copy(path, tmp_path)
    target = tmp_path / "ch02_attention.py"
    text = target.read_text()
    start = text.index("    # BEGIN SOLUTION 2.1")
    end = text.index("    # END SOLUTION", start)
    target.write_text(text[:start] + '    reference = __import__("importlib").import_module('
                      '"solutions.ch02_attention")\n    return reference.softmax(x, dim=dim)\n'
                      + text[end:])
    rows = {r.id: r for r in grade_run([1, 2, 6], str(tmp_path)).rows()}
    for exercise in ("2.1", "2.2", "2.3"):
        assert rows[exercise].status == "forbidden" and rows[exercise].points == 0
        assert "ch02_attention.py" in rows[exercise].message, rows[exercise].message
        assert "__import__" in rows[exercise].message, rows[exercise].message
    assert {rows[e].status for e in ("1.1", "1.2", "6.1", "6.4")} == {"passed"}
    # The capstone builds its model from every chapter of the folder, chapter 2's included.
    assert rows["6.6"].status == "forbidden" and "ch02_attention.py" in rows["6.6"].message


# ---------------------------------------------------------------- tamper evidence

# A conftest.py above tests/ that turns every failure into a pass, were pytest to load it.
PASS_EVERYTHING = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def test_the_grading_manifest_is_current():
    committed = manifest.load(grade.ROOT / manifest.MANIFEST)
    assert committed == manifest.compute(), (
        "a file that decides a grade (the graded tests, the grader, a module they import, the "
        "pytest settings) changed: run python -m annotated_transformer grade "
        "--write-manifest tests/graded/grading_manifest.json")


def copy_of_the_course(tmp_path):
    """The parts of the repository that grading needs, copied to ``tmp_path / "course"``."""
    root = tmp_path / "course"
    for name in ("annotated_transformer", "solutions", "exercises", "tests"):
        shutil.copytree(grade.ROOT / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(grade.ROOT / "pyproject.toml", root)
    return root


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_changed_tests_are_flagged_in_every_report_and_grading_still_runs(tmp_path):
    from xml.etree import ElementTree as ET

    root = copy_of_the_course(tmp_path)
    manifest.write(tmp_path / "manifest.json", root)  # the course as published
    test_file = root / "tests" / "graded" / "test_ch01_positional_encoding.py"
    test_file.write_text(test_file.read_text().replace("points=3", "points=30", 1))
    (root / "conftest.py").write_text(PASS_EVERYTHING)
    stubs.write_stubs(root / "mine")
    done = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", "grade", "--chapter", "1", "--parts",
         "mine",
         "--verify-manifest", str(tmp_path / "manifest.json"), "--json", "r.json",
         "--junit", "r.xml", "--markdown", "r.md"],
        cwd=root, capture_output=True, text=True)  # the copy's own grader, from its folder
    assert done.returncode == 0, done.stderr
    tampered = ["conftest.py", "tests/graded/test_ch01_positional_encoding.py"]
    data = json.loads((root / "r.json").read_text())
    assert data["tampered"] == tampered
    assert data["integrity"]["changes"] == {"conftest.py": "added", tampered[1]: "changed"}
    for text in (done.stdout, (root / "r.md").read_text()):
        assert "TAMPERED" in text and all(path in text for path in tampered)
    integrity = ET.parse(root / "r.xml").getroot().find("testsuite[@name='integrity']")
    assert integrity.find("testcase/failure").get("type") == "tampered"
    # Graded all the same, and the conftest.py above tests/ was not loaded.
    assert [r["status"] for r in data["exercises"]] == ["not implemented"] * 4
    report = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade",
                             "--from-report", "r.json", "--score"],
                            cwd=root, capture_output=True, text=True)
    assert "TAMPERED: " + ", ".join(tampered) in report.stdout


def test_the_manifest_names_missing_added_and_changed_files(tmp_path):
    root = copy_of_the_course(tmp_path)
    published = manifest.compute(root)
    assert manifest.verify(published, root) == {}
    (root / "tests" / "graded" / "test_ch07_decoding.py").unlink()
    (root / "tests" / "variants" / "ch01.py").unlink()  # not graded: the course's own check
    (root / "tests" / "graded" / "test_ch09_bonus.py").write_text("CHAPTER = 9\n")
    (root / "tests" / "graded" / "helpers.py").write_text("")  # the folder counts whole
    (root / "tests" / "test_more_of_the_package.py").write_text("")  # not graded
    (root / "tests" / "pytest.ini").write_text("[pytest]\n")
    (root / "setup.cfg").write_text("[metadata]\nname = x\n")  # no pytest settings: fine
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('testpaths = ["tests"]',
                                                       'testpaths = ["tests"]\nxfail_strict = 1'))
    assert manifest.verify(published, root) == {
        manifest.PYTEST_SETTINGS: "changed", "tests/pytest.ini": "added",
        "tests/graded/test_ch09_bonus.py": "added", "tests/graded/helpers.py": "added",
        "tests/graded/test_ch07_decoding.py": "missing"}
    # Line endings do not count.
    checks = root / "tests" / "graded" / "checks.py"
    checks.write_bytes(checks.read_bytes().replace(b"\n", b"\r\n"))
    assert "tests/graded/checks.py" not in manifest.verify(published, root)
    ignored = Integrity("m.json", "../alice", {"tests/graded/checks.py": "changed"}, used=False)
    assert "The course's own copies graded this run" in " ".join(ignored.lines())


# ---------------------------------------------------------------- fresh random inputs


def test_a_memorized_answer_cannot_be_kept_between_runs(tmp_path):
    """Answers recorded in one run and replayed in the next need a file: an exercise file
    may not read or write one (and the inputs come from a fresh seed each run)."""
    reference = (stubs.SOLUTIONS_DIR / "ch03_multi_head.py").read_text()
    replay = reference + "\n\nANSWERS = torch.load('answers.pt')\n"
    (tmp_path / "ch03_multi_head.py").write_text(replay)
    row = next(r for r in grade_run([3], str(tmp_path), exercises=["3.2"], seed=12).rows())
    assert row.status == "forbidden" and "load" in row.message, (row.status, row.message)


# ---------------------------------------------------------------- one exercise, what it builds on


def test_one_exercise_runs_only_its_tests():
    records = grade_run(None, "solutions", exercises=["6.2", "1.4"]).records
    assert {r.exercise for r in records} == {"6.2", "1.4"}, "the capstone did not run"
    assert {r.outcome for r in records} == {"passed"}


def test_every_dependency_is_a_graded_exercise_of_an_earlier_or_the_same_chapter():
    declared = dependencies.read()
    for exercise, parts in declared.builds_on.items():
        assert exercise in declared.titles, exercise
        for part in parts:
            assert part in declared.titles and part != exercise, (exercise, part)
            assert dependencies.order(part) < dependencies.order(exercise), (exercise, part)
    capstone = {declared.chapter_of(p) for p in declared.closure("6.6")}
    assert capstone == {1, 2, 3, 4, 5, 6}


@pytest.mark.slow  # the two capstones trained on the reference: a minute
def test_each_capstone_builds_on_what_it_calls(tmp_path):
    """What a capstone builds on (BUILDS_ON, followed through the chain) is what the
    reference's capstone run enters: every exercise of its chapter or an earlier one it
    calls is there (a broken one is named first when the capstone fails), and each one it
    names directly is called. A later chapter's part is one the package tries and does
    without (6.6's decoding tries chapter 8's cached attention step)."""
    for path in stubs.SOLUTIONS_DIR.glob("ch*.py"):
        shutil.copy(path, tmp_path / path.name)
    declared = dependencies.read()
    run = grade_run(None, str(tmp_path), exercises=sorted(declared.integration))
    for capstone in sorted(declared.integration):
        names = [n for r in run.records if r.exercise == capstone for n in r.calls]
        entered = {e for e in declared.called(names)
                   if declared.chapter_of(e) <= declared.chapter_of(capstone)} - {capstone}
        assert entered == set(declared.closure(capstone)), (
            f"{capstone} calls {sorted(entered - set(declared.closure(capstone)))} beyond "
            f"BUILDS_ON and not {sorted(set(declared.closure(capstone)) - entered)}")
        assert set(declared.builds_on[capstone]) <= entered, capstone


@pytest.mark.slow  # two chapters graded
def test_a_broken_chapter_3_costs_chapter_5_nothing_and_says_so(tmp_path):
    """A chapter 3 without out_proj: 3.3 fails; 5.4 and 5.5, graded with the grader's
    attention in place of the learner's, earn their points, and say that a model of the
    learner's own parts will not work until 3.3 is fixed."""
    for path in stubs.SOLUTIONS_DIR.glob("ch0*.py"):
        shutil.copy(path, tmp_path)
    target = tmp_path / "ch03_multi_head.py"
    target.write_text(target.read_text().replace("out_proj", "output_proj"))
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--chapter", "3",
                           "--chapter", "5", "--parts", str(tmp_path), "--json",
                           str(tmp_path / "r.json")], capture_output=True, text=True,
                          cwd=grade.ROOT)
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in json.loads((tmp_path / "r.json").read_text())["exercises"]}
    assert rows["3.3"]["status"] != "passed"
    for exercise in ("5.1", "5.2", "5.3", "5.4", "5.5"):
        assert rows[exercise]["status"] == "passed", rows[exercise]
        assert rows[exercise]["points"] == rows[exercise]["max_points"]
    for exercise in ("5.4", "5.5"):
        note = (f"Graded with the grader's MultiHeadAttention (3.3) in place of yours, which "
                f"does not pass yet: {exercise} earns its points alone")
        assert rows[exercise]["message"].startswith(note), rows[exercise]["message"]
        assert not rows[exercise]["mistake"]


@pytest.mark.slow  # the named variants graded, once a seed
@pytest.mark.parametrize("seed", SEEDS)
def test_each_named_mistake_gets_its_message(seed):
    """The table of mistakes the tests tell apart: a wrong variant with ``mistake=`` fails, and
    its exercise's row (as every report shows it) names that id and carries its message."""
    named = [v for chapter in CHAPTERS for v in variants.for_chapter(chapter)
             if v.mistake or v.says]
    assert named and not any(v.correct for v in named)
    unknown = sorted({v.mistake for v in named if v.mistake} - set(MISTAKES))
    assert not unknown, f"ids the table does not hold: {unknown}"
    assert all(v.mistake.startswith(f"{v.exercise}/") for v in named if v.mistake)
    run = grade_run(None, ",".join(f"variant:{v.name}" for v in named),
                    exercises=sorted({v.exercise for v in named}), seed=seed)
    problems = []
    for variant in named:
        rows = [r for r in run.rows(Source.of_variant(variant.name)) if r.id == variant.exercise]
        row = rows[0] if rows else None
        if variant.says:  # a refused road: its message names what was refused
            if row is None or row.status == "passed" or variant.says not in row.message:
                problems.append(f"{variant.name} ({variant.why}) should say {variant.says!r}; "
                                f"it says: {row.message if row else '(no test ran)'}")
            continue
        if row is None or row.status == "passed" or row.mistake != variant.mistake:
            problems.append(f"{variant.name} ({variant.why}) should be named "
                            f"{variant.mistake!r}; it is {row.mistake if row else None!r}: "
                            f"{row.message if row else '(no test ran)'}")
    assert not problems, "\n".join(problems)


def test_every_mistake_id_is_one_the_reports_read_back():
    """An id the grader's tag pattern would not read back (say, with capitals) is lost."""
    unreadable = [m for m in MISTAKES
                  if messages.unseal(f"... {messages.mistake_tag(m)}") != ("...", m)]
    assert not unreadable, unreadable


def test_only_the_grader_s_sealed_tag_names_a_mistake():
    """Text that imitates a tag (the learner's exception message, say) names nothing, is
    marked as not the grader's, and a sealed tag beside it still counts."""
    forged = "ValueError: bad\r\n## Injected [mistake 2.1/no-maximum-subtracted]"
    assert messages.unseal(forged) == (
        "ValueError: bad\r\n## Injected [not the grader's: mistake 2.1/no-maximum-subtracted]",
        "")
    other_seal = "x [mistake 2.1/no-maximum-subtracted " + "0" * 32 + "]"
    assert messages.unseal(other_seal)[1] == ""
    text, named = messages.unseal(f"{forged} {messages.mistake_tag('4.1/inverted')}")
    assert named == "4.1/inverted" and "not the grader's" in text


def test_learner_text_is_data_in_markdown():
    """A message with a line break, a heading, a table row, HTML and backticks stays one
    code span on one line: nothing of it is rendered."""
    code = messages.markdown_code("a\r\n# head | x |<b>`y`", table=True)
    assert "\n" not in code and "\r" not in code and code.startswith("``")
    assert "\\|" in code and code.count("``") == 2


def test_every_named_mistake_has_a_variant_that_makes_it():
    """No message in the table goes untested: each id is some wrong variant's."""
    made = {v.mistake for chapter in CHAPTERS for v in variants.for_chapter(chapter)}
    assert set(MISTAKES) <= made, sorted(set(MISTAKES) - made)


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_every_report_format_carries_the_named_mistake(tmp_path):
    """A padding mask that is True at the padding, graded from the command line: the table,
    the JSON, the Markdown and the JUnit report all name ``4.1/inverted``."""
    for path in stubs.SOLUTIONS_DIR.glob("ch0*.py"):
        shutil.copy(path, tmp_path)
    target = tmp_path / "ch04_masking.py"
    target.write_text(target.read_text().replace("return (tokens != pad_id)[:, None, None, :]",
                                                  "return (tokens == pad_id)[:, None, None, :]"))
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--exercise",
                           "4.1", "--parts", str(tmp_path), "--json", str(tmp_path / "r.json"),
                           "--markdown", str(tmp_path / "r.md"), "--junit",
                           str(tmp_path / "r.xml")], capture_output=True, text=True,
                          cwd=grade.ROOT)
    assert done.returncode == 0, done.stderr
    assert "[mistake 4.1/inverted]" in done.stdout
    [row] = json.loads((tmp_path / "r.json").read_text())["exercises"]
    assert (row["status"], row["mistake"]) == ("failed", "4.1/inverted")
    assert "compare tokens != pad_id" in row["message"]
    assert "| `4.1/inverted` |" in (tmp_path / "r.md").read_text()
    assert '<property name="mistake" value="4.1/inverted"' in (tmp_path / "r.xml").read_text()


# ---------------------------------------------------------------- the capstone's result, reused


def test_the_capstone_result_is_reused_while_its_files_are_unchanged(tmp_path, monkeypatch):
    for path in stubs.SOLUTIONS_DIR.glob("ch0*.py"):
        shutil.copy(path, tmp_path)
    test_file = chapter_test_files([6])[6]
    graded = (Source.parse(str(tmp_path)),)
    key = cache.key(graded, {1, 2, 3, 4, 5, 6}, test_file)
    record = TestRecord("t", "6.6", 6, "Capstone", 5, "passed", parts=str(tmp_path))
    folder = tmp_path / "cache"
    assert not cache.store(folder, "6.6", key, [replace(record, outcome="error")]), "errors: never"
    assert not cache.store(folder, "6.6", key, [replace(record, outcome="timeout")])
    runs = []

    def run(spec):  # the capstone's run, without its training
        runs.append(list(spec.exercises))
        return [record]

    monkeypatch.setattr(engine, "_run", run)
    spec = RunSpec.new(str(tmp_path), seed=0, exercises=["6.6"])
    rows = engine.grade(spec, cache_dir=folder).rows()
    assert runs == [["6.6"]] and rows[0].message == ""
    run_again = engine.grade(spec, cache_dir=folder)
    records, rows = run_again.records, run_again.rows()
    assert runs == [["6.6"]], "the second time nothing runs"
    assert [r.status for r in rows] == ["passed"] and len(records) == 1
    assert rows[0].message.startswith("(result reused: files unchanged since ")
    assert "(result reused" in Report(rows, str(tmp_path)).table()
    engine.grade(spec, cache_dir=None)
    assert len(runs) == 2, "without a cache it runs"
    # Any file it builds from changes the key; chapter 7 does not.
    (tmp_path / "ch07_decoding.py").write_text("# changed\n")
    assert cache.key(graded, {1, 2, 3, 4, 5, 6}, test_file) == key
    (tmp_path / "ch03_multi_head.py").write_text("# changed\n")
    assert cache.key(graded, {1, 2, 3, 4, 5, 6}, test_file) != key
    # Never inside the course, where a forged result could be committed.
    monkeypatch.setenv("XDG_CACHE_HOME", str(grade.ROOT / ".cache"))
    assert cache.default_dir() is None


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_half_typed_line_costs_its_chapter_and_what_uses_it_only(tmp_path):
    """A chapter 2 file that does not parse: chapter 2's exercises are errors naming the
    file and line; everything else is graded as usual, 3.3 too (graded with the grader's
    attention in place of the learner's)."""
    for path in stubs.SOLUTIONS_DIR.glob("ch0[1-4]_*.py"):
        shutil.copy(path, tmp_path)
    target = tmp_path / "ch02_attention.py"
    target.write_text(target.read_text().replace(
        "    total = exps.sum(dim=dim, keepdim=True)\n",
        "    total = exps.sum(dim=dim, keepdim=True\n", 1))
    rows = {r.id: r for r in grade_run([1, 2, 3, 4], str(tmp_path)).rows()}
    for exercise in ("2.1", "2.2", "2.3"):
        assert rows[exercise].status == "error", (exercise, rows[exercise].status)
        assert re.search(r"ch02_attention\.py,? line \d+", rows[exercise].message), (
            rows[exercise].message)
    for exercise in ("1.1", "1.2", "1.3", "1.4", "3.1", "3.2", "3.3", "4.1", "4.2", "4.3"):
        assert rows[exercise].status == "passed", (exercise, rows[exercise].message)


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_constant_error_earns_no_points(tmp_path):
    """Every stub raising one ValueError whose text holds every word the tests of a clear
    error look for: those tests pass, but they pay only with the behaviour, so 0 points."""
    stubs.write_stubs(tmp_path)
    words = "d_model 7 0 -4 10 4 13 12 d_k query key value Lk mask beam_size"
    for path in tmp_path.glob("ch*.py"):
        text = re.sub(r"raise NotImplementedError\(\"Exercise [^\"]*\"\)",
                      f"raise ValueError({words!r})", path.read_text())
        path.write_text(text)
    graded = ["1.1", "1.2", "2.2", "3.1", "3.3", "7.1"]
    run = grade_run(None, str(tmp_path), exercises=graded)
    records = run.records
    assert {r.exercise for r in records if r.errors} == set(graded)
    assert any(r.outcome == "passed" for r in records if r.errors)
    rows = run.rows()
    assert {r.id for r in rows} == set(graded)
    for row in rows:
        assert row.points == 0, f"{row.id}: {row.points} points for a constant ValueError"
    assert any("count once the tests on good input pass" in r.message for r in rows)


# ---------------------------------------------------------------- the grader's own faults


def test_a_worker_that_cannot_start_is_one_line_naming_the_cause_and_credits_nothing(tmp_path):
    """A copy of the course whose worker cannot import (a broken installation): grading
    exits with one line that names the cause and says it is not the learner's fault, and
    writes no report."""
    course = tmp_path / "course"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("annotated_transformer", "exercises", "tests/graded"):
        shutil.copytree(grade.ROOT / folder, course / folder, ignore=skip)
    shutil.copy(grade.ROOT / "pyproject.toml", course)
    worker = course / "annotated_transformer" / "course" / "grading" / "worker" / "process.py"
    head = "from __future__ import annotations\n"
    started = course / "exercises" / "ch01_positional_encoding.py"  # not the untouched stub,
    started.write_text(started.read_text() + "# started\n")  # which needs no worker
    worker.write_text(worker.read_text().replace(
        head, head + "raise ImportError('No module named torch (a broken installation)')\n", 1))
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--chapter",
                           "1", "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, cwd=course, timeout=600)
    assert done.returncode != 0 and done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == ("grade: the grader could not start its worker (ImportError: No module "
                        "named torch (a broken installation)); this is no fault of the code "
                        "under test"), lines[0]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_learner_cannot_name_a_mistake_or_write_markup(tmp_path):
    """A padding mask that raises with a made-up mistake tag, a carriage return, a heading
    and a table row, graded from the command line: no report names a mistake, and the
    Markdown shows the text as one code span (no heading, no row of its own)."""
    for path in stubs.SOLUTIONS_DIR.glob("ch0*.py"):
        shutil.copy(path, tmp_path)
    target = tmp_path / "ch04_masking.py"
    forged = r"wrong [mistake 4.1/inverted]\r\n# Injected heading\n| 4.2 | forged | 9/9 |"
    target.write_text(target.read_text().replace(
        "return (tokens != pad_id)[:, None, None, :]", f'raise ValueError("{forged}")'))
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--exercise",
                           "4.1", "--parts", str(tmp_path), "--json", str(tmp_path / "r.json"),
                           "--markdown", str(tmp_path / "r.md"), "--junit",
                           str(tmp_path / "r.xml")], capture_output=True, text=True,
                          cwd=grade.ROOT)
    assert done.returncode == 0, done.stderr
    [row] = json.loads((tmp_path / "r.json").read_text())["exercises"]
    assert row["status"] != "passed" and row["mistake"] == "", row
    assert "[mistake 4.1/inverted]" not in done.stdout
    assert 'name="mistake"' not in (tmp_path / "r.xml").read_text()
    markdown = (tmp_path / "r.md").read_text()
    assert "`ValueError: wrong [not the grader's: mistake 4.1/inverted]`" in markdown
    assert not any(line.startswith(("#", "| 4.2")) for line in markdown.splitlines()[1:])
