"""Each learner graded against their own release: what a release offered, read from the
course's history at the commit its record names (never from the record itself), and a
class of learners of an older release of this course graded through ``regrade``.

The older release is this course's commit before exercises 5.6-5.8 were added (chapters 6
and 8 then ended with their capstones, 6.5 and 8.5); a clone without that history skips
what needs it."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from annotated_transformer.course.distribution import release_record
from annotated_transformer.course.grading import boundary, dependencies, engine, manifest
from annotated_transformer.course.instructor import regrade, releases
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.layout import EXERCISES_DIR, ROOT, chapter_test_files

OLD = "8063bfe5ca570fe2eb5d23b038fadf5bae4c21e6"  # the course before exercise 5.6


def in_history(commit: str) -> bool:
    try:
        release_record.resolve(commit)
    except ValueError:
        return False
    return True


needs_history = pytest.mark.skipif(not in_history(OLD), reason=f"the course's history here "
                                   f"lacks {OLD[:12]} (not a git clone, or a shallow one)")


def test_a_release_offers_what_it_had_renumbered_or_reworded_and_nothing_built_on_more():
    release = {"1.1": "table", "1.2": "module", "2.1": "softmax: old words",
               "6.5": "Capstone: copy", "6.6": "uses the capstone"}
    now = {"1.1": "table", "1.2": "module", "1.3": "new helper", "2.1": "softmax: new words",
           "6.5": "train_step", "6.6": "Capstone: copy", "6.7": "uses the capstone"}
    builds_on = {"1.2": ("1.1",), "6.6": ("1.2", "6.5"), "6.7": ("6.6",)}
    kept, left_out = releases.offered(release, now, builds_on)
    assert kept == {"1.1": "1.1", "1.2": "1.2", "2.1": "2.1"}
    assert left_out == {
        "1.3": "added to the course after your release",
        "6.5": "added to the course after your release",  # its number now names another
        "6.6": "its tests now build on 6.5, which your release did not have",
        "6.7": "its tests now build on 6.6, which your release did not have"}
    # the same capstone, renumbered, with nothing new under it, is offered
    kept, left_out = releases.offered(release, now, {"6.6": ("1.2",)})
    assert kept["6.6"] == "6.5" and "6.6" not in left_out


@needs_history
def test_the_older_release_of_this_course_offers_chapters_1_to_8_without_what_came_later():
    release = release_record.at_commit(OLD)
    assert release.commit == OLD and "5.6" not in release.titles
    assert release.titles["8.5"].startswith("Capstone")
    declared = dependencies.read()
    kept, left_out = releases.offered(release.titles, dict(declared.titles),
                                      dict(declared.builds_on))
    assert sorted(left_out, key=dependencies.order) == [
        "5.6", "5.7", "5.8", "6.5", "6.6", "8.5", "8.6"], left_out
    assert left_out["8.6"].startswith("its tests now build on")
    assert {e: kept[e] for e in ("1.1", "5.5", "8.4")} == {"1.1": "1.1", "5.5": "5.5",
                                                          "8.4": "8.4"}
    assert "5.5" not in [e for e, why in left_out.items()]
    assert release.stubs["ch05_layers.py"] != release_record.at_commit("HEAD").stubs[
        "ch05_layers.py"]


def test_a_release_records_its_commit_exercises_and_hashes(tmp_path):
    """What ``release`` writes, read from a tree: the exercises and points the grader
    reads, every stub's and workflow's sha256, and the grading manifest of its files."""
    tree = course_tree(tmp_path / "tree", "HEAD")
    record = release_record.describe(tree, "f" * 40, uncommitted=False)
    declared = dependencies.read(chapter_test_files(graded_dir=tree / "tests" / "graded"))
    assert record["commit"] == "f" * 40 and record["uncommitted_changes"] is False
    assert set(record["exercises"]) == set(declared.titles)
    assert all(isinstance(e["points"], float) and e["points"] > 0
               for e in record["exercises"].values())
    assert record["grading_files"] == manifest.compute(tree)["files"]
    stub = tree / "exercises" / "ch01_positional_encoding.py"
    assert record["stubs"]["exercises/ch01_positional_encoding.py"] == manifest.file_sha256(stub)
    assert record["workflows"][".github/workflows/classroom.yml"] == manifest.file_sha256(
        tree / ".github" / "workflows" / "classroom.yml")
    assert release_record.commit_of(json.dumps(record).encode()) == "f" * 40


@pytest.mark.parametrize("text, says", [
    (b"not json", "is not JSON"), (b"[]", "names no commit"),
    (b'{"commit": "HEAD"}', "names no commit"), (b'{"commit": "' + b"a" * 39 + b'"}',
                                                 "names no commit")])
def test_a_record_that_names_no_commit_is_refused(text, says):
    with pytest.raises(ValueError, match=says):
        release_record.commit_of(text)


def test_what_a_learner_is_graded_against(tmp_path):
    """No record: the course now, with a note; a record naming a commit the course lacks,
    or none: flagged, the course now; ``--release current``: the course now."""
    bare = tmp_path / "bare"
    bare.mkdir()
    who = Learner("x", "x")
    basis = releases.for_learner(bare, releases.OWN, who)
    assert basis.commit == "" and basis.exercises is None and who.flags == {}
    assert basis.note.startswith("Your repository holds no course-release.json")
    for record in (json.dumps({"commit": "0" * 40}), "{", ""):
        (bare / release_record.RECORD).write_text(record)
        who = Learner("x", "x")
        basis = releases.for_learner(bare, releases.OWN, who)
        assert basis.exercises is None and len(who.flags["release-unknown"]) == 1, record
        assert basis.note.startswith("Your course-release.json could not be used")
    (bare / release_record.RECORD).write_text(json.dumps({"commit": "0" * 40}))
    who = Learner("x", "x")
    releases.for_learner(bare, releases.OWN, who)
    assert "has no commit '0000000000" in who.flags["release-unknown"][0]
    who = Learner("x", "x")
    assert releases.for_learner(bare, releases.CURRENT, who).exercises is None
    assert who.flags == {}


@pytest.mark.skipif(not in_history("HEAD"), reason="the course here is not a git clone")
def test_a_record_is_trusted_for_its_commit_only(tmp_path):
    """A record whose exercise list was edited (to leave out what its learner failed) is
    graded on what its commit's release offered all the same."""
    head = release_record.resolve("HEAD")
    (tmp_path / release_record.RECORD).write_text(json.dumps(
        {"commit": head, "exercises": {"1.1": {"title": "x", "points": 1}}}))
    basis = releases.for_learner(tmp_path, releases.OWN, Learner("x", "x"))
    assert basis.commit == head and {"1.1", "2.1", "8.4"} <= basis.exercises
    assert basis.grading_files == release_record.at_commit(head).grading_files


@pytest.mark.parametrize("args, says", [(["--release", "no-such-commit"], "no commit"),
                                        (["--release", "0" * 40], "no commit")])
def test_a_release_the_course_lacks_is_refused_up_front(tmp_path, args, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        regrade.main(["x", "--out", str(tmp_path / "o"), *args])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a class of an older release


def course_tree(path: Path, commit: str) -> Path:
    """The course's files that a learner's repository holds (the package, the graded tests,
    the stubs, the Classroom workflow, the pytest settings), as they were at ``commit``."""
    paths = ["annotated_transformer", "tests/graded", "exercises", "pyproject.toml",
             ".github/workflows/classroom.yml"]
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              "--", *paths], check=True, capture_output=True).stdout
    path.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(path, filter="data")
    return path


def old_solution(name: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD}:solutions/{name}"],
                          check=True, capture_output=True, text=True).stdout


def old_learner(tmp: Path, name: str, solved: tuple[str, ...], record: bool = True) -> str:
    """A learner's repository made from the older release, with ``solved`` chapter files
    answered as that release's reference did; its file:// URL."""
    repo = course_tree(tmp / name, OLD)
    for file in solved:
        (repo / "exercises" / file).write_text(old_solution(file))
    if record:
        release_record.write(repo, OLD, uncommitted=False)
    for args in (["init", "--quiet", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=l", "-c", "user.email=l@x", "commit", "--quiet", "-m", "w"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return repo.as_uri()


CH05, CH08 = "ch05_layers.py", "ch08_generation.py"
OFFERED = ("5.1", "5.2", "5.3", "5.4", "5.5", "8.1", "8.2", "8.3", "8.4")
LATER = ("5.6", "5.7", "5.8", "8.5", "8.6")


@pytest.fixture(scope="module")
def older_class(tmp_path_factory):
    """Four learners of the older release (one who answered chapters 1 to 8 as its
    reference did, two who started nothing, one complete whose repository lost its
    record), graded on chapters 5 and 8 with their own releases, then the same class with
    ``--release current``, and with ``--release`` naming the older release's commit."""
    if boundary.unavailable() is not None:
        pytest.skip(f"no bubblewrap: {boundary.unavailable()}")
    tmp = tmp_path_factory.mktemp("older")
    every = tuple(p.name for p in EXERCISES_DIR.glob("ch0[1-8]_*.py"))
    urls = [old_learner(tmp, "ana", every), old_learner(tmp, "bo", ()),
            old_learner(tmp, "cai", ()), old_learner(tmp, "dee", every, record=False)]
    names = "ana,bo,cai,dee"
    own, current, pinned = tmp / "own", tmp / "current", tmp / "pinned"
    common = ["--names", names, "--chapter", "5", "--chapter", "8", "--seed", "3",
              "--jobs", "1"]
    assert regrade.main([*urls, "--out", str(own), *common]) == 0
    assert regrade.main([*urls, "--out", str(current), "--release", "current", *common]) == 0
    assert regrade.main([*urls, "--out", str(pinned), "--release", OLD[:10], *common]) == 0
    return own, current, pinned


def gradebook_of(out: Path) -> tuple[dict, dict[tuple[str, str], dict]]:
    data = json.loads((out / "gradebook.json").read_text())
    rows = {(r["learner"], r["exercise"]): r for r in data["rows"]}
    return {w["learner"]: w for w in data["learners"]}, rows


@needs_history
@pytest.mark.slow  # eight gradings of chapters 5 and 8
def test_no_learner_is_graded_on_an_exercise_their_release_did_not_have(older_class):
    own, _, _ = older_class
    learners, rows = gradebook_of(own)
    possible = sum(p for e, p in dependencies.points_offered().items() if e in OFFERED)
    for name in ("ana", "bo", "cai"):
        who = learners[name]
        assert sorted(e for (n, e) in rows if n == name) == sorted(OFFERED)
        assert who["max_points"] == possible and who["release"] == OLD
        assert sorted(who["not_in_release"]) == sorted(LATER)
        feedback = (own / "feedback" / f"{name}.md").read_text()
        assert feedback.count("| not in your release |") == len(LATER)
        assert f"**{who['points']:g}/{possible:g} points.**" in feedback
    assert learners["ana"]["points"] == possible, "the older release's answers earn it all"
    assert all(rows[("ana", e)]["status"] == "passed" for e in OFFERED)
    assert all(rows[(n, e)]["status"] == "not implemented" for e in OFFERED
               for n in ("bo", "cai"))


@needs_history
@pytest.mark.slow  # eight gradings of chapters 5 and 8, shared
def test_the_checks_compare_with_the_learner_s_release(older_class):
    """The older release's grading files, workflow and untouched stubs raise no flag
    against that release; the learner whose record is gone is graded on the course now,
    with a note, and its files differ from the course's now."""
    own, _, _ = older_class
    learners, rows = gradebook_of(own)
    for name in ("ana", "bo", "cai"):
        flags = learners[name]["flags"]
        assert not {"tests-changed", "workflow-changed", "release-unknown"} & set(flags), flags
    for name in ("bo", "cai"):  # the release's untouched stubs are no one's copy
        assert "identical-file" not in learners[name]["flags"], learners[name]["flags"]
    aside = "comments, spacing and docstrings aside"
    assert learners["ana"]["flags"]["identical-file"] == [
        f"{file} is the same as dee's (shared by 2 of 4), {aside}" for file in (CH05, CH08)]
    dee = learners["dee"]
    assert dee["release"] == "" and "no course-release.json" in dee["release_note"]
    assert {"tests-changed", "workflow-changed"} <= set(dee["flags"])
    assert ("dee", "5.6") in rows and dee["not_in_release"] == {}
    assert dee["flags"]["release-other"] == [
        f"graded against the course as it is now; 3 of 4 learners against the release of "
        f"commit {OLD[:12]}"]
    with (own / "grades-wide.csv").open(newline="") as handle:
        wide = {r["learner"]: r for r in csv.DictReader(handle)}
    assert wide["ana"]["5.6"] == "" and wide["dee"]["5.6"] == "0"
    summary = (own / "class-summary.md").read_text()
    assert "| 5.6 | " in summary and "| 0/1 |" in summary.split("| 5.6 | ")[1].split("\n")[0]


@needs_history
@pytest.mark.slow  # eight gradings of chapters 5 and 8, shared
def test_release_current_grades_every_exercise_of_the_course_now(older_class):
    _, current, _ = older_class
    learners, rows = gradebook_of(current)
    every = [e.id for e in engine.exercise_points([5, 8])]
    for name in ("ana", "bo", "cai", "dee"):
        assert sorted(e for (n, e) in rows if n == name) == sorted(every)
        assert learners[name]["not_in_release"] == {} and learners[name]["release"] == ""
    assert rows[("ana", "5.6")]["status"] == "error", "the older file lacks the Encoder"
    assert learners["ana"]["max_points"] == round(sum(
        r.max_points for r in engine.exercise_points([5, 8])), 2)


@needs_history
@pytest.mark.slow  # eight gradings of chapters 5 and 8, shared
def test_a_class_pinned_to_its_release_exports_that_release_s_maxima(older_class, capsys):
    """``--release COMMIT``: every learner on the older release, the one without a record
    too; Canvas's Points Possible line and the CSV's possible are that release's."""
    _, _, pinned = older_class
    learners, rows = gradebook_of(pinned)
    assert {w["release"] for w in learners.values()} == {OLD}
    assert not any(e in LATER for (_, e) in rows)
    assert "release-other" not in learners["dee"]["flags"]
    assert learners["dee"]["points"] == learners["ana"]["points"] > 0
    offered = {e: p for e, p in dependencies.points_offered().items() if e in OFFERED}
    roster = pinned / "roster.csv"
    roster.write_text("learner,lms_id\n" + "".join(f"{n},{i}\n" for i, n in enumerate(
        ("ana", "bo", "cai", "dee"), 100)))
    assert regrade.main(["export", "--out", str(pinned), "--format", "canvas", "--roster",
                         str(roster)]) == 0
    with (pinned / "grades-canvas.csv").open(newline="") as handle:
        canvas = list(csv.DictReader(handle))
    assert canvas[0]["Student"].strip() == "Points Possible"
    assert float(canvas[0]["Chapter 5"]) == sum(p for e, p in offered.items() if e[0] == "5")
    assert float(canvas[0]["Chapter 8"]) == sum(p for e, p in offered.items() if e[0] == "8")
    assert regrade.main(["export", "--out", str(pinned), "--format", "csv"]) == 0
    with (pinned / "grades-csv.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert {float(r["possible"]) for r in table} == {sum(offered.values())}
