"""What a call of the worker can end with, besides its value: the exceptions the graded
tests see (:meth:`annotated_transformer.course.grading.supervisor.CodeUnderTest.run`), and whose
fault each one is; :class:`Outcome`, how a test ended, and :class:`StopReason`, why a call
was stopped. Of the grader it imports only the words of :mod:`.messages` (which imports none
of it): the graded test files import these names, and a grading worker loads those files
for their probes."""

from __future__ import annotations

from enum import Enum

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


class StopReason(str, Enum):
    """Why a call was stopped (the bounds are :mod:`.watch`'s and :mod:`.limits`'s): every
    reason but ``busy`` is the code under test's doing."""

    CPU = "cpu"  # its processes used more CPU seconds than the call allows
    WAITED = "waited"  # it waited WAIT_SECONDS of wall time without computing
    REPLY = "reply"  # a reply begun was not complete REPLY_SECONDS later (counted as waited)
    REQUEST = "request"  # the request was not all read REPLY_SECONDS in (counted as waited)
    PROCESSES = "processes"  # more processes than TASKS, where no cgroup bounds them
    BUSY = "busy"  # the wall-clock backstop ran out within the CPU budget: the machine's fault


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
    ``reason`` is :class:`StopReason`'s ``CPU``, ``WAITED``, ``REQUEST`` or ``REPLY``; ``where``
    the learner's ``file:line`` it was running, when known; ``at_import`` whether that was
    the chapter file's import."""

    outcome = Outcome.TIMEOUT

    def __init__(self, message: str, where: str = "", reason: StopReason = StopReason.CPU,
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
