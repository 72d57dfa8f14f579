"""A class graded as instructors do: in parallel, in shards merged afterwards, and one
learner graded again later (only their rows change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_regrade import FULL, course_copy, solve_chapter_1

from annotated_transformer.course.grading import manifest
from annotated_transformer.course.instructor import regrade


def rows(folder: Path, leave_out: tuple[str, ...] = ("graded_at",)) -> list[tuple]:
    """The gradebook's rows without the time they were graded at (nor ``leave_out``)."""
    data = json.loads((folder / "gradebook.json").read_text())
    return sorted(tuple(v for k, v in r.items() if k not in leave_out) for r in data["rows"])


@pytest.mark.slow  # seven gradings of chapter 1
@pytest.mark.alone  # regrade --jobs 2
def test_a_class_in_parallel_in_shards_and_one_learner_again(tmp_path):
    pristine = course_copy(tmp_path / "pristine")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest.compute(pristine)))
    ann = solve_chapter_1(course_copy(tmp_path / "ann", pristine))
    ben = course_copy(tmp_path / "ben", pristine)
    cy = solve_chapter_1(course_copy(tmp_path / "cy", pristine))
    common = ["--chapter", "1", "--seed", "3", "--manifest", str(tmp_path / "manifest.json")]
    subs = [str(ann), str(ben), str(cy)]
    whole, merged = tmp_path / "whole", tmp_path / "merged"
    assert regrade.main([*subs, "--out", str(whole), "--jobs", "2", *common]) == 0
    for k in (1, 2):
        assert regrade.main([*subs, "--out", str(tmp_path / f"s{k}"), "--shard", f"{k}/2",
                             "--jobs", "1", *common]) == 0
    assert regrade.main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"),
                         "--out", str(merged)]) == 0
    assert rows(merged) == rows(whole)
    assert (merged / "grades-wide.csv").read_text() == (whole / "grades-wide.csv").read_text()
    # the class's flags aside: ann's and cy's chapter 1 are the same, 2 of 3 (rare enough)
    aside = ("graded_at", "flags")
    before = [r for r in rows(whole, aside) if r[0] != "ben"]
    flagged = json.loads((whole / "gradebook.json").read_text())["rows"]
    assert {r["learner"]: r["flags"] for r in flagged}["ann"] == "identical-file"
    # ben hands in chapter 1 later: graded again alone, into the class's folder
    solve_chapter_1(ben)
    assert regrade.main([str(ben), "--out", str(whole), *common]) == 0
    assert [r for r in rows(whole, aside) if r[0] != "ben"] == before
    data = json.loads((whole / "gradebook.json").read_text())
    # now all three share it, more than a quarter of the class: no one is flagged
    assert all("identical-file" not in w["flags"] for w in data["learners"])
    assert {w["learner"]: w["points"] for w in data["learners"]} == {
        "ann": FULL, "ben": FULL, "cy": FULL}
    summary = (whole / "class-summary.md").read_text()
    assert "3 submission(s)" in summary
    assert sorted(p.name for p in (whole / "feedback").iterdir()) == [
        "ann.md", "ben.md", "cy.md"]
