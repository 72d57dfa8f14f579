"""The GitHub Actions workflows are valid: they cannot run here, so their structure is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

WORKFLOWS = sorted((Path(__file__).resolve().parent.parent / ".github/workflows").glob("*.yml"))


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_structure(path):
    workflow = yaml.safe_load(path.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert triggers, f"{path.name}: no trigger"
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
    workflow = yaml.safe_load((WORKFLOWS[0].parent / "book.yml").read_text())
    steps = workflow["jobs"]["build"]["steps"]
    assert any(s.get("run") == "bash scripts/book.sh" for s in steps)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages"))
    assert upload["with"]["path"] == "_build/html"
    assert workflow["permissions"]["pages"] == "write"
