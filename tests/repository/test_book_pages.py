"""The book's pages outside the notebooks, read as files: the landing figure's script runs,
and the intro's table of exercises names every exercise of ``solutions/``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # trains a small model to reverse its input: about half a minute
def test_the_landing_figure_redraws(tmp_path):
    """``book/landing_figure.py FILE`` trains the model of the intro's caption, which learns
    to reverse, and draws its cross-attention into FILE."""
    out = tmp_path / "figure" / "attention_map.png"
    run = subprocess.run([sys.executable, str(ROOT / "book/landing_figure.py"), str(out)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, f"the script failed:\n{run.stderr[-4000:]}"
    learnt = re.search(r"held-out exact match: ([\d.]+)%", run.stdout)
    assert learnt, f"the script did not print its held-out exact match:\n{run.stdout}"
    assert float(learnt.group(1)) >= 90, (
        f"the caption shows a model that has learnt to reverse; this one gets "
        f"{learnt.group(1)}% of held-out sequences right")
    assert out.is_file(), f"the script did not write {out}:\n{run.stdout}"
    height, width, _ = matplotlib.image.imread(out).shape
    assert height > 100 and width > 100, f"the image is {width} x {height} pixels"
