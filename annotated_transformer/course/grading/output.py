"""What the worker prints (the learner's ``print``, faulthandler's stack), drained by the
grader as it comes and kept bounded."""

from __future__ import annotations

import os
import select
import threading
import time


class PrintedOutput(threading.Thread):
    """Drains what the worker prints, keeping only its last ``limit`` bytes."""

    def __init__(self, fd: int, limit: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.limit, self.tail, self.total = fd, limit, b"", 0

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):  # until the worker closes its end
                self.tail = (self.tail + chunk)[-self.limit:]
                self.total += len(chunk)
        except OSError:  # the descriptor was closed under it
            return

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")

    def since(self, mark: int) -> str:
        """What was printed after ``total`` was ``mark`` (its end, when more than the tail
        kept): waits briefly for what is still in the pipe."""
        deadline = time.monotonic() + 0.5
        while select.select([self.fd], [], [], 0)[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.01)  # the chunk being appended
        new = self.total - mark
        return self.tail[-new:].decode("utf-8", errors="replace") if new > 0 else ""
