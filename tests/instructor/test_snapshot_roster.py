"""Snapshots that agree with the roster: ``regrade snapshot --roster`` records each
learner's branch as the roster names it (the default branch by its name) and every
branch's head; ``regrade`` refuses a roster branch that differs from the snapshot's, and
never calls a commit of a branch the snapshot saw ``backdated``.

The repositories are hand-made here, their commits dated with ``GIT_COMMITTER_DATE``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_regrade import CH01, FULL, course_copy

from annotated_transformer.course.grading import boundary, manifest
from annotated_transformer.course.instructor import regrade, repositories, snapshot
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.course.instructor.snapshot import Seen
from annotated_transformer.layout import SOLUTIONS_DIR

DEADLINE = "2026-12-02T23:59+01:00"


def git(repo: Path, *args: str, when: str | None = None) -> str:
    env = dict(os.environ)
    if when:
        env |= {"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when}
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=l", "-c",
                           "user.email=l@x", *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def commit(repo: Path, when: str | None, message: str) -> str:
    (repo / "work.txt").write_text(message)
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", message, when=when)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def dev_work(tmp_path) -> Path:
    """main: one commit; dev: two more, made on time (before the deadline)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(repo)], check=True)
    commit(repo, "2026-12-01T10:00:00+01:00", "start")
    git(repo, "checkout", "--quiet", "-b", "dev")
    commit(repo, "2026-12-01T12:00:00+01:00", "dev one")
    commit(repo, "2026-12-01T13:00:00+01:00", "dev two")
    git(repo, "checkout", "--quiet", "main")
    return repo


def roster(path: Path, lines: list[tuple[str, str, str]]) -> Path:
    path.write_text("learner,repository,branch\n" + "".join(
        f"{name},{repo},{branch}\n" for name, repo, branch in lines))
    return path


def test_the_snapshot_records_the_roster_s_branch_and_every_head(dev_work, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(dev_work, other)
    listed = roster(tmp_path / "roster.csv", [("ann", dev_work.as_uri(), "dev"),
                                              ("ben", other.as_uri(), "")])
    assert regrade.main(["snapshot", "--roster", str(listed), "--out", str(tmp_path / "class"),
                         "--deadline", DEADLINE]) == 0
    assert "ann: " in capsys.readouterr().out
    taken = snapshot.load(next((tmp_path / "class").glob("snapshot-*.json")))
    heads = {"main": git(dev_work, "rev-parse", "main"), "dev": git(dev_work, "rev-parse", "dev")}
    ann, ben = taken.seen["ann"], taken.seen["ben"]
    assert (ann.branch, ann.commit, ann.heads) == ("dev", heads["dev"], heads)
    assert (ben.branch, ben.commit) == ("main", heads["main"]), "the default, by its name"


def test_a_roster_branch_other_than_the_snapshot_s_is_refused(dev_work, tmp_path, capsys):
    """The snapshot recorded ann's default branch; the roster says dev: regrade stops before
    grading anyone, naming the learner and both branches."""
    taken = snapshot.take([dev_work.as_uri()], ["ann"], None, tmp_path / "class")
    listed = roster(tmp_path / "roster.csv", [("ann", dev_work.as_uri(), "dev")])
    with pytest.raises(SystemExit) as stopped:
        regrade.main(["--roster", str(listed), "--snapshot", str(taken), "--out",
                      str(tmp_path / "grades")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ann: the roster or --branch names 'dev', the snapshot recorded " \
        "'main'" in err[0], err
    assert not (tmp_path / "grades" / "gradebook.json").exists()
    on_dev = snapshot.take([dev_work.as_uri()], ["ann"], "dev", tmp_path / "class")
    assert on_dev != taken, "a second snapshot of the same second is a file of its own"
    with pytest.raises(ValueError, match="ann: the roster or --branch names 'main'"):
        snapshot.check_branches(snapshot.load(on_dev), {"ann": "main"})
    snapshot.check_branches(snapshot.load(taken), {"ann": None})  # none named: the snapshot's
    snapshot.check_branches(snapshot.load(taken), {"ann": "main"})


def test_work_merged_from_a_branch_the_snapshot_saw_is_never_backdated(dev_work, tmp_path):
    """After the snapshot, dev's on-time commits are merged into main, and one commit dated
    before the deadline is pushed: only the merge and that commit came after, and only that
    one is backdated."""
    deadline = repositories.parse_deadline(DEADLINE)
    taken = snapshot.take([str(dev_work)], ["ann"], None, tmp_path / "class", deadline)
    git(dev_work, "merge", "--quiet", "--no-ff", "dev", "-m", "merge dev")
    late = commit(dev_work, "2026-12-01T21:00:00+01:00", "backdated")
    seen = snapshot.load(taken).seen["ann"]
    who = Learner("ann", "repo")
    repositories.fetch(dev_work.as_uri(), tmp_path / "c", who, seen.branch, seen, deadline)
    assert who.commit == seen.commit
    assert who.flags["after-deadline"][0].startswith("2 commit(s) pushed after the deadline's "
                                                    "snapshot (not graded): ")
    assert who.flags["backdated"] == [
        f"{late[:10]} claims 2026-12-01T21:00:00+01:00, on or before the deadline, but was "
        f"not there when the snapshot was taken"]
    # a snapshot that did not record the other branches cannot tell: it calls none backdated
    unsure = Seen("ann", "repo", "main", seen.commit, seen.seen_at, heads=None)
    who = Learner("ann", "repo")
    repositories.fetch(dev_work.as_uri(), tmp_path / "d", who, "main", unsure, deadline)
    assert "backdated" not in who.flags
    assert who.flags["after-deadline"][0].startswith("4 commit(s) pushed after")
    assert who.flags["after-deadline"][0].endswith("the snapshot did not record every branch, "
                                                   "so none is called backdated")


def test_a_default_branch_changed_after_the_snapshot_grades_the_branch_recorded(dev_work,
                                                                              tmp_path):
    """The learner makes dev the default after the deadline: the snapshot named main, so
    main's commit is graded, and dev's commits are neither later nor backdated."""
    deadline = repositories.parse_deadline(DEADLINE)
    taken = snapshot.take([str(dev_work)], ["ann"], None, tmp_path / "class", deadline)
    git(dev_work, "symbolic-ref", "HEAD", "refs/heads/dev")
    seen = snapshot.load(taken).seen["ann"]
    assert seen.branch == "main"
    who = Learner("ann", "repo")
    clone = repositories.fetch(dev_work.as_uri(), tmp_path / "c", who, seen.branch, seen,
                               deadline)
    assert (clone / "work.txt").read_text() == "start"
    assert not {"after-deadline", "backdated"} & set(who.flags), who.flags


@pytest.mark.slow  # two gradings of chapter 1
@pytest.mark.skipif(boundary.unavailable() is not None, reason="no bubblewrap")
def test_a_learner_on_the_roster_s_branch_is_graded_there_through_regrade(tmp_path):
    """The class of the roster: ann works on dev, which the roster names; the snapshot is
    taken with the roster and graded with it: ann's chapter 1 on dev earns every point and
    nothing is flagged as after the deadline or backdated."""
    pristine = course_copy(tmp_path / "pristine")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest.compute(pristine)))
    repo = course_copy(tmp_path / "ann", pristine)
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "the release", when="2026-11-01T10:00:00+01:00")
    git(repo, "checkout", "--quiet", "-b", "dev")
    shutil.copyfile(SOLUTIONS_DIR / CH01, repo / "exercises" / CH01)
    git(repo, "commit", "--quiet", "-am", "chapter 1", when="2026-12-01T12:00:00+01:00")
    git(repo, "checkout", "--quiet", "main")
    listed = roster(tmp_path / "roster.csv", [("ann", repo.as_uri(), "dev")])
    out = tmp_path / "grades"
    assert regrade.main(["snapshot", "--roster", str(listed), "--out", str(out),
                         "--deadline", DEADLINE]) == 0
    taken = next(out.glob("snapshot-*.json"))
    assert regrade.main(["--roster", str(listed), "--snapshot", str(taken), "--out", str(out),
                         "--chapter", "1", "--jobs", "1", "--manifest",
                         str(tmp_path / "manifest.json")]) == 0
    data = json.loads((out / "gradebook.json").read_text())
    ann = data["learners"][0]
    assert ann["points"] == FULL and ann["commit"] == git(repo, "rev-parse", "dev")
    assert not {"after-deadline", "backdated", "other-branch"} & set(ann["flags"]), ann["flags"]
