"""The deadline as the instructor saw it: each repository's head commit, recorded when seen.

Git's dates are the learner's to set (``GIT_COMMITTER_DATE``): a commit made after the
deadline can say it was made before. So the grade never chooses a commit by its date.
``regrade snapshot`` runs at the deadline (by hand, cron or a scheduled workflow), asks each
repository for its branch's head (``git ls-remote``, nothing cloned) and writes what it saw,
with the instructor's clock, into a file of the class folder signed with a key kept there
(HMAC-SHA256): ``regrade --snapshot FILE`` then grades exactly those commits and refuses a
file that was changed. Commits pushed later are flagged with the dates they claim, and so is
one that claims a date before the deadline (backdated) or before its parent.
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


@dataclass(frozen=True)
class Seen:
    """One repository at the deadline: its head commit then, or why there was none."""

    learner: str
    source: str  # without credentials
    branch: str | None
    commit: str  # "" when none could be read
    seen_at: str  # the instructor's clock, UTC, ISO 8601
    error: str = ""


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


def head(source: str, branch: str | None) -> str:
    """The commit ``source``'s branch (default: its HEAD) points at now, read with
    ``git ls-remote``; a :class:`~.repositories.SubmissionError` when it cannot be read."""
    from annotated_transformer.course.instructor import repositories

    ref = f"refs/heads/{branch}" if branch else "HEAD"
    shown = repositories.without_credentials(source)
    listing = repositories._run(["git", "-c", "protocol.ext.allow=never", "ls-remote", "--",
                                 source, ref], f"cannot read {shown}", LS_REMOTE_TIMEOUT)
    for line in listing.splitlines():
        commit, _, name = line.partition("\t")
        if name == ref and len(commit) == 40:
            return commit
    raise repositories.SubmissionError(f"the repository has no branch {branch!r}" if branch
                                       else "the repository has no commit on its default "
                                            "branch")


def take(sources: list[str], names: list[str], branch: str | None, folder: Path,
         deadline: datetime | None = None) -> Path:
    """Record each repository's head now into ``folder/snapshot-TIME.json``, signed."""
    from annotated_transformer.course.instructor import repositories

    taken_at = now()
    seen = []
    for source, name in zip(sources, names, strict=True):
        place = str(Path(source).resolve()) if Path(source).exists() else source
        try:
            commit, error = head(place, branch), ""
        except repositories.SubmissionError as why:
            commit, error = "", str(why)
        seen.append(Seen(name, repositories.without_credentials(source), branch, commit,
                         now(), error))
    body = {"taken_at": taken_at, "deadline": deadline.isoformat() if deadline else None,
            "seen": [asdict(s) for s in seen]}
    body["signature"] = _signature(_key(folder), body)
    path = folder / f"snapshot-{taken_at.replace(':', '')}.json"
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


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
