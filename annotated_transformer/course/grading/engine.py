"""The grading engine: run the graded tests on some parts and turn their records into
points per exercise. :func:`grade` is the one entry (``grade``, ``regrade``, the workflows and
the course's tests all come here); the GitHub Classroom workflow takes its points from
:func:`exercise_points`. The design: ``book/instructor.md``, "Grading a submission".
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from annotated_transformer.course.grading import cache, dependencies
from annotated_transformer.course.grading.exercise_id import ExerciseId, order
from annotated_transformer.course.grading.outcomes import GraderFault, Outcome
from annotated_transformer.course.grading.protocol import MESSAGE_LIMIT, cut
from annotated_transformer.course.grading.results import ExerciseResult, TestRecord
from annotated_transformer.course.grading.runspec import RunSpec
from annotated_transformer.layout import GRADED_DIR, ROOT, chapter_test_files
from annotated_transformer.sources import Source


def _run(spec: RunSpec) -> list[TestRecord]:
    """Run the graded tests of ``spec.exercises`` (the files of their chapters are collected,
    nothing else runs) in a fresh interpreter, which reads ``spec`` from one file
    (``--grade-run``) and runs the code under test only in the grading worker it starts;
    one record a test (written by :mod:`.plugin`)."""
    files = chapter_test_files(sorted({ExerciseId(e).chapter for e in spec.exercises or ()}))
    with tempfile.TemporaryDirectory() as tmp:
        report, described = Path(tmp) / "report.json", Path(tmp) / "run.json"
        replace(spec, records=str(report)).write(described)
        # Only the course's settings and plugins: pyproject.toml's section (not a
        # pytest.ini), tests/graded/conftest.py, which loads the grading plugin (not a
        # conftest.py above it), pytest-timeout (not whatever else is installed).
        command = [
            sys.executable, "-m", "pytest", *map(str, files.values()), f"--grade-run={described}",
            "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
            "--confcutdir", str(GRADED_DIR), "-p", "pytest_timeout",
            # No wall-clock limit on a test: each call of the code under test has its CPU
            # budget and its own backstop (grading.supervisor).
            "--timeout=0", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        returncode, stdout, stderr = bounded_run(command, env)
        over_bound(returncode, stderr, report.exists())
        if not report.exists():
            raise RuntimeError(f"the graded tests did not run:\n{stdout[-3000:]}"
                               f"{stderr[-3000:]}")
        return [TestRecord.from_json(r) for r in json.loads(report.read_text())]


# The graded tests' own process (the trusted side, outside the worker and its cgroup) has
# bounds of its own, set by the kernel: whatever the code under test replies, checking it
# costs at most this (its worker resets both for itself and has its own, :mod:`.limits`).
CHECKS_DATA_BYTES = 4 * 2**30  # its data (RLIMIT_DATA); the reference's whole course: 0.4 GiB
CHECKS_CPU_SECONDS = 600  # its own CPU time, not its worker's; the reference's course: 11 s
# A backstop for a wait that no call's deadline covers (every call of the worker has its
# own, :mod:`.watch`); the reference's whole course takes under 2 minutes on a loaded machine.
CHECKS_WALL_SECONDS = 3 * 3600


class ChecksOverBound(RuntimeError):
    """The graded tests' own process went past one of its bounds: nothing of the run is
    graded (``regrade`` gives that submission its ``error`` row and goes on)."""


def bounded_run(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run the graded tests' ``command`` under :data:`CHECKS_DATA_BYTES` and
    :data:`CHECKS_CPU_SECONDS` (soft limits: its worker resets them) and
    :data:`CHECKS_WALL_SECONDS` (past it, :class:`ChecksOverBound`); its
    ``(returncode, stdout, stderr)``.

    The kernel kills it when this process dies, by any signal, ``SIGKILL`` included
    (``setpriv --pdeathsig KILL``, util-linux; as it is where there is no ``setpriv``): a
    grader stopped from outside leaves no graded tests running, and their workers die with
    them (``bwrap --die-with-parent``)."""
    import resource  # Unix only

    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv:
        command = [setpriv, "--pdeathsig", "KILL", "--", *command]
    process = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for which, bound in ((resource.RLIMIT_DATA, CHECKS_DATA_BYTES),
                             (resource.RLIMIT_CPU, CHECKS_CPU_SECONDS)):
            hard = resource.prlimit(process.pid, which)[1]
            resource.prlimit(process.pid, which, (bound, hard))
        stdout, stderr = process.communicate(timeout=CHECKS_WALL_SECONDS)
    except subprocess.TimeoutExpired:
        raise ChecksOverBound(f"the graded tests did not finish in {CHECKS_WALL_SECONDS:,} s "
                              f"of wall time; nothing was graded") from None
    finally:  # a deadline, an interrupt, a limit that could not be set: none is left behind
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stdout, stderr


def die_with_parent() -> None:
    """Have the kernel end this process (``SIGTERM``) when its parent dies, where Linux's
    ``prctl`` is at hand: ``regrade``'s worker processes, so that a ``regrade`` stopped from
    outside leaves none of them grading (:func:`bounded_run` takes it from there)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def over_bound(returncode: int, stderr: str, reported: bool = False) -> None:
    """:class:`ChecksOverBound` naming the bound, when the graded tests' process was stopped
    by one: the CPU's signal (a run cut short grades nothing, whatever records it wrote), or
    a ``MemoryError`` that ended it before it wrote any (one inside a test is that test's
    failure)."""
    about = ("the graded tests' own process (outside the worker) went past its bound of {} "
             "while checking the replies of the code under test; nothing was graded (the "
             "reference's whole course needs 11 CPU s and 0.4 GiB)")
    if returncode == -signal.SIGXCPU:
        raise ChecksOverBound(about.format(f"{CHECKS_CPU_SECONDS} CPU seconds"))
    if not reported and returncode != 0 and "MemoryError" in stderr:
        raise ChecksOverBound(about.format(f"{CHECKS_DATA_BYTES / 2**30:g} GiB of data"))


def exercise_points(chapters: list[int] | None = None) -> list[ExerciseResult]:
    """The points on offer per exercise, read from the graded test files without running
    or importing them: one row an exercise, as :func:`summarize` gives, with ``points`` 0
    and status ``"collected"``."""
    files = chapter_test_files(chapters)
    declared, offered = dependencies.read(files), dependencies.points_offered(files)
    return [ExerciseResult(id=e, chapter=declared.chapter_of(e),
                           title=declared.titles.get(e, e), points=0,
                           max_points=round(offered[e], 2), status=Outcome.COLLECTED, message="")
            for e in sorted(offered, key=order)]


def value_tests(tests: list[TestRecord]) -> list[TestRecord]:
    """The tests of one exercise that compare its values with the right ones (``values=True``);
    an exercise that marks none counts every test but those of errors on bad input."""
    marked = [r for r in tests if r.values]
    return marked or [r for r in tests if not r.errors]


def values_right(records: list[TestRecord]) -> dict[str, bool | None]:
    """``{exercise: whether every test of its values passed}``: what a later exercise that
    calls it can rely on. ``None`` for the release's stub, which is never to blame: code
    that called it and still ran caught its ``NotImplementedError``."""
    return {e: None if all(r.outcome == Outcome.NOT_IMPLEMENTED for r in tests)
            else all(r.outcome == Outcome.PASSED for r in value_tests(tests))
            for e, tests in _by_exercise(records).items()}


def unsure_names(records: list[TestRecord]) -> dict[str, str]:
    """``{exercise: the message of a failed test of its values that names no mistake}`` for
    each exercise whose failed tests of values do not all name one and the same mistake: a
    name that one input supports and another contradicts (an exercise that calls a wrong
    part computes what a mistake of its own would, on some inputs only)."""
    unsure = {}
    for exercise, tests in _by_exercise(records).items():
        failed = [r for r in value_tests(tests) if r.outcome != Outcome.PASSED]
        if len({r.mistake for r in failed}) > 1:
            unsure[exercise] = next((r.message for r in failed if not r.mistake), "")
    return unsure


def _by_exercise(records: list[TestRecord]) -> dict[str, list[TestRecord]]:
    by_exercise: dict[str, list[TestRecord]] = {}
    for record in records:
        if record.exercise is not None:
            by_exercise.setdefault(record.exercise, []).append(record)
    return by_exercise


def summarize(records: list[TestRecord]) -> list[ExerciseResult]:
    """One row an exercise: points earned, status from its worst test, that test's message
    and the known mistake it names (a test of that outcome that names one first).

    Only behaviour pays: a test that a wrong answer can pass too (a shape, a device, a
    property) pays only when every test of the exercise's values passed, and a test of a
    clear error (``errors=True``) only when every other test of its exercise passed; an
    exercise one of whose tests reached a forbidden op earns nothing."""
    by_exercise = _by_exercise(records)
    rows = []
    for exercise in sorted(by_exercise, key=order):
        tests = by_exercise[exercise]
        values = value_tests(tests)
        right = all(r.outcome == Outcome.PASSED for r in values)
        worst = min(tests, key=lambda r: (r.outcome.priority, not r.mistake))
        behaves = all(r.outcome == Outcome.PASSED for r in tests if not r.errors)
        # An exercise whose code reached a forbidden op anywhere earns nothing: the op it was
        # asked to write was not its own work, whatever its other tests gave.
        forbidden = any(r.outcome == Outcome.FORBIDDEN for r in tests)
        paid = [] if forbidden else [r for r in tests if r.outcome == Outcome.PASSED and (
            any(r is v for v in values) or (right and (behaves or not r.errors)))]
        withheld = sum(r.points for r in tests if r.outcome == Outcome.PASSED) - sum(
            r.points for r in paid)
        message = worst.message
        if forbidden and withheld > 1e-9:
            message = f"{message} (an exercise that reaches a forbidden op earns nothing)"
        elif withheld > 1e-9:
            message = (f"{message} (the {round(withheld, 2):g} point(s) of its other checks "
                       f"(shapes, devices, properties, a clear error on bad input) count once "
                       f"the tests on good input pass)")
        printed = (worst.printed if worst.outcome != Outcome.PASSED
                   else "".join(r.printed for r in tests)[-2000:])
        rows.append(ExerciseResult(
            id=exercise, chapter=ExerciseId(exercise).chapter, title=tests[0].title or exercise,
            points=round(sum(r.points for r in paid), 2),
            max_points=round(sum(r.points for r in tests), 2),
            status=worst.outcome, message=message, printed=printed, mistake=worst.mistake,
        ))
    return rows


@dataclass(frozen=True)
class Graded:
    """One grading run's result: every graded test's record, and :meth:`rows`."""

    spec: RunSpec
    records: list[TestRecord]

    def rows(self, source: Source | None = None) -> list[ExerciseResult]:
        """One row an exercise graded on ``source`` (None: the run's only source), with
        what its earlier parts mean for it (:func:`_explained`)."""
        if source is None:
            if len(self.spec.sources) != 1:
                raise ValueError("a run of several sources has rows for each: name one")
            source = self.spec.sources[0]
        mine = [r for r in self.records if r.parts in (None, str(source))]
        declared = dependencies.read()
        # Blame names only parts graded in this run: what the learner's code calls (any
        # name it exports) never orders more tests.
        right, unsure = values_right(mine), unsure_names(mine)
        called = {e: declared.called(n for r in tests for n in r.calls)
                  for e, tests in _by_exercise(mine).items()}
        rows = summarize(mine)
        faults = {r.id: fault for r in rows if (fault := contract_fault(r.mistake))}
        return [_explained(r, right, called, declared, unsure, faults) for r in rows]


CONTRACT_FAULTS = ("device-not-kept", "dtype-changed", "detached")


def contract_fault(mistake: str) -> str | None:
    """The contract a named mistake breaks (``"3.1/detached"``: ``"detached"``), or None: a
    fault that an exercise inherits from a part it calls, whose own name would then be false."""
    fault = mistake.partition("/")[2]
    return fault if fault in CONTRACT_FAULTS else None


def grade(spec: RunSpec, chapters: list[int] | None = None,
          cache_dir: Path | None = None) -> Graded:
    """Grade the exercises ``spec`` asks for (its ``exercises``, else those of ``chapters``,
    else all), running only their graded tests. A whole-course exercise (the capstone)
    whose files are unchanged since it last passed or failed is not run again when
    ``cache_dir`` is given (:mod:`.cache`). A ``ValueError`` names an exercise or chapter
    that has no graded tests; :class:`~.outcomes.GraderFault` says why the grader could not
    grade (no learner code ran: nothing to credit or blame)."""
    chapter_test_files(chapters)  # a chapter without graded tests is a ValueError
    declared = dependencies.read()
    wanted = list(spec.exercises or map(ExerciseId, declared.exercises(chapters)))
    unknown = sorted(set(wanted).difference(declared.titles), key=order)
    if unknown:
        raise ValueError(f"no graded exercise {', '.join(unknown)}; exercises: "
                         f"{', '.join(declared.exercises())}")
    keys: dict[str, str] = {}  # {whole-course exercise: the key of its result}
    kept: dict[str, list[TestRecord]] = {}  # {whole-course exercise: its records, reused}
    if cache_dir is not None:
        for exercise in (e for e in wanted if e in declared.integration):
            chapter = declared.chapter_of(exercise)
            built_on = {declared.chapter_of(p) for p in declared.closure(exercise)} | {chapter}
            entry = cache.key(spec.sources, built_on, chapter_test_files([chapter])[chapter])
            if entry is None:
                continue
            keys[exercise] = entry
            if (found := cache.load(cache_dir, exercise, entry)) is not None:
                kept[exercise] = found
    to_run = [e for e in wanted if e not in kept]
    records = _run(replace(spec, exercises=tuple(to_run))) if to_run else []
    for whole_course, entry in keys.items():
        if cache_dir is not None and whole_course not in kept:
            cache.store(cache_dir, whole_course, entry, records)
    records += [r for exercise in wanted for r in kept.get(exercise, [])]
    records.sort(key=lambda r: r.chapter or 0)
    fault = next((r for r in records if r.outcome is Outcome.GRADER_ERROR), None)
    if fault is not None:
        raise GraderFault(fault.message)
    return Graded(spec, records)


def _explained(row: ExerciseResult, right: dict[str, bool | None],
               called: dict[str, set[str]], declared: dependencies.Declared,
               unsure: dict[str, str], faults: dict[str, str]) -> ExerciseResult:
    """``row``, with what its earlier parts mean for it (``book/instructor.md``, "Each
    exercise is graded on its own code"). Where it passes, called a stand-in
    (``Declared.stand_ins``), and the learner's own version of that part is wrong or not
    graded in this run, :func:`alone` says so. Where it does not pass and called an earlier part
    without a stand-in whose values are wrong, the message names that part (first, or after
    the learner's own mistake when its tests name one), and a mistake that some of its tests
    of values do not name is dropped (the wrong part may explain it). A contract's mistake
    (``device-not-kept``, ...) named for it while such a part it called is named for the
    same one (``faults``: each exercise's) is that part's: the name is dropped and the
    message names the part."""
    # The stand-ins its code called (a part it never calls is none of its business).
    offered = declared.stand_ins(row.id)
    stood = [p for p in offered if p in called.get(row.id, ())]
    wrong = [p for p in stood if right.get(p) is False]  # each graded on its own: all of them
    unknown = [p for p in stood if p not in right]  # not graded in this run (--exercise)
    if (wrong or unknown) and row.status == Outcome.PASSED:  # else its message is its own code's
        note = alone(row.id, wrong or unknown, declared, graded=bool(wrong))
        message = f"{cut(row.message, MESSAGE_LIMIT - len(note) - 1)} {note}".strip()
        row = replace(row, message=message)
    # A stub's own message already names the exercise that is not written yet.
    if row.status in (Outcome.PASSED, Outcome.FORBIDDEN, Outcome.NOT_IMPLEMENTED):
        return row
    fault = contract_fault(row.mistake)
    inherited = sorted((p for p in called.get(row.id, set()) - {row.id}
                        if p not in offered and fault and faults.get(p) == fault),
                       key=order)
    if inherited:
        blame = dependencies.blame(row.id, inherited, declared)
        return replace(row, mistake="", message=cut(f"{blame} {row.message}"),
                       blocked_by=",".join(inherited))
    roots = [p for p in dependencies.failing_roots(row.id, right, called) if p not in offered]
    if not roots:
        return row
    blame = dependencies.blame(row.id, roots, declared)
    if row.mistake and row.id in unsure:
        row = replace(row, mistake="", message=cut(unsure[row.id]) or row.message)
    if row.mistake:  # the learner's own mistake first, whole; the blame after it
        message = f"{cut(row.message, MESSAGE_LIMIT - len(blame) - 1)} {blame}"
    else:
        message = cut(f"{blame} {row.message}".strip())
    return replace(row, message=message, blocked_by=",".join(roots))


def alone(exercise: str, wrong: list[str], declared: dependencies.Declared, *,
          graded: bool) -> str:
    """``"Graded with the grader's LayerNorm (5.1) in place of yours, which does not pass
    yet: 5.5 earns its points alone, but a model of your own parts will not work until you
    fix 5.1."`` (wrong values, a forbidden op or a stub: it does not pass). ``graded`` False:
    those parts were not graded in this run, and the note says to grade them."""
    named = [f"{declared.name(p)} ({p})" for p in wrong[:dependencies.SHOWN]]
    if len(wrong) > dependencies.SHOWN:
        named.append(f"{len(wrong) - dependencies.SHOWN} more")
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    fix = wrong[0] if len(wrong) == 1 else f"{', '.join(wrong[:-1])} and {wrong[-1]}"
    verb = "does" if len(wrong) == 1 else "do"
    if not graded:
        return (f"Graded with the grader's {listed} in place of yours: {exercise} earns its "
                f"points alone; grade {fix} as well to know that a model of your own parts "
                f"works.")
    return (f"Graded with the grader's {listed} in place of yours, which {verb} not pass "
            f"yet: {exercise} earns its points alone, but a model of your own parts will "
            f"not work until you fix {fix}.")
