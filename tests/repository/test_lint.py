"""The house style, checked: ``ruff check .`` (pyproject's rules: pycodestyle, pyflakes,
import order, pyupgrade, bugbear; lines of 100) passes on the package, the tests, the
scripts and the notebooks' code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (requirements.txt pins it: bash scripts/test.sh)")
    done = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"ruff check . found:\n{done.stdout[-4000:]}{done.stderr}"
