"""The capstone's result, reused while nothing it depends on has changed (local grading only).

The records of a whole-course exercise (``INTEGRATION`` in its test file) are kept under a
key (:func:`key`), and only a ``passed`` or ``failed`` verdict, never an error or a timeout.
The cache lives outside the course and the submission: a file in the repository could be
committed, forged, by a learner. CI and the instructor's re-grade never use it
(``--no-cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import replace
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from annotated_transformer.course.grading import manifest
from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.runspec import learner_folder
from annotated_transformer.layout import CHAPTER_FILE, ROOT, SOLUTIONS_DIR, TESTS_DIR, relative
from annotated_transformer.sources import Source, Word

KEPT = (Outcome.PASSED, Outcome.FAILED)  # the verdicts worth keeping
ENTRIES = 20  # the most results kept; the oldest go first


def default_dir() -> Path | None:
    """``$XDG_CACHE_HOME/annotated-transformer`` (or ``~/.cache/...``); None when that lies
    inside the course, where it could be committed."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base).expanduser().resolve() / "annotated-transformer"
    return None if folder.is_relative_to(ROOT.resolve()) else folder


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def key(sources: tuple[Source, ...], chapters: set[int], test_file: Path) -> str | None:
    """The key of a result graded from the files of ``chapters`` of ``sources`` by
    ``test_file`` (the sha256 of each, of the files that decide a grade and of the versions
    of Python and PyTorch, read from its installed metadata: importing it would cost this
    process seconds); None when ``sources`` are not one folder (variants, several sources)."""
    if len(sources) != 1:
        return None
    folder = SOLUTIONS_DIR if sources[0].word is Word.SOLUTIONS else learner_folder(sources[0])
    if folder is None:
        return None
    # Only its files of those chapters: nothing else of it is run.
    learner = {p.name: _digest(p) for p in sorted(folder.glob("*.py"))
               if (match := CHAPTER_FILE.match(p.name)) and int(match["chapter"]) in chapters}
    grading = {**manifest.compute(ROOT)["files"], relative(test_file): _digest(test_file)}
    facts = {"parts": ",".join(map(str, sources)), "learner": learner, "grading": grading,
             "tests": str(TESTS_DIR), "python": platform.python_version(),
             "torch": version("torch")}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def load(folder: Path, exercise: str, entry: str) -> list[TestRecord] | None:
    """The records kept under ``entry``, each message saying that the result was reused and
    since when; None when none are kept."""
    try:
        data = json.loads((folder / f"{exercise}-{entry}.json").read_text())
        records = [TestRecord.from_json(r) for r in data["records"]]
        note = f"(result reused: files unchanged since {data['date']})"
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not records or any(r.exercise != exercise or r.outcome not in KEPT for r in records):
        return None
    return [replace(r, message=f"{note} {r.message}".strip()) for r in records]


def store(folder: Path, exercise: str, entry: str, records: list[TestRecord]) -> bool:
    """Keep ``exercise``'s records when every one passed or failed; whether they were kept."""
    records = [r for r in records if r.exercise == exercise]
    if not records or any(r.outcome not in KEPT for r in records):
        return False
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{exercise}-{entry}.json.partial"
        partial.write_text(json.dumps({"date": date,
                                       "records": [r.to_json() for r in records]}))
        os.replace(partial, folder / f"{exercise}-{entry}.json")
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        return False
    return True
