"""The course's own tests grade through the grader's one entry, ``engine.grade``: a run as
they make it (seed 0, the sandbox where it can start); and through a workflow's own grading
step, as GitHub runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from annotated_transformer.course.grading import boundary, engine
from annotated_transformer.course.grading.limits import DEFAULT_CPU_SECONDS
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.layout import ROOT


def grade_run(chapters: list[int] | None, parts: str, *, timeout: float = DEFAULT_CPU_SECONDS,
           seed: int = 0, exercises: list[str] | None = None) -> engine.Graded:
    """``parts`` graded on ``exercises`` (else those of ``chapters``, else all)."""
    spec = RunSpec.new(parts, seed=seed, cpu_seconds=timeout, sandbox=boundary.decide("auto"),
                       exercises=exercises)
    return engine.grade(spec, chapters)


FAKE_SUDO = '#!/bin/sh\n[ "$1" = -E ] && shift\nexec "$@"\n'  # the tests run as root already


def run_grading_step(workflow: str, workspace: Path, course: Path,
                     timeout: float = 1200) -> subprocess.CompletedProcess:
    """``workflow``'s own grading step (``.github/workflows/<workflow>``, the step whose id
    is ``grade``), run as GitHub runs it: as root, in a checkout ``workspace`` whose
    ``exercises/`` is the learner's and whose ``.course`` becomes a copy of ``course``. Its
    report is ``workspace/temp/grade/grade.json``."""
    shutil.copytree(course, workspace / ".course", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / ".github", workspace / ".github", dirs_exist_ok=True)
    (workspace / "temp").mkdir(exist_ok=True)
    bin_dir = workspace / "bin"
    bin_dir.mkdir()
    python = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'
    for name, text in (("sudo", FAKE_SUDO), ("python", python)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    data = yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())
    (job,) = data["jobs"].values()
    step = next(s for s in job["steps"] if s.get("id") == "grade")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "RUNNER_TEMP": str(workspace / "temp"), "GITHUB_WORKSPACE": str(workspace),
           "HOME": str(workspace)}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                          cwd=workspace / ".course", env=env, capture_output=True, text=True,
                          timeout=timeout)
