"""The GitHub Actions workflows are valid: they cannot run here, so their structure is checked."""

from __future__ import annotations

import copy
import posixpath
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

from annotated_transformer.grading import classroom, grade

WORKFLOWS_DIR = Path(__file__).resolve().parent.parent / ".github/workflows"
WORKFLOWS = sorted(WORKFLOWS_DIR.glob("*.yml"))
GRADE = "python -m annotated_transformer.grade"
COURSE_REPO = "transformer-course/annotated-transformer"


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS_DIR / name).read_text())


def triggers(workflow: dict):
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True


@cache
def points() -> tuple[grade.ExerciseResult, ...]:
    return tuple(grade.exercise_points())


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_structure(path):
    workflow = yaml.safe_load(path.read_text())
    assert triggers(workflow), f"{path.name}: no trigger"
    assert workflow.get("jobs"), f"{path.name}: no jobs"
    for name, job in workflow["jobs"].items():
        assert "runs-on" in job, f"{path.name}: job {name} has no runs-on"
        assert job.get("steps"), f"{path.name}: job {name} has no steps"
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), (
                f"{path.name}: a step of {name} needs exactly one of uses/run: {step}")
            if "uses" in step:
                assert "@" in step["uses"], f"{path.name}: pin the version of {step['uses']}"
        for need in job.get("needs", []) if isinstance(job.get("needs"), list) else [
                job["needs"]] if "needs" in job else []:
            assert need in workflow["jobs"], f"{path.name}: {name} needs unknown job {need}"


def test_pages_workflow_publishes_the_built_book():
    workflow = load("book.yml")
    steps = workflow["jobs"]["build"]["steps"]
    assert any(s.get("run") == "bash scripts/book.sh" for s in steps)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages"))
    assert upload["with"]["path"] == "_build/html"
    assert workflow["permissions"]["pages"] == "write"


# ---------------------------------------------------------------- shared by both grading workflows


def grade_commands(step: dict) -> list[tuple[str, list[str]]]:
    """``(working directory, grader arguments)`` of every grader command in a step."""
    text = step.get("run") or step.get("with", {}).get("command") or ""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        workdir = step.get("working-directory", ".")
        for command in re.split(r"&&|;|\|\|", line):
            words = shlex.split(command)
            if len(words) == 2 and words[0] == "cd":
                workdir = posixpath.normpath(posixpath.join(workdir, words[1]))
            elif command.strip().startswith(GRADE):
                found.append((workdir, words[3:]))
    return found


def parse_grade_args(arguments: list[str]):
    """The grader's own parser reads the arguments (a usage error exits 2)."""
    try:
        return grade.build_parser().parse_args(arguments)
    except SystemExit as exit_:
        raise AssertionError(f"the grader rejects {arguments}") from exit_


def check_course_checkout(workflow: dict, job: dict) -> list[str]:
    """The course's tests and grader come from COURSE_REPO at COURSE_REF, into .course."""
    problems = []
    env = workflow.get("env", {})
    if env.get("PIP_EXTRA_INDEX_URL") != "https://download.pytorch.org/whl/cpu":
        problems.append("PIP_EXTRA_INDEX_URL is not the CPU index of PyTorch")
    if COURSE_REPO not in env.get("COURSE_REPO", "") or "COURSE_REF" not in env:
        problems.append("COURSE_REPO / COURSE_REF are not set")
    steps = job["steps"]
    checkouts = [s for s in steps if s.get("uses") == "actions/checkout@v4"]
    course = [s for s in checkouts if "repository" in s.get("with", {})]
    if len(checkouts) != 2 or len(course) != 1:
        problems.append("expected a checkout of the submission and one of the course")
    else:
        wanted = {"repository": "${{ env.COURSE_REPO }}", "ref": "${{ env.COURSE_REF }}",
                  "path": ".course"}
        if {k: course[0]["with"].get(k) for k in wanted} != wanted:
            problems.append(f"the course checkout is not {wanted}: {course[0]['with']}")
    python = [s for s in steps if s.get("uses") == "actions/setup-python@v5"]
    if not python or python[0]["with"].get("python-version") != "3.11" \
            or python[0]["with"].get("cache") != "pip":
        problems.append("setup-python@v5 with Python 3.11 and the pip cache is missing")
    install = [s for s in steps if s.get("run") == "pip install -r requirements.txt -e ."]
    if len(install) != 1 or install[0].get("working-directory") != ".course":
        problems.append("the course is not installed from .course")
    elif python and steps.index(install[0]) < steps.index(python[0]):
        problems.append("the course is installed before Python is set up")
    grading = [(workdir, args) for s in steps for workdir, args in grade_commands(s)
               if not parse_grade_args(args).from_report]
    if len(grading) != 1:
        problems.append(f"expected one grading run, found {len(grading)}")
    else:
        workdir, args = grading[0]
        parsed = parse_grade_args(args)
        if workdir != ".course" or parsed.impl != "../exercises":
            problems.append("the grading run does not grade ../exercises from .course")
        if not parsed.json:
            problems.append("the grading run writes no JSON report")
        if str(parsed.verify_manifest) != "tests/grading_manifest.json" \
                or str(parsed.submission_root) != "..":
            problems.append("the grading run does not check the submission against the "
                            "course's manifest")
    return problems


def report_path(workdir: str, path) -> str:
    return posixpath.normpath(posixpath.join(workdir, str(path)))


# ---------------------------------------------------------------- grade.yml (forks, copies)


def check_grade_workflow(workflow: dict) -> list[str]:
    problems = []
    on = triggers(workflow) or {}
    for event in ("push", "pull_request", "workflow_dispatch"):
        if event not in on:
            problems.append(f"grade.yml does not run on {event}")
    job = workflow["jobs"].get("grade")
    if job is None:
        return problems + ["grade.yml has no job 'grade'"]
    if COURSE_REPO not in job.get("if", ""):
        problems.append("grade.yml also runs in the course's own repository")
    problems += check_course_checkout(workflow, job)
    steps = job["steps"]
    commands = [(w, parse_grade_args(a)) for s in steps for w, a in grade_commands(s)]
    runs = [(w, a) for w, a in commands if not a.from_report]
    if runs:
        workdir, args = runs[0]
        written = {kind: report_path(workdir, getattr(args, kind))
                   for kind in ("json", "junit", "markdown") if getattr(args, kind)}
        if set(written) != {"json", "junit", "markdown"}:
            problems.append(f"the grading run writes only {sorted(written)}")
        summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
        if not summary or written.get("markdown", "?") not in summary[0]["run"] \
                or summary[0].get("if") != "always()":
            problems.append("the Markdown table does not reach the job summary")
        upload = [s for s in steps if s.get("uses") == "actions/upload-artifact@v4"]
        paths = upload[0]["with"]["path"].split() if upload else []
        if not upload or not {written.get("json"), written.get("junit")} <= set(paths):
            problems.append("the JSON and JUnit reports are not uploaded as an artifact")
        scores = [a for _, a in commands if a.from_report and a.score]
        if not scores or report_path(".course", scores[0].from_report) != written.get("json"):
            problems.append("no step shows the score from the JSON report")
    return problems


def test_grade_workflow():
    assert check_grade_workflow(load("grade.yml")) == []


def test_grade_workflow_check_catches_mistakes():
    good = load("grade.yml")
    steps = good["jobs"]["grade"]["steps"]
    broken = copy.deepcopy(good)
    del broken["on" if "on" in broken else True]["pull_request"]
    assert any("pull_request" in p for p in check_grade_workflow(broken))
    broken = copy.deepcopy(good)
    broken["jobs"]["grade"]["steps"] = [s for s in steps if "upload-artifact" not in
                                        s.get("uses", "")]
    assert any("artifact" in p for p in check_grade_workflow(broken))
    broken = copy.deepcopy(good)
    for step in broken["jobs"]["grade"]["steps"]:
        if step.get("with", {}).get("repository"):
            step["with"]["ref"] = "main"
    assert any("course checkout" in p for p in check_grade_workflow(broken))
    broken = copy.deepcopy(good)
    for step in broken["jobs"]["grade"]["steps"]:
        if "--junit" in step.get("run", ""):
            step["run"] = step["run"].replace("--junit", "--junit-xml")
    with pytest.raises(AssertionError, match="rejects"):
        check_grade_workflow(broken)
    broken = copy.deepcopy(good)
    for step in broken["jobs"]["grade"]["steps"]:
        if "--verify-manifest" in step.get("run", ""):
            step["run"] = step["run"].replace("--verify-manifest", "--json")
    assert any("manifest" in p for p in check_grade_workflow(broken))


# ---------------------------------------------------------------- classroom.yml (GitHub Classroom)


def check_classroom_workflow(workflow: dict, rows) -> list[str]:
    problems = []
    if workflow.get("name") != "Autograding Tests":  # the reporter updates the check of that name
        problems.append("the workflow is not named 'Autograding Tests'")
    if workflow.get("permissions", {}).get("checks") != "write":
        problems.append("the reporter needs permissions: checks: write")
    job = workflow["jobs"].get("run-autograding-tests")
    if job is None:
        return problems + ["no job run-autograding-tests"]
    if "github-classroom[bot]" not in job.get("if", "") or COURSE_REPO not in job.get("if", ""):
        problems.append("the job also runs for Classroom's bot or in the course itself")
    problems += check_course_checkout(workflow, job)
    steps = job["steps"]
    grading = [(w, parse_grade_args(a)) for s in steps for w, a in grade_commands(s)]
    written = next((report_path(w, a.json) for w, a in grading if not a.from_report and a.json),
                   None)
    graders = [s for s in steps if s.get("uses", "").startswith(
        "classroom-resources/autograding-command-grader")]
    by_exercise = {}
    for step in graders:
        if step["uses"] != "classroom-resources/autograding-command-grader@v1":
            problems.append(f"{step['uses']}: use the command grader's v1")
        inputs = step.get("with", {})
        if set(inputs) != {"test-name", "setup-command", "command", "timeout", "max-score"}:
            problems.append(f"step {step.get('id')}: inputs {sorted(inputs)}")
            continue
        commands = grade_commands(step)
        if len(commands) != 1:
            problems.append(f"step {step.get('id')}: not one grader command")
            continue
        workdir, args = commands[0]
        parsed = parse_grade_args(args)
        if not parsed.from_report or len(parsed.exercise or []) != 1 \
                or parsed.fail_under != 100:
            problems.append(f"step {step.get('id')}: not --from-report, one --exercise, "
                            f"--fail-under 100")
            continue
        if report_path(workdir, parsed.from_report) != written:
            problems.append(f"step {step.get('id')} reads {parsed.from_report}, not the report "
                            "that the grading run writes")
        exercise = parsed.exercise[0]
        if exercise in by_exercise:
            problems.append(f"two steps for exercise {exercise}")
        by_exercise[exercise] = step
        if not isinstance(inputs["max-score"], int) or not 0 < inputs["timeout"] <= 10:
            problems.append(f"step {step.get('id')}: max-score and timeout are minutes/points")
    offered = {r.id: r for r in rows}
    for exercise in sorted(set(offered) - set(by_exercise)):
        problems.append(f"exercise {exercise} has no step")
    for exercise in sorted(set(by_exercise) - set(offered)):
        problems.append(f"step for exercise {exercise}, which the grader does not know")
    for exercise in sorted(set(offered) & set(by_exercise)):
        score = by_exercise[exercise]["with"]["max-score"]
        if score != offered[exercise].max_points:
            problems.append(f"exercise {exercise}: max-score {score}, the tests give "
                            f"{offered[exercise].max_points}")
    chapters = {r.chapter for r in rows}
    if chapters - {offered[e].chapter for e in by_exercise if e in offered}:
        problems.append("a chapter has no step")
    total = sum(s["with"].get("max-score") or 0 for s in graders)
    possible = sum(r.max_points for r in rows)
    if total != possible:
        problems.append(f"the steps give {total} points, the course {possible}")
    reporter = steps[-1]
    if reporter.get("uses") != "classroom-resources/autograding-grading-reporter@v1":
        problems.append("the last step is not the grading reporter v1")
    else:
        ids = [s.get("id") for s in graders]
        if reporter.get("with", {}).get("runners", "").split(",") != ids:
            problems.append("the reporter's runners are not the grader steps' ids")
        wanted = {f"{i.upper()}_RESULTS": f"${{{{steps.{i}.outputs.result}}}}" for i in ids}
        if reporter.get("env") != wanted:
            problems.append("the reporter's env does not carry each step's result "
                            "as <ID>_RESULTS")
    return problems


def test_classroom_workflow_gives_every_exercise_its_points():
    assert check_classroom_workflow(load("classroom.yml"), points()) == []


def test_classroom_workflow_is_generated_from_the_current_points():
    text = (WORKFLOWS_DIR / "classroom.yml").read_text()
    assert text == classroom.render(list(points())), (
        "classroom.yml is stale: run python -m annotated_transformer.classroom")


def test_classroom_check_catches_mistakes():
    good = load("classroom.yml")
    rows = list(points())

    def steps(workflow):
        return workflow["jobs"]["run-autograding-tests"]["steps"]

    broken = copy.deepcopy(good)
    next(s for s in steps(broken) if s.get("id") == "exercise-2-1")["with"]["max-score"] += 1
    problems = check_classroom_workflow(broken, rows)
    assert any("exercise 2.1: max-score" in p for p in problems)
    assert any("the steps give" in p for p in problems)
    broken = copy.deepcopy(good)
    steps(broken)[:] = [s for s in steps(broken) if not s.get("id", "").startswith("exercise-4")]
    problems = check_classroom_workflow(broken, rows)
    assert "a chapter has no step" in problems and "exercise 4.1 has no step" in problems
    broken = copy.deepcopy(good)
    steps(broken)[-1]["env"].popitem()
    assert any("<ID>_RESULTS" in p for p in check_classroom_workflow(broken, rows))
    broken = copy.deepcopy(good)
    step = next(s for s in steps(broken) if s.get("id") == "exercise-1-1")
    step["with"]["command"] = step["with"]["command"].replace("../grade.json", "grade.json")
    assert any("not the report" in p for p in check_classroom_workflow(broken, rows))
    # One more exercise than the file has: a new chapter's tests need a regenerated file.
    extra = [*rows, grade.ExerciseResult("9.1", 9, "new", 0, 3, "collected", "")]
    assert "exercise 9.1 has no step" in check_classroom_workflow(good, extra)
