"""The book's pages outside the notebooks, read as files: the landing figure's script runs,
the intro's table of exercises names every exercise of ``solutions/``, and every test the
instructor page names for a claim exists."""

from __future__ import annotations

import ast
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


def exercises_of_solutions() -> dict[str, str]:
    """Every exercise of ``solutions/``, by id (``"5.6"``), and the public name that holds
    it (the function or class around its ``# BEGIN SOLUTION`` marker)."""
    from annotated_transformer.course.authoring import stubs

    exercises: dict[str, str] = {}
    for path in stubs.solution_files():
        source = path.read_text()
        enclosing = stubs.enclosing_names(source)
        for number, line in enumerate(source.splitlines(), start=1):
            if begin := stubs.BEGIN.match(line):
                exercises[begin["id"]] = enclosing[number].split(".")[0]
    return exercises


def intro_table(text: str) -> dict[int, set[str]]:
    """The names in the "you write" column of the intro's table, by chapter number."""
    rows = re.findall(r"^\| \[(\d+)\. [^|]*\| ([^|]*) \|", text, flags=re.MULTILINE)
    return {int(chapter): set(re.findall(r"`([^`]+)`", names)) for chapter, names in rows}


def test_the_intro_names_every_exercise_of_its_chapter_and_nothing_else():
    """The intro's "What you will build" names, in each chapter's row, the function or
    class of every exercise of that chapter (read from ``solutions/``' markers), and only
    those."""
    table = intro_table((ROOT / "book/intro.md").read_text())
    assert set(table) >= set(range(9)), f"the table's chapters: {sorted(table)}"
    exercises = exercises_of_solutions()
    missing = sorted((number, name) for number, name in exercises.items()
                     if name not in table[int(number.split(".")[0])])
    assert not missing, f"book/intro.md's table leaves out these exercises: {missing}"
    extra = {chapter: names - set(exercises.values()) for chapter, names in table.items()}
    assert not any(extra.values()), (
        f"book/intro.md's table names, under 'you write', what is no exercise: {extra}")


def test_the_readers_find_a_table_s_names_and_the_exercises():
    table = intro_table("| [5. Layers](x.ipynb) | `LayerNorm`, `Encoder` | stacks |\n"
                        "| [6. Training](y.ipynb) | `noam_lr` | a model |\n")
    assert table == {5: {"LayerNorm", "Encoder"}, 6: {"noam_lr"}}
    exercises = exercises_of_solutions()
    assert exercises["5.6"] == "Encoder" and exercises["8.5"] == "DecoderOnlyTransformer"
    assert exercises["6.5"] == "train_step" and exercises["1.2"] == "PositionalEncoding"


# `file.py::test` in book/instructor.md: the test that backs a claim, in tests/grading/
# unless the file's path says otherwise.
CITED_TEST = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)::(test_\w+)`")


def cited_tests(page: str) -> list[tuple[Path, str]]:
    """``(file, test function)`` for each test a page names."""
    return [(ROOT / file if "/" in file else ROOT / "tests" / "grading" / file, name)
            for file, name in CITED_TEST.findall(page)]


def test_every_test_the_instructor_page_names_is_a_test_of_its_file():
    cited = cited_tests((ROOT / "book" / "instructor.md").read_text())
    assert len(cited) > 20, "the instructor page names the test of each claim"
    missing = []
    for path, name in cited:
        tree = ast.parse(path.read_text()) if path.is_file() else ast.Module(body=[])
        if name not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
            missing.append(f"{path.relative_to(ROOT)}::{name}")
    assert not missing, f"book/instructor.md names tests that do not exist: {missing}"


def test_a_cited_test_is_read_from_its_folder():
    cited = cited_tests("`test_boundary.py::test_no_network` and "
                        "`tests/distribution/test_workflows.py::test_grade_workflow`")
    assert cited == [(ROOT / "tests/grading/test_boundary.py", "test_no_network"),
                     (ROOT / "tests/distribution/test_workflows.py", "test_grade_workflow")]
