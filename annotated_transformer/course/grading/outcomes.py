"""What a call of the worker can end with, besides its value: the exceptions the graded
tests see (:meth:`annotated_transformer.course.grading.supervisor.CodeUnderTest.run`), and whose
fault each one is."""

from __future__ import annotations

from annotated_transformer.course.grading import watch


class LearnerNotImplemented(NotImplementedError):
    """The code under test reached a stub that is still ``raise NotImplementedError``."""


class LearnerRaised(RuntimeError):
    """The code under test raised; ``types`` names the exception's classes (most derived
    first), ``message`` its text, ``where`` the learner's ``file:line``."""

    def __init__(self, types: list[str], message: str, where: str) -> None:
        self.types, self.message, self.where = types, message, where
        suffix = f" (at {where})" if where else ""
        super().__init__(f"{types[0] if types else 'Exception'}: {message}{suffix}")


class ForbiddenCall(RuntimeError):
    """The code under test broke a rule of what an exercise may do (a forbidden op, a
    forbidden name, PyTorch or the course replaced)."""


class WorkerTimeout(RuntimeError):
    """The code under test used more CPU time than its test allows, waited without
    computing, or did not finish its reply (the worker was stopped): ``reason`` is
    ``cpu``, ``waited`` or ``reply`` (:mod:`.watch`); ``where`` the learner's ``file:line``
    it was running, when known; ``at_import`` whether that was the chapter file's import."""

    def __init__(self, message: str, where: str = "", reason: str = "cpu",
                 at_import: bool = False) -> None:
        self.where, self.reason, self.at_import = where, reason, at_import
        super().__init__(message)


class MachineBusy(RuntimeError):
    """The wall-clock backstop ran out while the code under test was still within its CPU
    budget: the machine was too busy to grade, which is no fault of the learner's code."""


class GraderFault(RuntimeError):
    """The worker could not start before any learner code ran: a fault of the grader or of
    its installation, never of the code under test."""


class WorkerCrashed(RuntimeError):
    """The worker ended while it ran the code under test (``os._exit``, a crash, memory)."""


def imported(module: object) -> None:
    """The probe that only imports a chapter file (the worker imports it before any probe):
    run by the sandbox in the worker to tell a chapter whose import crashes."""


BUSY_LIMIT = 2  # calls of one worker stopped for a busy machine, before its others end at once


def busy_again() -> MachineBusy:
    """What a call tells after :data:`BUSY_LIMIT` calls of its worker were stopped busy."""
    return MachineBusy(f"the machine was too busy for {BUSY_LIMIT} tests of this code (each ran "
                       f"out of wall time within its CPU budget), so its other tests were not "
                       f"run. Not your code's fault: grade again when the machine is quieter")


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
    elif stop.reason == "reply":
        message = (f"Timeout: the process running your code began its answer to the grader "
                   f"but had not finished it {watch.REPLY_SECONDS:g} s later, and was stopped "
                   f"(does your code write to the grader's channel?).{at}")
    else:
        message = (f"Timeout: your code waited {stop.may_wait:g} s without computing and was "
                   f"stopped (time.sleep, input(), a lock, a Future's wait(), a process or "
                   f"pipe that never answers?).{at}")
    return WorkerTimeout(message, where, stop.reason, at_import)
