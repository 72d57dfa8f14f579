"""The trusted side of grading: start a worker for the code under test and talk to it.

The graded tests run in the trusted process and never import a learner's code. A test
hands a *probe* (a small function of its own file, the part that calls the learner's
code) and its inputs to :meth:`Learner.run`; the probe runs in the worker
(:mod:`annotated_transformer.course.grading.worker`) and what it returns comes back as plain
data, which the test then checks against what it computes itself with PyTorch's own
ops. Whatever the learner's code does in the worker, it cannot reach the verdict: the
worker is its own process (its own session, killed at the end), its replies are parsed
as data only, its printed output is bounded, and each call has a time limit.
"""

from __future__ import annotations

import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from annotated_transformer.layout import GRADED_DIR, VARIANTS_DIR

OUTPUT_LIMIT = 4000  # characters of the learner's printed output kept per worker
# Packages a learner's code must not import while it is graded: they hold answers.
UNREACHABLE = ["solutions", "annotated_transformer.fast_parts", "variants"]
DEFAULT_MEMORY = 16 * 2**30  # address space of the worker, bytes (PyTorch maps a lot)


# ---------------------------------------------------------------- what a call can end with


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
    """The code under test ran past its time limit (the worker was stopped)."""


class WorkerCrashed(RuntimeError):
    """The worker ended while it ran the code under test (``os._exit``, a crash, memory)."""


# ---------------------------------------------------------------- the worker process


class _Output(threading.Thread):
    """Drains what the worker prints, keeping only the last :data:`OUTPUT_LIMIT` characters."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.tail = fd, b""

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.tail = (self.tail + chunk)[-OUTPUT_LIMIT:]

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


class WorkerProcess:
    """One worker: a fresh interpreter in its own session, fed requests one at a time.

    It is started at once and waited for at its first call, so that it imports PyTorch
    while the tests are collected (which import it too)."""

    def __init__(self, source: str, learner_dir: Path | None, blocked: Mapping[int, str],
                 user: str | None = None, memory_bytes: int = DEFAULT_MEMORY) -> None:
        self.home = tempfile.TemporaryDirectory(prefix="grading-worker-")
        config = {"source": source, "learner_dir": str(learner_dir) if learner_dir else None,
                  "blocked": {str(c): why for c, why in blocked.items()},
                  "tests_dir": str(GRADED_DIR), "variants_dir": str(VARIANTS_DIR.parent), "unreachable": UNREACHABLE,
                  "user": user, "memory_bytes": memory_bytes}
        config_path = Path(self.home.name) / "config.json"
        config_path.write_text(json.dumps(config))
        if user:
            _open_to(user, Path(self.home.name))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.home.name,
               "TMPDIR": self.home.name, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
               "TORCH_HOME": self.home.name}
        env = {k: v for k, v in env.items() if v}
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-m", "annotated_transformer.course.grading.worker",
             str(config_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self.home.name, env=env, start_new_session=True)
        assert self.process.stdout and self.process.stderr and self.process.stdin
        self.output = _Output(self.process.stderr.fileno())
        self.output.start()
        self.ready = False

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        from annotated_transformer.course.grading import protocol

        assert self.process.stdin is not None
        if not self.ready:
            self._receive(timeout=120.0)  # {"ready": True}, once PyTorch is imported
            self.ready = True
        try:
            protocol.write_frame(self.process.stdin, request)
        except (BrokenPipeError, OSError) as error:
            raise WorkerCrashed(self._ended(f"it could not be sent the test ({error})")) from None
        return self._receive(timeout)

    def _receive(self, timeout: float) -> dict[str, Any]:
        from annotated_transformer.course.grading import protocol

        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            self.close()
            raise WorkerTimeout(f"Timeout: your code ran longer than {timeout:g} s and was "
                                f"stopped (an endless loop? a very slow loop in Python?)")
        try:
            reply = protocol.read_frame(fd)
        except (EOFError, protocol.ProtocolError) as error:
            raise WorkerCrashed(self._ended(str(error))) from None
        if not isinstance(reply, dict):
            raise WorkerCrashed(self._ended("it answered something that is not a reply"))
        return reply

    def _ended(self, why: str) -> str:
        code = self.process.poll()
        if code is None:
            self.close()
            code = self.process.returncode
        printed = [line[:100] for line in self.output.text().strip().splitlines()[-3:]]
        tail = f"; its last output: {' | '.join(printed)}" if printed else ""
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
        for stream in (self.process.stdin, self.process.stdout):
            if stream:
                try:
                    stream.close()
                except OSError:
                    pass
        self.home.cleanup()


def _open_to(user: str, folder: Path) -> None:
    """Hand ``folder`` (the worker's home) to ``user``."""
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(folder, entry.pw_uid, entry.pw_gid)


# ---------------------------------------------------------------- the tests' handle on it


def unreadable(message: str) -> bool:
    """Whether a static finding says the file cannot be read as Python at all (an error of
    the learner's, not a forbidden use)."""
    return any(phrase in message for phrase in ("is not valid Python", "cannot be read",
                                                "save the file as UTF-8", "not valid UTF-8"))


class Learner:
    """The code under test, as the graded tests see it: probes run in a worker.

    ``chapter`` is the chapter whose module the probes receive, ``exercise`` the
    exercise of the test (its forbidden ops are refused while the probe runs).
    """

    def __init__(self, pool: WorkerPool, source: str, chapter: int, exercise: str | None,
                 forbid_ops: tuple[str, ...], seed: int, timeout: float) -> None:
        self.pool, self.source, self.chapter, self.exercise = pool, source, chapter, exercise
        self.forbid_ops, self.seed, self.timeout = forbid_ops, seed, timeout

    def run(self, probe: Callable[..., Any], /, **kwargs: Any) -> Any:
        """``probe(chapter_module, **kwargs)`` run in the worker; its result, as plain data.

        Raises :class:`LearnerNotImplemented`, :class:`LearnerRaised`,
        :class:`ForbiddenCall`, :class:`WorkerTimeout` or :class:`WorkerCrashed`.
        """
        request = {"file": inspect.getfile(probe), "function": probe.__qualname__,
                   "kwargs": kwargs, "chapter": self.chapter, "exercise": self.exercise,
                   "forbid_ops": list(self.forbid_ops), "seed": self.seed}
        reply = self.pool.call(self.source, request, self.timeout)
        if reply.get("ok"):
            return reply.get("value")
        kind, message = reply.get("kind"), str(reply.get("message", ""))[:4000]
        if kind == "tampered":  # nothing that worker computes can be trusted any more
            self.pool.discard(self.source)
        if kind == "blocked" and unreadable(message):  # a file that does not parse
            raise LearnerRaised(["SyntaxError"], message, "")
        if kind in ("forbidden", "tampered", "blocked"):
            raise ForbiddenCall(message)
        types = [str(t) for t in reply.get("types", [])][:20]
        if reply.get("stub") and "NotImplementedError" in types:
            raise LearnerNotImplemented(message)
        raise LearnerRaised(types, message, str(reply.get("where", ""))[:200])

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
    not import (decided by the trusted static checks)."""

    def __init__(self, learner_dir_for: Callable[[str], Path | None],
                 blocked_for: Callable[[str], Mapping[int, str]], user: str | None = None) -> None:
        self.learner_dir_for, self.blocked_for, self.user = learner_dir_for, blocked_for, user
        self.workers: dict[str, WorkerProcess] = {}

    def _key(self, source: str) -> str:
        # The course's own code (the reference and the tests' variants) shares one worker.
        return "trusted" if source == "solutions" or source.startswith("variant:") else source

    def start(self, source: str) -> WorkerProcess:
        """The worker of ``source``, started now when it is not running."""
        key = self._key(source)
        worker = self.workers.get(key)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.close()
            learner_dir = self.learner_dir_for(source)
            worker = WorkerProcess("solutions" if key == "trusted" else source, learner_dir,
                                   self.blocked_for(source) if learner_dir else {}, self.user)
            self.workers[key] = worker
        return worker

    def call(self, source: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        key = self._key(source)
        worker = self.start(source)
        request = {**request, "source": source}
        try:
            return worker.call(request, timeout)
        except (WorkerTimeout, WorkerCrashed):
            worker.close()
            del self.workers[key]
            raise

    def discard(self, source: str) -> None:
        """Stop the worker of ``source``; the next call starts a fresh one."""
        worker = self.workers.pop(self._key(source), None)
        if worker is not None:
            worker.close()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
