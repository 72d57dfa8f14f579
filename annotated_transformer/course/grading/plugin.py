"""The graded tests' pytest plugin, loaded by ``tests/graded/conftest.py`` (``__all__``).

The run: the file ``--grade-run`` names (:class:`~.runspec.RunSpec`, from ``grade`` and
``regrade``), or by hand ``--parts`` (``--impl``, its earlier name) from seed 0. The code
under test: the ``learner`` fixture, a handle on a worker process (:mod:`.supervisor`) that
runs the test's probes; no learner code is ever imported here, and a chapter file that
breaks a source rule (:mod:`.source_rules`) is never imported there. The records: one
:class:`~.results.TestRecord` a test, written anew after every test. How to write a graded
test: CONTRIBUTING.md; the design: ``book/instructor.md``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import (
    boundary,
    dependencies,
    outcomes,
    source_rules,
)
from annotated_transformer.course.grading.exercise_id import ExerciseId
from annotated_transformer.course.grading.messages import unseal
from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.protocol import MESSAGE_LIMIT, cut
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.runspec import RunSpec, learner_folder, stream_seed
from annotated_transformer.course.grading.supervisor import (
    CodeUnderTest,
    ForbiddenCall,
    LearnerNotImplemented,
    LearnerRaised,
    WorkerPool,
)
from annotated_transformer.layout import (
    CHAPTER_FILE,
    PACKAGE_DIR,
    SOLUTIONS_DIR,
    TESTS_DIR,
    VARIANTS_DIR,
    chapter_test_files,
)
from annotated_transformer.sources import Source, Word

# What tests/graded/conftest.py takes: pytest reads a conftest's hooks and fixtures by name.
__all__ = ["pytest_addoption", "pytest_configure", "pytest_unconfigure", "learner",
           "pytest_collection_modifyitems", "pytest_generate_tests", "_isolated_torch_state"]

PYTEST_DIR = Path(pytest.__file__).resolve().parent.parent  # site-packages: pytest, torch, ...
PRINTED_LIMIT = 2000  # characters of a test's printed output kept in its record
NOT_RUN = ("this test did not run: the grading run ended before it (a crash, a timeout of the "
           "whole run, or an interruption); it counts 0 points")
RUN = pytest.StashKey[RunSpec]()
POOL = pytest.StashKey[WorkerPool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--grade-run", default=None, metavar="PATH",
                     help="the grading run, as grade or regrade described it (a JSON file: "
                     "sources, seed, CPU seconds, sandbox, exercises, where the records go)")
    # The reference is here (not in a student release); read from the disk, not from parts,
    # which would load PyTorch before the worker is started (pytest_configure).
    parser.addoption("--parts", default="solutions" if SOLUTIONS_DIR.is_dir() else "exercises",
                     help="comma-separated parts to grade: solutions (default; exercises in a "
                     "student release), exercises, a folder of chNN_*.py files, or variants; "
                     "a grading run's --grade-run replaces it")
    parser.addoption("--impl", dest="parts", default=argparse.SUPPRESS,
                     help=argparse.SUPPRESS)  # the earlier name of --parts


def run_spec(config: pytest.Config) -> RunSpec:
    """The run these tests are part of: the file ``--grade-run`` names, or the run of
    ``--parts`` with seed 0, the default CPU seconds and the sandbox where it can start."""
    if RUN not in config.stash:
        path = config.getoption("--grade-run", None)
        try:
            config.stash[RUN] = (
                RunSpec.read(Path(path)) if path else
                RunSpec.new(config.getoption("--parts"), seed=0,
                            sandbox=boundary.decide("auto")))
        except ValueError as error:
            raise pytest.UsageError(f"--grade-run {path}: {error}" if path
                                    else f"--parts: {error}") from None
    return config.stash[RUN]


def pytest_configure(config: pytest.Config) -> None:
    """In a grading run (one that writes records), register the recorder and start the first
    source's worker now: it imports PyTorch while this process collects the tests. The
    others start when first needed, one at a time."""
    spec = run_spec(config)
    pool = config.stash[POOL] = WorkerPool(learner_folder, _blocked,
                                           sandboxed=spec.sandbox == "bubblewrap")
    if not spec.records:
        return
    config.pluginmanager.register(GradeRecorder(spec.records), "grade-recorder")
    first = spec.sources[0]
    if not config.option.collectonly and not _all_untouched(first):
        with contextlib.suppress(Exception):  # the tests meet the same problem and report it
            pool.start(Source(Word.SOLUTIONS) if first.word is Word.VARIANTS else first)


def pytest_unconfigure(config: pytest.Config) -> None:
    if POOL in config.stash:
        config.stash[POOL].close()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a run of some exercises, keep only the graded tests of those exercises (before the
    recorder lists the tests of the report)."""
    wanted = run_spec(config).exercises
    if wanted is None:
        return
    kept = [item for item in items if _exercise(item) in wanted]
    dropped = [item for item in items if _exercise(item) not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test of the ``learner`` runs once a source of the run (once a variant of its
    exercise for ``variants``)."""
    if "learner" not in metafunc.fixturenames:
        return
    exercise = _exercise(metafunc.definition)
    chosen: list[Source] = []
    for source in run_spec(metafunc.config).sources:
        if source.word not in (Word.VARIANTS, Word.VARIANT):
            chosen.append(source)
            continue
        if str(VARIANTS_DIR.parent) not in sys.path:  # the course's own check of its tests;
            sys.path.append(str(VARIANTS_DIR.parent))  # not in a release
        import variants

        mine = [v.name for v in variants.for_chapter(metafunc.module.CHAPTER)
                if v.exercise == exercise]
        if source.word is Word.VARIANTS:
            chosen += map(Source.of_variant, mine)
        elif source.variant in mine:  # one variant: the tests of its own exercise only
            chosen.append(source)
    metafunc.parametrize("learner", chosen, ids=[s.label for s in chosen], indirect=True)


@pytest.fixture
def learner(request: pytest.FixtureRequest) -> CodeUnderTest:
    """The code under test of the test's chapter, from the source it runs against; a file
    that breaks a source rule for its exercise ends the test before anything runs."""
    parts: Source = request.param
    chapter: int = request.module.CHAPTER
    exercise = _exercise(request.node)
    if learner_folder(parts) is not None:
        untouched = _untouched(parts, chapter)
        if untouched:  # nothing of it is written: no worker is started for it
            stub = f"not implemented yet ({untouched} is the release's stub, untouched)"
            if exercise in _declared().integration:
                first = _declared().exercises([chapter])[0]
                raise LearnerNotImplemented(f"the capstone builds and trains a model from your "
                                            f"parts; Exercise {first}: {stub}")
            raise LearnerNotImplemented(f"Exercise {exercise}: {stub}")
        own = [v for v in _violations(parts).get(chapter, []) if v.exercise in (None, exercise)]
        if own and own[0].unreadable:
            raise LearnerRaised(["SyntaxError"], own[0].told(), "")
        if own:
            raise ForbiddenCall(own[0].told())
    spec = run_spec(request.config)
    cpu_seconds = spec.cpu_seconds
    limit = request.node.get_closest_marker("cpu_seconds")
    if limit and limit.args:
        cpu_seconds = max(cpu_seconds, float(limit.args[0]))
    handle = CodeUnderTest(request.config.stash[POOL], parts, chapter, exercise,
                           tuple(getattr(request.module, "FORBIDDEN_OPS", {}).get(exercise, ())),
                           stream_seed(spec.seed, _test_id(request.node), "worker"), cpu_seconds)
    # Which earlier exercises its code calls is observed where it may call some (BUILDS_ON
    # says which exercises to watch; what they call is what the worker sees).
    handle.observe = bool(getattr(request.module, "BUILDS_ON", {}).get(exercise))
    handle.standins = _declared().stand_ins(exercise)
    return handle


@cache
def _declared() -> dependencies.Declared:
    return dependencies.read()


@pytest.fixture(autouse=True)
def _isolated_torch_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test draws from its own seed, made from the run's (:func:`~.runspec.
    stream_seed`), and global torch settings are restored after it."""
    import torch

    seed = stream_seed(run_spec(request.config).seed, _test_id(request.node), "inputs")
    torch.manual_seed(seed)
    random.seed(seed)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)


def _test_id(node: pytest.Item) -> str:
    """The test function a test is a case of (``tests/graded/test_ch02_attention.py::
    test_softmax_matches_torch``): its cases, on every source, draw the same inputs."""
    return node.nodeid.partition("[")[0]


def _exercise(node: pytest.Item) -> str | None:
    """The exercise a graded test's ``grade`` marker names (None: not a graded test)."""
    marker = node.get_closest_marker("grade")
    return marker.args[0] if marker else None


# ---------------------------------------------------------------- the source rules' gate


@cache
def _untouched(parts: Source, chapter: int) -> str | None:
    """The name of the learner's chapter file when it is the release's stub exactly as
    generated (:func:`~annotated_transformer.course.authoring.stubs.is_untouched`)."""
    folder = learner_folder(parts)
    for path in sorted(folder.glob(f"ch{chapter:02d}_*.py")) if folder else ():
        try:
            if stubs.is_untouched(path.read_text(encoding="utf-8")):
                return path.name
        except (OSError, UnicodeDecodeError):
            return None
    return None


def _all_untouched(parts: Source) -> bool:
    """Whether every chapter file of a learner's folder is the untouched stub: then no test
    calls the worker, and it is not started ahead of them."""
    folder = learner_folder(parts)
    chapters = [int(m["chapter"]) for p in (folder.glob("ch*.py") if folder else ())
                if (m := CHAPTER_FILE.match(p.name))]
    return bool(chapters) and all(_untouched(parts, c) for c in chapters)


@cache
def _violations(parts: Source) -> Mapping[int, list[source_rules.Violation]]:
    """What a learner's chapter files break, each checked with its chapter's ``FORBIDDEN``
    (read from the graded test files, never imported)."""
    folder = learner_folder(parts)
    if folder is None:
        return {}
    forbidden = {c: dependencies.constants(ast.parse(p.read_text())).get("FORBIDDEN") or {}
                 for c, p in chapter_test_files().items()}
    return source_rules.check_folder(folder, forbidden)


def _blocked(parts: Source) -> Mapping[int, source_rules.Violation]:
    """Chapter files that break a rule for every exercise, each with its first violation
    (a :class:`~.source_rules.Violation`): never imported in the worker."""
    general = {c: [v for v in found if v.exercise is None]
               for c, found in _violations(parts).items()}
    return {c: found[0] for c, found in general.items() if found}


# ---------------------------------------------------------------- the records


def _first_message(error: BaseException) -> str:
    try:
        text = cut(str(error), 20 * MESSAGE_LIMIT)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return f"<a {type(error).__name__} whose message cannot be printed>"
    # pytest appends its own rendering of the failed expression after the message.
    text = text.split("\nassert ")[0].strip()
    if text.startswith("DID NOT RAISE"):
        expected = text.removeprefix("DID NOT RAISE").strip()
        return f"expected {expected} to be raised, but nothing was"
    return text or type(error).__name__


def _learner_location(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """``file:line`` of the deepest frame outside the tests and pytest (the learner's code)."""
    where = ""
    for entry in excinfo.traceback:
        path = Path(str(entry.path)).resolve()
        if not any(path.is_relative_to(d) for d in (PACKAGE_DIR, TESTS_DIR, PYTEST_DIR)):
            where = f"{path.name}:{entry.lineno + 1}"
    return where


def classify(excinfo: pytest.ExceptionInfo[BaseException] | None) -> tuple[Outcome, str]:
    """``(outcome, message)`` for a test that raised ``excinfo`` (None: it passed)."""
    if excinfo is None:
        return Outcome.PASSED, ""
    error = excinfo.value
    message = _first_message(error)
    if isinstance(error, NotImplementedError):
        return Outcome.NOT_IMPLEMENTED, message
    if isinstance(error, outcomes.RAISED):  # the worker's answer, as the grader's exception
        return error.outcome, message
    if isinstance(error, AssertionError) or excinfo.typename in ("Failed", "RaisesGroup"):
        return Outcome.FAILED, message  # a timeout is the worker's (outcomes.WorkerTimeout)
    if excinfo.typename == "Skipped":
        return Outcome.SKIPPED, message
    if isinstance(error.__cause__, NotImplementedError):
        return Outcome.NOT_IMPLEMENTED, _first_message(error.__cause__)
    where = _learner_location(excinfo)
    suffix = f" (at {where})" if where else ""
    return Outcome.ERROR, f"{type(error).__name__}: {message}{suffix}"


def _parts_of(item: pytest.Item) -> str | None:
    """The source a test ran against, as text (a record's ``parts``)."""
    callspec = getattr(item, "callspec", None)
    parts = callspec.params.get("learner") if callspec else None
    return str(parts) if isinstance(parts, Source) else None  # an empty set gives a sentinel


class GradeRecorder:
    """Writes one :class:`~.results.TestRecord` a graded test to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.records: dict[str, TestRecord] = {}
        self.cases: Counter[tuple[str, str | None]] = Counter()  # {(test function, parts): cases}

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        # A test function's points are shared by its parametrized cases.
        self.cases.update((_test_id(item), _parts_of(item)) for item in items)
        # Every graded test is in the report from the start, as not run: a run cut short
        # (a crash, pytest.exit, a kill) leaves them there with 0 points, never absent.
        collected = config.option.collectonly
        for item in items:
            if _exercise(item) is not None:
                self._record(item, Outcome.COLLECTED if collected else Outcome.ERROR,
                             "" if collected else NOT_RUN)
        self._write()

    def _record(self, item: pytest.Item, outcome: Outcome, message: str,
                learner: CodeUnderTest | None = None) -> None:
        marker = item.get_closest_marker("grade")
        exercise = marker.args[0]
        message, mistake = unseal(message)  # only the grader's own sealed tag names a mistake
        self.records[item.nodeid] = TestRecord(
            item.nodeid, exercise, ExerciseId(exercise).chapter,
            getattr(item.module, "EXERCISES", {}).get(exercise, exercise),
            marker.kwargs.get("points", 1) / (self.cases[_test_id(item), _parts_of(item)] or 1),
            outcome, message, values=bool(marker.kwargs.get("values", False)),
            errors=bool(marker.kwargs.get("errors", False)), parts=_parts_of(item),
            mistake=mistake,
            # The chapters' functions its code entered, and the end of what it printed.
            calls=tuple(sorted(getattr(learner, "called", ()))),
            printed=cut(str(getattr(learner, "printed", ""))[-PRINTED_LIMIT:]))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = (yield).get_result()
        if _exercise(item) is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            raised = call.excinfo if report.failed or report.skipped else None
            self._record(item, *classify(raised), getattr(item, "funcargs", {}).get("learner"))
            self._write()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.records[report.nodeid] = TestRecord(
                report.nodeid, None, None, None, 0, Outcome.ERROR,
                f"the tests could not be collected: {report.longreprtext[-600:]}")

    def _write(self) -> None:
        """The records as they stand (written anew after every test)."""
        temporary = Path(f"{self.path}.part")
        temporary.write_text(json.dumps([r.to_json() for r in self.records.values()],
                                        indent=1))
        temporary.replace(self.path)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._write()
