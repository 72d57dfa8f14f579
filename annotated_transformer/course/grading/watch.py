"""How long one call of the worker may take: the trusted side's deadlines, from what it sees.

A call ends with the worker's reply, or is stopped (:class:`Stop`) for a
:class:`~.outcomes.StopReason`. It waits only while, between two looks, no byte of the request
or the reply moved, no thread of the worker was runnable (running, or ready to run and waiting
for a core) and it used under half the time in CPU: a call slowed by a busy machine is
runnable all along, so a loaded machine never counts as waiting. ``book/instructor.md``
(*What one learner can cost a regrade*) says what each bound is for.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Hashable

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.outcomes import (
    MachineBusy,
    StopReason,
    WorkerCrashed,
    WorkerTimeout,
)

WAIT_SECONDS = 10.0  # wall seconds a call may spend waiting without computing
# Once a test of a chapter was stopped for waiting, each later call of that chapter may wait
# this long: a chapter that waits costs WAIT_SECONDS once, not once a test.
WAIT_AFTER_SECONDS = 2.0
WAITING_SHARE = 0.5  # under this share of the wall time in CPU (and not runnable): waiting
REPLY_SECONDS = 60.0  # wall seconds from a reply's first byte to its last
LOOK_SECONDS = 0.2  # while bytes flow, the least time between two readings of /proc
BUSY_FACTOR, BUSY_FLOOR = 20.0, 300.0  # the wall-clock backstop of a call: its CPU budget
# times BUSY_FACTOR, and at least BUSY_FLOOR seconds


class Stop(Exception):
    """A call stopped before its reply, for ``reason``."""

    def __init__(self, reason: StopReason, used: float, wall: float, may_wait: float) -> None:
        self.reason, self.used, self.wall, self.may_wait = reason, used, wall, may_wait
        super().__init__(reason)


class CallWatch:
    """The deadlines of one call, checked by :meth:`look` between two reads of the pipes."""

    def __init__(self, meter: boundary.CpuMeter, cpu_seconds: float,
                 wait_seconds: float = WAIT_SECONDS, processes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meter, self.cpu_seconds, self.wait_seconds = meter, cpu_seconds, wait_seconds
        self.processes, self.clock = processes, clock
        self.start = self.last = self.sampled = clock()
        self.cpu_start = self.cpu_last = meter.sample().seconds
        self.backstop = max(BUSY_FLOOR, BUSY_FACTOR * cpu_seconds)
        self.waited, self.reply_start = 0.0, None  # type: float, float | None

    def look(self, moved: bool, reply_started: bool, sending: bool = False) -> None:
        """Raise :class:`Stop` when a deadline has passed. ``moved``: bytes of the request or
        the reply went through since the last look; ``reply_started``: a reply has begun;
        ``sending``: part of the request is not sent yet. While bytes flow, the worker's
        processes are read at most every LOOK_SECONDS."""
        now = self.clock()
        if reply_started and self.reply_start is None:
            self.reply_start = now
        if moved:
            self.last = now  # moving bytes is not waiting
            if now - self.sampled < LOOK_SECONDS:
                return
        sample, self.sampled = self.meter.sample(), now
        elapsed, computed = now - self.last, sample.seconds - self.cpu_last
        if not sample.runnable and computed < WAITING_SHARE * elapsed:
            self.waited += elapsed
        self.last, self.cpu_last = now, sample.seconds
        used, wall = sample.seconds - self.cpu_start, now - self.start
        reason = None
        if used > self.cpu_seconds:
            reason = StopReason.CPU
        elif self.processes is not None and sample.processes > self.processes:
            reason = StopReason.PROCESSES
        elif self.waited > self.wait_seconds:
            reason = StopReason.WAITED
        elif sending and wall > REPLY_SECONDS:
            reason = StopReason.REQUEST
            self.waited += wall
        elif self.reply_start is not None and now - self.reply_start > REPLY_SECONDS:
            reason = StopReason.REPLY
            # Bytes dripped kept it from counting as waiting; the grader waited all the same,
            # and its run's allowance of waiting (TOTAL_WAIT_SECONDS) counts it.
            self.waited += now - self.reply_start
        elif wall > self.backstop:
            reason = StopReason.BUSY
        if reason is not None:
            raise Stop(reason, used, wall, self.wait_seconds)


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
        self.used: defaultdict[Hashable, float] = defaultdict(float)
        self.waited: defaultdict[Hashable, float] = defaultdict(float)
        self.busy: defaultdict[Hashable, int] = defaultdict(int)  # calls stopped for a busy machine

    def spend(self, key: Hashable, used: float, waited: float) -> None:
        self.used[key] += max(used, 0.0)
        self.waited[key] += max(waited, 0.0)

    def refusal(self, key: Hashable, totals: bool = True) -> Exception | None:
        """What ``key``'s next call ends with at once, or None when it may run; ``totals``:
        whether the totals apply (not to the course's own code, which the tests run at
        length)."""
        if self.busy[key] >= BUSY_LIMIT:  # each would wait out the backstop again
            return MachineBusy(f"the machine was too busy for {BUSY_LIMIT} tests of this code "
                               f"(each ran out of wall time within its CPU budget), so its other "
                               f"tests were not run. Not your code's fault: grade again when "
                               f"the machine is quieter")
        if not totals:
            return None
        used, waited = self.used[key], self.waited[key]
        if used > TOTAL_CPU_SECONDS:
            return WorkerTimeout(f"Timeout: your code has used {used:.0f} CPU seconds over its "
                                 f"tests, more than the {TOTAL_CPU_SECONDS:g} that a grading run "
                                 f"gives it in all, so its other tests were not run (a very "
                                 f"slow loop in Python?)", reason=StopReason.CPU)
        if waited > TOTAL_WAIT_SECONDS:
            return WorkerTimeout(f"Timeout: your code has kept the grader waiting {waited:.0f} s "
                                 f"over its tests, more than the {TOTAL_WAIT_SECONDS:g} s that a "
                                 f"grading run allows in all, so its other tests were not run "
                                 f"(time.sleep? input()? an answer to the grader begun and not "
                                 f"finished?)", reason=StopReason.WAITED)
        return None


def stopped(stop: Stop, cpu_seconds: float, where: str, at_import: bool) -> Exception:
    """What a call stopped by ``stop`` tells: the learner's fault, but for a
    busy machine. ``where``: the learner's ``file:line`` it was running, when known."""
    at = f" It was running {where}." if where else ""
    if stop.reason is StopReason.BUSY:
        return MachineBusy(f"the machine was too busy: after {stop.wall:.0f} s of wall time "
                           f"your code had used only {stop.used:.1f} of its {cpu_seconds:g} "
                           f"CPU seconds. Not your code's fault: grade again when the machine "
                           f"is quieter")
    if stop.reason is StopReason.PROCESSES:
        return WorkerCrashed("your code started more processes than the grader allows and "
                             "was stopped (a fork bomb?)")
    if stop.reason is StopReason.CPU:
        unit = "second" if cpu_seconds == 1 else "seconds"
        message = (f"Timeout: your code used more than {cpu_seconds:g} CPU {unit} and was "
                   f"stopped (an endless loop? a very slow loop in Python?).{at}")
    elif stop.reason is StopReason.REQUEST:
        message = (f"Timeout: the process running your code had not read the grader's "
                   f"request {REPLY_SECONDS:g} s after it was sent, and was stopped "
                   f"(does your code read from the grader's channel?).{at}")
    elif stop.reason is StopReason.REPLY:
        message = (f"Timeout: the process running your code began its answer to the grader "
                   f"but had not finished it {REPLY_SECONDS:g} s later, and was stopped "
                   f"(does your code write to the grader's channel?).{at}")
    else:
        message = (f"Timeout: your code waited {stop.may_wait:g} s without computing and was "
                   f"stopped (time.sleep, input(), a lock, a Future's wait(), a process or "
                   f"pipe that never answers?).{at}")
    return WorkerTimeout(message, where, stop.reason, at_import)
