"""A submission's repository at the commit to grade: its branch, its deadline, and what it
holds beyond them.

``regrade`` clones a repository whole (learners' repositories are small) and grades the last
commit of the branch it is told (default: the repository's own default branch) made on or
before the deadline, by its committer date. That date is the learner's computer's clock, as
in every tool that reads git: a commit after the deadline is flagged (``after-deadline``),
with its date, for the instructor to look at, and so is a branch that holds work the graded
one lacks (``other-branch``). The commit graded and its date are recorded in the gradebook.
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


def checkout(clone_dir: Path, who, branch: str | None, deadline: datetime | None) -> None:
    """Check out, in ``clone_dir``, the commit to grade; record it in ``who`` (``commit``,
    ``commit_time``) and flag later commits and other branches' work."""
    ref = f"origin/{branch}" if branch else "origin/HEAD"
    try:
        _git(clone_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except SubmissionError:
        raise SubmissionError(f"the repository has no branch {branch!r}" if branch
                              else "the repository has no commit on its default branch") from None
    history = [line.split() for line in
               _git(clone_dir, "log", "--first-parent", "--format=%H %ct %cI", ref).splitlines()]
    chosen = history[0] if history else None
    if deadline is not None:
        limit = deadline.timestamp()
        chosen = next((entry for entry in history if int(entry[1]) <= limit), None)
        if chosen is None:
            raise SubmissionError(f"no commit on {branch or 'the default branch'} on or before "
                                  f"the deadline {deadline.isoformat()}")
        later = [entry for entry in history if int(entry[1]) > limit]
        if later:
            who.flag("after-deadline", f"{len(later)} commit(s) after the deadline, the last "
                                       f"of {later[0][2]} (not graded)")
    commit, _, when = chosen
    check_size(clone_dir, commit)
    _git(clone_dir, "checkout", "--quiet", "--detach", commit)
    who.commit, who.commit_time = commit, when
    graded = _git(clone_dir, "rev-parse", ref)  # the branch's work, whatever the deadline
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
        timer = threading.Timer(GIT_TIMEOUT, lambda: (late.set(), process.kill()))
        timer.start()
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


def fetch(source: str, dest: Path, who, branch: str | None = None,
          deadline: datetime | None = None, is_url: bool = True) -> Path:
    """The folder to grade: a clone of ``source`` at the commit to grade, in ``dest``
    (a folder that is a repository is cloned too when a branch or a deadline is given)."""
    clone(source if is_url else str(Path(source).resolve()), dest)
    checkout(dest, who, branch, deadline)
    return dest
