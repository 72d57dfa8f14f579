"""``regrade``'s other commands over a class's folder, and what they share with it.

``regrade merge`` (shards and overrides into one gradebook), ``regrade snapshot`` (each
repository's head at the deadline, :mod:`.snapshot`) and ``regrade export`` (the gradebook
as the CSV an LMS imports, :mod:`.lms`); the flags that compare a learner with the class
(the identical-file flag, a release other than the class's); the learners' names; the files
written after every run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from annotated_transformer.course.instructor import (
    class_summary,
    gradebook,
    lms,
    repositories,
    snapshot,
)
from annotated_transformer.course.instructor.submissions import same_files


def is_git_url(text: str) -> bool:
    """Whether ``text`` names a repository to clone rather than a folder."""
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text)
                or re.match(r"^[\w.-]+@[\w.-]+:", text))


def default_name(source: str) -> str:
    """A learner's name from the submission: the folder's or the repository's name."""
    if is_git_url(source):
        tail = re.split(r"[/:]", source.rstrip("/"))[-1]
        return tail.removesuffix(".git") or "submission"
    return Path(source).resolve().name or "submission"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``error:`` line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def build_merge_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m annotated_transformer regrade merge",
                     description="Merge the gradebooks of several regrade runs (shards) into "
                     "--out; a learner graded in several keeps the rows of the last folder "
                     "named.")
    parser.add_argument("folders", nargs="*", type=Path, metavar="DIR",
                        help="a folder that holds a gradebook.json")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the merged class's folder (its gradebook, if any, is kept)")
    parser.add_argument("--overrides", type=Path, metavar="FILE",
                        help="a CSV of manual adjustments (learner, exercise, points, reason) "
                        "to add: with no DIR, this updates --out's outputs without grading")
    return parser


def warn_unmatched(book: gradebook.Gradebook, out: Path) -> None:
    """Say which overrides apply to nothing (kept in ``overrides-unmatched.csv``)."""
    for o in book.unmatched_overrides():
        print(f"warning: the override of {o.learner!r} {o.exercise!r} names no graded "
              f"exercise of the gradebook: not applied (listed in "
              f"{out / 'overrides-unmatched.csv'})", file=sys.stderr)


def write_all(out: Path, book: gradebook.Gradebook, about: dict[str, Any]) -> None:
    """The gradebook's files, then the class's summary rebuilt from the whole gradebook."""
    gradebook.write(out, book, about)
    class_summary.write(out, book.rows, len(book.learners))


def learner_names(sources: list[str], names: str | None) -> list[str]:
    """One distinct name per submission: those given, else each one's own (numbered when
    two are alike)."""
    if names is not None:
        given = [n.strip() for n in names.split(",")]
        if len(given) != len(sources):
            raise ValueError(f"--names gives {len(given)} name(s) for {len(sources)} "
                             f"submission(s)")
        if not all(given) or len(set(given)) != len(given):
            raise ValueError(f"--names must be distinct and not empty, got {names!r}")
        return given
    found: list[str] = []
    for source in sources:
        name, number = default_name(source), 2
        while name in found:
            name, number = f"{default_name(source)}-{number}", number + 1
        found.append(name)
    return found


def flag_against_class(book: gradebook.Gradebook) -> None:
    """Flag, in every learner's record and rows, what compares them with the class: the
    chapter files another learner handed in too (``identical-file``:
    :func:`.submissions.same_files`), and a release other than most of the class's
    (``release-other``, where the learners' own records chose)."""
    found = same_files(book.learners)
    graded = {name for name, who in book.learners.items() if who.status != "error"}
    releases = Counter(book.learners[name].release for name in graded)
    usual, count = releases.most_common(1)[0] if graded else ("", 0)
    for name, who in book.learners.items():
        for flag in gradebook.CLASS_FLAGS:
            who.flags.pop(flag, None)
        if name in found:
            who.flags["identical-file"] = found[name]
        if name in graded and who.release != usual:
            who.flags["release-other"] = [
                f"graded against {_release_name(who.release)}; {count} of {len(graded)} "
                f"learners against {_release_name(usual)}"]
    book.rows = [replace(r, flags=";".join(sorted(book.learners[r.learner].flags)))
                 if r.learner in book.learners else r for r in book.rows]


def _release_name(commit: str) -> str:
    return f"the release of commit {commit[:12]}" if commit else "the course as it is now"


def build_export_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m annotated_transformer regrade export",
                     description="Write --out's gradebook as the CSV an LMS imports.")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the class's folder (its gradebook.json)")
    parser.add_argument("--format", required=True, choices=lms.FORMATS,
                        help="canvas (Student, ID, SIS User ID, SIS Login ID, Section, and a "
                        "Points Possible line), moodle (ID number and the grade items; no "
                        "other line), or csv")
    parser.add_argument("--roster", type=Path, metavar="FILE",
                        help="the class's roster (learner, repository, branch, lms_id, "
                        "section): each learner's LMS id and section")
    parser.add_argument("--columns", choices=("chapters", "total"), default="chapters",
                        help="one assignment a chapter graded (default), or one for the course")
    parser.add_argument("--to", type=Path, metavar="FILE",
                        help="where to write it (default: DIR/grades-FORMAT.csv)")
    return parser


def export_main(argv: list[str]) -> int:
    parser = build_export_parser()
    args = parser.parse_args(argv)
    try:
        if not (args.out / "gradebook.json").is_file():
            raise ValueError(f"--out {args.out} holds no gradebook.json")
        book = gradebook.read(args.out)
        roster = lms.read_roster(args.roster) if args.roster is not None else []
    except (OSError, ValueError) as error:
        parser.error(str(error))
    totals: dict[str, dict[str, float]] = {name: {} for name in book.learners}
    possible: dict[str, float] = {}
    for row in book.effective_rows():
        if row.id:
            totals.setdefault(row.learner, {})[row.id] = row.points
            possible[row.id] = row.max_points
    text, left_out = lms.export(args.format, totals, possible, roster, args.columns)
    target = args.to or args.out / f"grades-{args.format}.csv"
    target.write_text(text, encoding="utf-8")
    for name in left_out:
        print(f"warning: {name} is not in the export: the roster gives no lms_id for them",
              file=sys.stderr)
    print(f"{args.format} gradebook: {target} ({len(totals) - len(left_out)} learner(s))")
    return 0


def build_snapshot_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m annotated_transformer regrade snapshot",
                     description="At the deadline: record each repository's branch, its head "
                     "commit, every branch's head and the time it was seen, signed, into "
                     "--out (snapshot-TIME.json); then 'regrade ... --snapshot FILE' grades "
                     "those commits.")
    parser.add_argument("submissions", nargs="*", metavar="REPOSITORY",
                        help="a learner's git URL (or repository folder), or --roster")
    parser.add_argument("--roster", type=Path, metavar="FILE",
                        help="the class's roster (learner, repository, branch, lms_id, "
                        "section): each line's repository, at its branch, under its name")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the class's folder (it keeps the key that signs snapshots)")
    parser.add_argument("--names", metavar="A,B,...",
                        help="the learners' names, one per repository, in order")
    parser.add_argument("--branch", metavar="NAME",
                        help="the branch to record where the roster names none (default: "
                        "each repository's default, recorded by its name)")
    parser.add_argument("--deadline", metavar="WHEN",
                        help="the deadline it is taken for, e.g. 2026-12-01T23:59+01:00 "
                        "(recorded; later commits claiming an earlier date are flagged)")
    return parser


def snapshot_main(argv: list[str]) -> int:
    parser = build_snapshot_parser()
    args = parser.parse_args(argv)
    try:
        branches: dict[str, str] = {}
        if args.roster is not None:
            if args.submissions or args.names:
                raise ValueError("--roster names the repositories and the learners: give no "
                                 "REPOSITORY and no --names with it")
            args.submissions, learners, branches = lms.repositories_of(args.roster)
            args.names = ",".join(learners)
        if not args.submissions:
            raise ValueError("give each REPOSITORY (a git URL or folder), or --roster FILE")
        names = learner_names(args.submissions, args.names)
        deadline = repositories.parse_deadline(args.deadline) if args.deadline else None
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is not a folder")
        path = snapshot.take(args.submissions, names, args.branch, args.out, deadline,
                             branches)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    taken = snapshot.load(path)
    for seen in taken.seen.values():
        where = f" on {seen.branch}" if seen.branch else ""
        print(f"{seen.learner}: {seen.commit[:10] or 'NOT READ'}{where} at {seen.seen_at}"
              + (f" ({seen.error})" if seen.error else ""))
    print(f"Snapshot: {path} (grade it with: regrade ... --snapshot {path})")
    return 1 if any(not s.commit for s in taken.seen.values()) else 0


def merge_main(argv: list[str]) -> int:
    parser = build_merge_parser()
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is not a folder")
    try:
        with gradebook.locked(args.out):
            return _merge(args)
    except gradebook.FolderBusy as error:
        parser.error(str(error))


def _merge(args: argparse.Namespace) -> int:
    """``regrade merge``, holding ``--out``."""
    parser = build_merge_parser()
    try:
        book = gradebook.read(args.out)
        for folder in args.folders:
            if not (folder / "gradebook.json").is_file():
                raise ValueError(f"{folder} holds no gradebook.json")
            book.merge(gradebook.read(folder))
        if not args.folders and not (args.out / "gradebook.json").is_file():
            raise ValueError(f"--out {args.out} holds no gradebook.json to update")
        last = args.folders[-1] if args.folders else args.out  # what the runs share
        data = json.loads((last / "gradebook.json").read_text())
        about = {k: data.get(k) for k in ("seed", "course", "sandbox", "flags")}
        if args.overrides is not None:
            book.add_overrides(gradebook.read_overrides(args.overrides))
    except (OSError, ValueError) as error:
        parser.error(str(error))
    warn_unmatched(book, args.out)
    flag_against_class(book)
    write_all(args.out, book, about)
    merged = (f"Merged {len(args.folders)} gradebook(s) into {args.out}" if args.folders
              else f"Updated {args.out}")
    applied = (f", {len(book.overrides) - len(book.unmatched_overrides())} override(s) "
               f"applied" if args.overrides is not None else "")
    print(f"{merged}{applied}: {len(book.learners)} learner(s)")
    return 0
