"""A submission's repository at the commit to grade: its branch, its deadline, and what it
holds beyond them.

``regrade`` clones a repository whole (learners' repositories are small) and grades the head
of the branch it is told (default: the repository's own default branch), or the commit a
snapshot taken at the deadline saw on the branch it recorded (:mod:`.snapshot`). Git's dates
are the learner's to set, so they choose nothing: they are shown. Commits of that branch
that no branch held when the snapshot was taken are flagged (``after-deadline``, each with
the date it claims), one that claims a date before the deadline all the same
(``backdated``; never a commit of a branch the snapshot saw, such as work merged in from
another branch) or before its parent (``dated-before-parent``) too, and so is a branch
that holds work the graded one lacks (``other-branch``). The commit graded and the date it
claims are recorded in the gradebook.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from datetime import datetime
from pathlib import Path

CLONE_TIMEOUT = 300  # seconds
GIT_TIMEOUT = 60  # seconds, for each command that reads a clone
# The most a commit may hold to be checked out (the course's own tree: 260 files, 21 MB): a
# few hundred bytes of git can name the same large blob, or the same tree, many times over.
MAX_CHECKOUT_FILES = 20_000
MAX_CHECKOUT_BYTES = 256 * 2**20
MAX_BRANCHES = 20  # other branches compared with the graded one, the most recent first


class SubmissionError(RuntimeError):
    """A submission that cannot be fetched or read; its learner gets an ``error`` row."""


def without_credentials(source: str) -> str:
    """A URL as the gradebook may show it: no user or token before the host."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", source)


def _without_any_credentials(text: str) -> str:
    """``text`` with a user or token removed from every URL in it."""
    return re.sub(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@", r"\1", text)


def parse_deadline(text: str) -> datetime:
    """``2026-12-01T23:59+01:00`` as a moment; a time without its zone is refused (a class's
    learners and its machines are not all in one)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--deadline must be a date and time such as "
                         f"2026-12-01T23:59+01:00, got {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"--deadline needs its time zone, e.g. {text}+01:00 or {text}Z, "
                         f"got {text!r}")
    return moment


def _run(command: list[str], what: str, timeout: int) -> str:
    """Run git, never asking for a password; its output, or a :class:`SubmissionError` that
    says ``what`` failed and why (no URL's token in it: the command's text is not kept)."""
    try:
        done = subprocess.run(command, env=_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmissionError(f"{what}: no answer within {timeout} s") from None
    except OSError as error:
        raise SubmissionError(f"{what}: {error.strerror}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"git exited {done.returncode}"])[-1]
        raise SubmissionError(f"{what}: {_without_any_credentials(why)}")
    return done.stdout.strip()


def _env() -> dict[str, str]:
    """Git's environment: it never asks for a password, nor fetches large files."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1"}


def _git(clone: Path, *args: str) -> str:
    return _run(["git", "-C", str(clone), "-c", "filter.lfs.required=false", *args],
                f"git {args[0]} failed", GIT_TIMEOUT)


def clone(url: str, dest: Path) -> None:
    """Clone ``url`` (every branch, no work tree yet) into ``dest``."""
    _run(["git", "-c", "protocol.ext.allow=never", "clone", "--no-checkout", "--quiet", "--",
          url, str(dest)], f"cannot clone {without_credentials(url)}", CLONE_TIMEOUT)


def checkout(clone_dir: Path, who, branch: str | None, seen=None,
             deadline: datetime | None = None) -> None:
    """Check out, in ``clone_dir``, the commit to grade: the branch's head, or ``seen``'s
    commit (a :class:`~.snapshot.Seen`: the head at the deadline of ``branch``, the one it
    recorded); record it in ``who``
    (``commit``, ``commit_time``) and flag what came after it, dates that cannot be true,
    and other branches' work. ``deadline`` (else the snapshot's time): what a later commit
    that claims an earlier date is compared with."""
    ref = f"origin/{branch}" if branch else "origin/HEAD"
    try:
        _git(clone_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except SubmissionError:
        raise SubmissionError(f"the repository has no branch {branch!r}" if branch
                              else "the repository has no commit on its default branch") from None
    head = _git(clone_dir, "rev-parse", ref)
    if seen is None:
        chosen = head
    else:
        chosen = seen.commit
        try:
            _git(clone_dir, "cat-file", "-e", f"{chosen}^{{commit}}")
        except SubmissionError:
            raise SubmissionError(f"the commit seen at the deadline, {chosen[:10]}, is no "
                                  f"longer in the repository (its history was rewritten "
                                  f"after the snapshot)") from None
        _flag_later(clone_dir, who, seen, ref, deadline)
    _flag_dates(clone_dir, who, head)
    check_size(clone_dir, chosen)
    _git(clone_dir, "checkout", "--quiet", "--detach", chosen)
    who.commit = chosen
    who.commit_time = _git(clone_dir, "log", "-1", "--format=%cI", chosen)  # as it claims
    graded = head  # the branch's work, whatever the deadline
    others = [other for other in _git(
        clone_dir, "for-each-ref", "--sort=-committerdate", f"--count={MAX_BRANCHES + 3}",
        "--format=%(refname:short)", "refs/remotes/origin").splitlines()
        if other not in ("origin/HEAD", "origin", ref) and not other.endswith("/HEAD")]
    for other in others[:MAX_BRANCHES]:
        ahead = int(_git(clone_dir, "rev-list", "--count", f"{graded}..{other}"))
        if ahead:
            who.flag("other-branch", f"{other.removeprefix('origin/')[:100]} holds {ahead} "
                                     f"commit(s) the graded one lacks (not graded)")
    if len(others) > MAX_BRANCHES:
        who.flag("other-branch", f"more than {MAX_BRANCHES} other branches: only the "
                                 f"{MAX_BRANCHES} with the latest commits were compared")


MAX_LISTED = 5  # later commits named in a flag, the most recent first


def _flag_later(clone_dir: Path, who, seen, ref: str, deadline: datetime | None) -> None:
    """Flag the commits of ``ref`` that no branch held when the snapshot saw ``seen`` (a
    :class:`~.snapshot.Seen`: its commit and every branch's head then), with the dates they
    claim; those that claim one on or before ``deadline`` as ``backdated``, where the
    snapshot recorded every branch; and a branch that no longer holds ``seen``'s commit
    (rewritten)."""
    known = [f"^{commit}" for commit in (seen.heads or {}).values()]
    later = [line.split() for line in _git(
        clone_dir, "log", "--ignore-missing", "--format=%H %ct %cI", ref, f"^{seen.commit}",
        *known).splitlines()]
    if later:
        named = ", ".join(f"{h[:10]} dated {iso}" for h, _, iso in later[:MAX_LISTED])
        more = f" and {len(later) - MAX_LISTED} more" if len(later) > MAX_LISTED else ""
        unsure = ("" if seen.heads is not None else "; the snapshot did not record every "
                  "branch, so none is called backdated")
        who.flag("after-deadline", f"{len(later)} commit(s) pushed after the deadline's "
                                   f"snapshot (not graded): {named}{more}{unsure}")
    limit = deadline.timestamp() if deadline is not None and seen.heads is not None else None
    for commit, stamp, iso in later:
        if limit is not None and int(stamp) <= limit:
            who.flag("backdated", f"{commit[:10]} claims {iso}, on or before the deadline, "
                                  f"but was not there when the snapshot was taken")
    try:
        _git(clone_dir, "merge-base", "--is-ancestor", seen.commit, ref)
    except SubmissionError:
        who.flag("after-deadline", f"the branch no longer holds the commit graded, "
                                   f"{seen.commit[:10]}: its history was rewritten after the "
                                   f"deadline")


def _flag_dates(clone_dir: Path, who, commit: str, depth: int = 500) -> None:
    """Flag a commit of ``commit``'s history (its last ``depth``) that claims a date before
    one of its parents': a clock set back by hand (git's dates are the committer's)."""
    dates = {}
    parents = {}
    for line in _git(clone_dir, "log", f"-{depth}", "--format=%H %ct %P", commit).splitlines():
        sha, stamp, *ups = line.split()
        dates[sha], parents[sha] = int(stamp), ups
    odd = [sha for sha, ups in parents.items()
           if any(up in dates and dates[sha] < dates[up] for up in ups)]
    for sha in odd[:MAX_LISTED]:
        who.flag("dated-before-parent", f"{sha[:10]} claims a date before its parent's")


def check_size(clone_dir: Path, commit: str) -> None:
    """A :class:`SubmissionError` when ``commit``'s files number more than
    :data:`MAX_CHECKOUT_FILES` or add up to more than :data:`MAX_CHECKOUT_BYTES`, read from
    git's listing of its tree (stopped as soon as either is passed, and after
    :data:`GIT_TIMEOUT` seconds), before anything is written."""
    command = ["git", "-C", str(clone_dir), "ls-tree", "-r", "-l", "--full-tree", commit]
    files = size = 0
    over, late = False, threading.Event()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          env=_env()) as process:
        def stop() -> None:
            late.set()
            process.kill()

        timer = threading.Timer(GIT_TIMEOUT, stop)
        timer.start()
        assert process.stdout is not None
        try:
            for line in process.stdout:  # "mode type object size\tpath"
                fields = line.split(b"\t", 1)[0].split()
                files += 1
                size += int(fields[3]) if len(fields) == 4 and fields[3].isdigit() else 0
                over = files > MAX_CHECKOUT_FILES or size > MAX_CHECKOUT_BYTES
                if over:
                    process.kill()
                    break
        finally:
            timer.cancel()
    if over:
        raise SubmissionError(
            f"the commit to grade holds more than {MAX_CHECKOUT_FILES:,} files or "
            f"{MAX_CHECKOUT_BYTES // 2**20} MB (the same file may be named many times); "
            f"it was not checked out")
    if late.is_set():
        raise SubmissionError(f"git ls-tree failed: no answer within {GIT_TIMEOUT} s")
    if process.returncode != 0:
        raise SubmissionError("git ls-tree failed: the commit's files could not be listed")


def fetch(source: str, dest: Path, who, branch: str | None = None, seen=None,
          deadline: datetime | None = None, is_url: bool = True) -> Path:
    """The folder to grade: a clone of ``source`` at the commit to grade (``seen``'s, else
    the branch's head), in ``dest`` (a folder that is a repository is cloned too when a
    branch or a snapshot is given)."""
    clone(source if is_url else str(Path(source).resolve()), dest)
    checkout(dest, who, branch, seen, deadline)
    return dest
