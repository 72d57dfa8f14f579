"""The exercises' hints (annotated_transformer/course/hints.toml): three levels for every
graded exercise, none holding a line of the reference solution, served one level at a time
by ``python -m annotated_transformer hint`` and shown on the book's page of hints."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from annotated_transformer.course import hints as hints_module
from annotated_transformer.course.hints import SEEN_FILE, book_page, load_hints
from annotated_transformer.layout import ROOT, SOLUTIONS_DIR, TESTS_DIR

HINTS = load_hints()


def graded_exercises() -> dict[str, str]:
    """``{id: title}`` from every graded test file's EXERCISES dict, read without importing."""
    found = {}
    for path in sorted((TESTS_DIR / "graded").glob("test_ch*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "EXERCISES" for t in node.targets):
                found.update(ast.literal_eval(node.value))
    return found


def solution_bodies() -> dict[str, list[str]]:
    """``{id: lines}`` between ``# BEGIN SOLUTION id`` and ``# END SOLUTION``."""
    bodies: dict[str, list[str]] = {}
    for path in sorted(SOLUTIONS_DIR.glob("ch*.py")):
        current = None
        for line in path.read_text(encoding="utf-8").splitlines():
            begin = re.match(r"\s*# BEGIN SOLUTION (\S+)", line)
            if begin:
                current = begin.group(1)
                bodies.setdefault(current, [])
            elif line.strip() == "# END SOLUTION":
                current = None
            elif current is not None:
                bodies[current].append(line)
    return bodies


def test_every_graded_exercise_has_three_levels_and_its_title():
    exercises = graded_exercises()
    assert len(exercises) >= 27
    assert set(HINTS) == set(exercises)
    assert set(solution_bodies()) <= set(exercises)  # the capstones have no body of their own
    for exercise, hint in HINTS.items():
        assert hint.title == exercises[exercise], exercise
        assert len(hint.levels) == 3 and all(len(level) > 40 for level in hint.levels)


def test_a_missing_level_is_named(tmp_path):
    path = tmp_path / "hints.toml"
    path.write_text('["1.1"]\ntitle = "t"\nidea = "i"\napproach = "a"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="1.1 has no tricky"):
        load_hints(path)


def test_no_hint_holds_a_line_of_the_solution():
    leaks = []
    for exercise, lines in solution_bodies().items():
        code = [line.strip() for line in lines]
        code = [line for line in code if len(line) >= 12 and not line.startswith("#")]
        for hint in HINTS.values():
            leaks += [(exercise, hint.exercise, line) for line in code
                      if any(line in level for level in hint.levels)]
    assert not leaks


def test_the_book_page_is_written_from_the_hints():
    page = (ROOT / "book" / "hints.md").read_text(encoding="utf-8")
    assert page == book_page(), "book/hints.md is stale: run `python scripts/hints_page.py`"
    assert page.count(":::{dropdown}") == 3 * len(HINTS)
    assert "file: book/hints" in (ROOT / "book" / "_toc.yml").read_text(encoding="utf-8")


def hint(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "annotated_transformer", "hint", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_each_call_prints_the_next_level_then_says_there_are_no_more(tmp_path):
    levels = HINTS["2.1"].levels
    for level in (1, 2, 3):
        result = hint(tmp_path, "2.1")
        assert result.returncode == 0, result.stderr
        assert f"level {level} of 3" in result.stdout
        assert " ".join(levels[level - 1].split()) in " ".join(result.stdout.split())
    result = hint(tmp_path, "2.1")
    assert result.returncode == 0 and "no more hints for 2.1" in result.stdout
    assert json.loads((tmp_path / SEEN_FILE).read_text()) == {"2.1": 3}
    assert "level 1 of 3" in hint(tmp_path, "3.1").stdout  # each exercise counts apart


def test_level_and_reset(tmp_path):
    result = hint(tmp_path, "6.2", "--level", "3")
    assert result.returncode == 0 and "level 3 of 3" in result.stdout
    assert "no more" in hint(tmp_path, "6.2").stdout
    assert "level 2 of 3" in hint(tmp_path, "6.2", "--level", "2").stdout
    assert hint(tmp_path, "6.2", "--reset").returncode == 0
    assert "level 1 of 3" in hint(tmp_path, "6.2").stdout
    assert hint(tmp_path, "--reset").returncode == 0
    assert json.loads((tmp_path / SEEN_FILE).read_text()) == {}
    assert hint(tmp_path, "6.2", "--level", "4").returncode == 2


def test_an_unknown_exercise_is_one_error_line_naming_the_known_ones(tmp_path):
    result = hint(tmp_path, "9.9")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "9.9" in result.stderr and all(e in result.stderr for e in HINTS)
    assert not (tmp_path / SEEN_FILE).exists()


def test_a_damaged_record_is_named_not_a_traceback(tmp_path):
    (tmp_path / SEEN_FILE).write_text("[", encoding="utf-8")
    result = hint(tmp_path, "1.1")
    assert result.returncode == 2 and SEEN_FILE in result.stderr
    assert "Traceback" not in result.stderr
    assert hint(tmp_path, "--reset").returncode == 0
    assert "level 1 of 3" in hint(tmp_path, "1.1").stdout


def test_the_seen_file_is_kept_in_the_current_folder_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hints_module.main(["4.2"]) == 0
    assert (tmp_path / SEEN_FILE).exists()
