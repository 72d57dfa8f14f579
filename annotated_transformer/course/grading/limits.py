"""Memory and processes of one worker, bounded for all its processes together: a cgroup.

Each worker gets a control group of its own, made by the grader and entered by the worker's
first process before it runs anything else, so that everything it ever starts is inside: at
most :data:`MEMORY_BYTES` of memory (no swap) and :data:`TASKS` processes and threads. The
group also counts the CPU time of all its processes, which the grader's CPU budget reads: a
child reaped without a wait leaves no trace in ``/proc``. It is made under the grader's own
group (cgroup v2 with the memory and pids controllers delegated to it, else v1's
hierarchies) or at the top of cgroup v2, which a grader running as root may do. Where none
can be made, :func:`why` says why, and what holds instead is each process's address space
(``RLIMIT_AS``, set by the worker) and a bounded number of its processes (counted by the
grader at each look, :mod:`.watch`, and ``RLIMIT_NPROC`` of the worker's user).
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from functools import cache
from pathlib import Path

DEFAULT_CPU_SECONDS = 10.0  # CPU seconds a call may use (the reference's largest: under 1)
# Once a call of an exercise has run out of CPU time, each later call of that exercise (same
# source) may use this many: an endless loop costs its full budget once, not once a test
# (the reference's largest call, the capstone aside, uses under 1 CPU second).
AFTER_TIMEOUT_CPU_SECONDS = 1.0
MEMORY_BYTES = 4 * 2**30  # all the worker's processes together (the reference's: 0.3 GiB)
TASKS = 128  # processes and threads of a worker together (the reference's worker: 4)
V1_CONTROLLERS = {"memory", "pids", "cpuacct"}  # the cgroup v1 hierarchies a group uses
_names = itertools.count()


class Cgroup:
    """One worker's control group: ``memory`` and ``pids`` are its folders (one folder in
    cgroup v2, one per hierarchy in v1), and, in v1, ``cpu`` its folder in the ``cpuacct``
    hierarchy where one can be made (None otherwise), which counts its CPU time."""

    def __init__(self, memory: Path, pids: Path) -> None:
        self.memory, self.pids = memory, pids
        self.v2 = memory == pids
        self.cpu: Path | None = None

    @classmethod
    def make(cls) -> Cgroup | None:
        """A new group bounded by :data:`MEMORY_BYTES` and :data:`TASKS`, or None where none
        can be made (see :func:`why`)."""
        bases = _bases()
        if bases is None:
            return None
        accounting = _cpu_base() if bases[0] != bases[1] else None
        _sweep((*bases, *([accounting] if accounting else [])))
        name = f"grading-{os.getpid()}-{next(_names)}"
        memory, pids = bases[0] / name, bases[1] / name
        made = []
        try:
            for folder in dict.fromkeys([memory, pids]):
                folder.mkdir()
                made.append(folder)
            group = cls(memory, pids)
            group._bound(MEMORY_BYTES, TASKS)
        except OSError:
            for folder in made:
                _remove(folder)
            return None
        if accounting is not None:  # v1: CPU time is counted in a hierarchy of its own
            try:
                (accounting / name).mkdir()
                group.cpu = accounting / name
            except OSError:
                pass
        return group

    def _bound(self, memory_bytes: int, tasks: int) -> None:
        if self.v2:
            (self.memory / "memory.max").write_text(str(memory_bytes))
            if (self.memory / "memory.swap.max").exists():
                (self.memory / "memory.swap.max").write_text("0")
        else:
            (self.memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (self.memory / "memory.memsw.limit_in_bytes").exists():
                (self.memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (self.pids / "pids.max").write_text(str(tasks))

    def command(self, argv: list[str]) -> list[str]:
        """``argv``, run by a shell that first moves itself into the group."""
        entry = 'echo $$ > "$1" && echo $$ > "$2" && echo $$ > "$3" && shift 3 && exec "$@"'
        procs = [str(folder / "cgroup.procs") for folder in (self.memory, self.pids,
                                                             self.cpu or self.memory)]
        return ["/bin/sh", "-c", entry, "sh", *procs, *argv]

    def cpu_seconds(self) -> float | None:
        """The CPU seconds every process of the group has used since it was made, reaped or
        not, however it was reaped (v2's ``cpu.stat``, kept whether or not the cpu
        controller is on; v1's ``cpuacct.usage``); None where the group does not count them."""
        try:
            if self.v2:
                for line in (self.memory / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
            elif self.cpu is not None:
                return int((self.cpu / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None
        return None

    def out_of_memory(self) -> bool:
        """Whether the kernel stopped a process of the group for its memory."""
        try:
            if self.v2:
                events = (self.memory / "memory.events").read_text().split()
                counts = dict(zip(events[::2], events[1::2], strict=False))
                return int(counts.get("oom_kill", 0)) > 0
            control = (self.memory / "memory.oom_control").read_text().split()
            if "oom_kill" in control:
                return int(control[control.index("oom_kill") + 1]) > 0
            return int((self.memory / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        """Stop whatever is left in the group, then remove it."""
        for folder in dict.fromkeys([self.memory, self.pids, *([self.cpu] if self.cpu else [])]):
            for _ in range(50):
                try:
                    pids = (folder / "cgroup.procs").read_text().split()
                except OSError:
                    break
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (OSError, ValueError):
                        pass
                if _remove(folder):
                    break
                time.sleep(0.02)


def _sweep(bases: tuple[Path, ...]) -> None:
    """Remove the empty groups of graders that are gone (killed before they closed them)."""
    for base in dict.fromkeys(bases):
        for folder in base.glob("grading-*-*"):
            owner = folder.name.split("-")[1]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                _remove(folder)  # the kernel refuses a group that still has a process


def _remove(folder: Path) -> bool:
    try:
        folder.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


@cache
def _bases() -> tuple[Path, Path] | None:
    """Where this process may make groups with memory and pids bounds: (memory, pids)."""
    found = _hierarchies()
    if "v2" in found:
        top, own = found["v2"]
        for base in (own, top):
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if {"memory", "pids"} <= set(enabled) and os.access(base, os.W_OK):
                return base, base
    if "memory" in found and "pids" in found:
        memory, pids = found["memory"][1], found["pids"][1]
        if all(os.access(p, os.W_OK) for p in (memory, pids)):
            return memory, pids
    return None


@cache
def _cpu_base() -> Path | None:
    """Where this process may make v1 groups that count CPU time (``cpuacct``), if anywhere."""
    if "cpuacct" not in (found := _hierarchies()):
        return None
    return found["cpuacct"][1] if os.access(found["cpuacct"][1], os.W_OK) else None


def _hierarchies() -> dict[str, tuple[Path, Path]]:
    """The cgroup v2 hierarchy (``v2``) and v1's ``memory``, ``pids`` and ``cpuacct``, each
    as (where it is mounted, this process's group in it)."""
    mounts: dict[str, Path] = {}
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, filesystem = left.split(), right.split()  # type, source, options
        if len(fields) < 5 or len(filesystem) < 3:
            continue
        if filesystem[0] == "cgroup2":
            mounts.setdefault("v2", Path(fields[4]))
        elif filesystem[0] == "cgroup":
            for controller in V1_CONTROLLERS & set(filesystem[2].split(",")):
                mounts.setdefault(controller, Path(fields[4]))
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            own["v2"] = path
        for controller in V1_CONTROLLERS & set(controllers.split(",")):
            own[controller] = path
    return {name: (mount, mount / own.get(name, "/").lstrip("/"))
            for name, mount in mounts.items()}


def why() -> str | None:
    """Why no group can be made here (None when one can)."""
    if _bases() is not None:
        return None
    if os.geteuid() != 0:
        return "the grader is not root, and no cgroup was delegated to it"
    return "no writable cgroup with the memory and pids controllers"


def describe() -> str:
    """What a report or the instructor hears about these bounds."""
    reason = why()
    if reason is None:
        return (f"a cgroup per learner: {MEMORY_BYTES / 2**30:g} GiB of memory and {TASKS} "
                f"processes and threads, all its processes together")
    return (f"no cgroup ({reason}): each process's address space is bounded and the grader "
            f"stops a worker of more than {TASKS} processes")
