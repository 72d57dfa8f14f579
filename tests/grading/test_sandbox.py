"""The worker that runs a learner's code while it is graded, attacked directly: what it
answers.

These tests skip the static rules (the first layer) on purpose: they hand the worker a
chapter file that breaks them, as a learner who found a way past those rules would, and
check what still holds: the grader's process is never changed, a crash, a flood of output
or a huge message costs the test and nothing else, the reference and the course's answers
are out of reach, and a forbidden op is refused whatever name reached it. What stops a
worker (an endless loop, waiting, memory, processes, the run's totals) is tested in
tests/grading/test_sandbox_limits.py, each test on a worker of its own.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from probes.worker_probes import call, grader_modules

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.supervisor import (
    OUTPUT_LIMIT,
    CodeUnderTest,
    ForbiddenCall,
    GraderFault,
    LearnerNotImplemented,
    LearnerRaised,
    WorkerCrashed,
    WorkerPool,
)
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"

HOSTILE = '''
import os

import torch

# Global state changed at import: the worker resets it before every probe.
torch.set_default_dtype(torch.float64)
torch.set_grad_enabled(False)


def softmax(x, dim=-1):
    exp = (x - x.amax(dim, keepdim=True)).exp()
    return exp / exp.sum(dim, keepdim=True)


def exits(x):
    os._exit(0)


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
    return subprocess.run(["true"]).returncode'''


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
def shared_pool():
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    yield pool
    pool.close()


@pytest.fixture
def pool(shared_pool, folder):
    """The module's pool: one worker, started once, answers every test of this file.

    Nothing a test leaves in it decides a later one. In the worker, each probe starts from
    the state the worker sets before every probe (its seed, PyTorch's global settings:
    test_global_state_set_at_import_is_reset_before_each_probe), and a crashed worker is
    replaced. In the pool, what it remembers of earlier calls is checked after each test:
    no timeout, wait or block, and an allowance (its CPU, waiting and busy stops) that still
    lets the next call run. A test that leaves one fails here; it belongs in
    tests/grading/test_sandbox_limits.py, on a pool of its own."""
    yield shared_pool
    key = str(Source.parse(str(folder)))
    remembered = {"timed out": shared_pool.timed_out, "waited": shared_pool.waited,
                  "blocked": shared_pool.blocks, "unstartable": shared_pool.unstartable}
    refusal = shared_pool.allowance.refusal(key)
    assert not any(remembered.values()) and refusal is None, (
        f"this test left the shared pool remembering {remembered}, refusing {refusal!r}: "
        f"give it a pool of its own (tests/grading/test_sandbox_limits.py)")


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


def test_printed_output_is_bounded(pool, folder):
    value = learner(pool, folder, cpu_seconds=120).run(call, name="floods", x=X)
    assert torch.equal(value, X)
    worker = pool.workers[Source.parse(str(folder))]
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
@pytest.mark.skipif(boundary.closed_to_others(PROBES) is not None,
                    reason="this Python is installed where nobody cannot enter (the next test)")
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


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
@pytest.mark.skipif(boundary.closed_to_others(PROBES) is None,
                    reason="this Python is open to every user (the test before)")
def test_without_the_boundary_a_python_nobody_cannot_read_is_the_grader_s_fault(folder):
    """A grader run as root without bubblewrap makes its worker nobody; a Python under a
    folder closed to others (pyenv under /root, as here) would fail at its first import
    after the change, which the learner would be told was their crash. It is refused up
    front, as the grader's fault, naming the folder and what to do."""
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES,
                      user="nobody", sandboxed=False)
    try:
        with pytest.raises(GraderFault, match=f"cannot enter {boundary.closed_to_others(PROBES)}"
                           ".*install bubblewrap"):
            learner(pool, folder).run(call, name="softmax", x=X)
    finally:
        pool.close()
