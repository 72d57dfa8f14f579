"""The trusted side of grading: start a worker for the code under test and talk to it.

A graded test hands a *probe* (a small function of its own file that calls the learner's
code) and its inputs to :meth:`CodeUnderTest.run`; the probe runs in the worker
(:mod:`.worker.process`) and its result comes back as plain data, which the test checks,
in this process that never imports a learner's code, against what it computes itself with
PyTorch's own ops. Whatever that code does in the worker, it cannot reach the verdict: the
worker is its own process (its own session, killed at the end), its replies are parsed as
data only, its printed output is bounded, each call has deadlines (:mod:`.watch`), and its
memory and processes are bounded together (:mod:`.limits`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from annotated_transformer.course.grading import boundary, limits, outcomes, protocol, watch
from annotated_transformer.course.grading.outcomes import (  # noqa: F401 - the tests' names
    ForbiddenCall,
    GraderFault,
    LearnerNotImplemented,
    LearnerRaised,
    MachineBusy,
    StopReason,
    WorkerCrashed,
    WorkerTimeout,
)
from annotated_transformer.course.grading.output import PrintedOutput
from annotated_transformer.course.grading.protocol import Ended, Reply, Request, WorkerConfig
from annotated_transformer.course.grading.runspec import is_trusted
from annotated_transformer.layout import GRADED_DIR, ROOT, VARIANTS_DIR
from annotated_transformer.sources import Source, Word

if TYPE_CHECKING:
    from annotated_transformer.course.grading.source_rules import Violation

OUTPUT_LIMIT = 4000  # characters of the learner's printed output kept per worker
DEFAULT_MEMORY = 16 * 2**30  # address space of the worker, bytes (PyTorch maps a lot)
START_SECONDS = 300.0  # wall time a worker may take to import PyTorch and the tests
POLL = 0.25  # seconds between two looks at the worker (its CPU time, its threads)
STACK_DUMP = re.compile(r"(?m)^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call "
                        r"first\):")  # faulthandler's stack, asked for by the grader
# How the worker starts: the grader's own copy of the package first on its path (the worker
# runs the package that grades, installed or not), then the worker's main.
WORKER_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from annotated_transformer.course."
               "grading.worker.process import main; sys.exit(main())")
STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')  # as faulthandler prints a frame


class WorkerProcess:
    """One worker: a fresh interpreter in its own session, fed requests one at a time,
    started at once and waited for at its first call (it imports PyTorch meanwhile)."""

    def __init__(self, source: str, learner_dir: Path | None, blocked: Mapping[int, Violation],
                 user: str | None, sandboxed: bool, probes: Path, new_tasks: bool) -> None:
        self.home: tempfile.TemporaryDirectory[str] | None = None
        self.staged, self.renamed = None, None  # a private copy, and (its path, the folder's own)
        if sandboxed and learner_dir is not None:
            self.staged, copy = boundary.staged(learner_dir)
            self.renamed, learner_dir = (str(copy), str(learner_dir)), copy
        self.learner_dir, self.probes = learner_dir, probes
        # What the worker says of a blocked chapter is its violation's text, told as is: a
        # file that does not parse (a violation marked unreadable) is the learner's error.
        self.unreadable = frozenset(v.told() for v in blocked.values() if v.unreadable)
        config = WorkerConfig(source, learner_dir, probes, VARIANTS_DIR.parent,
                              {c: v.told() for c, v in blocked.items()}, user, DEFAULT_MEMORY,
                              new_tasks)
        argv = [sys.executable, "-I", "-B", "-c", WORKER_BOOT, str(ROOT), config.to_wire()]
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "TORCH_HOME": "/tmp"}
        if sandboxed:
            argv = boundary.command(argv, learner_dir, probes, env)
            cwd = None
        else:  # no boundary: a private folder of the disk stands in for /tmp
            self.home = tempfile.TemporaryDirectory(prefix="grading-worker-")
            env = {**env, "HOME": self.home.name, "TMPDIR": self.home.name,
                   "TORCH_HOME": self.home.name, "PATH": os.environ.get("PATH", env["PATH"])}
            if user:  # the worker's home is the user's
                import pwd

                os.chown(self.home.name, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
            cwd = self.home.name
        self.group = limits.Cgroup.make()  # its memory and processes, all together
        if self.group is not None:
            argv = self.group.command(argv)
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, cwd=cwd, env=env,
                                        start_new_session=True)
        assert self.process.stdout and self.process.stderr and self.process.stdin
        for stream in (self.process.stdin, self.process.stdout):
            os.set_blocking(stream.fileno(), False)  # read and written by _exchange only
        self.meter = boundary.CpuMeter(self.process.pid, self.group)
        self.output = PrintedOutput(self.process.stderr.fileno(), OUTPUT_LIMIT)
        self.output.start()
        self.ready, self.mark, self.spent = False, 0, (0.0, 0.0)
        self.stack_asked = False  # the grader asked for the stack: not the learner's output
        self.stack: list[tuple[str, str]] = []  # its frames (file, line), most recent first

    def call(self, request: Request, cpu_seconds: float, locate: bool = True,
             wait_seconds: float = watch.WAIT_SECONDS) -> Reply:
        """Send ``request``; its reply, once the worker has used at most ``cpu_seconds`` of
        CPU time on it (all its processes together) and waited without computing at most
        ``wait_seconds`` (:mod:`.watch`). ``locate``: when it is stopped, name the line it
        was running (half a second of waiting for its stack)."""
        if not self.ready:
            self._wait_ready()
        self.mark = self.output.total
        self.stack_asked, self.stack = False, []
        calls = watch.CallWatch(self.meter, cpu_seconds, wait_seconds,
                                processes=None if self.group else limits.TASKS)
        try:
            reply = Reply.from_wire(self._exchange(protocol.frame(request.to_wire()),
                                                   calls.look))
        except (EOFError, protocol.ProtocolError) as error:
            said = f"it answered {error}" if isinstance(error, protocol.ProtocolError) else error
            raise WorkerCrashed(self._ended(str(said))) from None
        except watch.Stop as stop:
            where = self._running_line() if locate and stop.reason is not StopReason.BUSY else ""
            self.close()
            raise watch.stopped(stop, cpu_seconds, where, self._at_import()) from None
        finally:  # (CPU seconds, seconds waited) of this call; a stopped worker's last look
            self.spent = (max(self.meter.sample().seconds, calls.cpu_last) - calls.cpu_start,
                          calls.waited)
        if self.renamed:  # as the learner named it
            reply = dataclasses.replace(reply, message=reply.message.replace(*self.renamed))
        return reply

    def printed(self) -> str:
        """What the code under test printed during the last call (at most its end), without
        the stack the grader asked for."""
        text = self.output.since(self.mark)
        return STACK_DUMP.split(text, 1)[0] if self.stack_asked else text

    def _wait_ready(self) -> None:
        """Wait for the worker's :data:`~.protocol.READY`: it has imported PyTorch and the
        tests, and no learner code has run yet, so a failure here is the grader's."""
        start = time.monotonic()

        def look(moved: bool, started: bool, sending: bool) -> None:
            if time.monotonic() - start > START_SECONDS:
                raise EOFError(f"it did not start within {START_SECONDS:g} s")

        try:
            if self._exchange(b"", look) != protocol.READY:
                raise EOFError("it said something else than that it was ready")
        except EOFError as error:
            self.close()
            printed = [line for line in self.output.text().strip().splitlines() if line]
            cause = printed[-1][:300] if printed else str(error)
            raise GraderFault(f"the grader could not start its worker ({cause}); this is "
                              f"no fault of the code under test") from None
        self.ready = True

    def _exchange(self, send: bytes, look: Callable[[bool, bool, bool], None]
                  ) -> Any:
        """Write ``send`` to the worker and read its reply, never blocking: ``look(moved,
        started, sending)`` runs after each pass (at least every :data:`POLL` seconds) and raises to
        stop. ``EOFError`` when the worker ended or answered something that is not a reply."""
        assert self.process.stdin is not None and self.process.stdout is not None
        out, into = self.process.stdout.fileno(), self.process.stdin.fileno()
        left, reader = memoryview(send), protocol.FrameReader()
        while True:
            readable, writable, _ = select.select([out], [into] if left else [], [], POLL)
            moved = False
            if writable:
                try:
                    sent = os.write(into, left[:2**16])
                except BlockingIOError:
                    sent = 0
                except OSError as error:
                    raise EOFError(f"it could not be sent the test ({error})") from None
                left, moved = left[sent:], sent > 0
            if readable:
                try:
                    chunk = os.read(out, 2**20)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    raise EOFError("it closed its channel to the grader")
                if chunk:
                    moved = True
                    try:
                        reader.feed(chunk)
                        if reader.complete():
                            return reader.message()  # a Reply to read, or the worker's ready
                    except protocol.ProtocolError as error:
                        raise EOFError(f"it answered {error}") from None
            look(moved, reader.started, bool(left))

    def _running_line(self) -> str:
        """The learner's ``file:line`` the worker is running: asked for with SIGUSR1 (the
        worker's faulthandler prints its stack), read from what it printed."""
        if self.learner_dir is None:
            return ""
        pids = [self.process.pid, *self.meter.descendants()]
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:  # python -I -B -c BOOT
                    if WORKER_BOOT.encode() not in handle.read().split(b"\0")[1:5]:
                        continue
                self.stack_asked = True
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                continue
            time.sleep(0.5)
            break
        self.stack = STACK_FRAME.findall(self.output.since(self.mark))
        for path, line in self.stack:
            if Path(path).is_relative_to(self.learner_dir):
                return f"{Path(path).name}:{line}"  # most recent call first
        return ""

    def _at_import(self) -> bool:
        """Whether the stack the worker printed when it was stopped is in the learner's
        files and not in a probe (the chapter file was being imported). The worker could
        print a stack of its choice: the answer only ever costs the learner's own tests."""
        files = {Path(path) for path, _ in self.stack}
        inside = any(self.learner_dir is not None and path.is_relative_to(self.learner_dir)
                     for path in files)
        return inside and not any(path.is_relative_to(self.probes) for path in files)

    def _ended(self, why: str) -> str:
        memory = self.group is not None and self.group.out_of_memory()
        code = self.process.poll()
        if code is None:
            self.close()
            code = self.process.returncode
        printed = [line[:100] for line in self.output.text().strip().splitlines()[-3:]]
        tail = f"; its last output: {' | '.join(printed)}" if printed else ""
        if memory:
            return (f"the process running your code was stopped while it ran this test: your "
                    f"code used more than {limits.MEMORY_BYTES / 2**30:g} GiB of memory (all "
                    f"its processes together){tail}")[:2000]
        how = (f"was killed by signal {-code}" if code is not None and code < 0
               else f"exited with code {code}")
        return (f"the process running your code {how} while it ran this test ({why}): "
                f"does your code call exit(), crash, or run out of memory?{tail}")[:2000]

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the worker and anything it started (its whole process group)."""
        try:
            os.killpg(self.process.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        if self.group is not None:
            self.group.close()  # what left the process group (a daemon, without bubblewrap)
        for stream in (self.process.stdin, self.process.stdout):
            if stream:
                try:
                    stream.close()
                except OSError:
                    pass
        for folder in (self.home, self.staged):
            if folder is not None:
                folder.cleanup()


class CodeUnderTest:
    """The code under test, as the graded tests see it: probes run in a worker.

    ``chapter`` is the chapter whose module the probes receive, ``exercise`` the
    exercise of the test (its forbidden ops are refused while the probe runs).
    """

    def __init__(self, pool: WorkerPool, source: Source, chapter: int, exercise: str | None,
                 forbid_ops: tuple[str, ...], seed: int, cpu_seconds: float) -> None:
        self.pool, self.source, self.chapter, self.exercise = pool, source, chapter, exercise
        self.forbid_ops, self.seed, self.cpu_seconds = forbid_ops, seed, cpu_seconds
        self.printed = ""  # what the code under test printed in this test (its end)
        self.called: set[str] = set()  # the chapters' functions it entered (grading.worker.calls)
        self.observe = False  # whether the worker notes them (an exercise that builds on others)
        self.standins: tuple[str, ...] = ()  # earlier exercises on the grader's stand-ins

    def run(self, probe: Callable[..., Any], /, **kwargs: Any) -> Any:
        """``probe(chapter_module, **kwargs)`` run in the worker; its result, as plain data.

        Raises :class:`LearnerNotImplemented`, :class:`LearnerRaised`,
        :class:`ForbiddenCall`, :class:`WorkerTimeout` or :class:`WorkerCrashed` (the
        code under test's doing); :class:`MachineBusy` or :class:`GraderFault` (not).
        """
        request = Request(inspect.getfile(probe), probe.__qualname__, self.chapter,
                          str(self.source), self.exercise, kwargs, self.forbid_ops, self.seed,
                          self.observe, self.standins)
        try:
            reply = self.pool.call(self.source, request, self.cpu_seconds)
        finally:
            self.printed = (self.printed + self.pool.printed(self.source))[-OUTPUT_LIMIT:]
        self.called.update(reply.called)
        if reply.ended is None:
            return reply.value
        message = reply.message
        if reply.ended is Ended.BLOCKED and message in self.pool.unreadable(self.source):
            raise LearnerRaised(["SyntaxError"], message, "")
        if reply.ended in (Ended.FORBIDDEN, Ended.BLOCKED):
            raise ForbiddenCall(message)
        if reply.stub:
            raise LearnerNotImplemented(message)
        raise LearnerRaised(list(reply.types), message, reply.where)

    def raises(self, expected: str | tuple[str, ...], probe: Callable[..., Any], /,
               **kwargs: Any) -> str:
        """Run ``probe`` and check that the code under test raised ``expected`` (an
        exception class name, or several); return its message for further checks."""
        names = (expected,) if isinstance(expected, str) else expected
        wanted = " or ".join(names)
        try:
            self.run(probe, **kwargs)
        except LearnerRaised as error:
            if not set(names) & set(error.types):
                raise AssertionError(f"expected {wanted} to be raised, but your code raised "
                                     f"{error}") from None
            return error.message
        raise AssertionError(f"expected {wanted} to be raised, but nothing was")


class WorkerPool:
    """One worker per source under test, started when first needed and again after a
    crash or a timeout. ``blocked_for(source)`` gives the chapters a learner's folder may
    not import (decided by the trusted static checks).

    ``probes``: the folder of the probes' files (the graded tests). ``sandboxed``: inside
    bubblewrap's boundary (:mod:`.boundary`). ``user``: the user the worker becomes before
    any learner code runs; a grader running as root always makes it ``nobody`` at least."""

    def __init__(self, learner_dir_for: Callable[[Source], Path | None],
                 blocked_for: Callable[[Source], Mapping[int, Violation]], user: str | None = None,
                 sandboxed: bool = True, probes: Path = GRADED_DIR,
                 new_tasks: bool = False) -> None:
        self.learner_dir_for, self.blocked_for, self.probes = learner_dir_for, blocked_for, probes
        self.new_tasks = new_tasks  # threads and processes allowed: the boundary's tests only
        self.user = user or ("nobody" if os.geteuid() == 0 else None)
        self.sandboxed = sandboxed
        self.workers: dict[Source, WorkerProcess] = {}  # by _key
        self.last_printed: dict[Source, str] = {}
        self.timed_out: set[tuple[Source, str | None]] = set()  # (worker, exercise) past its CPU
        self.waited: set[tuple[Source, int | None]] = set()  # (worker, chapter) that waited
        # (worker, chapter) whose import waited or crashed, (worker, exercise) whose code
        # waited: the error each of their calls ends with, without running
        self.blocks: dict[tuple[Source, int | str | None], Callable[[], Exception]] = {}
        self.crashed: set[tuple[Source, int | None]] = set()  # (worker, chapter): a call crashed
        self.imports: set[tuple[Source, int | None]] = set()  # (worker, chapter): imports safely
        # worker -> why it could not start: the grader's fault, the same for every later test
        # (each would cost a start of PyTorch), so they end with it at once
        self.unstartable: dict[Source, str] = {}
        self.allowance = watch.Allowance()  # what each worker's calls used together

    def _key(self, source: Source) -> Source:
        # The course's own code (the reference and the tests' variants) shares one worker.
        return Source(Word.SOLUTIONS) if is_trusted(source) else source

    def start(self, source: Source) -> WorkerProcess:
        """The worker of ``source``, started now when it is not running."""
        key = self._key(source)
        worker = self.workers.get(key)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.close()
            closed = None if self.sandboxed or not self.user else boundary.closed_to_others(
                self.probes)
            if closed is not None:
                raise GraderFault(
                    f"without the sandbox the code under test runs as {self.user}, who cannot "
                    f"enter {closed} (where this Python or the course is installed): install "
                    f"bubblewrap (--sandbox bubblewrap), grade as an ordinary user, or open "
                    f"that folder to others (chmod o+x)")
            learner_dir = self.learner_dir_for(source)
            worker = WorkerProcess(str(key), learner_dir,
                                   self.blocked_for(source) if learner_dir else {}, self.user,
                                   sandboxed=self.sandboxed, probes=self.probes,
                                   new_tasks=self.new_tasks)
            self.workers[key] = worker
        return worker

    def unreadable(self, source: Source) -> frozenset[str]:
        """What ``source``'s worker tells of its blocked chapters that do not parse."""
        worker = self.workers.get(self._key(source))
        return worker.unreadable if worker is not None else frozenset()

    def call(self, source: Source, request: Request, cpu_seconds: float) -> Reply:
        """``request`` (made for ``source``) answered by ``source``'s worker."""
        key, chapter, exercise = self._key(source), request.chapter, request.exercise
        self.last_printed.pop(key, None)  # a call refused at once prints nothing
        if key in self.unstartable:
            raise GraderFault(self.unstartable[key])
        if (refused := self.allowance.refusal(key, totals=not is_trusted(key))) is not None:
            raise refused
        for blocked in ((key, chapter), (key, exercise)):  # each test would cost as much
            if blocked in self.blocks:
                raise self.blocks[blocked]()
        worker = self.start(source)
        spent = (key, exercise) in self.timed_out
        waits = watch.WAIT_AFTER_SECONDS if (key, chapter) in self.waited else watch.WAIT_SECONDS
        try:
            if (key, chapter) in self.crashed and (key, chapter) not in self.imports:
                self._check_import(worker, key, request, cpu_seconds, waits)
            # after a timeout of the exercise (whose line was named), the same loop, likely
            budget = min(cpu_seconds, limits.AFTER_TIMEOUT_CPU_SECONDS) if spent else cpu_seconds
            return worker.call(request, budget, locate=not spent, wait_seconds=waits)
        except (WorkerTimeout, WorkerCrashed, MachineBusy, GraderFault) as error:
            if isinstance(error, WorkerTimeout) and error.reason is StopReason.CPU:
                self.timed_out.add((key, exercise))
            elif isinstance(error, WorkerTimeout):
                self.waited.add((key, chapter))
                what = "Importing your chapter file" if error.at_import else "Your exercise"
                how = {StopReason.WAITED: "waited",
                       StopReason.REQUEST: "did not read the grader's request"}.get(
                    error.reason, "did not finish its answer")  # REPLY: half
                message = (f"{error} {what} {how}: its other tests are not run (fix it, "
                           f"then grade again).")
                self.blocks[(key, chapter) if error.at_import else (key, exercise)] = (
                    functools.partial(WorkerTimeout, message, reason=error.reason,
                                      at_import=error.at_import))
            elif isinstance(error, WorkerCrashed):
                self.crashed.add((key, chapter))
            elif isinstance(error, GraderFault):
                self.unstartable[key] = str(error)
            else:  # a busy machine: BUSY_LIMIT of them end the worker's other calls at once
                self.allowance.busy[key] += 1
            worker.close()
            del self.workers[key]
            raise
        finally:
            self.last_printed[key] = worker.printed()
            self.allowance.spend(key, *worker.spent)

    def _check_import(self, worker: WorkerProcess, key: Source, request: Request,
                      cpu_seconds: float, waits: float) -> None:
        """After a crash in a chapter: import the chapter alone, in the fresh worker. When
        that crashes too, the chapter's import crashes every worker: its other tests end
        the same, at once (a crash costs a new worker, a chapter has tens of tests)."""
        alone = dataclasses.replace(request, file=outcomes.__file__, function="imported",
                                    kwargs={}, forbid_ops=(), exercise=None)
        try:
            worker.call(alone, cpu_seconds, wait_seconds=waits)
        except WorkerCrashed as error:
            message = (f"{error}. Importing your chapter file crashed the process that runs "
                       f"it: its other tests are not run (fix it, then grade again).")
            self.blocks[key, request.chapter] = functools.partial(WorkerCrashed, message)
            raise WorkerCrashed(message) from None
        self.imports.add((key, request.chapter))

    def printed(self, source: Source) -> str:
        """What the code under test printed during the last call to ``source``'s worker
        (kept after the worker was stopped)."""
        return self.last_printed.pop(self._key(source), "")

    def discard(self, source: Source) -> None:
        """Stop the worker of ``source``; the next call starts a fresh one."""
        worker = self.workers.pop(self._key(source), None)
        if worker is not None:
            worker.close()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
