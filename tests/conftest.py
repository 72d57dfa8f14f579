"""Choose the implementation the graded tests run against, and keep every test independent.

``--impl`` takes a comma-separated list of sources: ``solutions`` (the default, or
``exercises`` in a student release, which has no reference), ``exercises``, a folder of
``chNN_*.py`` files, or ``variants`` (every wrong and right variant of each chapter, each
against its own exercise's tests). A graded test module sets ``CHAPTER`` and
``EXERCISES`` and asks for the ``impl`` fixture: the chapter's module from that source.
Earlier chapters' parts come from the reference (the learner's own in a student
release), so a learner stuck in one chapter can still be graded on the next. Every test
starts from the seed ``--grade-seed`` (0 unless given); the grader draws a fresh one per
run and reports it, so the random inputs change and a hard-coded answer fails.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from annotated_transformer import forbidden, parts
from annotated_transformer.parts import Parts, chapter_files, has_reference, load_chapter, use_parts

# The course's own sources: they may load the reference, a learner's file may not.
TRUSTED_SOURCES = {"solutions", *getattr(parts, "NAMED", {})}


class ExerciseImportError(RuntimeError):
    """The learner's chapter file could not be imported."""


class ForbiddenCall(RuntimeError):
    """The exercise's code uses the PyTorch op it asks the learner to write, or the
    learner's file reaches the reference solutions."""


def _check_forbidden(request: pytest.FixtureRequest, module: ModuleType, chapter: int) -> None:
    marker = request.node.get_closest_marker("grade")
    exercise = marker.args[0] if marker else None
    rules = getattr(request.module, "FORBIDDEN", {}).get(exercise)
    path = getattr(module, "__file__", None)
    try:
        solution = chapter_files("solutions").get(chapter)
    except ModuleNotFoundError:  # a release without the reference: nothing to compare with
        solution = None
    if rules and path and solution:
        message = forbidden.check(Path(path), solution, exercise, rules)
        if message:
            raise ForbiddenCall(message)


def _check_reference(request: pytest.FixtureRequest, spec: str, module: ModuleType,
                     chapter: int) -> None:
    """No learner file may reach the reference: the chapter's own, and for a test that
    assembles every chapter from the source (the capstone), each of them."""
    files = {chapter: Path(module.__file__)} if getattr(module, "__file__", None) else {}
    if "impl_source" in request.fixturenames:
        files |= dict(chapter_files(spec))
    for number, path in sorted(files.items()):
        message = forbidden.check_reference(path, number)
        if message:
            raise ForbiddenCall(message)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        default="solutions" if has_reference() else "exercises",
        help="comma-separated sources to grade: solutions (default; exercises in a "
        "student release), exercises, "
        "a folder of chNN_*.py files, or variants",
    )
    parser.addoption(
        "--grade-seed",
        type=int,
        default=0,
        help="the seed every test starts from, so the random inputs change with it "
        "(default 0; the grader draws a fresh one per run and reports it)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    chapter = metafunc.module.CHAPTER
    marker = metafunc.definition.get_closest_marker("grade")
    exercise = marker.args[0] if marker else None
    specs: list[str] = []
    for spec in metafunc.config.getoption("--impl").split(","):
        if spec == "variants":
            import variants  # the course's own check of its tests; a student release has none

            specs += [f"variant:{v.name}" for v in variants.for_chapter(chapter)
                      if v.exercise == exercise]
        elif spec:
            specs.append(spec)
    ids = [Path(s).name if s not in ("solutions", "exercises") and "/" in s else s for s in specs]
    metafunc.parametrize("impl", specs, ids=ids, indirect=True)


@pytest.fixture
def impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The module of the chapter under test, from the source chosen by ``--impl``."""
    spec: str = request.param
    chapter: int = request.module.CHAPTER
    try:
        if spec.startswith("variant:"):
            import variants

            module = variants.load(chapter, spec.removeprefix("variant:"))
        else:
            module = load_chapter(spec, chapter)
    except Exception as error:  # a learner's file can fail in any way
        raise ExerciseImportError(
            f"could not import chapter {chapter} from {spec}: {type(error).__name__}: {error}"
        ) from error
    if spec not in TRUSTED_SOURCES and not spec.startswith("variant:"):
        _check_reference(request, spec, module, chapter)
    if not spec.startswith("variant:"):
        _check_forbidden(request, module, chapter)
    source = "solutions" if spec.startswith("variant:") else spec
    with use_parts(Parts("solutions", {chapter: source})):
        yield module


@pytest.fixture
def impl_source(request: pytest.FixtureRequest) -> str:
    """The ``--impl`` source of the test (for tests that assemble every chapter from it)."""
    return request.node.callspec.params["impl"]


@pytest.fixture(autouse=True)
def _isolated_torch_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts from the run's seed (``--grade-seed``), and global torch settings
    are restored after it."""
    seed = request.config.getoption("--grade-seed")
    torch.manual_seed(seed)
    random.seed(seed)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
