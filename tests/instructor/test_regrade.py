"""The instructor's re-grade: only the exercise files count, everything else is a flag.

The submissions are built here, as folders and as a git repository cloned through a
``file://`` URL; only chapter 1 is graded, to keep this quick.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer.course.grading import engine, manifest
from annotated_transformer.course.grading.results import ExerciseResult
from annotated_transformer.course.instructor import regrade, submissions
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.course.instructor.spreadsheet import COLUMNS, spreadsheet_safe
from annotated_transformer.layout import EXERCISES_DIR, ROOT, SOLUTIONS_DIR

CH01 = "ch01_positional_encoding.py"
FULL = sum(r.max_points for r in engine.exercise_points([1]))  # chapter 1's points


def course_copy(path: Path, pristine: Path | None = None) -> Path:
    """A submission as a learner's repository holds it: the course's grading files and
    workflows, and the untouched stubs in exercises/ (from ``pristine``, an earlier copy,
    when given: the same files even while the course's change)."""
    if pristine is not None:
        shutil.copytree(pristine, path, symlinks=True)
        return path
    for relative in [*manifest.graded_files(ROOT), "pyproject.toml",
                     ".github/workflows/grade.yml", ".github/workflows/classroom.yml"]:
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / relative, path / relative)
    shutil.copytree(EXERCISES_DIR, path / "exercises")
    return path


def solve_chapter_1(path: Path) -> Path:
    """The reference's chapter 1 as the learner's exercise file."""
    shutil.copyfile(SOLUTIONS_DIR / CH01, path / "exercises" / CH01)
    return path


def git_repository(path: Path) -> str:
    """``path`` committed as a git repository; its file:// URL."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "--quiet")
    git("add", "-A")
    git("-c", "user.name=learner", "-c", "user.email=learner@example.com", "commit",
        "--quiet", "-m", "my work")
    return path.resolve().as_uri()


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """One re-grade of every kind of submission below; the gradebook and the exit status."""
    tmp = tmp_path_factory.mktemp("regrade")
    pristine = course_copy(tmp / "pristine")
    # The manifest of that copy: the committed one may lag while the grading files change.
    (tmp / "manifest.json").write_text(json.dumps(manifest.compute(pristine)))
    solved = solve_chapter_1(course_copy(tmp / "solved", pristine))
    stubs = course_copy(tmp / "stubs", pristine)
    workflow = solve_chapter_1(course_copy(tmp / "workflow", pristine))
    with (workflow / ".github/workflows/grade.yml").open("a") as handle:
        handle.write("# the learner's own edit\n")
    (workflow / ".github/workflows/mine.yml").write_text("name: mine\n")
    url = git_repository(workflow)
    reported = course_copy(tmp / "reported", pristine)
    fake = {"exercises": [], "points": FULL, "max_points": FULL}
    (reported / "grade.json").write_text(json.dumps(fake))
    linked = course_copy(tmp / "linked", pristine)
    (linked / "exercises" / CH01).unlink()
    (linked / "exercises" / CH01).symlink_to(SOLUTIONS_DIR / CH01)
    out = tmp / "out"
    status = regrade.main([str(solved), str(stubs), url, str(reported), str(linked),
                           "file:///nowhere/at/all.git", "--out", str(out), "--chapter", "1",
                           "--seed", "5", "--manifest", str(tmp / "manifest.json"), "--names",
                           "solved,stubs,git,reported,linked,missing"])
    data = json.loads((out / "gradebook.json").read_text())
    with (out / "gradebook.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    return status, data, table


def learner(data: dict, name: str) -> dict:
    return next(who for who in data["learners"] if who["learner"] == name)


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_a_correct_chapter_earns_full_marks_and_no_flag(gradebook):
    _, data, table = gradebook
    solved = learner(data, "solved")
    assert solved["points"] == solved["max_points"] == FULL, solved
    # git's chapter 1 is the same file: a reason to look, flagged on both
    assert solved["flags"] == {"identical-file": [
        f"{CH01} is the same as git's (shared by 2 of 6), comments, spacing and docstrings "
        f"aside"]}
    rows = [r for r in table if r["learner"] == "solved"]
    assert [r["exercise"] for r in rows] == ["1.1", "1.2", "1.3", "1.4"]
    assert all(r["status"] == "passed" and r["flags"] == "identical-file" for r in rows)


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_the_untouched_stubs_earn_nothing(gradebook):
    _, data, table = gradebook
    assert learner(data, "stubs")["points"] == 0 and learner(data, "stubs")["flags"] == {}
    assert {r["status"] for r in table if r["learner"] == "stubs"} == {"not implemented"}


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_a_changed_or_added_workflow_is_flagged_and_the_clone_graded(gradebook):
    _, data, table = gradebook
    git = learner(data, "git")
    assert git["points"] == FULL, "the flag does not change the points"
    assert sorted(git["flags"]["workflow-changed"]) == [
        ".github/workflows/grade.yml (changed)", ".github/workflows/mine.yml (added)"]
    assert git["source"].startswith("file://")
    assert all(r["flags"] == "identical-file;workflow-changed"
               for r in table if r["learner"] == "git")


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_a_committed_report_is_flagged_and_ignored(gradebook):
    _, data, _ = gradebook
    reported = learner(data, "reported")
    assert reported["points"] == 0 and reported["flags"] == {"committed-report": ["grade.json"]}


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_a_symbolic_link_is_flagged_and_not_followed(gradebook):
    _, data, _ = gradebook
    linked = learner(data, "linked")
    assert linked["points"] == 0, "the link to the reference was not followed"
    assert linked["flags"]["symlink"] == [f"exercises/{CH01}"]
    assert linked["flags"]["missing-chapter"] == [f"chapter 1 ({CH01})"]


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_a_submission_that_cannot_be_cloned_gets_an_error_row(gradebook):
    status, data, table = gradebook
    assert status == 1, "some submission could not be graded"
    rows = [r for r in table if r["learner"] == "missing"]
    assert len(rows) == 1 and rows[0]["status"] == "error" and float(rows[0]["points"]) == 0
    assert float(rows[0]["max_points"]) == FULL and "cannot clone" in rows[0]["message"]
    assert learner(data, "missing")["status"] == "error"
    assert [who["learner"] for who in data["learners"]] == [
        "solved", "stubs", "git", "reported", "linked", "missing"], "the others went on"


@pytest.mark.slow  # one re-grade of five submissions, shared
def test_one_seed_for_all_written_to_the_gradebook(gradebook):
    _, data, table = gradebook
    assert data["seed"] == 5 and {r["seed"] for r in table} == {"5"}
    assert data["chapters"] == [1]
    assert set(table[0]) == set(COLUMNS)


# ---------------------------------------------------------------- each check on its own


def test_changed_grading_files_are_flagged(tmp_path):
    clean = course_copy(tmp_path / "clean")
    expected = manifest.compute(clean)
    root = course_copy(tmp_path / "sub", clean)
    with (root / "tests" / "graded" / "checks.py").open("a") as handle:
        handle.write("# changed\n")
    (root / "tests" / "pytest.ini").write_text("[pytest]\n")
    who = Learner("x", str(root))
    submissions.check_tests(root, expected, who)
    assert sorted(who.flags["tests-changed"]) == ["tests/graded/checks.py (changed)",
                                                  "tests/pytest.ini (added)"]
    untouched = Learner("y", str(clean))
    submissions.check_tests(clean, expected, untouched)
    assert untouched.flags == {}


def test_grading_files_that_cannot_be_read_are_flagged_not_fatal(tmp_path):
    clean = course_copy(tmp_path / "clean")
    root = course_copy(tmp_path / "sub", clean)
    (root / "pyproject.toml").write_bytes(b"[tool.pytest.ini_options]\nx = '\xff'\n")
    (root / "tests" / "graded" / "conftest.py").unlink()
    (root / "tests" / "graded" / "conftest.py").symlink_to("/dev/zero")
    who = Learner("x", str(root))
    submissions.check_tests(root, manifest.compute(clean), who)
    assert "tests-changed" in who.flags and who.flags["symlink"] == ["tests/graded/conftest.py"]


def test_only_the_course_s_regular_exercise_files_are_copied(tmp_path):
    root = tmp_path / "sub"
    (root / "exercises").mkdir(parents=True)
    solve = root / "exercises" / CH01
    solve.write_bytes((SOLUTIONS_DIR / CH01).read_bytes())
    (root / "exercises" / "ch02_attention.py").write_bytes(b"#" * (submissions.MAX_BYTES + 1))
    (root / "exercises" / "ch03_helper.py").write_text("x = 1\n")
    (root / "exercises" / "helpers.py").write_text("x = 1\n")
    os.mkfifo(root / "exercises" / "ch04_masking.py")
    dest = tmp_path / "dest"
    dest.mkdir()
    who = Learner("x", str(root))
    submissions.collect_exercises(root, [1, 2, 3, 4], dest, who)
    assert (dest / CH01).read_bytes() == solve.read_bytes()
    assert who.flags["oversized"] == ["exercises/ch02_attention.py"]
    assert who.flags["extra-file"] == ["exercises/ch03_helper.py"]
    assert who.flags["not-a-file"] == ["exercises/ch04_masking.py"]
    assert who.flags["missing-chapter"] == [
        "chapter 2 (ch02_attention.py)", "chapter 3 (ch03_multi_head.py)",
        "chapter 4 (ch04_masking.py)"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in EXERCISES_DIR.glob("ch*.py")), "the course's stubs for the rest"
    assert (dest / "ch02_attention.py").read_bytes() == (
        EXERCISES_DIR / "ch02_attention.py").read_bytes()


def test_a_linked_exercises_folder_is_not_followed(tmp_path):
    root = tmp_path / "sub"
    root.mkdir()
    (root / "exercises").symlink_to(SOLUTIONS_DIR)
    dest = tmp_path / "dest"
    dest.mkdir()
    who = Learner("x", str(root))
    submissions.collect_exercises(root, [1], dest, who)
    assert who.flags["symlink"] == ["exercises/"]
    assert (dest / CH01).read_bytes() == (EXERCISES_DIR / CH01).read_bytes()


def test_names_urls_and_cells():
    assert regrade.learner_names(["/a/alice", "https://h/org/bob.git", "git@h:org/alice"],
                                 None) == ["alice", "bob", "alice-2"]
    assert regrade.learner_names(["x", "y"], "ann, ben") == ["ann", "ben"]
    for bad in ("ann", "ann,ann", "ann,"):
        with pytest.raises(ValueError, match="--names"):
            regrade.learner_names(["x", "y"], bad)
    assert regrade.is_git_url("file:///tmp/x") and regrade.is_git_url("git@github.com:o/r")
    assert not regrade.is_git_url("submissions/alice")
    assert regrade.without_credentials("https://me:token@github.com/o/r") == \
        "https://github.com/o/r"
    assert spreadsheet_safe("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert spreadsheet_safe("expected 1") == "expected 1"
    assert spreadsheet_safe(3) == 3


@pytest.mark.parametrize("args, says", [
    (["--out", "o"], "SUBMISSION"),
    (["x"], "--out"),
    (["x", "--out", "o", "--roster", "r.csv"], "--roster names the submissions"),
    (["x", "--out", "o", "--chapter", "99"], "chapter"),
    (["x", "y", "--out", "o", "--names", "a"], "--names"),
    (["x", "--out", "o", "--seed", "-1"], "--seed"),
    (["x", "--out", "o", "--manifest", "nowhere.json"], "nowhere.json"),
])
def test_bad_arguments_exit_2_with_one_error_line(tmp_path, args, says):
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "regrade", *args],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- the class's summary


def test_the_class_summary_counts_learners_per_mistake_most_common_first():
    """Rows of three learners: a learner counts once per mistake; the most common first."""
    from annotated_transformer.course.instructor import class_summary

    def row(who, exercise, status, mistake="", message="", blocked_by=""):
        return ExerciseResult(exercise, 4, f"title {exercise}", 0, 1, status,
                              "what went wrong" if mistake else message, mistake=mistake,
                              blocked_by=blocked_by, learner=who, seed=0)

    blamed = "4.3 uses your causal_mask (4.2), which does not pass yet: fix 4.2 first."
    rows = [row("a", "4.1", "passed"), row("b", "4.1", "failed", "4.1/inverted"),
            row("c", "4.1", "failed", "4.1/inverted"), row("a", "4.2", "failed"),
            row("b", "4.2", "failed", "4.2/no-diagonal"), row("c", "4.2", "passed"),
            row("a", "4.3", "failed", message=blamed, blocked_by="4.2"),
            row("b", "4.3", "not implemented"),
            row("c", "4.3", "failed", message=blamed),  # the text alone: not blocked
            ExerciseResult("", 0, "", 0, 2, "error", "not graded", learner="d", seed=0)]
    summary = class_summary.summarize(rows)
    assert [(e.id, e.passed, e.learners, e.unnamed, e.blocked, e.not_started)
            for e in summary] == [("4.1", 1, 3, 0, 0, 0), ("4.2", 1, 3, 1, 0, 0),
                                  ("4.3", 0, 3, 1, 1, 1)]
    assert class_summary.most_common(summary) == [("4.1/inverted", 2), ("4.2/no-diagonal", 1)]
    text = class_summary.markdown(summary, learners=4)
    assert "| 4.1 | title 4.1 | 1/3 | `4.1/inverted` (2) | 0 | 0 | 0 |" in text
    assert "| 4.3 | title 4.3 | 0/3 | - | 1 | 1 | 1 |" in text
    assert text.index("`4.1/inverted`**: 2") < text.index("`4.2/no-diagonal`**: 1")
    assert "1 learner(s). One of their messages: `what went wrong`" in text


@pytest.mark.slow  # three submissions, chapter 4
def test_regrade_writes_the_class_summary_beside_the_gradebook(tmp_path):
    """Two learners with the padding mask inverted and one right: the summary counts the
    named mistake twice, and the figure is written."""
    pristine = course_copy(tmp_path / "pristine")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest.compute(pristine)))
    reference = (SOLUTIONS_DIR / "ch04_masking.py").read_text()
    inverted = reference.replace("return (tokens != pad_id)[:, None, None, :]",
                                 "return (tokens == pad_id)[:, None, None, :]")
    assert inverted != reference
    folders = []
    for name, text in (("right", reference), ("first", inverted), ("second", inverted)):
        folder = course_copy(tmp_path / name, pristine)
        for path in SOLUTIONS_DIR.glob("ch0[1-3]_*.py"):
            shutil.copyfile(path, folder / "exercises" / path.name)
        (folder / "exercises" / "ch04_masking.py").write_text(text)
        folders.append(str(folder))
    out = tmp_path / "out"
    status = regrade.main([*folders, "--out", str(out), "--chapter", "4", "--seed", "3",
                           "--manifest", str(tmp_path / "manifest.json")])
    assert status == 0
    with (out / "gradebook.csv").open(newline="") as handle:
        table = [r for r in csv.DictReader(handle) if r["exercise"] == "4.1"]
    assert sorted(r["mistake"] for r in table) == ["", "4.1/inverted", "4.1/inverted"]
    text = (out / "class-summary.md").read_text()
    assert "| 4.1 | " in text and "| 1/3 | `4.1/inverted` (2) |" in text, text
    assert "**`4.1/inverted`**: 2 learner(s)" in text
    assert (out / "class-summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
