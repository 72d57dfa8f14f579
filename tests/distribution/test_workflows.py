"""The GitHub Actions workflows are valid: they cannot run here, so their structure is checked,
and the grading step's shell script is run with a stand-in for the grader. The reports they
read are checked here too: bounded messages, and the workflow file named in each."""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from annotated_transformer.course.distribution import classroom, release
from annotated_transformer.course.grading import engine, grade, manifest
from annotated_transformer.course.grading.protocol import MESSAGE_LIMIT, cut
from annotated_transformer.course.grading.report import (
    ExerciseResult,
    Integrity,
    Report,
    WorkflowCheck,
)
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.layout import WORKFLOWS_DIR

WORKFLOWS = sorted(WORKFLOWS_DIR.glob("*.yml"))
GRADE = ["python", "-m", "annotated_transformer", "grade"]
AS_ROOT = ["sudo", "-E", "env", "PATH=$PATH"]  # the grader as root, with the runner's Python
COURSE_REPO = "transformer-course/annotated-transformer"
REPORTS = "$RUNNER_TEMP/grade"  # outside the submission
PARTIAL = f"{REPORTS}/partial"  # where the grader writes, before the step moves them
DONE = f"{REPORTS}/ok"  # written last, only when the grader exited 0
SUCCEEDED = "steps.grade.outcome == 'success'"
FAILED = "steps.grade.outcome != 'success'"


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS_DIR / name).read_text())


def triggers(workflow: dict):
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True


@cache
def points() -> tuple[ExerciseResult, ...]:
    return tuple(engine.exercise_points())


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


class Command(NamedTuple):
    """A grader command of a step: where it runs, its arguments, and whether as root."""

    workdir: str
    args: list[str]
    as_root: bool


def canonical(text: str) -> str:
    """The runner's temporary folder named one way: ``${{ runner.temp }}`` as ``$RUNNER_TEMP``
    (the command grader's steps get no environment, so they use the expression)."""
    return re.sub(r"\$\{\{\s*runner\.temp\s*\}\}", "$RUNNER_TEMP", text)


def step_script(step: dict) -> str:
    """The shell text of a step: its ``run``, or a command grader's ``command``."""
    return canonical(step.get("run") or step.get("with", {}).get("command") or "")


def step_text(step: dict) -> str:
    """Everything a step names: its script and its inputs (an upload's paths)."""
    return canonical(" ".join([step.get("run") or "", *map(str, step.get("with", {}).values())]))


def grade_commands(step: dict) -> list[Command]:
    """Every grader command in a step."""
    found = []
    for line in step_script(step).replace("\\\n", " ").splitlines():
        workdir = step.get("working-directory", ".")
        for command in re.split(r"&&|;|\|\|", line):
            words = shlex.split(command)
            as_root = words[:len(AS_ROOT)] == AS_ROOT
            words = words[len(AS_ROOT):] if as_root else words
            if len(words) == 2 and words[0] == "cd":
                workdir = posixpath.normpath(posixpath.join(workdir, words[1]))
            elif words[:len(GRADE)] == GRADE:
                found.append(Command(workdir, words[len(GRADE):], as_root))
    return found


def parse_grade_args(arguments: list[str]):
    """The grader's own parser reads the arguments (a usage error exits 2)."""
    try:
        return grade.build_parser().parse_args(arguments)
    except SystemExit as exit_:
        raise AssertionError(f"the grader rejects {arguments}") from exit_


def report_path(workdir: str, path) -> str:
    """A report's path as the workflow names it: under ``$RUNNER_TEMP``, or from the
    workspace (the submission's checkout)."""
    path = canonical(str(path))
    if path.startswith("$RUNNER_TEMP"):
        return posixpath.normpath(path)
    return posixpath.normpath(posixpath.join(workdir, path))


def placed(path: str) -> str:
    """Where the grading step moves a report that the grader wrote under ``partial/``."""
    return path.replace(f"{PARTIAL}/", f"{REPORTS}/")


def grading_run(steps: list[dict]) -> tuple[dict, Command] | None:
    """The step that grades and its grader command, when there is exactly one."""
    runs = [(s, c) for s in steps for c in grade_commands(s)
            if not parse_grade_args(c.args).from_report]
    return runs[0] if len(runs) == 1 else None


def written_reports(steps: list[dict]) -> dict[str, str]:
    """``{"json" | "junit" | "markdown": path}``: where the grading step leaves its reports."""
    found = grading_run(steps)
    if found is None:
        return {}
    args = parse_grade_args(found[1].args)
    return {kind: placed(report_path(found[1].workdir, getattr(args, kind)))
            for kind in ("json", "junit", "markdown") if getattr(args, kind)}


def check_reference_removed(steps: list[dict]) -> list[str]:
    """The course's checkout loses what a release leaves out (the answers) and its history
    (whose objects hold them) before it is installed."""
    wanted = {f".course/{path.rstrip('/')}" for path in (*release.ANSWERS, ".git")}
    for index, step in enumerate(steps):
        words = shlex.split(step_script(step).replace("\\\n", " "))
        if words[:2] == ["rm", "-rf"] and {w.rstrip("/") for w in words[2:]} == wanted:
            course = next((i for i, s in enumerate(steps)
                           if s.get("with", {}).get("path") == ".course"), len(steps))
            install = next((i for i, s in enumerate(steps) if s.get("run", "").startswith(
                "pip install")), -1)
            if not course < index < install:
                return ["the reference is not removed between the course's checkout and its "
                        "installation"]
            return []
    return [f"no step removes the reference ({', '.join(sorted(wanted))}) from the course"]


def check_grading_step(steps: list[dict], workflow_name: str) -> list[str]:
    """One grading run, as root, of ../exercises from .course, writing its reports under
    $RUNNER_TEMP/grade/partial, which the step moves into place and marks ok last."""
    found = grading_run(steps)
    if found is None:
        return ["expected one grading run"]
    step, command = found
    args = parse_grade_args(command.args)
    problems = []
    if step.get("id") != "grade":
        problems.append("the grading step's id is not 'grade' (later steps check it)")
    if not command.as_root:
        problems.append(f"the grader does not run as root ({' '.join(AS_ROOT)})")
    if not args.no_cache:
        problems.append("the grading run may reuse a cached result: pass --no-cache")
    if command.workdir != ".course" or args.parts != "../exercises":
        problems.append("the grading run does not grade ../exercises from .course")
    if not args.json:
        problems.append("the grading run writes no JSON report")
    if str(args.verify_manifest) != "tests/graded/grading_manifest.json" \
            or str(args.submission_root) != "..":
        problems.append("the grading run does not check the submission against the "
                        "course's manifest")
    if args.sandbox != "bubblewrap":
        problems.append("the grading run does not insist on its sandbox (--sandbox bubblewrap)")
    installs = [i for i, s in enumerate(steps) if "apt-get install" in step_script(s)
                and "bubblewrap" in step_script(s)]
    if not installs or installs[0] > steps.index(step):
        problems.append("no step installs bubblewrap before the grading step")
    written = [report_path(command.workdir, getattr(args, kind))
               for kind in ("json", "junit", "markdown") if getattr(args, kind)]
    if any(posixpath.dirname(path) != PARTIAL for path in written):
        problems.append(f"the grader does not write its reports under {PARTIAL}: {written}")
    script = step_script(step).replace("\\\n", " ")
    moves = [shlex.split(line) for line in script.splitlines() if line.strip().startswith("mv")]
    if not any(set(m[1:-1]) == set(written) and m[-1].rstrip("/") == REPORTS for m in moves):
        problems.append(f"the grading step does not move {written} into {REPORTS}")
    if [line.strip() for line in script.splitlines() if line.strip()][-1:] != [
            f'touch "{DONE}"']:
        problems.append(f"the grading step does not end by writing {DONE}")
    if step.get("shell") != "bash":
        problems.append("the grading step does not run with bash -eo pipefail (shell: bash)")
    return problems


def check_reports_read(steps: list[dict]) -> list[str]:
    """No report in the workspace is read or written (a committed grade.* stays unread); a
    step after grading reads the reports only when the grading step succeeded; and one says
    so when it did not."""
    problems = []
    for step in steps:
        for name in re.findall(r"[^\s\"']*grade\.(?:json|xml|md)\b", step_text(step)):
            if not name.startswith(f"{REPORTS}/"):
                problems.append(f"step {step.get('name')!r} names {name}, not a report under "
                                f"{REPORTS}")
    found = grading_run(steps)
    later = steps[steps.index(found[0]) + 1:] if found else []
    for step in later:
        reads = REPORTS in step_text(step)
        guarded = SUCCEEDED in str(step.get("if", "")) or step_script(step).startswith(
            f'test -f "{DONE}" && ')
        if reads and not guarded:
            problems.append(f"step {step.get('name')!r} reads the reports without checking "
                            f"that the grading step succeeded ({SUCCEEDED} or {DONE})")
    if not any(FAILED in str(s.get("if", "")) for s in later):
        problems.append("no step says that there is no grade when the grader did not finish")
    return problems


def check_course_checkout(workflow: dict, job: dict, workflow_name: str) -> list[str]:
    """The course's tests and grader come from COURSE_REPO at COURSE_REF, into .course,
    without the reference; one grading run, whose reports are read only when it succeeded."""
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
                  "path": ".course", "persist-credentials": False}
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
    problems += check_reference_removed(steps)
    problems += check_grading_step(steps, workflow_name)
    problems += check_reports_read(steps)
    return problems


def grading_step(workflow: dict) -> dict:
    """The grading step of a workflow's only job."""
    (job,) = workflow["jobs"].values()
    found = grading_run(job["steps"])
    assert found is not None, "no grading run"
    return found[0]


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
    problems += check_course_checkout(workflow, job, "grade.yml")
    steps = job["steps"]
    written = written_reports(steps)
    if set(written) != {"json", "junit", "markdown"}:
        problems.append(f"the grading run writes only {sorted(written)}")
    summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")
               and SUCCEEDED in str(s.get("if", ""))]
    if not summary or written.get("markdown", "?") not in canonical(summary[0]["run"]):
        problems.append("the Markdown table does not reach the job summary")
    upload = [s for s in steps if s.get("uses") == "actions/upload-artifact@v4"]
    paths = canonical(upload[0]["with"]["path"]).split() if upload else []
    if not upload or set(paths) != set(written.values()):
        problems.append("the three reports are not uploaded as an artifact")
    commands = [(c.workdir, parse_grade_args(c.args)) for s in steps for c in grade_commands(s)]
    scores = [(w, a) for w, a in commands if a.from_report and a.score]
    if not scores or report_path(scores[0][0], scores[0][1].from_report) != written.get("json"):
        problems.append("no step shows the score from the JSON report")
    return problems


def test_grade_workflow():
    assert check_grade_workflow(load("grade.yml")) == []


def test_grade_workflow_check_catches_mistakes():
    good = load("grade.yml")

    def broken(change) -> list[str]:
        workflow = copy.deepcopy(good)
        for step in workflow["jobs"]["grade"]["steps"]:
            change(step)
        workflow["jobs"]["grade"]["steps"] = [s for s in workflow["jobs"]["grade"]["steps"]
                                              if s.get("name") != "drop"]
        return check_grade_workflow(workflow)

    def replace(old: str, new: str):
        def change(step):
            if old in step.get("run", ""):
                step["run"] = step["run"].replace(old, new)
        return change

    def drop(predicate):
        def change(step):
            if predicate(step):
                step["name"] = "drop"
        return change

    workflow = copy.deepcopy(good)
    del workflow["on" if "on" in workflow else True]["pull_request"]
    assert any("pull_request" in p for p in check_grade_workflow(workflow))
    assert any("artifact" in p for p in broken(drop(
        lambda s: "upload-artifact" in s.get("uses", ""))))
    assert any("removes the reference" in p for p in broken(drop(
        lambda s: s.get("run", "").startswith("rm -rf"))))
    assert any("removes the reference" in p for p in broken(replace(
        ".course/tests/variants/", "")))
    assert any("course checkout" in p for p in broken(
        lambda s: s.get("with", {}).get("repository") and s["with"].update(ref="main")))
    with pytest.raises(AssertionError, match="rejects"):
        broken(replace("--junit", "--junit-xml"))
    assert any("manifest" in p for p in broken(replace("--verify-manifest", "--json")))
    assert any("removes the reference" in p for p in broken(replace(".course/.git/ ", "")))
    assert any("sandbox" in p for p in broken(replace("--sandbox bubblewrap", "--sandbox auto")))
    assert any("installs bubblewrap" in p for p in broken(drop(
        lambda s: "bubblewrap" in s.get("run", "") and "apt-get" in s.get("run", ""))))
    assert any("course checkout" in p for p in broken(
        lambda s: s.get("with", {}).get("repository") and s["with"].pop("persist-credentials")))
    assert any("as root" in p for p in broken(replace('sudo -E env "PATH=$PATH" ', "")))
    assert any("--no-cache" in p for p in broken(replace(" --no-cache", "")))
    # Reports in the submission: a committed grade.json could be what later steps read.
    problems = broken(replace('"$RUNNER_TEMP/grade/partial/grade.json"', "../grade.json"))
    assert any("names ../grade.json" in p for p in problems)
    assert any("under $RUNNER_TEMP/grade/partial" in p for p in problems)
    assert any("does not end by writing" in p for p in broken(replace(
        'touch "$RUNNER_TEMP/grade/ok"', "")))
    assert any("does not move" in p for p in broken(replace("mv ", "cp ")))
    # A later step that reads the reports whatever became of the grading step.
    problems = broken(lambda s: s.get("if") == f"always() && {SUCCEEDED}" and s.update(
        {"if": "always()"}))
    assert any("without checking that the grading step succeeded" in p for p in problems)
    assert any("no grade when the grader did not finish" in p for p in broken(drop(
        lambda s: FAILED in str(s.get("if", "")))))


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
    problems += check_course_checkout(workflow, job, "classroom.yml")
    steps = job["steps"]
    found = grading_run(steps)
    if found is not None and not found[0].get("continue-on-error"):
        problems.append("the grading step stops the job when the grader fails: the reporter "
                        "would send nothing")
    written = written_reports(steps).get("json")
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
        parsed = parse_grade_args(commands[0].args)
        if not parsed.from_report or len(parsed.exercise or []) != 1 \
                or parsed.fail_under != 100:
            problems.append(f"step {step.get('id')}: not --from-report, one --exercise, "
                            f"--fail-under 100")
            continue
        if report_path(commands[0].workdir, parsed.from_report) != written:
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


def grading_arguments(workflow: dict) -> dict:
    """What a workflow's grading run is asked, but for where it writes its reports."""
    (job,) = workflow["jobs"].values()
    _, command = grading_run(job["steps"])
    asked = vars(parse_grade_args(command.args))
    return {"workdir": command.workdir, "as_root": command.as_root,
            **{k: v for k, v in asked.items() if k not in ("json", "junit", "markdown")}}


def test_both_workflows_grade_alike():
    """grade.yml and classroom.yml run the same grading command but for the reports it
    writes (grade.yml's JUnit file): a grade through one is the grade through the other, so
    the slow tests that grade a whole course through a workflow's own step run each learner
    through one of them (tests/grading/test_attack_catalogue.py)."""
    assert grading_arguments(load("grade.yml")) == grading_arguments(load("classroom.yml"))


def test_classroom_workflow_gives_every_exercise_its_points():
    assert check_classroom_workflow(load("classroom.yml"), points()) == []


def test_classroom_workflow_is_generated_from_the_current_points():
    text = (WORKFLOWS_DIR / "classroom.yml").read_text()
    assert text == classroom.render(list(points())), (
        "classroom.yml is stale: run python -m annotated_transformer classroom")


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
    step["with"]["command"] = step["with"]["command"].replace(
        "${{ runner.temp }}/grade/grade.json", "../grade.json")
    problems = check_classroom_workflow(broken, rows)
    assert any("not the report" in p for p in problems)
    assert any("names ../grade.json" in p for p in problems)
    # An exercise step that reads the report without the grading run's ok mark.
    broken = copy.deepcopy(good)
    step = next(s for s in steps(broken) if s.get("id") == "exercise-1-1")
    step["with"]["command"] = step["with"]["command"].split(" && ", 1)[1]
    assert any("exercise-1-1" not in p and "without checking" in p
               for p in check_classroom_workflow(broken, rows))
    broken = copy.deepcopy(good)
    grading_step(broken).pop("continue-on-error")
    assert any("reporter would send nothing" in p for p in check_classroom_workflow(broken, rows))
    # One more exercise than the file has: a new chapter's tests need a regenerated file.
    extra = [*rows, ExerciseResult("9.1", 9, "new", 0, 3, "collected", "")]
    assert "exercise 9.1 has no step" in check_classroom_workflow(good, extra)


# ---------------------------------------------------------------- the grading step, run here

# Stands in for `python` in the grading step: copies $FAKE_REPORT to every report path it is
# given (as a grader that crashed after writing might), then exits with $FAKE_EXIT.
FAKE_GRADER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in --json|--junit|--markdown) cp "$FAKE_REPORT" "$2"; shift;; esac
  shift
done
exit "${FAKE_EXIT:-0}"
"""
FAKE_SUDO = '#!/bin/sh\n[ "$1" = -E ] && shift\nexec "$@"\n'


def run_grading_step(tmp_path: Path, workflow_name: str, exit_code: int) -> tuple[int, Path]:
    """Run a workflow's grading step in a workspace that holds a committed grade.json, with
    a grader that exits ``exit_code``; its exit status and the workspace."""
    workspace, bin_dir, temp = tmp_path / "workspace", tmp_path / "bin", tmp_path / "temp"
    for folder in (workspace / ".course", bin_dir, temp):
        folder.mkdir(parents=True)
    rows = [ExerciseResult("1.1", 1, "first", 7, 7, "passed", ""),
            ExerciseResult("1.2", 1, "second", 0, 9, "failed", "expected 1, got 2")]
    (tmp_path / "report.json").write_text(json.dumps(Report(rows, "../exercises").to_json()))
    committed = [ExerciseResult(r.id, 1, r.title, r.max_points, r.max_points, "passed",
                                      "") for r in rows]
    (workspace / "grade.json").write_text(json.dumps(Report(committed, "exercises").to_json()))
    for name, text in (("python", FAKE_GRADER), ("sudo", FAKE_SUDO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "step.sh"
    script.write_text(grading_step(load(workflow_name))["run"])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "RUNNER_TEMP": str(temp), "FAKE_REPORT": str(tmp_path / "report.json"),
           "HOME": str(tmp_path), "GITHUB_WORKSPACE": str(workspace),
           "FAKE_EXIT": str(exit_code)}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                          cwd=workspace / ".course", env=env, capture_output=True, text=True)
    return done.returncode, workspace


def exercise_step(workspace: Path, temp: Path, exercise: str) -> int:
    """Run classroom.yml's step for ``exercise`` as the command grader would (a shell, the
    workspace, no environment but PATH and HOME); its exit status (0: the points)."""
    steps = load("classroom.yml")["jobs"]["run-autograding-tests"]["steps"]
    step = next(s for s in steps if s.get("id") == classroom.step_id(exercise))
    command = re.sub(r"\$\{\{\s*runner\.temp\s*\}\}", str(temp), step["with"]["command"])
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["sh", "-c", command], cwd=workspace, env=env,
                          capture_output=True).returncode


@pytest.mark.parametrize("workflow_name", ["grade.yml", "classroom.yml"])
def test_the_reports_are_placed_only_when_the_grader_finished(tmp_path, workflow_name):
    status, workspace = run_grading_step(tmp_path / "ok", workflow_name, 0)
    reports = tmp_path / "ok" / "temp" / "grade"
    assert status == 0 and (reports / "ok").is_file()
    assert {p.name for p in reports.glob("grade.*")} >= {"grade.json", "grade.md"}
    for code in (1, 3):  # 1 also: no --fail-under here, so an uncaught exception
        status, workspace = run_grading_step(tmp_path / str(code), workflow_name, code)
        reports = tmp_path / str(code) / "temp" / "grade"
        assert status != 0, "a grader that did not finish fails the grading step"
        assert not (reports / "ok").exists() and not list(reports.glob("grade.*"))


def test_a_classroom_step_gives_points_only_from_a_finished_grading(tmp_path):
    status, workspace = run_grading_step(tmp_path / "ok", "classroom.yml", 0)
    temp = tmp_path / "ok" / "temp"
    assert exercise_step(workspace, temp, "1.1") == 0, "passed: its points"
    assert exercise_step(workspace, temp, "1.2") != 0, "failed: no points"
    # A crashed grader: the committed grade.json (full marks) is never read.
    status, workspace = run_grading_step(tmp_path / "crash", "classroom.yml", 3)
    temp = tmp_path / "crash" / "temp"
    assert exercise_step(workspace, temp, "1.1") != 0
    # Even with the reports written by some other road, no ok mark means no points.
    (temp / "grade" / "grade.json").write_text((workspace / "grade.json").read_text())
    assert exercise_step(workspace, temp, "1.1") != 0


# ---------------------------------------------------------------- what the reports say


def test_a_huge_message_gives_small_reports():
    message = "x" * 50_000_000 + "\x00\x1b[2J"
    records = [TestRecord("test_a", "1.1", 1, "first", 7, "failed", message, parts="exercises")]
    rows = engine.Graded(RunSpec.new("exercises", seed=0), records).rows()
    assert len(rows[0].message) <= MESSAGE_LIMIT and "[... cut: " in rows[0].message
    junit = Report([], "exercises", seed=1, records=records).junit()
    data = json.dumps(Report(rows, "exercises", seed=1).to_json())
    table = Report(rows, "exercises", seed=1).table()
    markdown = Report(rows, "exercises", seed=1).markdown()
    for text in (junit, data, table, markdown):
        assert len(text) < 10_000 and "[... cut: " in text
    from xml.etree import ElementTree as ET

    failure = ET.fromstring(junit.split("?>", 1)[1]).find(".//failure")
    assert len(failure.get("message")) <= MESSAGE_LIMIT
    assert "\x1b" not in table and "\x1b" not in markdown
    hidden = [ExerciseResult("1.1", 1, "first", 0, 7, "failed", "<!-- hides the rest")]
    # a code span: shown as it is, never run as HTML
    assert "| `<!-- hides the rest` |" in Report(hidden, "exercises").markdown()
    many = Integrity("m.json", "..", {f"tests/t{n}/pytest.ini": "added" for n in
                                            range(10_000)}, used=False)
    assert len(Report(hidden, "exercises", many).score()) < 2 * MESSAGE_LIMIT
    assert len(Report(hidden, "exercises", many).table()) < 3 * MESSAGE_LIMIT
    assert cut("short") == "short"
    long = cut("y" * 5000)
    assert len(long) <= MESSAGE_LIMIT
    kept = long.index(" [... cut: ")
    assert long.endswith(f"[... cut: {5000 - kept} characters]")


def test_the_submission_s_workflows_are_named_in_every_report(tmp_path):
    """What a report says of the workflows comes from the submission's committed files (no
    path a workflow names): a changed, an added or a linked workflow is WORKFLOW CHANGED."""
    same = tmp_path / "same"
    shutil.copytree(WORKFLOWS_DIR, same / ".github" / "workflows")
    assert manifest.workflow_changes(same) == {}
    changed = tmp_path / "changed"
    shutil.copytree(WORKFLOWS_DIR, changed / ".github" / "workflows")
    (changed / ".github/workflows/grade.yml").write_text("name: grade\n# edited\n")
    (changed / ".github/workflows/mine.yml").write_text("name: mine\n")
    assert manifest.workflow_changes(changed) == {"grade.yml": "changed", "mine.yml": "added"}
    linked = tmp_path / "linked" / ".github" / "workflows"
    linked.mkdir(parents=True)
    (linked / "grade.yml").symlink_to(WORKFLOWS_DIR / "grade.yml")
    assert manifest.workflow_changes(tmp_path / "linked") == {"grade.yml": "changed"}, (
        "a link is not followed")
    check = WorkflowCheck(str(changed / ".github/workflows"), manifest.workflow_changes(changed))
    rows = [ExerciseResult("1.1", 1, "first", 7, 7, "passed", "")]
    for text in (Report(rows, "x", workflow=check).table(),
                 Report(rows, "x", workflow=check).markdown(),
                 Report(rows, "x", workflow=check).score(),
                 Report([], "x", workflow=check, records=[]).junit()):
        assert "WORKFLOW CHANGED" in text and "mine.yml" in text
    unchanged = WorkflowCheck(str(same), {})
    assert "WORKFLOW CHANGED" not in Report(rows, "x", workflow=unchanged).score()
    assert "advisory" in Report(rows, "x", workflow=unchanged).table()
    # The JSON report keeps it, so that the later steps (--from-report) say it too.
    path = tmp_path / "grade.json"
    path.write_text(json.dumps(Report(rows, "x", workflow=check).to_json()))
    data = json.loads(path.read_text())["workflow"]
    assert data["changed"] is True and data["changes"]["mine.yml"] == "added"
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade",
                           "--from-report", str(path), "--score"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and "WORKFLOW CHANGED" in done.stdout
    usage = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade",
                            "--from-report", str(path), "--workflow-file", "grade.yml"],
                           capture_output=True, text=True)
    assert usage.returncode == 2, "--workflow-file is gone: the grader reads the files itself"


def test_the_course_workflows_are_the_course_s():
    assert manifest.workflow_changes(WORKFLOWS_DIR.parent.parent) == {}


def test_a_file_name_the_learner_chose_cannot_move_hide_or_forge_a_line(tmp_path):
    """The submission names its own workflow files and test folders: shown in every report
    on one line, each control character as its escape, so that a name can neither redraw
    the terminal (hide WORKFLOW CHANGED), break the JUnit XML, nor start a line that
    GitHub reads as a command of its own (``::error``)."""
    from xml.etree import ElementTree

    from annotated_transformer.course.grading.messages import CONTROL

    check = WorkflowCheck(str(tmp_path), {
        "x\x1b[2K\r\x1b[1AWorkflows: holds the course's copies\x1b[8m.yml": "added",
        "y\x01\n::error title=Grade::100% forged.yml": "added"})
    integrity = Integrity("manifest.json", str(tmp_path),
                          {"tests/a\x1b[1A\n::notice::b/conftest.py": "added"}, False)
    rows = [ExerciseResult("1.1", 1, "first", 7, 7, "passed", "")]
    report = Report(rows, "x", integrity, workflow=check, records=[])
    for text in (report.table(), report.score(), report.markdown()):
        assert not CONTROL.search(text), text
        assert not [line for line in text.splitlines() if line.lstrip("> *").startswith("::")]
        assert "WORKFLOW CHANGED" in text and "TAMPERED" in text
    ElementTree.fromstring(report.junit())
    path = tmp_path / "grade.json"
    path.write_text(json.dumps(report.to_json()))
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade",
                           "--from-report", str(path), "--score"], capture_output=True,
                          text=True, env={**os.environ, "GITHUB_ACTIONS": "true"})
    commands = [line for line in done.stdout.splitlines() if line.startswith("::")]
    assert done.returncode == 0 and len(commands) == 1, done.stdout
    assert commands[0].startswith("::warning title=Grade::") and "\x1b" not in done.stdout
