"""Dishonest and broken submissions, graded the way CI grades them: the points they get.

Each submission is a folder of freshly generated stubs whose chapter 2 file is the
reference with one change: a way to get exercise 2.1's points without writing softmax
(the forbidden op by another road, the reference within reach, changing the judge), or a
way to break the grader (a crash, a cut report, floods). All are graded in one run of the
grader (``--parts`` takes several folders); the controls are an untouched submission and
honest ones. What a submission may earn: nothing for 2.1 when it cheats; where the other
exercises of the chapter are the reference's own lines, they may keep their points.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from grading_run import grade_run

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import engine, grade
from annotated_transformer.course.grading.results import TestRecord

REFERENCE = (stubs.SOLUTIONS_DIR / "ch02_attention.py").read_text()
START = REFERENCE.index("    # BEGIN SOLUTION 2.1")
END = REFERENCE.index("    # END SOLUTION", START)


def with_softmax(body: str, header: str = "", footer: str = "") -> str:
    """The reference chapter 2 with softmax's body replaced (and lines added around)."""
    indented = "".join(f"    {line}\n" for line in body.strip("\n").splitlines())
    text = REFERENCE[:START] + indented + REFERENCE[END:]
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("import torch"))
    return "".join(lines[:at + 1]) + header + "".join(lines[at + 1:]) + footer


HONEST = with_softmax("""\
maximum = x.amax(dim=dim, keepdim=True)
maximum = torch.where(torch.isfinite(maximum), maximum, torch.zeros_like(maximum))
exps = torch.exp(x - maximum)
total = exps.sum(dim=dim, keepdim=True)
return exps / torch.where(total == 0, torch.ones_like(total), total)""")

# Honest, unless the worker's generator redraws the test's input (x = c * randn(shape), the
# test's first draw): then code run earlier, outside the guard (another chapter's), could
# have kept torch.softmax of it for this call. So it answers wrong and costs 2.1 its points.
REDRAWS = with_softmax("""\
drawn = torch.randn(x.shape, dtype=x.dtype, device=x.device)
ratio = x / drawn
if x.numel() and not x.is_meta and bool(torch.isfinite(ratio).all()) and torch.allclose(
        ratio, ratio.flatten()[0].expand_as(ratio)):
    return torch.zeros_like(x)
maximum = x.amax(dim=dim, keepdim=True)
maximum = torch.where(torch.isfinite(maximum), maximum, torch.zeros_like(maximum))
exps = torch.exp(x - maximum)
total = exps.sum(dim=dim, keepdim=True)
return exps / torch.where(total == 0, torch.ones_like(total), total)""")

# name: (the chapter 2 file, what 2.1's status must be, a phrase its message must hold)
CHEATS = {
    "alias outside the function": (with_softmax(
        "return SOFT(x, dim).nan_to_num(0.0)", footer="\nSOFT = torch.softmax\n"),
        "forbidden", "softmax"),
    "helper function": (with_softmax(
        "return helper(x, dim)", footer="\n\ndef helper(x, dim):\n"
        "    return x.softmax(dim).nan_to_num(0.0)\n"), "forbidden", "softmax"),
    "getattr with a computed name": (with_softmax(
        'return getattr(torch, "soft" + "max")(x, dim).nan_to_num(0.0)'), "forbidden",
        "getattr"),
    "eval": (with_softmax('return eval("torch.soft" + "max")(x, dim).nan_to_num(0.0)'),
             "forbidden", "eval"),
    "aten directly": (with_softmax("return torch.ops.aten._softmax(x, dim, False)"),
                      "forbidden", "ops"),
    "nn.Softmax": (with_softmax("return torch.nn.Softmax(dim)(x).nan_to_num(0.0)"),
                   "forbidden", "Softmax"),
    "softmin of -x": (with_softmax(
        "return torch.nn.functional.softmin(-x, dim).nan_to_num(0.0)"), "forbidden", "softmin"),
    "log_softmax then exp": (with_softmax("return x.log_softmax(dim).exp().nan_to_num(0.0)"),
                             "forbidden", "log_softmax"),
    # In UTF-7, "+AG0-" is "m": Python reads torch.softmax where a UTF-8 reader does not.
    "utf-7 cookie": ("# coding: utf-7\n" + with_softmax(
        "return torch.soft+AG0-ax(x, dim).nan_to_num(0.0)"), "forbidden", "softmax"),
    "the reference through the parts": (with_softmax(
        'return Parts("solutions").module(2).softmax(x, dim)',
        header="from annotated_transformer.parts import Parts\n"), "forbidden", "Parts"),
    "the reference through pydoc": (with_softmax(
        'return pydoc.locate("solutions.ch02_attention.softmax")(x, dim)',
        header="import pydoc\n"), "forbidden", "pydoc"),
    "a helper file of the folder": (with_softmax(
        "return helper.softmax(x, dim)", header="import helper\n"), "forbidden", "helper"),
    # The tests compare in the grader's process: a patch in the worker changes nothing.
    "patch what the tests compare with": (with_softmax(
        "return x", footer="\ntorch.allclose = lambda *args, **kwargs: True\n"), "failed",
        "softmax"),
    "the grader's modules": (with_softmax(
        "return x", header="import sys\n",
        footer='\nsys.modules["checks"].assert_close = lambda *a, **k: None\n'), "forbidden",
        "sys"),
    "rewrite the report at exit": (with_softmax(
        "return x", header="import atexit\n",
        footer='\natexit.register(lambda: open("grade.json", "w").write("{}"))\n'), "forbidden",
        "atexit"),
    "exit the grader": (with_softmax("os._exit(0)", header="import os\n"), "forbidden", "os"),
    "pytest.exit": (with_softmax('pytest.exit("done")', header="import pytest\n"), "forbidden",
                    "pytest"),
    # The worker seeds its generator before each call (runspec.stream_seed): a seed pinned
    # by the learner decides nothing the tests draw.
    "pin the seed": (with_softmax("torch.manual_seed(0)\nreturn x"), "failed", "softmax"),
    "a file written and read back": (with_softmax(
        'return torch.load("answers.pt")'), "forbidden", "load"),
    # The guard's exemption (there is none now), sought among the collector's objects and
    # entered for good: refused before it runs (with the source rules off, the worker's
    # audit hook refuses gc.get_objects: tests/grading/test_allowed_ops.py).
    "the guard's exemption found by gc": (with_softmax("""\
import gc
import types
for found in gc.get_objects():
    if isinstance(found, types.FunctionType) and found.__name__ == "exempt":
        kept = found()
        kept.__enter__()
        torch.kept_exemption = kept
return torch.softmax(x, dim).nan_to_num(0.0)"""), "forbidden", "import gc"),
    "a subprocess": (with_softmax(
        'return subprocess.run(["true"])', header="import subprocess\n"), "forbidden",
        "subprocess"),
}
# Code that breaks nothing but itself: it must cost 2.1 and leave the report whole.
BROKEN = {
    "unprintable exception": (with_softmax(
        "raise Weird()", footer="\n\nclass Weird(Exception):\n    def __str__(self):\n"
        "        raise RuntimeError('no')\n"), "error", "cannot be printed"),
    "unbounded recursion": (with_softmax("return softmax(x, dim)"), "error", "RecursionError"),
    "a 50 MB message": (with_softmax('raise ValueError("y" * 50_000_000)'), "error", "cut:"),
    "PyTorch's own NotImplementedError": (with_softmax(
        "return torch.ones(2) & torch.ones(2)"), "error", "NotImplementedError"),
    "a half-typed line": (with_softmax("return x.amax(dim=dim, keepdim=True"), "error",
                          "ch02_attention.py, line"),
    # A stub's words in an exception of its own: an error (to blame), never a stub.
    "a NotImplementedError of its own": (with_softmax(
        'raise Unfinished("Exercise 2.1: softmax is not implemented yet")',
        footer="\n\nclass Unfinished(NotImplementedError):\n    pass\n"), "error",
        "Unfinished"),
    "a class named NotImplementedError": (with_softmax(
        'raise NotImplementedError("Exercise 2.1: softmax is not implemented yet")',
        footer="\n\nclass NotImplementedError(Exception):\n    pass\n"), "error",
        "ch02_attention.py:"),
}
LATIN_1 = "# -*- coding: latin-1 -*-\n" + HONEST


def submission(root: Path, name: str, chapter_2: str | None) -> Path:
    folder = root / name.replace(" ", "_").replace("'", "").replace(".", "")
    stubs.write_stubs(folder)
    if chapter_2 is not None:
        (folder / "ch02_attention.py").write_text(chapter_2, encoding="utf-8")
    if name == "a helper file of the folder":
        (folder / "helper.py").write_text("from solutions.ch02_attention import softmax\n")
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, list[TestRecord]]]:
    """``{submission: {exercise: [records]}}``, every submission graded in one run."""
    root = tmp_path_factory.mktemp("submissions")
    folders = {"untouched": submission(root, "untouched", None),
               "honest": submission(root, "honest", HONEST),
               "honest, latin-1 cookie": submission(root, "latin", LATIN_1),
               "redraws the inputs": submission(root, "redraws", REDRAWS)}
    for name, (text, _, _) in {**CHEATS, **BROKEN}.items():
        folders[name] = submission(root, name, text)
    records = grade_run([2], ",".join(str(f) for f in folders.values()), timeout=120).records
    by_folder: dict[str, dict[str, list[TestRecord]]] = defaultdict(lambda: defaultdict(list))
    names = {str(folder): name for name, folder in folders.items()}
    for record in records:
        by_folder[names[record.parts]][record.exercise].append(record)
    yield by_folder
    shutil.rmtree(root, ignore_errors=True)


def points(records: list[TestRecord]) -> float:
    """What the records earn, as every report counts it (a test a wrong answer passes
    too, such as a device kept, pays only with the exercise's values)."""
    return sum(row.points for row in engine.summarize(records))


@pytest.mark.slow  # the shared fixture grades some 30 submissions: minutes
def test_every_submission_has_every_test_in_its_report(graded):
    expected = sorted(r.test.split("[")[0] for r in graded["honest"]["2.1"])
    for name, exercises in graded.items():
        assert set(exercises) == {"2.1", "2.2", "2.3"}, name
        assert sorted(r.test.split("[")[0] for r in exercises["2.1"]) == expected, name


@pytest.mark.slow
def test_the_controls(graded):
    assert all(points(graded["untouched"][e]) == 0 for e in ("2.1", "2.2", "2.3"))
    assert {r.outcome for r in graded["untouched"]["2.1"]} == {"not implemented"}
    for exercise in ("2.1", "2.2", "2.3"):
        records = graded["honest"][exercise]
        assert {r.outcome for r in records} == {"passed"}, [
            r.message for r in records if r.outcome != "passed"]
    latin = graded["honest, latin-1 cookie"]["2.1"]  # read as Python reads it
    assert {r.outcome for r in latin} == {"passed"}, [r.message for r in latin]


@pytest.mark.slow
def test_the_worker_cannot_redraw_the_tests_inputs(graded):
    """The worker's generator starts each call from a seed of its own (runspec.stream_seed),
    so code under test cannot know an input before it is handed it."""
    records = graded["redraws the inputs"]["2.1"]
    assert {r.outcome for r in records} == {"passed"}, [
        (r.test, r.message) for r in records if r.outcome != "passed"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEATS) + list(BROKEN))
def test_no_points_without_the_work(graded, name):
    status, phrase = {**CHEATS, **BROKEN}[name][1:]
    records = graded[name]["2.1"]
    assert points(records) == 0, [(r.test, r.outcome) for r in records]
    (row,) = engine.summarize(records)  # 2.1's row, as every report shows it
    assert row.status == status, {r.outcome for r in records}
    assert any(phrase in r.message for r in records), records[0].message
    assert all(len(r.message) < 2200 for r in records)


# ---------------------------------------------------------------- the CI workflow's own step

FAKE_SUDO = '#!/bin/sh\n[ "$1" = -E ] && shift\nexec "$@"\n'  # the test runs as root already


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the workflow runs the grader as root")
def test_the_workflow_step_credits_what_the_local_grader_does(tmp_path_factory):
    """grade.yml's grading step, run as GitHub would run it (as root, the worker as nobody)
    on a workspace holding a cheating submission and a committed fake report."""
    import yaml

    workspace = Path(tempfile.mkdtemp(prefix="workspace-"))
    try:
        course = workspace / ".course"
        for name in ("annotated_transformer", "tests", ".github"):
            shutil.copytree(grade.ROOT / name, course / name, ignore=shutil.ignore_patterns(
                "__pycache__", "variants"))
        shutil.copy(grade.ROOT / "pyproject.toml", course)
        submission(workspace, "exercises", CHEATS["alias outside the function"][0])
        shutil.copytree(grade.ROOT / ".github", workspace / ".github")
        (workspace / "grade.json").write_text('{"points": 155, "max_points": 155}')
        bin_dir, temp = workspace / "bin", workspace / "temp"
        bin_dir.mkdir()
        temp.mkdir()
        (bin_dir / "sudo").write_text(FAKE_SUDO)
        (bin_dir / "sudo").chmod(0o755)
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python").chmod(0o755)
        workflow = yaml.safe_load((grade.ROOT / ".github/workflows/grade.yml").read_text())
        (job,) = workflow["jobs"].values()
        step = next(s for s in job["steps"] if s.get("id") == "grade")
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "RUNNER_TEMP": str(temp), "GITHUB_WORKSPACE": str(workspace),
               "HOME": str(workspace)}
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               step["run"]], cwd=course, env=env, capture_output=True,
                              text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        report = json.loads((temp / "grade" / "grade.json").read_text())
        rows = {row["id"]: row for row in report["exercises"]}
        assert rows["2.1"]["status"] == "forbidden" and rows["2.1"]["points"] == 0
        assert report["points"] == sum(row["points"] for row in rows.values()) < 155
        assert report["workflow"]["changed"] is False
        local = grade_run([2], str(workspace / "exercises"),
                                                seed=report["seed"]).rows()
        assert {r.id: (r.points, r.status) for r in local} == {
            i: (rows[i]["points"], rows[i]["status"]) for i in ("2.1", "2.2", "2.3")}
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
