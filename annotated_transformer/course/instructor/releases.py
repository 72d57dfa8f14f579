"""What each learner is graded against: the release they were given, or the course now.

A learner's repository carries the record of its release (``course-release.json``,
:mod:`~annotated_transformer.course.distribution.release_record`); ``regrade`` reads its
commit and the release itself from the course's history, and grades the learner only on the
exercises that release offered, with the course's tests as they are now. An exercise is
offered when the release had it (the same title, whatever its number there; or the same
number, reworded, when no exercise of the course now has that number's old title) and had
every exercise its tests now build on: a capstone that now builds on an exercise added
later cannot be graded for that release. Every other exercise of the chapters graded is
*not in your release*: no points, and none on offer. The grading files and workflows are
compared with that release's, and its stubs are what the copy check sets aside.

``--release current`` grades every learner on the course as it is now; ``--release
COMMIT`` on the release of that commit, whatever their repositories say. A repository
without a record is graded on the course as it is now, with a note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from annotated_transformer.course.distribution import release_record
from annotated_transformer.course.distribution.release_record import RECORD, Release
from annotated_transformer.course.grading import dependencies
from annotated_transformer.course.instructor.gradebook import Learner
from annotated_transformer.course.instructor.submissions import read_regular
from annotated_transformer.layout import WORKFLOWS_DIR

OWN, CURRENT = "own", "current"  # --release: each learner's own; the course as it is now


@dataclass(frozen=True)
class Basis:
    """What one learner is graded against: ``commit`` (the release's; "" for the course as
    it is now), the exercises graded (None: every one), those left out with why, the stubs
    the copy check sets aside, the grading manifest and workflows compared with, and a note
    for the learner."""

    commit: str = ""
    exercises: frozenset[str] | None = None
    left_out: dict[str, str] = field(default_factory=dict)  # {exercise: why not graded}
    stubs: dict[str, str] = field(default_factory=dict)  # {chapter file: the release's stub}
    grading_files: dict[str, Any] | None = None  # None: the run's --manifest
    workflows: dict[str, bytes] | None = None  # None: the course's own workflows
    note: str = ""


def offered(release: dict[str, str], titles: dict[str, str],
            builds_on: dict[str, tuple[str, ...]]) -> tuple[dict[str, str], dict[str, str]]:
    """Which of the course's exercises now (``titles``: ``{id: title}``, ``builds_on``: what
    their tests build on) a release with the exercises ``release`` (``{id: title}``) offered:
    ``({id now: its id in the release}, {id now: why it is not graded})``.

    The same title is the same exercise, whatever its number; a number whose title changed
    is the same exercise reworded, unless an exercise of the course now has its old title
    (then the number went to a new exercise). An exercise whose tests now build on one left
    out is left out too."""
    by_title = {title: e for e, title in release.items()}
    now_titles = set(titles.values())
    kept: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for exercise, title in titles.items():
        if title in by_title:
            kept[exercise] = by_title[title]
        elif exercise in release and release[exercise] not in now_titles:
            kept[exercise] = exercise
        else:
            left_out[exercise] = "added to the course after your release"
    changed = True
    while changed:  # follow the chains: 8.6 builds on 8.5, which builds on 5.6
        changed = False
        for exercise in sorted(kept, key=dependencies.order):
            missing = [e for e in builds_on.get(exercise, ()) if e in left_out]
            if missing:
                del kept[exercise]
                left_out[exercise] = (f"its tests now build on {', '.join(missing)}, which "
                                      f"your release did not have")
                changed = True
    return kept, left_out


def of_release(release: Release, how: str) -> Basis:
    """The basis of ``release``; ``how``: how it was chosen, for the note."""
    declared = dependencies.read()
    kept, left_out = offered(release.titles, dict(declared.titles), dict(declared.builds_on))
    renumbered = [f"{now} was {then}" for now, then in sorted(
        kept.items(), key=lambda item: dependencies.order(item[0])) if now != then]
    note = (f"Graded on the exercises of your release, the course at commit "
            f"{release.commit[:12]} ({how}), with the course's tests now")
    note += f"; your release numbered them otherwise: {', '.join(renumbered)}." if renumbered \
        else "."
    return Basis(release.commit, frozenset(kept), left_out, release.stubs,
                 release.grading_files, release.workflows, note)


def for_learner(root: Path, choice: str, who: Learner) -> Basis:
    """What the learner whose files are in ``root`` is graded against: ``choice`` is
    ``--release`` (``own``, ``current`` or a commit). A record that cannot be used is
    flagged (``release-unknown``) and the course as it is now is the basis."""
    if choice == CURRENT:
        return Basis(note="Graded on every exercise of the course as it is now.")
    if choice != OWN:
        return of_release(release_record.at_commit(choice), "your instructor's choice")
    if not os.path.lexists(root / RECORD):
        return Basis(note=f"Your repository holds no {RECORD}, the record of the release it "
                          f"was made from: graded on every exercise of the course as it is "
                          f"now.")
    data = read_regular(root / RECORD)
    try:
        if isinstance(data, str):
            raise ValueError(f"{RECORD} is not a regular file of at most 1 MB ({data})")
        release = release_record.at_commit(release_record.commit_of(data))
    except ValueError as why:
        who.flag("release-unknown", f"{why}: graded on the course as it is now")
        return Basis(note=f"Your {RECORD} could not be used: graded on every exercise of "
                          f"the course as it is now.")
    return of_release(release, f"as your {RECORD} says")


def workflows_folder(basis: Basis, tmp: Path) -> Path:
    """The folder of the workflows a learner's are compared with: the course's own, or the
    release's, written into the new folder ``tmp``."""
    if basis.workflows is None:
        return WORKFLOWS_DIR
    tmp.mkdir()
    for name, data in basis.workflows.items():
        (tmp / name).write_bytes(data)
    return tmp
