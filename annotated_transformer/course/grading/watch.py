"""How long one call of the worker may take: the trusted side's deadlines, from what it sees.

A call ends with the worker's reply or with one of these verdicts (:class:`Stop`):

* ``cpu``: the worker's processes used more CPU seconds than the call allows;
* ``waited``: the call spent :data:`WAIT_SECONDS` of wall time waiting without computing:
  between two looks, no byte of the request or the reply moved, no thread of the worker was
  runnable (running, or ready to run and waiting for a core), and it used under half the
  time in CPU (a ``time.sleep``, a lock, a ``Future().wait()``, a pipe never written, half a
  reply). A call slowed by a busy machine is runnable all along, so a loaded machine never
  counts as waiting;
* ``reply``: a reply began and was not complete :data:`REPLY_SECONDS` later (that time
  counts as waited: bytes dripped slowly keep a call from waiting, not the grader);
* ``request``: the worker had not read the whole request :data:`REPLY_SECONDS` after the
  call began (counted as waited too: a request read a page at a time moves bytes);
* ``processes``: the worker had more than its number of processes (where no cgroup bounds
  them, :mod:`.limits`);
* ``busy``: the wall-clock backstop ran out while the worker was within its CPU budget and
  kept wanting the machine: the machine was too busy, no fault of the code under test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from annotated_transformer.course.grading import boundary

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
    """A call stopped before its reply; ``reason`` is one of the module's verdicts."""

    def __init__(self, reason: str, used: float, waited: float, wall: float,
                 may_wait: float) -> None:
        self.reason, self.used, self.waited, self.wall = reason, used, waited, wall
        self.may_wait = may_wait
        super().__init__(reason)


class CallWatch:
    """The deadlines of one call, checked by :meth:`look` between two reads of the pipes."""

    def __init__(self, meter: boundary.CpuMeter, cpu_seconds: float,
                 wait_seconds: float = WAIT_SECONDS, processes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meter, self.cpu_seconds, self.wait_seconds = meter, cpu_seconds, wait_seconds
        self.processes, self.clock = processes, clock
        self.start = self.last = self.sampled = clock()
        self.cpu_start = self.cpu_last = meter.seconds()
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
            reason = "cpu"
        elif self.processes is not None and sample.processes > self.processes:
            reason = "processes"
        elif self.waited > self.wait_seconds:
            reason = "waited"
        elif sending and wall > REPLY_SECONDS:
            reason = "request"
            self.waited += wall
        elif self.reply_start is not None and now - self.reply_start > REPLY_SECONDS:
            reason = "reply"
            # Bytes dripped kept it from counting as waiting; the grader waited all the same,
            # and its run's allowance of waiting (outcomes.TOTAL_WAIT_SECONDS) counts it.
            self.waited += now - self.reply_start
        elif wall > self.backstop:
            reason = "busy"
        if reason:
            raise Stop(reason, used, self.waited, wall, self.wait_seconds)
