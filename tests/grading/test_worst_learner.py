"""scripts/worst_learner.py reports what did not hold, even when a learner was not graded
at all or a regrade never finished (the script itself must not crash on either)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "worst_learner.py"


@pytest.fixture(scope="module")
def worst():
    spec = importlib.util.spec_from_file_location("worst_learner", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(learner: str, exercise: str, points: float, status: str, message: str = "") -> dict:
    return {"learner": learner, "exercise": exercise, "points": points, "max_points": 4,
            "status": status, "message": message}


def test_an_error_row_is_a_bound_that_did_not_hold(worst):
    rows = [row("alice", "1.1", 4, "passed"), row("bob", "1.1", 0, "failed"),
            row("mallory", "", 0, "error", "not graded: RuntimeError: the process stopped")]
    assert worst.verdict(rows) == ["mallory was not graded: not graded: RuntimeError: the "
                                   "process stopped"]
    assert worst.verdict(rows[:2]) == []


def test_a_regrade_that_never_finishes_is_named_not_a_traceback(worst, monkeypatch, tmp_path):
    def never(*args, timeout, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout, stderr=b"[1/1] grading mallory")

    monkeypatch.setattr(worst.subprocess, "run", never)
    with pytest.raises(SystemExit) as stop:
        worst.regrade(tmp_path, {"mallory": tmp_path}, [], tmp_path / "out", limit=5)
    assert "regrade of mallory did not finish in 5 s" in str(stop.value.code)
    assert "grading mallory" in str(stop.value.code)
