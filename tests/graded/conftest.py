"""Choose the parts the graded tests run against (``--parts``); keep every test independent.

``--parts`` takes a comma-separated list of the parts to grade, each graded on its own, in
the one ``--parts`` language (:mod:`annotated_transformer.sources`): ``solutions`` (the
default, or ``exercises`` in a student release, which has no reference), ``exercises``, a
folder of ``chNN_*.py`` files, or ``variants`` (every wrong and right variant of each
chapter, each against its own exercise's tests); ``fast`` is refused (not graded). ``--impl`` is
its earlier name, still accepted. A graded test module sets ``CHAPTER`` and
``EXERCISES`` and asks for the ``learner`` fixture: a handle on the code under test,
which runs in a separate worker process (:mod:`annotated_transformer.course.grading.supervisor`).
A test hands ``learner.run`` a *probe*, a small function of the test file that calls the
code under test and returns plain data, and checks what comes back against what it
computes itself with PyTorch's own ops. No learner code is ever imported here.

In the worker every chapter comes from the source under test: a learner's chapter 5 is
built on the learner's own chapters 1 to 4, in the course as in a student release and in
CI, so a file gets the same points everywhere. Before a learner's folder is used, every
chapter file in it is read (never run) for what an exercise file may not do
(:mod:`annotated_transformer.course.grading.source_rules`); a file that breaks a rule is never
imported, and the tests that need it are ``forbidden``. While a probe of an exercise runs,
the ops in the test file's ``FORBIDDEN_OPS`` for it are refused at PyTorch's dispatch level.

A grading run is described once, by ``grade`` or ``regrade``, in the file ``--grade-run``
names (:mod:`annotated_transformer.course.grading.runspec`): its sources, seed, CPU
seconds, sandbox and exercises; run by hand, the tests grade ``--parts`` from seed 0. Every
test starts from the run's seed, here and in the worker; the grader draws a fresh one per
run and reports it, so the random inputs change and a hard-coded answer fails.
"""

from __future__ import annotations

import argparse
import ast
import random
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

from annotated_transformer.course.grading.plugin import run_spec
from annotated_transformer.course.grading.supervisor import (
    CodeUnderTest,
    ForbiddenCall,
    LearnerRaised,
    WorkerPool,
    unreadable,
)
from annotated_transformer.layout import VARIANTS_DIR, chapter_test_files
from annotated_transformer.parts import has_reference
from annotated_transformer.sources import Source


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--parts",
        default="solutions" if has_reference() else "exercises",
        help="comma-separated parts to grade: solutions (default; exercises in a "
        "student release), exercises, a folder of chNN_*.py files, or variants; "
        "a grading run's --grade-run replaces it",
    )
    parser.addoption("--impl", dest="parts", default=argparse.SUPPRESS,
                     help=argparse.SUPPRESS)  # the earlier name of --parts


def _learner_dir(parts: str) -> Path | None:
    """The folder of a learner's parts, None for the course's own code."""
    if parts.startswith("variant:"):  # one of the course's variants (see generate_tests)
        return None
    return Source.parse(parts).learner_folder


@cache
def _forbidden_names() -> Mapping[int, Mapping[str, tuple[str, ...]]]:
    """``{chapter: FORBIDDEN}`` read from the graded test files (without importing them)."""
    from annotated_transformer.course.grading.dependencies import constants

    found: dict[int, Mapping[str, tuple[str, ...]]] = {}
    for chapter, path in chapter_test_files().items():
        forbidden = constants(ast.parse(path.read_text())).get("FORBIDDEN")
        if forbidden is not None:
            found[chapter] = forbidden
    return found


@cache
def _violations(parts: str) -> Mapping[int | None, list]:
    from annotated_transformer.course.grading import source_rules

    folder = _learner_dir(parts)
    assert folder is not None
    return source_rules.check_folder(folder, _forbidden_names())


def _blocked(parts: str) -> Mapping[int, str]:
    """Chapter files that break a rule for every exercise: never imported in the worker."""
    blocked: dict[int, str] = {}
    for chapter, found in _violations(parts).items():
        general = [v for v in found if v.exercise is None]
        if chapter is not None and general:
            blocked[chapter] = _say(general[0])
    return blocked


def _say(violation) -> str:
    return f"{Path(violation.path).name}, line {violation.line}: {violation.message}"


POOL = pytest.StashKey[WorkerPool]()


def pytest_configure(config: pytest.Config) -> None:
    """In a grading run (one that writes records), start the first source's worker now: it
    imports PyTorch while this process collects the tests, which import it too (this module
    does not). The others start when first needed, one at a time."""
    spec = run_spec(config)
    pool = WorkerPool(_learner_dir, _blocked, sandboxed=spec.sandbox == "bubblewrap")
    config.stash[POOL] = pool
    first = str(spec.parsed_sources()[0])
    if spec.records and not config.option.collectonly:
        try:
            pool.start("solutions" if first == "variants" else first)
        except Exception:  # noqa: BLE001 - the tests meet the same problem and report it
            pass


def pytest_unconfigure(config: pytest.Config) -> None:
    if POOL in config.stash:
        config.stash[POOL].close()


@pytest.fixture(scope="session")
def _workers(request: pytest.FixtureRequest) -> Iterator[WorkerPool]:
    yield request.config.stash[POOL]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "learner" not in metafunc.fixturenames:
        return
    chapter = metafunc.module.CHAPTER
    marker = metafunc.definition.get_closest_marker("grade")
    exercise = marker.args[0] if marker else None
    chosen: list[str] = []
    ids: list[str] = []
    for source in run_spec(metafunc.config).parsed_sources():
        if source.word == "variants":
            if str(VARIANTS_DIR.parent) not in sys.path:  # the course's own check of its
                sys.path.append(str(VARIANTS_DIR.parent))  # tests; not in a release
            import variants

            named = [f"variant:{v.name}" for v in variants.for_chapter(chapter)
                     if v.exercise == exercise]
            chosen += named
            ids += named
        else:
            chosen.append(str(source))
            ids.append(source.folder.name if source.folder else source.word)
    metafunc.parametrize("learner", chosen, ids=ids, indirect=True)


@pytest.fixture
def learner(request: pytest.FixtureRequest, _workers: WorkerPool) -> CodeUnderTest:
    """The code under test of the test's chapter, from the parts chosen by ``--parts``."""
    parts: str = request.param
    chapter: int = request.module.CHAPTER
    marker = request.node.get_closest_marker("grade")
    exercise = marker.args[0] if marker else None
    if _learner_dir(parts) is not None:
        found = _violations(parts)
        # A file of the folder that is no chapter's (a helper, __init__.py) concerns all.
        own = [v for v in [*found.get(chapter, []), *found.get(None, [])]
               if v.exercise in (None, exercise)]
        if own and unreadable(own[0].message):
            raise LearnerRaised(["SyntaxError"], _say(own[0]), "")
        if own:
            raise ForbiddenCall(_say(own[0]))
    spec = run_spec(request.config)
    cpu_seconds = spec.cpu_seconds
    limit = request.node.get_closest_marker("cpu_seconds")
    if limit and limit.args:
        cpu_seconds = max(cpu_seconds, float(limit.args[0]))
    handle = CodeUnderTest(_workers, parts, chapter, exercise,
                     tuple(getattr(request.module, "FORBIDDEN_OPS", {}).get(exercise, ())),
                     spec.seed, cpu_seconds)
    # Which earlier exercises its code calls is observed where it may call some (BUILDS_ON
    # says which exercises to watch; what they call is what the worker sees).
    handle.observe = bool(getattr(request.module, "BUILDS_ON", {}).get(exercise))
    return handle


@pytest.fixture(autouse=True)
def _isolated_torch_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts from the run's seed, and global torch settings are restored after
    it."""
    import torch

    seed = run_spec(request.config).seed
    torch.manual_seed(seed)
    random.seed(seed)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
