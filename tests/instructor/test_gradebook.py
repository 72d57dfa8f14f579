"""The class's gradebook: runs that add up, overrides in every output, outputs that agree,
a deadline and a branch read from a repository, and the release's stub for a missing
chapter."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading.results import ExerciseResult
from annotated_transformer.course.instructor import (
    gradebook,
    regrade,
    repositories,
    snapshot,
    submissions,
)
from annotated_transformer.course.instructor.gradebook import Gradebook, Learner, Override
from annotated_transformer.course.instructor.spreadsheet import spreadsheet_safe, spreadsheet_text
from annotated_transformer.layout import EXERCISES_DIR, SOLUTIONS_DIR


def rows_of(name: str, points: tuple[float, float, float], seed: int = 1,
            ) -> list[ExerciseResult]:
    exercises = ("1.1", "1.2", "2.1")
    return [ExerciseResult(e, int(e[0]), f"title {e}", p, 2, "passed" if p == 2 else "failed",
                           "=cmd|' /C calc'!A0" if p == 0 else "", learner=name, seed=seed,
                           graded_at=f"t{seed}")
            for e, p in zip(exercises, points, strict=True)]


def book_of(*learners: tuple[str, tuple[float, float, float]], seed: int = 1) -> Gradebook:
    book = Gradebook(chapters=[1, 2])
    for name, points in learners:
        book.put(Learner(name, f"/subs/{name}", seed=seed), rows_of(name, points, seed))
    return book


def test_a_learner_graded_again_replaces_only_their_rows():
    book = book_of(("ann", (2, 2, 2)), ("ben", (0, 1, 2)))
    book.put(Learner("ben", "/subs/ben", seed=9), rows_of("ben", (2, 2, 0), seed=9))
    assert [(r.learner, r.points, r.seed) for r in book.rows if r.learner == "ann"] == [
        ("ann", 2, 1)] * 3
    assert [(r.points, r.seed) for r in book.rows if r.learner == "ben"] == [
        (2, 9), (2, 9), (0, 9)]
    assert book.totals() == {"ann": (6, 6), "ben": (4, 6)}


def test_shards_merged_equal_one_run():
    whole = book_of(("ann", (2, 2, 2)), ("ben", (0, 1, 2)), ("cy", (1, 1, 1)))
    merged = book_of(("ann", (2, 2, 2)), ("cy", (1, 1, 1)))
    merged.merge(book_of(("ben", (0, 1, 2))))
    assert sorted(map(str, merged.rows)) == sorted(map(str, whole.rows))
    assert gradebook.wide_csv(merged) == gradebook.wide_csv(whole)


def test_every_output_agrees_and_carries_the_overrides(tmp_path):
    """The long CSV, the wide CSV, the JSON and the feedback files give each learner the
    same points, the override applied and its reason shown; the JSON reads back whole."""
    book = book_of(("ann", (2, 2, 2)), ("ben", (0, 1, 2)))
    book.add_overrides([Override("ben", "1.1", 1.5, "late-day penalty waived")])
    gradebook.write(tmp_path, book, {"seed": 1})
    long = list(csv.DictReader(io.StringIO((tmp_path / "gradebook.csv").read_text())))
    wide = list(csv.DictReader(io.StringIO((tmp_path / "grades-wide.csv").read_text())))
    data = json.loads((tmp_path / "gradebook.json").read_text())
    assert wide[0]["learner"] == "Points Possible" and float(wide[0]["total"]) == 6
    for name, total in (("ann", 6), ("ben", 4.5)):
        assert sum(float(r["points"]) for r in long if r["learner"] == name) == total
        assert float(next(r for r in wide if r["learner"] == name)["total"]) == total
        assert next(w["points"] for w in data["learners"] if w["learner"] == name) == total
        assert f"**{total:g}/6 points.**" in (tmp_path / "feedback" / f"{name}.md").read_text()
    ben = next(r for r in wide if r["learner"] == "ben")
    assert (ben["1.1"], ben["chapter 1"], ben["chapter 2"]) == ("1.5", "2.5", "2")
    assert "late-day penalty waived" in next(
        r["override"] for r in long if (r["learner"], r["exercise"]) == ("ben", "1.1"))
    assert "late-day penalty waived" in (tmp_path / "feedback" / "ben.md").read_text()
    back = gradebook.read(tmp_path)
    assert back.rows == book.rows and back.overrides == book.overrides


def test_learner_text_is_data_in_every_output(tmp_path):
    """A message that would be a formula in a spreadsheet, or markup in Markdown."""
    book = book_of(("ann", (0, 2, 2)))
    book.rows[0] = replace(book.rows[0], message="=HYPERLINK(\"x\")\r\n# heading | cell |")
    gradebook.write(tmp_path, book, {})
    long = list(csv.reader(io.StringIO((tmp_path / "gradebook.csv").read_text())))
    assert not any(cell.startswith(("=", "+", "-", "@")) for line in long for cell in line)
    feedback = (tmp_path / "feedback" / "ann.md").read_text()
    assert not any(line.startswith("# heading") for line in feedback.splitlines())
    assert "\\r\\n# heading \\| cell \\|" in feedback


def test_bad_overrides_are_named(tmp_path):
    path = tmp_path / "o.csv"
    path.write_text("learner,exercise,points,reason\nann,1.1,two,because\n")
    with pytest.raises(ValueError, match="line 2: points must be a number"):
        gradebook.read_overrides(path)
    path.write_text("learner,exercise,points\nann,1.1,2\n")
    with pytest.raises(ValueError, match="line 2: no reason"):
        gradebook.read_overrides(path)


def test_a_missing_chapter_is_the_release_s_stub_not_the_checkout_s_file(tmp_path,
                                                                        monkeypatch):
    """An instructor whose exercises/ch04 holds answers: a learner without ch04 gets the
    stub made from the reference, never those answers."""
    checkout = tmp_path / "exercises"
    checkout.mkdir()
    for path in EXERCISES_DIR.glob("ch*.py"):
        (checkout / path.name).write_text(path.read_text())
    (checkout / "ch04_masking.py").write_text((SOLUTIONS_DIR / "ch04_masking.py").read_text())
    monkeypatch.setattr(submissions, "EXERCISES_DIR", checkout)
    monkeypatch.setattr(submissions, "relative",
                        lambda path, root=None: Path(path).relative_to(tmp_path).as_posix())
    submission, dest = tmp_path / "sub", tmp_path / "dest"
    (submission / "exercises").mkdir(parents=True)
    dest.mkdir()
    who = Learner("x", str(submission))
    submissions.collect_exercises(submission, [4], dest, who)
    graded = (dest / "ch04_masking.py").read_text()
    assert stubs.is_untouched(graded) and "NotImplementedError" in graded
    assert who.flags["missing-chapter"] == ["chapter 4 (ch04_masking.py)"]


# ---------------------------------------------------------------- a repository's history


def commit(repo: Path, when: str, message: str) -> None:
    env = {**os.environ, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when}
    (repo / "work.txt").write_text(message)
    for args in (["add", "-A"], ["-c", "user.name=l", "-c", "user.email=l@x", "commit",
                                 "--quiet", "-m", message]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env,
                       capture_output=True)


@pytest.fixture
def history(tmp_path) -> Path:
    """main: a commit before the deadline and one after; a branch 'late' with one more."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(repo)], check=True)
    commit(repo, "2026-12-01T20:00:00+01:00", "before")
    commit(repo, "2026-12-02T09:00:00+01:00", "after")
    subprocess.run(["git", "-C", str(repo), "checkout", "--quiet", "-b", "late"], check=True)
    commit(repo, "2026-12-02T10:00:00+01:00", "on a branch")
    subprocess.run(["git", "-C", str(repo), "checkout", "--quiet", "main"], check=True)
    return repo


def test_a_commit_backdated_before_the_deadline_but_pushed_after_it_is_not_graded(
        history, tmp_path):
    """The snapshot taken at the deadline saw "after" as the head (main's commits, whatever
    dates they claim); then a commit made later but dated before the deadline with
    GIT_COMMITTER_DATE is pushed. The snapshot's commit is graded, and the later one is
    listed with its claimed date and flagged as backdated."""
    taken = snapshot.take([str(history)], ["x"], None, tmp_path / "class",
                          repositories.parse_deadline("2026-12-02T23:59+01:00"))
    commit(history, "2026-12-01T21:00:00+01:00", "backdated")
    who = Learner("x", "repo")
    seen = snapshot.load(taken).seen["x"]
    clone = repositories.fetch(history.as_uri(), tmp_path / "c", who, None, seen,
                               repositories.parse_deadline("2026-12-02T23:59+01:00"))
    assert (clone / "work.txt").read_text() == "after"
    assert who.commit == seen.commit and who.commit_time.startswith("2026-12-02T09:00:00")
    assert who.flags["after-deadline"][0].startswith(
        "1 commit(s) pushed after the deadline's snapshot (not graded): ")
    assert "dated 2026-12-01T21:00:00+01:00" in who.flags["after-deadline"][0]
    assert who.flags["backdated"][0].endswith("claims 2026-12-01T21:00:00+01:00, on or before "
                                              "the deadline, but was not there when the "
                                              "snapshot was taken")
    assert who.flags["dated-before-parent"], who.flags  # 21:00 on the 1st after 9:00 on the 2nd


def test_a_snapshot_changed_after_it_was_taken_is_refused(history, tmp_path):
    taken = snapshot.take([str(history)], ["x"], None, tmp_path / "class")
    data = json.loads(taken.read_text())
    data["seen"][0]["commit"] = "0" * 40
    taken.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="changed after it was taken"):
        snapshot.load(taken)


def test_a_deadline_alone_chooses_nothing(history, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        regrade.main([str(history), "--out", str(tmp_path / "g"), "--deadline",
                      "2026-12-01T23:59+01:00"])
    assert stopped.value.code == 2
    assert "git's dates are the learner's to set" in capsys.readouterr().err


def test_a_branch_is_graded_at_its_head(history, tmp_path):
    who = Learner("x", "repo")
    clone = repositories.fetch(history.as_uri(), tmp_path / "c", who, "late")
    assert (clone / "work.txt").read_text() == "on a branch" and "other-branch" not in who.flags
    with pytest.raises(repositories.SubmissionError, match="no branch 'nope'"):
        repositories.fetch(history.as_uri(), tmp_path / "d", Learner("y", "r"), "nope")


def test_a_commit_that_names_one_blob_many_times_is_not_checked_out(history, tmp_path):
    """A tree bomb: a few kilobytes of git whose tree names one 1 MB blob 300 times (300 MB
    on disk once checked out) gets an error before anything is written."""
    def git(*args, data=None):
        return subprocess.run(["git", "-C", str(history), *args], input=data, check=True,
                              capture_output=True).stdout.decode().strip()

    blob = git("hash-object", "-w", "--stdin", data=b"A" * 2**20)
    tree = git("mktree", data="".join(f"100644 blob {blob}\tjunk{i}\n"
                                      for i in range(300)).encode())
    git("read-tree", "--prefix=junk/", tree)
    git("-c", "user.name=l", "-c", "user.email=l@x", "commit", "--quiet", "-m", "bomb")
    with pytest.raises(repositories.SubmissionError, match="more than 20,000 files or 256 MB"):
        repositories.fetch(history.as_uri(), tmp_path / "c", Learner("x", "repo"))
    assert not (tmp_path / "c" / "junk").exists()


def test_only_the_most_recent_branches_are_compared(history, tmp_path, monkeypatch):
    """Every other branch costs a git command: past MAX_BRANCHES the rest are not compared,
    and the flags say so."""
    monkeypatch.setattr(repositories, "MAX_BRANCHES", 2)
    for name in ("b1", "b2", "b3", "b4"):
        subprocess.run(["git", "-C", str(history), "branch", name, "late"], check=True)
    who = Learner("x", "repo")
    repositories.fetch(history.as_uri(), tmp_path / "c", who)
    compared = [f for f in who.flags["other-branch"] if "holds 1 commit(s)" in f]
    assert len(compared) == 2
    assert who.flags["other-branch"][-1] == ("more than 2 other branches: only the 2 with "
                                             "the latest commits were compared")


@pytest.mark.parametrize("text, says", [("2026-12-01T23:59", "time zone"),
                                        ("tomorrow", "date and time")])
def test_a_deadline_without_its_zone_is_refused(text, says):
    with pytest.raises(ValueError, match=says):
        repositories.parse_deadline(text)


def test_overrides_added_later_update_every_output_without_grading(tmp_path, capsys):
    """``regrade merge --out DIR --overrides FILE``: the adjustments reach the wide CSV and
    the feedback; a bad file is one ``error:`` line, exit status 2."""
    from annotated_transformer.course.instructor import regrade

    gradebook.write(tmp_path, book_of(("ann", (2, 0, 2))), {"seed": 1})
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("learner,exercise,points,reason\nann,1.2,2,regrade request #4\n")
    assert regrade.main(["merge", "--out", str(tmp_path), "--overrides", str(overrides)]) == 0
    wide = list(csv.DictReader(io.StringIO((tmp_path / "grades-wide.csv").read_text())))
    assert float(wide[1]["total"]) == 6
    assert "regrade request #4" in (tmp_path / "feedback" / "ann.md").read_text()
    overrides.write_text("learner,exercise,points\nann,1.2,2\n")
    with pytest.raises(SystemExit) as stop:
        regrade.main(["merge", "--out", str(tmp_path), "--overrides", str(overrides)])
    assert stop.value.code == 2 and "no reason" in capsys.readouterr().err


def test_names_that_share_their_safe_characters_get_feedback_files_of_their_own(tmp_path):
    book = book_of(("Zoë", (2, 2, 2)), ("Zoé", (0, 0, 0)), ("ann lee", (1, 1, 1)),
                   ("ann_lee", (2, 0, 0)))
    gradebook.write(tmp_path, book, {})
    files = {p.read_text().splitlines()[0] for p in (tmp_path / "feedback").iterdir()}
    assert len(files) == 4
    assert gradebook.feedback_name("alice") == "alice"


def test_a_chapter_graded_again_replaces_only_that_chapter_s_rows():
    book = book_of(("ann", (2, 2, 2)))
    book.put(Learner("ann", "/subs/ann", seed=4),
             [ExerciseResult("2.1", 2, "t", 1, 2, "failed", "", learner="ann", seed=4)],
             chapters=[2])
    assert [(r.id, r.points) for r in book.rows] == [("1.1", 2), ("1.2", 2), ("2.1", 1)]


def test_an_override_that_names_no_graded_exercise_is_listed_apart(tmp_path):
    book = book_of(("ann", (2, 2, 2)))
    book.add_overrides([Override("Ann", "1.1", 0, "typo in the name")])
    gradebook.write(tmp_path, book, {})
    assert "typo in the name" in (tmp_path / "overrides-unmatched.csv").read_text()
    assert book.totals() == {"ann": (6, 6)}


def test_a_second_run_into_a_folder_in_use_stops_with_a_clear_error(tmp_path, capsys):
    """Two runs into one ``--out`` would read the same gradebook and each write its own over
    the other's: while one holds the folder, ``regrade`` (another process) and ``regrade
    merge`` stop at once (one ``error:`` line, exit status 2) and change nothing; once it is
    done, they run."""
    from annotated_transformer.course.instructor import regrade

    gradebook.write(tmp_path, book_of(("ann", (2, 0, 2))), {"seed": 1})
    before = (tmp_path / "gradebook.json").read_text()
    submission = tmp_path / "ben"
    submission.mkdir()
    with gradebook.locked(tmp_path):
        done = subprocess.run([sys.executable, "-m", "annotated_transformer", "regrade",
                               str(submission), "--chapter", "1", "--unsafe", "--out",
                               str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: another regrade is writing to")
        assert f"process {os.getpid()}" in done.stderr
        with pytest.raises(SystemExit) as stop:
            regrade.main(["merge", "--out", str(tmp_path)])
        assert stop.value.code == 2
        assert "another regrade is writing to" in capsys.readouterr().err
    assert (tmp_path / "gradebook.json").read_text() == before
    assert regrade.main(["merge", "--out", str(tmp_path)]) == 0


def test_the_class_summary_agrees_with_the_merged_gradebook(tmp_path):
    """Two shards merged by ``regrade merge``: the class summary is rebuilt from the whole
    gradebook, and its passes, named mistakes and other failures are the gradebook's."""
    from annotated_transformer.course.instructor import regrade

    shards = [book_of(("ann", (2, 2, 2)), ("ben", (0, 1, 2))), book_of(("cy", (0, 2, 1)))]
    for k, book in enumerate(shards, 1):
        book.rows = [replace(r, mistake="1.1/sine-cosine-swapped")
                     if r.id == "1.1" and not r.points else r for r in book.rows]
        gradebook.write(tmp_path / f"s{k}", book, {"seed": 1})
    out = tmp_path / "class"
    assert regrade.main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"),
                         "--out", str(out)]) == 0
    summary = (out / "class-summary.md").read_text()
    assert "3 submission(s)" in summary
    lines = [line for line in summary.splitlines() if line.startswith(("| 1.", "| 2."))]
    assert lines == [
        "| 1.1 | title 1.1 | 1/3 | `1.1/sine-cosine-swapped` (2) | 0 | 0 | 0 |",
        "| 1.2 | title 1.2 | 2/3 | - | 0 | 0 | 1 |",
        "| 2.1 | title 2.1 | 2/3 | - | 0 | 0 | 1 |"]
    merged = gradebook.read(out)
    assert merged.totals() == {"ann": (6, 6), "ben": (3, 6), "cy": (3, 6)}


def exported(tmp_path, format_, columns="chapters"):
    """A class of three graded into tmp_path, ``cy`` missing from the roster's LMS ids;
    its export in ``format_``, read back as CSV lines, and what the command printed."""
    gradebook.write(tmp_path, book_of(("ann", (2, 2, 2)), ("ben", (0, 1, 2)),
                                      ("cy", (1, 1, 1))), {"seed": 1})
    roster = tmp_path / "roster.csv"
    roster.write_text("learner,repository,branch,lms_id,section\n"
                      "ann,https://x/ann.git,,1001,A\nben,https://x/ben.git,dev,1002,B\n"
                      "cy,https://x/cy.git,,,A\n")
    code = regrade.main(["export", "--out", str(tmp_path), "--format", format_, "--roster",
                         str(roster), "--columns", columns])
    assert code == 0
    with (tmp_path / f"grades-{format_}.csv").open(newline="") as handle:
        return list(csv.reader(handle))


def test_the_canvas_export_has_canvas_s_columns_and_points_possible(tmp_path, capsys):
    """Canvas's gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one
    column an assignment; the line under the header gives the points possible."""
    lines = exported(tmp_path, "canvas")
    assert lines[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                        "Chapter 1", "Chapter 2"]
    assert lines[1][0].strip() == "Points Possible" and lines[1][5:] == ["4.0", "2.0"]
    assert lines[2:] == [["ann", "1001", "ann", "ann", "A", "4.0", "2.0"],
                         ["ben", "1002", "ben", "ben", "B", "1.0", "2.0"]]
    assert "cy is not in the export" in capsys.readouterr().err


def test_the_moodle_export_has_one_line_a_known_user_and_nothing_else(tmp_path):
    """Moodle's CSV import stops at a line whose user it cannot find: an identifier column
    (ID number) and the grade items, no points-possible line, no learner without an id."""
    lines = exported(tmp_path, "moodle", columns="total")
    assert lines == [["ID number", "Transformer course"], ["1001", "6.0"], ["1002", "3.0"]]


# Names a spreadsheet would run as formulas (OWASP's CSV injection: = + - @, tab, CR first).
FORMULA_NAMES = ('=HYPERLINK("evil.example","Open")', "+1+cmd|' /C calc'!A0", "-2+3",
                 "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1")


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_a_name_that_starts_a_formula_is_text_in_every_csv_of_the_class_folder(tmp_path):
    """A class whose learners are named like formulas, one of them with a formula for an LMS
    id and section, a negative override and an override of no graded exercise: every CSV
    of the folder (the gradebook's, the unmatched overrides, each LMS export) holds each
    name escaped and reading back as the name, no cell that starts a formula but the
    numbers, and the numbers as written (``-1.5``, not ``'-1.5``)."""
    out = tmp_path / "class"
    book = book_of(("ann", (2, 2, 2)), *((name, (0, 1, 2)) for name in FORMULA_NAMES))
    first = FORMULA_NAMES[0]
    book.add_overrides([Override(first, "1.1", -1.5, "=penalty"),
                        Override(FORMULA_NAMES[1], "9.9", 1, "-no such exercise")])
    gradebook.write(out, book, {"seed": 1})
    # the roster's reader strips each value: a name that starts with a tab or CR cannot be
    # matched there, so the LMS exports leave it out (and say so)
    in_roster = [n for n in FORMULA_NAMES if n == n.strip()]
    roster = tmp_path / "roster.csv"
    with roster.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["learner", "repository", "branch", "lms_id", "section"])
        writer.writerow(["ann", "", "", "1000", "A"])
        writer.writerow([first, "", "", "=1001", "@A"])
        for k, name in enumerate(in_roster[1:], 2):
            writer.writerow([name, "", "", f"100{k}", "B"])
    for format_ in ("canvas", "moodle", "csv"):
        assert regrade.main(["export", "--out", str(out), "--format", format_, "--roster",
                             str(roster)]) == 0
    expected = {"gradebook.csv": FORMULA_NAMES, "grades-wide.csv": FORMULA_NAMES,
                "overrides-unmatched.csv": FORMULA_NAMES[1:2], "grades-csv.csv": FORMULA_NAMES,
                "grades-canvas.csv": in_roster, "grades-moodle.csv": ("=1001",)}
    tables = {}
    for path in sorted(out.glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            tables[path.name] = list(csv.reader(handle))
    assert set(expected) <= set(tables)
    for name, lines in tables.items():
        cells = [cell for line in lines for cell in line]
        formulas = [cell for cell in cells
                    if cell.startswith(("=", "+", "-", "@", "\t", "\r")) and not is_number(cell)]
        assert not formulas, (name, formulas)
        for text in expected.get(name, ()):
            assert spreadsheet_safe(text) in cells, (name, text)
            assert text not in cells, (name, text)
        assert all(spreadsheet_text(spreadsheet_safe(t)) == t for t in expected.get(name, ()))
    wide = {line[0]: line for line in tables["grades-wide.csv"]}
    assert wide[spreadsheet_safe(first)][1] == "-1.5" and wide["ann"][1:4] == ["2", "2", "2"]
    canvas = {line[0]: line for line in tables["grades-canvas.csv"]}
    assert canvas[spreadsheet_safe(first)] == [
        "'" + first, "'=1001", "'" + first, "'" + first, "'@A", "-0.5", "2.0"]
    assert canvas["ann"] == ["ann", "1000", "ann", "ann", "A", "4.0", "2.0"]
    assert tables["grades-canvas.csv"][1][5:] == ["4.0", "2.0"]
