"""What a call of the worker can end with, besides its value: the exceptions the graded
tests see (:meth:`annotated_transformer.course.grading.supervisor.CodeUnderTest.run`), and whose
fault each one is."""

from __future__ import annotations

from enum import Enum

from annotated_transformer.course.grading import watch
from annotated_transformer.course.grading.messages import learner_error


class Outcome(str, Enum):
    """How a graded test ended, and an exercise's status (its worst test's outcome). The
    order is the priority: an exercise's status is the first of its tests' outcomes in it.
    The value is the word the reports write (and read back)."""

    GRADER_ERROR = "grader error"  # no learner code ran: the grader's fault
    BUSY = "busy"  # the machine was too busy to finish a call: no one's fault
    FORBIDDEN = "forbidden"
    NOT_IMPLEMENTED = "not implemented"
    ERROR = "error"
    TIMEOUT = "timeout"
    FAILED = "failed"
    SKIPPED = "skipped"
    PASSED = "passed"
    COLLECTED = "collected"  # listed, not run (the points on offer)

    def __str__(self) -> str:
        return self.value

    @property
    def priority(self) -> int:
        """Its place in the order: lower is worse."""
        return list(Outcome).index(self)


class LearnerNotImplemented(NotImplementedError):
    """The code under test reached a stub that is still ``raise NotImplementedError``."""

    outcome = Outcome.NOT_IMPLEMENTED


class LearnerRaised(RuntimeError):
    """The code under test raised; ``types`` names the exception's classes (most derived
    first), ``message`` its text, ``where`` the learner's ``file:line``."""

    outcome = Outcome.ERROR

    def __init__(self, types: list[str], message: str, where: str) -> None:
        self.types, self.message, self.where = types, message, where
        super().__init__(learner_error(types, message, where))


class ForbiddenCall(RuntimeError):
    """The code under test broke a rule of what an exercise may do (a forbidden op, a
    forbidden name, PyTorch or the course replaced)."""

    outcome = Outcome.FORBIDDEN


class WorkerTimeout(RuntimeError):
    """The code under test used more CPU time than its test allows, waited without
    computing, or did not read its request or finish its reply (the worker was stopped):
    ``reason`` is ``cpu``, ``waited``, ``request`` or ``reply`` (:mod:`.watch`); ``where``
    the learner's ``file:line`` it was running, when known; ``at_import`` whether that was
    the chapter file's import."""

    outcome = Outcome.TIMEOUT

    def __init__(self, message: str, where: str = "", reason: str = "cpu",
                 at_import: bool = False) -> None:
        self.where, self.reason, self.at_import = where, reason, at_import
        super().__init__(message)


class MachineBusy(RuntimeError):
    """The wall-clock backstop ran out while the code under test was still within its CPU
    budget: the machine was too busy to grade, which is no fault of the learner's code."""

    outcome = Outcome.BUSY


class GraderFault(RuntimeError):
    """The worker could not start before any learner code ran: a fault of the grader or of
    its installation, never of the code under test."""

    outcome = Outcome.GRADER_ERROR


class WorkerCrashed(RuntimeError):
    """The worker ended while it ran the code under test (``os._exit``, a crash, memory)."""

    outcome = Outcome.ERROR


# What the code under test's call ends with, as the graded tests see it; each says its outcome.
RAISED = (LearnerNotImplemented, LearnerRaised, ForbiddenCall, WorkerTimeout, MachineBusy,
          GraderFault, WorkerCrashed)


def imported(module: object) -> None:
    """The probe that only imports a chapter file (the worker imports it before any probe):
    run by the sandbox in the worker to tell a chapter whose import crashes."""


def unreadable(message: str) -> bool:
    """Whether a static finding says the file cannot be read as Python at all (an error of
    the learner's, not a forbidden use)."""
    return "is not valid Python" in message or "cannot be read" in message


BUSY_LIMIT = 2  # calls of one worker stopped for a busy machine, before its others end at once
# What one source's calls may use together in a grading run, each call within its own
# limits: code that stays just under them in every test would hold a class regrade for
# hours. The reference's whole course grades in 34 s of wall time on a 2-core machine
# (`grade --parts solutions --no-cache`); its worst call, the capstone's, may use 300.
TOTAL_CPU_SECONDS = 1200.0
TOTAL_WAIT_SECONDS = 60.0  # honest code never waits


class Allowance:
    """The CPU seconds, the waiting and the busy stops of each source's calls (by worker
    key) in a grading run, and the end of its calls once one is spent (:meth:`refusal`)."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {}
        self.waited: dict[str, float] = {}
        self.busy: dict[str, int] = {}

    def spend(self, key: str, used: float, waited: float) -> None:
        self.used[key] = self.used.get(key, 0.0) + max(used, 0.0)
        self.waited[key] = self.waited.get(key, 0.0) + max(waited, 0.0)

    def count(self, key: str, error: Exception) -> None:
        """Note how a call ended (a busy machine counts towards :data:`BUSY_LIMIT`)."""
        self.busy[key] = self.busy.get(key, 0) + isinstance(error, MachineBusy)

    def refusal(self, key: str, totals: bool = True) -> Exception | None:
        """What ``key``'s next call ends with at once, or None when it may run; ``totals``:
        whether the totals apply (not to the course's own code, which the tests run at
        length)."""
        if self.busy.get(key, 0) >= BUSY_LIMIT:  # each would wait out the backstop again
            return MachineBusy(f"the machine was too busy for {BUSY_LIMIT} tests of this code "
                               f"(each ran out of wall time within its CPU budget), so its other "
                               f"tests were not run. Not your code's fault: grade again when "
                               f"the machine is quieter")
        if not totals:
            return None
        used, waited = self.used.get(key, 0.0), self.waited.get(key, 0.0)
        if used > TOTAL_CPU_SECONDS:
            return WorkerTimeout(f"Timeout: your code has used {used:.0f} CPU seconds over its "
                                 f"tests, more than the {TOTAL_CPU_SECONDS:g} that a grading run "
                                 f"gives it in all, so its other tests were not run (a very "
                                 f"slow loop in Python?)", reason="cpu")
        if waited > TOTAL_WAIT_SECONDS:
            return WorkerTimeout(f"Timeout: your code has kept the grader waiting {waited:.0f} s "
                                 f"over its tests, more than the {TOTAL_WAIT_SECONDS:g} s that a "
                                 f"grading run allows in all, so its other tests were not run "
                                 f"(time.sleep? input()? an answer to the grader begun and not "
                                 f"finished?)", reason="waited")
        return None


def stopped(stop: watch.Stop, cpu_seconds: float, where: str, at_import: bool) -> Exception:
    """What a call stopped by ``stop`` (:mod:`.watch`) tells: the learner's fault, but for a
    busy machine. ``where``: the learner's ``file:line`` it was running, when known."""
    at = f" It was running {where}." if where else ""
    if stop.reason == "busy":
        return MachineBusy(f"the machine was too busy: after {stop.wall:.0f} s of wall time "
                           f"your code had used only {stop.used:.1f} of its {cpu_seconds:g} "
                           f"CPU seconds. Not your code's fault: grade again when the machine "
                           f"is quieter")
    if stop.reason == "processes":
        return WorkerCrashed("your code started more processes than the grader allows and "
                             "was stopped (a fork bomb?)")
    if stop.reason == "cpu":
        unit = "second" if cpu_seconds == 1 else "seconds"
        message = (f"Timeout: your code used more than {cpu_seconds:g} CPU {unit} and was "
                   f"stopped (an endless loop? a very slow loop in Python?).{at}")
    elif stop.reason == "request":
        message = (f"Timeout: the process running your code had not read the grader's "
                   f"request {watch.REPLY_SECONDS:g} s after it was sent, and was stopped "
                   f"(does your code read from the grader's channel?).{at}")
    elif stop.reason == "reply":
        message = (f"Timeout: the process running your code began its answer to the grader "
                   f"but had not finished it {watch.REPLY_SECONDS:g} s later, and was stopped "
                   f"(does your code write to the grader's channel?).{at}")
    else:
        message = (f"Timeout: your code waited {stop.may_wait:g} s without computing and was "
                   f"stopped (time.sleep, input(), a lock, a Future's wait(), a process or "
                   f"pipe that never answers?).{at}")
    return WorkerTimeout(message, where, stop.reason, at_import)
