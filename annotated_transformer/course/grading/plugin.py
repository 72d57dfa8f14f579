"""A pytest plugin that records every graded test's outcome for the grader.

Loaded by :mod:`annotated_transformer.course.grading.engine` with ``-p`` and
``--grade-run PATH``, the run described once (:class:`~.runspec.RunSpec`): the graded tests
read their sources, seed, CPU seconds, sandbox and exercises from it (:func:`run_spec`), and
this plugin writes one JSON record a test to its ``records`` file: its exercise, points,
whether it checks an error on bad input (``errors=True`` on its ``grade`` marker) or its
values (``values=True``), the parts it ran against, its outcome, the first message a
learner should read and the id of the known mistake that message names
(``tests/graded/mistakes.py``), if any. A test that compares the values the code computes
with the right ones says ``values=True`` on its marker: the others (shapes, devices,
dtypes, properties a wrong answer can also have) pay only when those pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.messages import MESSAGE_LIMIT, cut, unseal
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.layout import PACKAGE_DIR, TESTS_DIR

PYTEST_DIR = Path(pytest.__file__).resolve().parent.parent  # site-packages: pytest, torch, ...

OUTCOMES = ("passed", "failed", "not implemented", "forbidden", "error", "timeout", "skipped",
            "busy", "grader error")


RUN = pytest.StashKey[RunSpec]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--grade-run", default=None, metavar="PATH",
                     help="the grading run, as grade or regrade described it (a JSON file: "
                     "sources, seed, CPU seconds, sandbox, exercises, where the records go)")


def run_spec(config: pytest.Config) -> RunSpec:
    """The run these tests are part of: the file ``--grade-run`` names, or, for the graded
    tests run by hand, the run of ``--parts`` with seed 0, the default CPU seconds and the
    sandbox where it can start."""
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


def selected_exercises(config: pytest.Config) -> set[str] | None:
    """The exercises of the run (None: every test runs)."""
    exercises = run_spec(config).exercises
    return None if exercises is None else set(exercises)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a run of some exercises, keep only the graded tests of those exercises (before the
    recorder lists the tests of the report)."""
    wanted = selected_exercises(config)
    if wanted is None:
        return
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("grade")
        (kept if marker is not None and marker.args[0] in wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


PRINTED_LIMIT = 2000  # characters of a test's printed output kept in its record
NOT_RUN = ("this test did not run: the grading run ended before it (a crash, a timeout of the "
           "whole run, or an interruption); it counts 0 points")


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


def classify(excinfo: pytest.ExceptionInfo[BaseException] | None) -> tuple[str, str]:
    """``(outcome, message)`` for a test that raised ``excinfo`` (None: it passed)."""
    if excinfo is None:
        return "passed", ""
    error = excinfo.value
    message = _first_message(error)
    if isinstance(error, NotImplementedError):
        return "not implemented", message
    if excinfo.typename == "ForbiddenCall":
        return "forbidden", message
    if excinfo.typename == "WorkerTimeout":
        return "timeout", message
    if excinfo.typename == "MachineBusy":  # the machine's fault, not the learner's
        return "busy", message
    if excinfo.typename == "GraderFault":  # the grader's fault, not the learner's
        return "grader error", message
    if excinfo.typename in ("LearnerRaised", "WorkerCrashed"):
        return "error", message
    if isinstance(error, AssertionError) or excinfo.typename in ("Failed", "RaisesGroup"):
        if message.startswith("Timeout"):
            return "timeout", message
        return "failed", message
    if excinfo.typename == "Skipped":
        return "skipped", message
    cause = error.__cause__
    if isinstance(cause, NotImplementedError):
        return "not implemented", _first_message(cause)
    where = _learner_location(excinfo)
    suffix = f" (at {where})" if where else ""
    return "error", f"{type(error).__name__}: {message}{suffix}"


def _parts_of(item: pytest.Item) -> str | None:
    """The parts (``--parts``) a test ran against."""
    callspec = getattr(item, "callspec", None)
    parts = callspec.params.get("learner") if callspec else None
    return parts if isinstance(parts, str) else None  # an empty parameter set gives a sentinel


class GradeRecorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.records: dict[str, dict[str, Any]] = {}
        self.cases: dict[tuple[str, str, str | None], int] = {}

    def _function_key(self, item: pytest.Item) -> tuple[str, str, str | None]:
        return (item.nodeid.split("::")[0], getattr(item, "originalname", item.name),
                _parts_of(item))

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        # A test function's points are shared by its parametrized cases.
        for item in items:
            key = self._function_key(item)
            self.cases[key] = self.cases.get(key, 0) + 1
        # Every graded test is in the report from the start, as not run: a run cut short
        # (a crash, pytest.exit, a kill) leaves them there with 0 points, never absent.
        collected = config.option.collectonly
        for item in items:
            if item.get_closest_marker("grade") is not None:
                self._record(item, "collected" if collected else "error",
                             "" if collected else NOT_RUN)
        self._write()

    def _record(self, item: pytest.Item, outcome: str, message: str) -> None:
        marker = item.get_closest_marker("grade")
        exercise = marker.args[0]
        share = marker.kwargs.get("points", 1) / self.cases.get(self._function_key(item), 1)
        message, mistake = unseal(message)  # only the grader's own sealed tag names a mistake
        self.records[item.nodeid] = {
            "test": item.nodeid,
            "exercise": exercise,
            "chapter": int(exercise.split(".")[0]),
            "title": getattr(item.module, "EXERCISES", {}).get(exercise, exercise),
            "points": share,
            # A test of the values (``values=True``) pays on its own; every other test (shapes,
            # properties, a clear error on bad input) pays only with them (engine.summarize).
            "values": bool(marker.kwargs.get("values", False)),
            "errors": bool(marker.kwargs.get("errors", False)),
            "parts": _parts_of(item),
            "outcome": outcome,
            "message": cut(message),
            "mistake": mistake,  # the id of the known mistake the test named, or ""
        }

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        outcome = yield
        report = outcome.get_result()
        if item.get_closest_marker("grade") is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome_name, message = classify(call.excinfo if report.failed or report.skipped
                                             else None)
            self._record(item, outcome_name, message)
            learner = getattr(item, "funcargs", {}).get("learner")
            # The chapters' functions its code entered: which earlier exercises it called.
            self.records[item.nodeid]["calls"] = sorted(getattr(learner, "called", ()))
            printed = getattr(learner, "printed", "")
            if printed:  # what the learner's code printed in this test, its end only
                self.records[item.nodeid]["printed"] = cut(str(printed)[-PRINTED_LIMIT:])
            self._write()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.records[report.nodeid] = {
                "test": report.nodeid, "exercise": None, "chapter": None, "title": None,
                "points": 0, "parts": None, "outcome": "error",
                "message": f"the tests could not be collected: {report.longreprtext[-600:]}",
            }

    def _write(self) -> None:
        """The report as it stands (written anew after every test)."""
        temporary = Path(f"{self.path}.part")
        temporary.write_text(json.dumps(list(self.records.values()), indent=1, default=str))
        temporary.replace(self.path)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._write()


def pytest_configure(config: pytest.Config) -> None:
    path = run_spec(config).records
    if path:
        config.pluginmanager.register(GradeRecorder(path), "grade-recorder")
