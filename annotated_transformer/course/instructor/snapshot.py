"""The deadline as the instructor saw it: each repository's head commit, recorded when seen.

Git's dates are the learner's to set (``GIT_COMMITTER_DATE``): a commit made after the
deadline can say it was made before. So the grade never chooses a commit by its date.
``regrade snapshot`` runs at the deadline (by hand, cron or a scheduled workflow), asks each
repository for its branch's head (``git ls-remote``, nothing cloned) and writes what it saw,
with the instructor's clock, into a file of the class folder signed with a key kept there
(HMAC-SHA256): ``regrade --snapshot FILE`` then grades exactly those commits and refuses a
file that was changed. It records each repository's branch by name (the roster's, with
``--roster``; else ``--branch``; else the default branch, named as it was then) and every
branch's head: ``regrade`` grades the branch recorded and refuses a roster or ``--branch``
that names another (:func:`check_branches`). Commits pushed later are flagged with the dates
they claim, and one that no branch held at the deadline and claims a date before it is
flagged as backdated (a commit of any branch the snapshot saw never is), as is one dated
before its parent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

KEY_FILE = "snapshot.key"  # in the class folder, readable by its owner only
LS_REMOTE_TIMEOUT = 120  # seconds a repository may take to answer
MAX_HEADS = 1000  # branches' heads recorded a repository (more: none is called backdated)


@dataclass(frozen=True)
class Seen:
    """One repository at the deadline: its head commit then, or why there was none."""

    learner: str
    source: str  # without credentials
    branch: str | None  # the branch recorded (None: the default, unnamed in older files)
    commit: str  # "" when none could be read
    seen_at: str  # the instructor's clock, UTC, ISO 8601
    error: str = ""
    # {branch: its head commit then}, every branch of the repository; None where they were
    # not all recorded (more than MAX_HEADS, or a file written before they were)
    heads: dict[str, str] | None = None


@dataclass(frozen=True)
class Snapshot:
    taken_at: str
    deadline: str | None
    seen: dict[str, Seen]  # by learner


def _key(folder: Path) -> bytes:
    """The class folder's signing key, made on first use (mode 600)."""
    path = folder / KEY_FILE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def _signature(key: bytes, body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def heads(source: str) -> tuple[str | None, str, dict[str, str]]:
    """What ``source`` holds now, read with one ``git ls-remote`` (nothing cloned): the name
    of its default branch (None where the server does not say), the commit its ``HEAD``
    points at ("" for none) and ``{branch: head commit}``; a
    :class:`~.repositories.SubmissionError` when it cannot be read."""
    from annotated_transformer.course.instructor import repositories

    shown = repositories.without_credentials(source)
    listing = repositories._run(["git", "-c", "protocol.ext.allow=never", "ls-remote",
                                 "--symref", "--", source, "HEAD", "refs/heads/*"],
                                f"cannot read {shown}", LS_REMOTE_TIMEOUT)
    default, head, found = None, "", {}
    for line in listing.splitlines():
        left, _, name = line.partition("\t")
        if left.startswith("ref: refs/heads/") and name == "HEAD":
            default = left.removeprefix("ref: refs/heads/")
        elif re.fullmatch(r"[0-9a-f]{40}", left):
            if name == "HEAD":
                head = left
            elif name.startswith("refs/heads/"):
                found[name.removeprefix("refs/heads/")] = left
    return default, head, found


def see(source: str, name: str, branch: str | None) -> Seen:
    """``name``'s repository ``source`` now: the head of ``branch`` (default: the default
    branch, recorded by its name), and every branch's head."""
    from annotated_transformer.course.instructor import repositories

    shown = repositories.without_credentials(source)
    place = str(Path(source).resolve()) if Path(source).exists() else source
    try:
        default, head, found = heads(place)
        commit = found.get(branch, "") if branch else head
        if not commit:
            raise repositories.SubmissionError(
                f"the repository has no branch {branch!r}" if branch
                else "the repository has no commit on its default branch")
    except repositories.SubmissionError as why:
        return Seen(name, shown, branch, "", now(), str(why))
    recorded = found if len(found) <= MAX_HEADS else None
    return Seen(name, shown, branch or default, commit, now(), heads=recorded)


def take(sources: list[str], names: list[str], branch: str | None, folder: Path,
         deadline: datetime | None = None, branches: dict[str, str] | None = None) -> Path:
    """Record each repository's head now into ``folder/snapshot-TIME.json``, signed:
    ``branches`` (``{learner: branch}``, the roster's) where it names one, else
    ``branch``, else the default branch."""
    taken_at = now()
    seen = []
    for source, name in zip(sources, names, strict=True):
        seen.append(see(source, name, (branches or {}).get(name) or branch))
    body = {"taken_at": taken_at, "deadline": deadline.isoformat() if deadline else None,
            "seen": [asdict(s) for s in seen]}
    body["signature"] = _signature(_key(folder), body)
    stem, number = f"snapshot-{taken_at.replace(':', '')}", 1
    while True:  # two snapshots of one second: each its own file
        path = folder / (f"{stem}.json" if number == 1 else f"{stem}-{number}.json")
        try:
            with path.open("x") as handle:
                handle.write(json.dumps(body, indent=2) + "\n")
            return path
        except FileExistsError:
            number += 1


def check_branches(taken: Snapshot, wanted: dict[str, str | None]) -> None:
    """A ``ValueError`` naming each learner whose branch to grade (``wanted``: the roster's
    or ``--branch``; None: no branch named) is not the one ``taken`` recorded: the commit
    the snapshot saw is another branch's, and that branch's own commits are not later
    ones."""
    wrong = []
    for learner, branch in wanted.items():
        seen = taken.seen.get(learner)
        if branch and seen is not None and seen.commit and branch != seen.branch:
            recorded = f"{seen.branch!r}" if seen.branch else "the default branch"
            wrong.append(f"{learner}: the roster or --branch names {branch!r}, the snapshot "
                         f"recorded {recorded}")
    if wrong:
        raise ValueError(f"the snapshot of {taken.taken_at} recorded other branches than "
                         f"the ones to grade ({'; '.join(wrong)}): take the snapshot with "
                         f"the roster ('regrade snapshot --roster FILE'), or correct the "
                         f"roster")


def load(path: Path) -> Snapshot:
    """The snapshot at ``path``, its signature checked with the key of the folder it was
    written into; a ``ValueError`` that says what is wrong."""
    folder = path.parent
    try:
        body = json.loads(path.read_text())
        signature = body.pop("signature")
    except (OSError, ValueError, KeyError, AttributeError) as error:
        raise ValueError(f"--snapshot {path} is not a snapshot: {error}") from None
    if not (folder / KEY_FILE).is_file():
        raise ValueError(f"--snapshot {path}: the class folder {folder} has no {KEY_FILE} to "
                         f"check it with (the snapshot is written into the class folder)")
    if not hmac.compare_digest(str(signature), _signature(_key(folder), body)):
        raise ValueError(f"--snapshot {path} was changed after it was taken (its signature "
                         f"does not match)")
    seen = {entry["learner"]: Seen(**entry) for entry in body["seen"]}
    for entry in seen.values():
        if entry.commit and not re.fullmatch(r"[0-9a-f]{40}", entry.commit):
            raise ValueError(f"--snapshot {path}: {entry.learner}'s commit {entry.commit!r} "
                             f"is not a commit id")
    return Snapshot(body["taken_at"], body.get("deadline"), seen)
