"""One grading run, described once (:class:`RunSpec`): ``grade`` and ``regrade`` hand the
graded tests one file, ``--grade-run PATH`` (:mod:`.plugin`), instead of settings parsed
again at every hop; run by hand, the tests make it from ``--parts``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.limits import DEFAULT_CPU_SECONDS
from annotated_transformer.layout import EXERCISES_DIR, PARTS_PACKAGES, SOLUTIONS_DIR, folder_name
from annotated_transformer.sources import Source, Word, parse_sources

SANDBOXES = ("bubblewrap", "none")  # never "auto" here


def graded_sources(text: str) -> tuple[Source, ...]:
    """The sources of a comma list that the grader grades: ``sources.parse_sources``, less
    ``fast`` (the reference on fused kernels is measured, not graded), which is refused."""
    found = parse_sources(text)
    for source in found:
        if source.word in PARTS_PACKAGES:
            raise ValueError(f"'{source.word}' names the reference in another implementation "
                             f"(annotated_transformer/{PARTS_PACKAGES[source.word].name}, "
                             f"PyTorch's fused kernels), which is measured, not graded; a "
                             f"folder named {source.word} is written ./{source.word}")
    return found


def is_trusted(source: Source) -> bool:
    """Whether ``source`` is the course's own code (the reference, the fast parts, a
    variant): its tests share one worker, unconfined to a learner's folder."""
    return source.word in (Word.SOLUTIONS, Word.VARIANT, *PARTS_PACKAGES)


def learner_folder(source: Source) -> Path | None:
    """The folder of a learner's files that ``source`` grades (``exercises/`` or the
    folder); None for the course's own code (the reference, the fast parts, variants)."""
    return EXERCISES_DIR.resolve() if source.word is Word.EXERCISES else source.folder


def described_folder(source: Source) -> str:
    """What a report says of the folder ``source`` grades ("" for the course's own code); in
    a student release, ``solutions`` grades the learner's ``exercises/`` and says why."""
    if source.word is Word.SOLUTIONS and not SOLUTIONS_DIR.is_dir():
        return (f"{EXERCISES_DIR}: this student release has no {folder_name(SOLUTIONS_DIR)}, "
                f"so your own exercises were graded")
    return str(learner_folder(source) or "")


def draw_seed() -> int:
    """A fresh seed for a run's random inputs (the one place one is drawn)."""
    return secrets.randbelow(2**31)


def stream_seed(seed: int, test: str, side: str) -> int:
    """The seed of one test function's (``test``, pytest's id without its parameters) random
    draws on one ``side``: ``"inputs"`` for the test's own (its inputs and weights, in the
    trusted process), ``"worker"`` for the code under test's (in the worker, before each call).

    A sha256 of the three, so that the code under test can neither redraw a test's inputs
    from its own generator (and precompute what a later, guarded call will be asked) nor
    learn them from another test's inputs; the same run seed gives the same draws."""
    digest = hashlib.sha256(f"{seed}\0{side}\0{test}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # below 2**63, as torch.manual_seed takes


@dataclass(frozen=True)
class RunSpec:
    """What one grading run is (its sources parsed by :meth:`new` or :meth:`read`)."""

    sources: tuple[Source, ...]  # the --parts list, parsed (annotated_transformer.sources)
    seed: int = 0  # every test's draws start from it (stream_seed)
    cpu_seconds: float = DEFAULT_CPU_SECONDS  # one call's; a test's marker may give more
    sandbox: str = "bubblewrap"  # or "none": decided (boundary.decide)
    exercises: tuple[ExerciseId, ...] | None = None  # only their graded tests run; None: all
    records: str | None = None  # the file the plugin writes one record a test to; None: none

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOXES:
            raise ValueError(f"a run's sandbox is one of {SANDBOXES}, got {self.sandbox!r}")
        if not self.cpu_seconds > 0:
            raise ValueError(f"a run's CPU seconds must be positive, got {self.cpu_seconds}")
        if self.exercises is not None:  # a ValueError names an id that is none
            object.__setattr__(self, "exercises", tuple(map(ExerciseId, self.exercises)))

    @classmethod
    def new(cls, parts: str, *, seed: int | None = None,
            cpu_seconds: float = DEFAULT_CPU_SECONDS, sandbox: str = "bubblewrap",
            exercises: Iterable[str] | None = None) -> RunSpec:
        """A run of ``parts`` (parsed here, once: a ``ValueError`` names a wrong word); a
        fresh seed unless ``seed`` is given."""
        return cls(graded_sources(parts), draw_seed() if seed is None else seed, cpu_seconds,
                   sandbox, None if exercises is None else tuple(map(ExerciseId, exercises)))

    @property
    def parts(self) -> str:
        """The sources as ``--parts`` writes them (parsed again, the same sources)."""
        return ",".join(map(str, self.sources))

    def write(self, path: Path) -> None:
        """The run as JSON: the sources as text, written here and read by :meth:`read`."""
        path.write_text(json.dumps({**asdict(self), "sources": self.parts}, indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        """The run written at ``path``; a ``ValueError`` naming what is wrong with it."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read the grading run {path}: {error}") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) - known or "sources" not in data:
            raise ValueError(f"{path} is not a grading run (its keys: {sorted(known)})")
        return cls(**{**data, "sources": graded_sources(str(data["sources"]))})
