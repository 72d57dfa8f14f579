"""The worker that runs a learner's code while it is graded, attacked directly.

These tests skip the static rules (the first layer) on purpose: they hand the worker a
chapter file that breaks them, as a learner who found a way past those rules would, and
check what still holds: the grader's process is never changed, a crash, an endless loop,
a flood of output or a huge message costs the test and nothing else, the reference and
the course's answers are out of reach, and a forbidden op is refused whatever name
reached it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from probes.worker_probes import call, grader_modules

from annotated_transformer.course.grading import boundary, limits, supervisor, watch
from annotated_transformer.course.grading.supervisor import (
    OUTPUT_LIMIT,
    CodeUnderTest,
    ForbiddenCall,
    LearnerNotImplemented,
    LearnerRaised,
    MachineBusy,
    WorkerCrashed,
    WorkerPool,
    WorkerTimeout,
)
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"

HOSTILE = '''
import math
import os
import sys

import torch

# Global state changed at import: the worker resets it before every probe.
torch.set_default_dtype(torch.float64)
torch.set_grad_enabled(False)


def softmax(x, dim=-1):
    exp = (x - x.amax(dim, keepdim=True)).exp()
    return exp / exp.sum(dim, keepdim=True)


def exits(x):
    os._exit(0)


def loops(x):
    while True:
        pass


def floods(x):
    for _ in range(2000):
        print("x" * 100_000)
    return x


def prints_then_fails(x):
    print("the shape is", tuple(x.shape))
    raise ValueError("wrong")


def huge_message(x):
    raise ValueError("y" * 50_000_000)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


def unprintable(x):
    raise Unprintable()


def recurses(x):
    return recurses(x)


def pytest_exit(x):
    import pytest
    pytest.exit("done")


def not_plain(x):
    return object()


def stub(x):
    raise NotImplementedError("Exercise 2.1: softmax is not implemented yet")


def torch_not_implemented(x):
    return torch.ones(2) & torch.ones(2)


def reaches_reference(x):
    import solutions.ch02_attention as reference
    return reference.softmax(x)


def reaches_reference_through_parts(x):
    from annotated_transformer.parts import Parts
    return Parts("solutions").module(2).__file__


def uses_torch_softmax(x):
    return torch.softmax(x, -1)


def hides_torch_softmax(x):
    try:
        return torch.nn.Softmax(dim=-1)(x)
    except Exception:
        return softmax(x)


def through_aten(x):
    return torch.ops.aten._softmax(x, -1, False)


def writes(path):
    with open(path, "w") as handle:
        handle.write("z" * 64 * 2**20)
    return "written"


def global_state(x):
    return str(torch.get_default_dtype()), torch.is_grad_enabled(), str(torch.ones(1).dtype)


def writes_small(path):
    with open(path, "w") as handle:
        handle.write("changed")
    return "written"


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


class _Placeholder(torch.nn.Parameter):
    """A result whose own methods compute the forbidden op, if anyone calls them."""

    def detach(self):
        return torch.softmax(self.source, -1)

    def to(self, *args, **kwargs):
        return torch.softmax(self.source, -1)


def _placeholder_of(x):
    out = _Placeholder(torch.zeros_like(x))
    out.source = x.detach()
    return out


def returns_too_much(x):
    return torch.zeros(10_000_000)  # 40 MB: more than a frame holds


def returns_a_placeholder(x):
    return _placeholder_of(x)


def returns_a_placeholder_in_a_list(x):
    return [x.sum(), _placeholder_of(x)]


def a_backward_returns_a_placeholder(x):
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return _placeholder_of(grad)

    t = x.detach().clone().requires_grad_(True)
    Double.apply(t).sum().backward()
    return t.grad


def _honest(x):
    exp = (x - x.amax(-1, keepdim=True)).exp()
    return exp / exp.sum(-1, keepdim=True)


def pops_the_guard(x):
    mode = torch._C._pop_torch_dispatch_stack(None)
    try:
        return torch.softmax(x, -1)
    finally:
        torch._C._push_on_torch_dispatch_stack(mode)


def catches_the_refusal(x):
    try:
        torch._C._pop_torch_dispatch_stack(None)
    except Exception:
        pass
    return _honest(x)


def disables_current_modes(x):
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        return torch.softmax(x, -1)


def disables_dispatch(x):
    with torch._C._DisableTorchDispatch():
        return torch.softmax(x, -1)


def excludes_the_python_key(x):
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        return torch.softmax(x, -1)


def redispatches_below_the_guard(x):
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    return torch.ops.aten._softmax.default.redispatch(below, x, -1, False)


def reads_the_guard_to_change_it(x):
    mode = torch._C._get_dispatch_stack_at(0)
    mode.__torch_dispatch__ = lambda func, types, args=(), kwargs=None: func(*args, **kwargs)
    return torch.softmax(x, -1)


def pops_the_function_mode(x):
    from torch.overrides import _pop_mode_temporarily
    with _pop_mode_temporarily():
        return _honest(x)


def disables_torch_function(x):
    with torch._C.DisableTorchFunction():
        return _honest(x)


def runs_a_string(x):
    namespace = {"x": x}
    exec("import torch; result = torch.softmax(x, -1)", namespace)
    return namespace["result"]


def computes_on_another_thread(x):
    import threading
    found = []
    thread = threading.Thread(target=lambda: found.append(torch.softmax(x, -1)))
    thread.start()
    thread.join()
    return found[0]


def starts_a_process(x):
    import subprocess
    return subprocess.run(["true"]).returncode


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


# ---------------------------------------------------------------- probes (run in the worker)


# ---------------------------------------------------------------- set-up


@pytest.fixture(scope="module")
def folder():
    path = Path(tempfile.mkdtemp(prefix="hostile-"))
    os.chmod(path, 0o755)  # readable by an unprivileged worker too
    (path / "ch02_attention.py").write_text(HOSTILE)
    os.chmod(path / "ch02_attention.py", 0o644)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    yield pool
    pool.close()


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


def learner(pool, folder, forbid_ops=(), cpu_seconds=30.0, exercise="2.1"):
    return CodeUnderTest(pool, Source.parse(str(folder)), 2, exercise, tuple(forbid_ops), seed=0,
                   cpu_seconds=cpu_seconds)


X = torch.randn(3, 5, dtype=torch.float64)


# ---------------------------------------------------------------- tests


def test_an_honest_function_runs(pool, folder):
    assert torch.allclose(learner(pool, folder).run(call, name="softmax", x=X),
                          torch.softmax(X, -1))


def test_the_worker_holds_of_the_grader_only_its_room_and_the_door(pool, folder):
    """What the worker process really imports, not only what its files say
    (test_grader_design.py reads those): once PyTorch, the preloaded modules and a chapter
    file are loaded, the course's modules it holds are the worker's room
    (``grading/worker/``), the door (``grading/protocol.py``) and the packages on their way."""
    held = learner(pool, folder).run(grader_modules)
    grader = "annotated_transformer.course.grading"
    room = f"{grader}.worker"
    assert f"{room}.process" in held and f"{room}.allowed_ops" in held
    others = [m for m in held if not (m == room or m.startswith(f"{room}."))]
    assert others == ["annotated_transformer.course", grader, f"{grader}.protocol"]


def test_global_state_set_at_import_is_reset_before_each_probe(pool, folder):
    assert learner(pool, folder).run(call, name="global_state", x=X) == (
        "torch.float32", True, "torch.float32")


def test_exit_is_a_crash_of_that_test_only(pool, folder):
    with pytest.raises(WorkerCrashed, match="exited with code 0"):
        learner(pool, folder).run(call, name="exits", x=X)
    # The next test gets a fresh worker.
    assert learner(pool, folder).run(call, name="softmax", x=X).shape == X.shape


def test_an_endless_loop_is_stopped_and_its_line_named(fresh, folder):
    # A pool of its own: the shared one would keep this exercise's timeout and give every
    # later test of it one CPU second (a forbidden-op test ran out of it on a busy machine).
    with pytest.raises(WorkerTimeout, match="more than 3 CPU seconds") as stopped:
        learner(fresh, folder, cpu_seconds=3).run(call, name="loops", x=X)
    line = HOSTILE.splitlines().index("    while True:") + 1
    assert stopped.value.where in (f"ch02_attention.py:{line}", f"ch02_attention.py:{line + 1}")
    assert learner(fresh, folder).run(call, name="softmax", x=X).shape == X.shape


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
@pytest.mark.parametrize("name", ["waits", "naps", "stops_itself", "half_replies"])
def test_code_that_waits_without_computing_is_stopped_and_blamed(fresh, folder, name,
                                                                 monkeypatch):
    monkeypatch.setattr(watch, "WAIT_SECONDS", 3.0)
    with pytest.raises(WorkerTimeout, match="waited 3 s without computing") as stopped:
        learner(fresh, folder, cpu_seconds=60).run(call, name=name, x=X)
    assert stopped.value.reason is watch.StopReason.WAITED and not stopped.value.at_import
    if name != "stops_itself":  # a stopped process cannot print its stack
        assert stopped.value.where.startswith("ch02_attention.py:")
    assert learner(fresh, folder, exercise="2.2").run(call, name="softmax", x=X).shape == X.shape
    with pytest.raises(WorkerTimeout, match="its other tests are not run"):  # once is enough
        learner(fresh, folder, cpu_seconds=60).run(call, name="softmax", x=X)
    assert str(folder) in fresh.workers  # refused without stopping the worker
    with pytest.raises(WorkerTimeout, match="waited 2 s without computing"):  # and its chapter
        learner(fresh, folder, cpu_seconds=60, exercise="2.3").run(call, name=name, x=X)


def test_a_reply_never_finished_is_stopped_and_blamed(fresh, folder, monkeypatch):
    """Its bytes drip, so the call never waits; its time counts towards the run's waiting
    all the same, so that each exercise cannot cost a reply's deadline."""
    monkeypatch.setattr(watch, "REPLY_SECONDS", 3.0)
    monkeypatch.setattr(watch, "TOTAL_WAIT_SECONDS", 5.0)
    with pytest.raises(WorkerTimeout, match="had not finished it 3 s later") as stopped:
        learner(fresh, folder, cpu_seconds=60).run(call, name="trickles", x=X)
    assert stopped.value.reason is watch.StopReason.REPLY
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
    assert stopped.value.reason is watch.StopReason.REQUEST
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
    assert str(tmp_path) not in fresh.workers  # refused without starting a worker


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
    assert str(tmp_path) not in fresh.workers  # refused without starting a worker


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

    def seconds(self) -> float:
        return self.total

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
    worker = fresh.workers[str(Source.parse(str(folder)))]
    group = worker.group.pids
    fresh.discard(Source.parse(str(folder)))
    assert not group.exists() and not worker.meter.descendants()


@CGROUP
def test_processes_are_bounded_and_die_with_the_worker(fresh_tasks, folder, monkeypatch):
    monkeypatch.setattr(limits, "TASKS", 40)
    started = learner(fresh_tasks, folder, cpu_seconds=60).run(call, name="forks", x=X)
    assert 0 < started < 40
    worker = fresh_tasks.workers[str(Source.parse(str(folder)))]
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


def test_printed_output_is_bounded(pool, folder):
    value = learner(pool, folder, cpu_seconds=120).run(call, name="floods", x=X)
    assert torch.equal(value, X)
    worker = pool.workers[str(folder)]
    assert len(worker.output.tail) <= OUTPUT_LIMIT


def test_what_a_test_printed_is_kept_for_its_report(pool, folder):
    graded = learner(pool, folder)
    with pytest.raises(LearnerRaised):
        graded.run(call, name="prints_then_fails", x=X)
    assert "the shape is (3, 5)" in graded.printed
    graded.run(call, name="softmax", x=X)  # prints nothing: what came before is kept
    assert "the shape is (3, 5)" in graded.printed
    assert learner(pool, folder).printed == ""  # another test starts with nothing


def test_messages_are_bounded_and_unprintable_ones_named(pool, folder):
    with pytest.raises(LearnerRaised) as raised:
        learner(pool, folder, cpu_seconds=60).run(call, name="huge_message", x=X)
    assert raised.value.types[0] == "ValueError" and len(str(raised.value)) < 5000
    assert "cut:" in raised.value.message
    with pytest.raises(LearnerRaised, match="cannot be printed"):
        learner(pool, folder).run(call, name="unprintable", x=X)


def test_recursion_and_pytest_exit_are_errors_of_the_test(pool, folder):
    with pytest.raises(LearnerRaised, match="RecursionError"):
        learner(pool, folder).run(call, name="recurses", x=X)
    with pytest.raises(LearnerRaised, match="Exit"):
        learner(pool, folder).run(call, name="pytest_exit", x=X)


def test_only_plain_data_comes_back(pool, folder):
    with pytest.raises(LearnerRaised, match="could not be sent back"):
        learner(pool, folder).run(call, name="not_plain", x=X)


def test_a_value_larger_than_a_frame_is_refused_in_the_worker(pool, folder):
    """The grader reads a reply into memory outside any cgroup: the worker refuses to send
    more than a frame holds (the reference's largest is 2.6 MB), and says so."""
    with pytest.raises(LearnerRaised, match=r"could not be sent back.*at most 33,554,432"):
        learner(pool, folder, cpu_seconds=60).run(call, name="returns_too_much", x=X)
    assert learner(pool, folder).run(call, name="softmax", x=X).shape == X.shape


def test_only_the_stubs_own_error_means_not_implemented(pool, folder):
    with pytest.raises(LearnerNotImplemented):
        learner(pool, folder).run(call, name="stub", x=X)
    with pytest.raises(LearnerRaised) as raised:  # PyTorch's own NotImplementedError
        learner(pool, folder).run(call, name="torch_not_implemented", x=X)
    assert "NotImplementedError" in raised.value.types
    assert raised.value.where.startswith("ch02_attention.py:")


def test_the_reference_is_out_of_reach(pool, folder):
    with pytest.raises(LearnerRaised, match="No module named 'solutions'"):
        learner(pool, folder).run(call, name="reaches_reference", x=X)
    # The course's own parts registry answers with the learner's folder, whatever is asked.
    where = learner(pool, folder).run(call, name="reaches_reference_through_parts", x=X)
    assert Path(where).read_text() == HOSTILE  # the learner's file (a copy the worker reads)


@pytest.mark.parametrize("name", ["uses_torch_softmax", "hides_torch_softmax", "through_aten"])
def test_a_forbidden_op_is_refused_whatever_name_reached_it(pool, folder, name):
    with pytest.raises(ForbiddenCall, match="aten._softmax"):
        learner(pool, folder, forbid_ops=("_softmax",)).run(call, name=name, x=X)


@pytest.mark.parametrize("name", [
    "pops_the_guard", "catches_the_refusal", "disables_current_modes", "disables_dispatch",
    "excludes_the_python_key", "redispatches_below_the_guard", "reads_the_guard_to_change_it",
    "pops_the_function_mode", "disables_torch_function", "runs_a_string"])
def test_no_switch_turns_the_guard_off(pool, folder, name):
    """Every way the worker's Python has to pop, read, disable or step below the guard's
    modes is refused, and the refusal costs the test even when the code catches it."""
    with pytest.raises(ForbiddenCall, match="aten._softmax|turns the grader's check|popped or "
                                            "disabled"):
        learner(pool, folder, forbid_ops=("_softmax",)).run(call, name=name, x=X)


@pytest.mark.parametrize("name", ["returns_a_placeholder", "returns_a_placeholder_in_a_list"])
def test_a_result_whose_methods_would_compute_is_refused(pool, folder, name):
    """Only tensors of exactly Tensor or Parameter come back; a subclass's own methods
    (which would run after the code, or outside the guard) never run."""
    with pytest.raises(LearnerRaised, match="not plain data"):
        learner(pool, folder, forbid_ops=("_softmax",)).run(call, name=name, x=X)


def test_a_gradient_is_its_values_whatever_a_backward_returned(pool, folder):
    """Autograd keeps the values of a placeholder a backward returns, as a plain tensor:
    its methods, which would compute the softmax, never run."""
    grad = learner(pool, folder, forbid_ops=("_softmax",)).run(
        call, name="a_backward_returns_a_placeholder", x=X)
    assert type(grad) is torch.Tensor and torch.equal(grad, torch.zeros_like(X))


@pytest.mark.parametrize("name", ["computes_on_another_thread", "starts_a_process"])
def test_no_thread_or_process_can_start(pool, folder, name):
    """The guard is per thread: the kernel refuses the worker every new thread or process."""
    with pytest.raises(LearnerRaised, match="can't start new thread|Operation not permitted"):
        learner(pool, folder, forbid_ops=("_softmax",)).run(call, name=name, x=X)


def test_files_written_stay_small(pool, folder):
    with pytest.raises(LearnerRaised, match="File too large|OSError"):
        learner(pool, folder).run(call, name="writes", x="/tmp/big")


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_without_the_boundary_as_nobody_the_course_is_read_only(folder):
    target = Path(tempfile.mkdtemp(prefix="course-"))
    (target / "grade.json").write_text("{}")
    os.chmod(target, 0o755)
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES, user="nobody",
                      sandboxed=False)
    try:
        with pytest.raises(LearnerRaised, match="PermissionError"):
            learner(pool, folder).run(call, name="writes_small", x=str(target / "grade.json"))
    finally:
        pool.close()
    assert (target / "grade.json").read_text() == "{}"
    (target / "grade.json").unlink()
    target.rmdir()


def test_the_learner_file_is_never_imported_here():
    import sys

    assert not [name for name in sys.modules if name.endswith("ch02_attention")
                and "hostile" in str(getattr(sys.modules[name], "__file__", ""))]


@pytest.mark.slow
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
