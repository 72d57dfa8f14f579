"""The bounds of the worker that runs a learner's code: what stops it, and what that costs.

As in tests/grading/test_sandbox.py, the static rules are skipped on purpose. The chapter
file below loops, waits, drips or bloats its reply, takes memory, forks or hides its CPU;
each test checks that the worker is stopped, the code blamed for what it did (or not, on
a busy machine), and that the stop costs its test, its exercise or its run, as the grader
says, and nothing more. Each test has a pool of its own (``fresh``): a stop is remembered
by the pool that saw it, and several tests change the bounds a worker starts with.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from probes.worker_probes import call

from annotated_transformer.course.grading import (
    boundary,
    limits,
    outcomes,
    protocol,
    supervisor,
    watch,
)
from annotated_transformer.course.grading.supervisor import (
    CodeUnderTest,
    MachineBusy,
    WorkerCrashed,
    WorkerPool,
    WorkerTimeout,
)
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"

UNBOUNDED = '''
import os
import sys

import torch


def softmax(x, dim=-1):
    exp = (x - x.amax(dim, keepdim=True)).exp()
    return exp / exp.sum(dim, keepdim=True)


def loops(x):
    while True:
        pass


def waits(x):
    torch.futures.Future().wait()


def naps(x):
    while True:
        __import__("time").sleep(0.01)


def stops_itself(x):
    import signal
    os.kill(os.getpid(), signal.SIGSTOP)


def _reply_channel():
    frame = sys._getframe()
    while "replies" not in frame.f_locals:  # the worker's main() holds its reply channel
        frame = frame.f_back
    return frame.f_locals["replies"]


def half_replies(x):
    channel = _reply_channel()
    channel.write((1000).to_bytes(8, "big") + b"half")
    channel.flush()
    torch.futures.Future().wait()


def dozes(x):
    __import__("time").sleep(1.5)
    return x


def burns(x):
    import time
    start = time.process_time()
    while time.process_time() - start < 1.2:
        pass
    return x


def replies_a_bomb(x):
    import io
    channel, nested = _reply_channel(), "a"
    for _ in range(40):  # 2**40 items, each level two references to the one below
        nested = [nested, nested]
    data = io.BytesIO()
    torch.save({"ok": False, "outcome": "raised", "types": ["ValueError"], "message": nested,
                "where": "", "stub": False}, data)
    channel.write(len(data.getvalue()).to_bytes(8, "big") + data.getvalue())
    channel.flush()
    torch.futures.Future().wait()


def replies_deflated(x):
    import io
    import zipfile
    channel, data, deflated = _reply_channel(), io.BytesIO(), io.BytesIO()
    torch.save({"ended": None, "value": torch.zeros(2**26), "message": "", "types": [],
                "where": "", "stub": False, "called": []}, data)  # 256 MiB of zeros
    with zipfile.ZipFile(data) as stored, zipfile.ZipFile(deflated, "w",
                                                         zipfile.ZIP_DEFLATED) as packed:
        for part in stored.infolist():
            packed.writestr(part.filename, stored.read(part.filename))
    channel.write(len(deflated.getvalue()).to_bytes(8, "big") + deflated.getvalue())
    channel.flush()
    torch.futures.Future().wait()


def reads_slowly(x):
    """From the next call on, the worker reads its request a page at a time."""
    from annotated_transformer.course.grading import protocol

    def read_frame(fd):
        (size,) = protocol.HEADER.unpack(protocol._read_exactly(fd, protocol.HEADER.size))
        data = b""
        while len(data) < size:
            data += os.read(fd, min(size - len(data), 4096))
            __import__("time").sleep(0.2)
        return protocol.decode(data)

    protocol.read_frame = read_frame
    return x


def trickles(x):
    channel = _reply_channel()
    channel.write((10**6).to_bytes(8, "big"))
    while True:
        channel.write(b"x")
        channel.flush()
        __import__("time").sleep(0.05)


def hogs(x):
    blocks = []
    while True:
        blocks.append(torch.ones(2**27, dtype=torch.uint8))  # 128 MiB, written


def forks(x):
    children = []
    try:
        for _ in range(1000):
            child = os.fork()
            if child == 0:
                __import__("time").sleep(600)
                os._exit(0)
            children.append(child)
    except OSError:
        pass
    return len(children)


def hides_its_cpu(x):
    import signal
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps them: no parent's cutime
    while True:
        child = os.posix_spawn("/bin/sh", ["sh", "-c", "i=0; while [ $i -lt 200000 ]; do "
                                           "i=$((i+1)); done"], {})
        while True:
            __import__("time").sleep(0.01)
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break


def computes(x):
    total = 0
    for i in range(int(x)):
        total += i % 7
    return total
'''

BLOCKS_AT_IMPORT = '''
import torch

torch.futures.Future().wait()


def softmax(x, dim=-1):
    return x
'''


# ---------------------------------------------------------------- set-up


@pytest.fixture
def folder():
    """A learner's folder holding UNBOUNDED as chapter 2; after the test, this process
    (the grader's) has still not imported it."""
    path = Path(tempfile.mkdtemp(prefix="unbounded-"))
    os.chmod(path, 0o755)  # readable by an unprivileged worker too
    (path / "ch02_attention.py").write_text(UNBOUNDED)
    os.chmod(path / "ch02_attention.py", 0o644)
    yield path
    assert not [module for module in list(sys.modules.values())
                if str(getattr(module, "__file__", "") or "").startswith(str(path))]
    (path / "ch02_attention.py").unlink()
    path.rmdir()


@pytest.fixture
def fresh():
    """A pool of its own: what earlier tests taught it (a chapter that waits) is not there."""
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    yield pool
    pool.close()


@pytest.fixture
def fresh_tasks():
    """A pool whose worker may start threads and processes: the bounds of the cgroup and of
    the grader's count, tested alone (a grading worker never may)."""
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES,
                      new_tasks=True)
    yield pool
    pool.close()


def learner(pool, folder, cpu_seconds=30.0, exercise="2.1"):
    return CodeUnderTest(pool, Source.parse(str(folder)), 2, exercise, (), seed=0,
                         cpu_seconds=cpu_seconds)


X = torch.randn(3, 5, dtype=torch.float64)


# ---------------------------------------------------------------- tests


def test_an_endless_loop_is_stopped_and_its_line_named(fresh, folder):
    # A pool of its own: the shared one would keep this exercise's timeout and give every
    # later test of it one CPU second (a forbidden-op test ran out of it on a busy machine).
    with pytest.raises(WorkerTimeout, match="more than 3 CPU seconds") as stopped:
        learner(fresh, folder, cpu_seconds=3).run(call, name="loops", x=X)
    line = UNBOUNDED.splitlines().index("    while True:") + 1
    assert stopped.value.where in (f"ch02_attention.py:{line}", f"ch02_attention.py:{line + 1}")
    assert learner(fresh, folder).run(call, name="softmax", x=X).shape == X.shape


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
@pytest.mark.parametrize("name", ["waits", "naps", "stops_itself", "half_replies"])
def test_code_that_waits_without_computing_is_stopped_and_blamed(fresh, folder, name,
                                                                 monkeypatch):
    monkeypatch.setattr(watch, "WAIT_SECONDS", 3.0)
    with pytest.raises(WorkerTimeout, match="waited 3 s without computing") as stopped:
        learner(fresh, folder, cpu_seconds=60).run(call, name=name, x=X)
    assert stopped.value.reason is outcomes.StopReason.WAITED and not stopped.value.at_import
    if name != "stops_itself":  # a stopped process cannot print its stack
        assert stopped.value.where.startswith("ch02_attention.py:")
    assert learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X).shape == X.shape
    with pytest.raises(WorkerTimeout, match="its other tests are not run"):  # once is enough
        learner(fresh, folder, cpu_seconds=60).run(call, name="softmax", x=X)
    assert Source.parse(str(folder)) in fresh.workers  # refused without stopping the worker
    with pytest.raises(WorkerTimeout, match="waited 2 s without computing"):  # and its chapter
        learner(fresh, folder, cpu_seconds=60, exercise="2.3").run(call, name=name, x=X)


def test_a_reply_never_finished_is_stopped_and_blamed(fresh, folder, monkeypatch):
    """Its bytes drip, so the call never waits; its time counts towards the run's waiting
    all the same, so that each exercise cannot cost a reply's deadline."""
    monkeypatch.setattr(watch, "REPLY_SECONDS", 3.0)
    monkeypatch.setattr(watch, "TOTAL_WAIT_SECONDS", 5.0)
    with pytest.raises(WorkerTimeout, match="had not finished it 3 s later") as stopped:
        learner(fresh, folder, cpu_seconds=60).run(call, name="trickles", x=X)
    assert stopped.value.reason is outcomes.StopReason.REPLY
    assert learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X).shape == X.shape
    with pytest.raises(WorkerTimeout, match="had not finished it 3 s later"):
        learner(fresh, folder, cpu_seconds=60, exercise="2.3").run(call, name="trickles", x=X)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="kept the grader waiting [0-9]+ s over its tests"):
        learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X)
    assert time.monotonic() - started < 1.0


def test_a_reply_of_a_few_kilobytes_that_stands_for_a_huge_one_is_refused(fresh, folder):
    """Pickle's shared references: 2 KB that would be 2**40 items as text. The grader refuses
    the message (the learner's doing) without building what it stands for."""
    with pytest.raises(WorkerCrashed, match="stands for more than 100,000 items"):
        learner(fresh, folder, cpu_seconds=60).run(call, name="replies_a_bomb", x=X)
    assert learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X).shape == X.shape


def test_a_request_read_a_page_at_a_time_is_stopped_and_counted(fresh, folder, monkeypatch):
    """Its bytes move, so the call never waits; it is stopped all the same, and its time
    counts towards the run's waiting."""
    monkeypatch.setattr(watch, "REPLY_SECONDS", 3.0)
    monkeypatch.setattr(watch, "TOTAL_WAIT_SECONDS", 2.0)
    learner(fresh, folder).run(call, name="reads_slowly", x=X)
    with pytest.raises(WorkerTimeout, match="had not read the grader's request 3 s") as stopped:
        learner(fresh, folder, cpu_seconds=60).run(call, name="softmax", x=torch.zeros(10**6))
    assert stopped.value.reason is outcomes.StopReason.REQUEST
    with pytest.raises(WorkerTimeout, match="kept the grader waiting [0-9]+ s over its tests"):
        learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X)


def test_a_reply_whose_parts_are_compressed_is_refused_before_it_is_inflated(fresh, folder):
    """A few hundred kilobytes of deflated zeros that torch.load would inflate to 256 MiB
    (a megabyte can stand for gigabytes): refused unread, the learner's doing."""
    with pytest.raises(WorkerCrashed, match="parts are compressed"):
        learner(fresh, folder, cpu_seconds=60).run(call, name="replies_deflated", x=X)
    assert learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X).shape == X.shape


def test_a_chapter_whose_import_waits_costs_its_wait_once(fresh, tmp_path, monkeypatch):
    monkeypatch.setattr(watch, "WAIT_SECONDS", 3.0)
    tmp_path.chmod(0o755)
    (tmp_path / "ch02_attention.py").write_text(BLOCKS_AT_IMPORT)
    (tmp_path / "ch02_attention.py").chmod(0o644)
    with pytest.raises(WorkerTimeout, match="waited 3 s without computing") as first:
        learner(fresh, tmp_path).run(call, name="softmax", x=X)
    assert first.value.at_import and first.value.where == "ch02_attention.py:4"
    with pytest.raises(WorkerTimeout, match="its other tests are not run"):
        learner(fresh, tmp_path, exercise="2.2").run(call, name="softmax", x=X)
    assert Source.parse(str(tmp_path)) not in fresh.workers  # refused without starting a worker


def test_a_chapter_whose_import_crashes_costs_two_workers(fresh, tmp_path):
    tmp_path.chmod(0o755)
    (tmp_path / "ch02_attention.py").write_text("import os\n\nos._exit(3)\n")
    (tmp_path / "ch02_attention.py").chmod(0o644)
    with pytest.raises(WorkerCrashed, match="exited with code 3"):
        learner(fresh, tmp_path).run(call, name="softmax", x=X)
    with pytest.raises(WorkerCrashed, match="Importing your chapter file crashed"):
        learner(fresh, tmp_path, exercise="2.2").run(call, name="softmax", x=X)
    with pytest.raises(WorkerCrashed, match="Importing your chapter file crashed"):
        learner(fresh, tmp_path, exercise="2.3").run(call, name="softmax", x=X)
    assert Source.parse(str(tmp_path)) not in fresh.workers  # refused without starting a worker


def test_code_slowed_by_a_busy_machine_is_not_waiting(fresh, folder, monkeypatch):
    monkeypatch.setattr(watch, "WAIT_SECONDS", 0.5)  # far less than the machine delays it
    learner(fresh, folder).run(call, name="softmax", x=X)  # the worker started
    spinners = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"])
                for _ in range(4 * (os.cpu_count() or 1))]
    try:
        time.sleep(1)  # they run
        total = learner(fresh, folder, cpu_seconds=60).run(call, name="computes", x=3e7)
        assert total == (30_000_000 // 7) * 21 + 1  # the loop ran to its end: sum of i % 7
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


class FakeMeter:
    """A worker seen from /proc: each look, ``cpu`` more CPU seconds, runnable or not."""

    def __init__(self, cpu: float, runnable: bool) -> None:
        self.total, self.cpu, self.runnable = 0.0, cpu, runnable

    def sample(self) -> boundary.Sample:
        self.total += self.cpu
        return boundary.Sample(self.total, self.runnable, 3)


def watched(cpu: float, runnable: bool, moved: bool, looks: int, budget: float = 1000,
            sending: bool = False) -> str:
    """The verdict after ``looks`` looks, one second apart, at a worker that way."""
    clock = iter(range(looks + 2)).__next__
    calls = watch.CallWatch(FakeMeter(cpu, runnable), cpu_seconds=budget, wait_seconds=10,
                            clock=clock)
    try:
        for _ in range(looks):
            calls.look(moved, False, sending)
    except watch.Stop as stop:
        return stop.reason
    return "running"


def test_only_a_worker_that_wants_no_cpu_is_waiting():
    assert watched(cpu=0.0, runnable=False, moved=False, looks=20) == "waited"
    assert watched(cpu=0.01, runnable=True, moved=False, looks=200) == "running"  # starved
    assert watched(cpu=0.9, runnable=False, moved=False, looks=200) == "running"  # computing
    assert watched(cpu=0.0, runnable=False, moved=True, looks=200) == "running"  # talking
    # reading the request a page at a time: bytes move, but not for ever
    assert watched(cpu=0.0, runnable=False, moved=True, looks=200, sending=True) == "request"
    assert watched(cpu=0.01, runnable=True, moved=False, looks=400, budget=10) == "busy"
    assert watched(cpu=0.9, runnable=False, moved=False, looks=200, budget=10) == "cpu"


CGROUP = pytest.mark.skipif(limits.why() is not None, reason=f"no cgroup: {limits.why()}")


@CGROUP
def test_memory_is_bounded_for_the_whole_worker(fresh, folder, monkeypatch):
    monkeypatch.setattr(limits, "MEMORY_BYTES", 2**30)
    with pytest.raises(WorkerCrashed, match="more than 1 GiB of memory"):
        learner(fresh, folder, cpu_seconds=60).run(call, name="hogs", x=X)
    assert learner(fresh, folder).run(call, name="softmax", x=X).shape == X.shape


@CGROUP
def test_no_process_starts_and_the_group_goes_with_the_worker(fresh, folder):
    """The kernel refuses the worker's forks (grading.worker.switches); its cgroup, which would
    bound and count any process, is removed with it."""
    started = learner(fresh, folder, cpu_seconds=60).run(call, name="forks", x=X)
    assert started == 0
    worker = fresh.workers[Source.parse(str(folder))]
    group = worker.group.pids
    fresh.discard(Source.parse(str(folder)))
    assert not group.exists() and not worker.meter.descendants()


@CGROUP
def test_processes_are_bounded_and_die_with_the_worker(fresh_tasks, folder, monkeypatch):
    monkeypatch.setattr(limits, "TASKS", 40)
    started = learner(fresh_tasks, folder, cpu_seconds=60).run(call, name="forks", x=X)
    assert 0 < started < 40
    worker = fresh_tasks.workers[Source.parse(str(folder))]
    group = worker.group.pids
    fresh_tasks.discard(Source.parse(str(folder)))
    assert not group.exists() and not worker.meter.descendants()


@CGROUP
def test_the_cpu_of_children_reaped_without_a_wait_is_counted(fresh_tasks, folder):
    """Children reaped by the kernel (SIGCHLD ignored) leave no trace in /proc; the group
    counts them, so the code runs out of its CPU seconds instead of being called busy."""
    group = limits.Cgroup.make()
    counts = group.cpu_seconds() is not None
    group.close()
    if not counts:
        pytest.skip("no group here counts CPU time (v1 without a writable cpuacct)")
    with pytest.raises(WorkerTimeout, match="more than 3 CPU seconds"):
        learner(fresh_tasks, folder, cpu_seconds=3).run(call, name="hides_its_cpu", x=X)


@CGROUP
def test_the_groups_of_a_grader_that_is_gone_are_removed():
    stale = [base / "grading-999999999-0" for base in dict.fromkeys(limits._bases())]
    for folder in stale:
        folder.mkdir()
    limits.Cgroup.make().close()
    assert not [folder for folder in stale if folder.exists()]


def test_a_worker_stopped_twice_for_a_busy_machine_runs_no_more(fresh, folder, monkeypatch):
    """Each busy call waited out the wall-clock backstop; after BUSY_LIMIT of them the
    source's other calls end at once, not blamed on the code."""
    sent = []

    def busy(self, request, cpu_seconds, locate=True, wait_seconds=0.0):
        sent.append(request)
        raise MachineBusy("the machine was too busy: after 300 s of wall time")

    monkeypatch.setattr(supervisor.WorkerProcess, "call", busy)
    for _ in range(watch.BUSY_LIMIT):
        with pytest.raises(MachineBusy, match="after 300 s"):
            learner(fresh, folder).run(call, name="softmax", x=X)
    with pytest.raises(MachineBusy, match="other tests were not run. Not your code's fault"):
        learner(fresh, folder).run(call, name="softmax", x=X)
    assert len(sent) == watch.BUSY_LIMIT


@pytest.mark.parametrize("name, total, says", [
    ("dozes", "TOTAL_WAIT_SECONDS", "has kept the grader waiting [0-9]+ s over its tests"),
    ("burns", "TOTAL_CPU_SECONDS", "has used [0-9]+ CPU seconds over its tests")])
def test_calls_each_within_their_limits_are_stopped_by_the_run_s_total(fresh, folder, name,
                                                                       total, says, monkeypatch):
    """Each call waits (or computes) well within its own limit; once the calls together pass
    the run's total, the learner's other calls end at once, blamed on the code."""
    monkeypatch.setattr(watch, total, 2.0)
    for _ in range(2):
        assert learner(fresh, folder).run(call, name=name, x=X).shape == X.shape
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match=says):
        learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X)
    assert time.monotonic() - started < 1.0


def test_without_a_cgroup_no_process_starts_either(fresh, folder, monkeypatch):
    monkeypatch.setattr(limits.Cgroup, "make", classmethod(lambda cls: None))
    assert learner(fresh, folder, cpu_seconds=60).run(call, name="forks", x=X) == 0
    assert learner(fresh, folder).run(call, name="softmax", x=X).shape == X.shape


def test_without_a_cgroup_the_grader_counts_the_processes(fresh_tasks, folder, monkeypatch):
    monkeypatch.setattr(limits.Cgroup, "make", classmethod(lambda cls: None))
    monkeypatch.setattr(limits, "TASKS", 40)
    with pytest.raises(WorkerCrashed, match="more processes than the grader allows"):
        learner(fresh_tasks, folder, cpu_seconds=60).run(call, name="forks", x=X)
    assert learner(fresh_tasks, folder).run(call, name="softmax", x=X).shape == X.shape


@pytest.mark.slow
@pytest.mark.alone  # takes the memory and the processes it can, on purpose
@pytest.mark.skipif(limits.why() is not None, reason=f"no cgroup: {limits.why()}")
def test_a_regrade_beside_a_learner_who_attacks_every_bound(tmp_path):
    """scripts/worst_learner.py: a learner whose 2.3 half-writes its reply and waits, whose
    chapter 4 forks a thousand processes, chapter 7 takes all the memory it can and chapter
    8 waits at import, regraded beside the reference and the untouched release: all three
    graded, the attacks blamed for what they did, the rest exact."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "worst_learner.py"
    done = subprocess.run([sys.executable, str(script), *(f"--chapter={c}" for c in (2, 4, 7, 8)),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every bound held" in done.stdout


@pytest.mark.parametrize(("frame", "says"), [
    pytest.param(protocol.frame({"exercise": "2.1"}), "something that is not a request",
                 id="a message that is no request"),
    pytest.param(protocol.HEADER.pack(5) + b"junk!", "a message that is not plain data",
                 id="bytes that are no message", marks=pytest.mark.slow),  # a worker each
    pytest.param(protocol.HEADER.pack(protocol.MAX_FRAME + 1), "announced",
                 id="a frame too large", marks=pytest.mark.slow),
])
def test_a_request_the_worker_cannot_read_ends_it_and_the_next_call_gets_a_new_one(
        fresh, folder, frame, says):
    """The door checked from the worker's side, on a live worker: a frame that is not a
    request (the grader never sends one) ends the worker with its own line on what it read,
    and never runs as one; the pool starts a new worker for the next call."""
    assert torch.allclose(learner(fresh, folder).run(call, name="softmax", x=X),
                          torch.softmax(X, -1))
    worker = fresh.start(Source.parse(str(folder)))  # the live one, ready
    os.set_blocking(worker.process.stdin.fileno(), True)
    os.write(worker.process.stdin.fileno(), frame)
    assert worker.process.wait(timeout=60) == 2
    deadline = time.monotonic() + 10  # its stderr is read by a thread of the grader's
    while "cannot be read" not in worker.output.since(0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "a request that cannot be read" in worker.output.since(0)
    assert re.search(says, worker.output.since(0))
    assert torch.allclose(learner(fresh, folder).run(call, name="softmax", x=X),
                          torch.softmax(X, -1))
