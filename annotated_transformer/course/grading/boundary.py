"""The operating-system boundary around the grading worker: bubblewrap, and a CPU meter.

The worker runs the learner's code, which may do anything a process can. What holds no
matter what it does is decided here, outside it, by the kernel: its own PID namespace
(everything it starts, a ``setsid`` daemon included, dies with it), no network, its own
IPC and host name, and a filesystem that shows only what it needs, read-only, with a small
private ``/tmp`` as its only writable place; and :class:`CpuMeter` counts its time in CPU
seconds of all its processes, so a busy machine costs it no budget. ``book/instructor.md``
(layer 1) says what each stops and names the test that shows it. Where bubblewrap cannot
start, :func:`unavailable` says why; the caller decides whether to grade without it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import NamedTuple

from annotated_transformer.course.grading import limits
from annotated_transformer.layout import PACKAGE_DIR, PARTS_PACKAGES, SOLUTIONS_DIR, VARIANTS_DIR

SCRATCH_BYTES = 64 * 2**20  # the worker's private /tmp
# What the dynamic linker and Python read of /etc (no secrets: no shadow, no ssl keys).
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
             "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
CPU_INFO = "/sys/devices/system/cpu"  # how many cores PyTorch may use


@cache
def unavailable() -> str | None:
    """Why the worker cannot be sandboxed here (None when it can): bubblewrap missing, or
    unable to create its namespaces (checked once, by running ``true`` in a sandbox)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap runs on Linux only (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    true = shutil.which("true") or "/bin/true"
    command = [*_namespaces(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", true]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap could not start: {error}"
    if done.returncode != 0:
        return f"bubblewrap could not create its namespaces: {done.stderr.strip()[:300]}"
    return None


def decide(wanted: str) -> str:
    """The boundary a grading run uses, ``bubblewrap`` or ``none``, from what was asked for:
    ``auto`` is bubblewrap where it can start, else none (which the report says);
    ``bubblewrap`` where it cannot start is a ``ValueError`` saying why."""
    if wanted not in ("auto", "bubblewrap", "none"):
        raise ValueError(f"the sandbox is auto, bubblewrap or none, not {wanted!r}")
    why = unavailable() if wanted != "none" else None
    if wanted == "bubblewrap" and why:
        raise ValueError(why)
    return "none" if wanted == "none" or why else "bubblewrap"


def staged(folder: Path) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    """A private, readable copy of the learner's ``.py`` files (regular files only, no link
    followed) for the worker to import: it reads them whatever the folder's permissions,
    and a change to the folder while grading runs changes nothing."""
    staged = tempfile.TemporaryDirectory(prefix="grading-learner-")
    target = Path(staged.name)
    target.chmod(0o755)
    for path in sorted(folder.glob("*.py")):
        if path.is_file() and not path.is_symlink():
            (target / path.name).write_bytes(path.read_bytes())
            (target / path.name).chmod(0o644)
    return staged, target


def closed_to_others(probes: Path) -> Path | None:
    """The first folder on the way to this interpreter, its packages, the package or the
    probes that a user other than its owner cannot enter (no execute bit for others), or
    None. A worker that becomes ``nobody`` without the boundary (a grader run as root,
    ``--sandbox none``) reads its modules from there: a Python under ``/root`` (pyenv, a
    container's) is closed to it, and its first import after the change would fail."""
    roots = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent,
             PACKAGE_DIR, probes}
    roots |= {Path(p) for p in sys.path if p and Path(p).is_dir() and "site-packages" in p}
    for root in sorted(roots):
        for folder in [*reversed(root.resolve().parents), root.resolve()]:
            if not folder.stat().st_mode & stat.S_IXOTH:
                return folder
    return None


def describe(sandboxed: bool) -> str:
    """What a report says about the boundary its grading ran in."""
    if sandboxed:
        version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True)
        return (f"{version.stdout.strip() or 'bubblewrap'}: the code under test ran in its own "
                f"PID, network and IPC namespaces, saw only what it needs, read-only, and was "
                f"limited in CPU seconds and in waiting; memory and processes: "
                f"{limits.describe()}")
    why = unavailable() or "not asked for"
    return (f"none ({why}): the code under test ran with the rights of the user who graded, "
            f"limited in CPU seconds and in waiting; memory and processes: "
            f"{limits.describe()}; this grade is feedback, not a grade to record")


def _namespaces() -> list[str]:
    """bwrap and its namespaces. As root it needs no user namespace, and keeps only the
    capabilities the worker needs to become an unprivileged user before any learner code
    runs; as any other user it creates a user namespace (and drops every capability)."""
    command = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        return [*command, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID"]
    return [*command, "--unshare-user"]


def command(argv: list[str], learner_dir: Path | None, probes: Path,
            env: Mapping[str, str]) -> list[str]:
    """``argv`` run inside the boundary, ``env`` its whole environment. It reads, read-only,
    the system's folders, this interpreter's and its packages', the package and the probes'
    folder (the graded tests), and the learner's folder, the fast parts inside the package
    replaced by an empty folder; or, for the course's own code (``learner_dir`` None), the
    reference and the variants, the fast parts shown."""
    if learner_dir is not None:
        own, hidden = [learner_dir], [d for d in PARTS_PACKAGES.values() if d.is_dir()]
    else:
        own, hidden = [d for d in (SOLUTIONS_DIR, VARIANTS_DIR) if d.is_dir()], []
    python = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix),
              Path(sys.executable).resolve().parent}
    python |= {Path(p) for p in sys.path if p and Path(p).is_dir() and "site-packages" in p}
    shown = sorted({p.resolve() for p in [*python, PACKAGE_DIR, probes, *own]},
                   key=lambda p: len(p.parts))
    binds: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds += ["--ro-bind", path, path]
    for path in ETC_FILES:
        binds += ["--ro-bind-try", path, path]
    # The private /tmp first: what is shown inside it (a learner's folder there) goes on top.
    binds += ["--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp"]
    made: set[Path] = {Path("/"), Path("/tmp")}
    for folder in shown:
        for parent in reversed(folder.parents):  # bwrap makes missing folders 0700: say 0755
            if parent not in made and not any(parent.is_relative_to(s) for s in SYSTEM_DIRS):
                binds += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        binds += ["--ro-bind", str(folder), str(folder)]
        made.add(folder)
    for empty in hidden:
        binds += ["--perms", "0555", "--tmpfs", str(empty.resolve())]
    environment = ["--clearenv"]
    for key, value in env.items():
        environment += ["--setenv", key, value]
    return [*_namespaces(), *binds, "--ro-bind-try", CPU_INFO, CPU_INFO,
            "--proc", "/proc", "--dev", "/dev", *environment, "--chdir", "/tmp", *argv]


class CpuMeter:
    """The CPU seconds used by a process and all its descendants, whatever the load of the
    machine: from its control group where it has one that counts them (every process of
    the group, however it ended), else from ``/proc`` (what the tree's processes used, and
    what their children used once waited for: a child reaped without a wait, as when
    SIGCHLD is ignored, is not counted there)."""

    def __init__(self, pid: int, group: limits.Cgroup | None = None) -> None:
        self.pid, self.group = pid, group
        self.ticks = os.sysconf("SC_CLK_TCK")

    def _tree(self) -> tuple[list[int], dict[int, int]]:
        """The process and its descendants, and each one's CPU ticks."""
        children: dict[int, list[int]] = {}
        used: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    stat = handle.read().decode("ascii", "replace")
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # after "pid (name) "
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            used[pid] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree, used

    def sample(self) -> Sample:
        """The tree's CPU seconds, whether one of its threads is runnable now (running or
        waiting for a core: wanting the machine, not waiting for something else), and how
        many processes it has."""
        tree, used = self._tree()
        counted = self.group.cpu_seconds() if self.group is not None else None
        seconds = counted if counted is not None else sum(used.get(pid, 0) for pid in tree) / (
            self.ticks)
        return Sample(seconds, any(_runnable(pid) for pid in tree), len(tree))

    def descendants(self) -> list[int]:
        """The processes under ``pid``, itself excluded."""
        return self._tree()[0][1:]


class Sample(NamedTuple):
    seconds: float
    runnable: bool
    processes: int


def _runnable(pid: int) -> bool:
    """Whether a thread of ``pid`` is in state R (running, or ready to run)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2:][:1] == b"R":
            return True
    return False
