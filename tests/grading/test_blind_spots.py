"""Where the guard looks away, no code of the learner's runs: attacked in the worker.

The dispatch guard (grading/worker/allowed_ops.py) looks away in two places: inside its own
handlers, where PyTorch pops its mode, and at the ops the grader's stand-ins call, known by
the code objects that call them (grading/worker/trusted.py). As in
tests/grading/test_allowed_ops.py, the static rules are skipped: the worker is handed a
chapter file that registers every callback PyTorch offers and makes each compute what the
exercise may not call (F.cross_entropy with a label smoothing, for 6.2; F.layer_norm, for
5.3), and one that keeps the stand-ins it is handed for later tests. Each road must be
refused, or its callback never run.
"""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import pytest
import torch
from probes.worker_probes import call

from annotated_transformer.course.grading.supervisor import (
    CodeUnderTest,
    ForbiddenCall,
    LearnerRaised,
    WorkerPool,
)
from annotated_transformer.course.grading.worker import allowed_ops, trusted
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"
SMOOTHING = ("+_log_softmax", "+nll_loss_forward", "+nll_loss_nd",
             "F.cross_entropy:label_smoothing")  # 6.2's, in part
SOFTMAX = ("_softmax", "_log_softmax", "logsumexp")  # 2.1's and 2.2's, in part
NORMS = ("native_layer_norm", "torch:rms_norm")  # 5.3's, in part

CALLBACKS = '''
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from annotated_transformer.parts import active_parts

KEPT = []


def smoothed(x):
    """What 6.2 may not call."""
    target = torch.zeros(x.shape[0], dtype=torch.long)
    return F.cross_entropy(x.detach(), target, label_smoothing=0.1)


def pack_hook(x):
    found = []
    probe = torch.ones(1, 1, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda saved: found.append(smoothed(x)) or saved, lambda saved: saved):
        probe @ probe
    return found


def unpack_hook(x):
    found = []
    probe = torch.ones(1, 1, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda saved: saved, lambda saved: found.append(smoothed(x)) or saved):
        out = (probe @ probe).sum()
    torch.autograd.grad(out, probe)
    return found


def tensor_hook(x):
    found = []
    probe = torch.ones(2, requires_grad=True)
    doubled = probe * 2
    doubled.register_hook(lambda grad: found.append(smoothed(x)))
    torch.autograd.grad(doubled.sum(), probe)
    return found


def node_hook(x):
    found = []
    probe = torch.ones(2, requires_grad=True)
    doubled = probe * 2
    doubled.grad_fn.register_prehook(lambda grads: found.append(smoothed(x)))
    doubled.grad_fn.register_hook(lambda inputs, outputs: found.append(smoothed(x)))
    doubled.sum().backward()
    return found


def accumulate_hook(x):
    found = []
    probe = torch.ones(2, requires_grad=True)
    probe.register_post_accumulate_grad_hook(lambda leaf: found.append(smoothed(x)))
    (probe * 2).sum().backward()
    return found


def multi_grad_hook(x):
    found = []
    first, second = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    torch.autograd.graph.register_multi_grad_hook(
        (first, second), lambda grads: found.append(smoothed(x)))
    (first * second).sum().backward()
    return found


def queued_callback(x):
    found = []
    probe = torch.ones(2, requires_grad=True)
    doubled = probe * 2
    engine = torch.autograd.Variable._execution_engine
    doubled.register_hook(
        lambda grad: engine.queue_callback(lambda: found.append(smoothed(x))))
    doubled.sum().backward()
    return found


def custom_backward(x):
    found = []

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            found.append(smoothed(x))
            return grad

    probe = torch.ones(2, requires_grad=True)
    torch.autograd.grad(Identity.apply(probe).sum(), probe)
    return found


def module_hooks(x):
    found = []
    layer = nn.Linear(x.shape[-1], 2)
    layer.register_forward_pre_hook(lambda module, args: found.append(smoothed(x)))
    layer.register_forward_hook(lambda module, args, out: found.append(smoothed(x)))
    layer.register_full_backward_hook(lambda module, gin, gout: found.append(smoothed(x)))
    layer(x.float()).sum().backward()
    return found


def global_module_hook(x):
    found = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, out: found.append(smoothed(x)))
    try:
        nn.Identity()(x)
    finally:
        handle.remove()
    return found


def function_mode(x):
    class Passes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passes():
        return smoothed(x)


class Spy(torch.Tensor):
    """A subclass whose own __torch_function__ computes what the exercise may not."""

    found = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.found.append(smoothed(cls.source))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def skips_the_check(x):
    """PyTorch's own way for a mode to run a call with the check skipped."""
    from torch.overrides import redispatch_function

    target = torch.zeros(x.shape[0], dtype=torch.long)
    return redispatch_function(F.cross_entropy, (), (x, target), {"label_smoothing": 0.1})


def subclass_function(x):
    Spy.found, Spy.source = [], x
    (x.as_subclass(Spy) + 1).sum()
    return Spy.found


class Below(torch.Tensor):
    """A subclass whose own __torch_dispatch__ computes the softmax."""

    found = []

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cls.found.append(torch.softmax(cls.source, -1))
        plain = [torch.Tensor._make_subclass(torch.Tensor, a) if type(a) is cls else a
                 for a in args]
        return func(*plain, **(kwargs or {}))


def subclass_dispatch(x):
    Below.found, Below.source = [], x
    torch.Tensor._make_subclass(Below, x) * 2
    return Below.found


def library_kernel(x):
    found = []
    library = torch.library.Library("aten", "IMPL")

    def neg(t):
        found.append(torch.softmax(x, -1))
        return torch.zeros_like(t).sub(t)

    library.impl("neg", neg, "CPU")
    -x
    return found


# ---------------------------------------------------------------- the grader's stand-ins


def stand_in_with_pack_hook(x):
    found = []
    x = x.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda saved: found.append(torch.softmax(x.detach(), -1)) or saved,
            lambda saved: saved):
        active_parts().softmax(x, -1)
    return found


def stand_in_under_a_mode(x):
    seen = []

    class Notes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", "?"))
            return func(*args, **(kwargs or {}))

    with Notes():
        active_parts().softmax(x, -1)
    return seen


def stand_in_with_torch_replaced(x):
    seen, where = [], torch.where

    def spy(*args, **kwargs):
        seen.append(torch.softmax(x, -1))
        return where(*args, **kwargs)

    torch.where = spy
    try:
        active_parts().softmax(x, -1)
    finally:
        torch.where = where
    return seen


def stand_in_module_hook(x):
    norm = active_parts().LayerNorm(x.shape[-1])
    norm.register_forward_hook(lambda module, args, out: F.layer_norm(x, (x.shape[-1],)))
    return norm(x)


def keeps(x):
    """In a test it is handed the stand-ins for 2.1 and 5.1: keeps them, a module made of
    one, and a graph through one, for later tests."""
    leaf = x.clone().requires_grad_(True)
    KEPT[:] = [active_parts().softmax, active_parts().LayerNorm,
               active_parts().LayerNorm(x.shape[-1]), active_parts().softmax(leaf, -1), leaf]
    return KEPT[3].detach()


def kept_function(x):
    return KEPT[0](x, -1)


def kept_class(x):
    return KEPT[1](x.shape[-1])(x)


def kept_module(x):
    return KEPT[2](x)


def kept_graph(x):
    return torch.autograd.grad(KEPT[3].sum(), KEPT[4])[0]


def kept_quietly(x):
    try:
        return KEPT[0](x, -1)
    except Exception:
        exp = (x - x.amax(-1, keepdim=True)).exp()
        return exp / exp.sum(-1, keepdim=True)


def steals_the_computation(x):
    """In a test handed the stand-in for 2.1: keeps the class of its computation, handed to
    ``torch.autograd.Function.apply`` (replaced a while), and the node it made."""
    apply = torch.autograd.Function.apply

    def spy(cls, *args):
        STOLEN.append(cls)
        return apply.__func__(cls, *args)

    torch.autograd.Function.apply = classmethod(spy)
    try:
        out = active_parts().softmax(x.clone().requires_grad_(True), -1)
    finally:
        torch.autograd.Function.apply = classmethod(apply.__func__)
    STOLEN.append(out.grad_fn)
    return out.detach()


class Context:
    needs_input_grad = (False, False, False)


def stolen_forward(x):
    """Softmax by the stand-in's own forward, called with a context and an alive() of its own."""
    return STOLEN[0].forward(Context(), lambda: None, x, -1)


def stolen_backward(x):
    """Its own graph's backward pass by the stand-in's own backward, the node's alive(),
    inputs and outputs replaced."""
    leaf = x.clone().requires_grad_(True)
    node = STOLEN[1]
    node.alive, node.inputs, node.outputs = (lambda: None), [leaf], ((leaf * leaf).sum(),)
    return STOLEN[0].backward(node, torch.ones((), dtype=x.dtype))[1]


STOLEN = []
'''


@pytest.fixture(scope="module")
def folder():
    path = Path(tempfile.mkdtemp(prefix="callbacks-"))
    os.chmod(path, 0o755)  # readable by an unprivileged worker too
    (path / "ch06_training.py").write_text(CALLBACKS)
    os.chmod(path / "ch06_training.py", 0o644)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    yield pool
    pool.close()


def learner(pool, folder, forbid_ops=SMOOTHING, exercise="6.2", standins=()):
    handle = CodeUnderTest(pool, Source.parse(str(folder)), 6, exercise, tuple(forbid_ops),
                           seed=0, cpu_seconds=30.0)
    handle.standins = tuple(standins)
    return handle


X = torch.randn(3, 5, dtype=torch.float64)


@pytest.mark.parametrize("name", [
    "pack_hook", "unpack_hook", "tensor_hook", "node_hook", "accumulate_hook",
    "multi_grad_hook", "queued_callback", "custom_backward", "module_hooks",
    "global_module_hook", "function_mode"])
def test_a_callback_run_from_inside_pytorch_is_checked_as_the_learner_s_code(pool, folder,
                                                                              name):
    """Saved-tensor, tensor, node, module and autograd callbacks run inside a torch
    function's call (an op, ``backward``, ``autograd.grad``), where PyTorch pops the guard's
    mode: the guard puts it back, so what they call is refused as if called directly."""
    with pytest.raises(ForbiddenCall, match="F.cross_entropy with label_smoothing"):
        learner(pool, folder).run(call, name=name, x=X)


def test_the_check_cannot_be_skipped_as_the_guard_skips_it(pool, folder):
    with pytest.raises(ForbiddenCall, match="_skip_one_hop_torch_function"):
        learner(pool, folder).run(call, name="skips_the_check", x=X)


def test_a_subclass_s_own_torch_function_never_runs_under_the_guard(pool, folder):
    assert learner(pool, folder).run(call, name="subclass_function", x=X) == []


@pytest.mark.parametrize(("name", "refused"), [
    ("subclass_dispatch", "__torch_dispatch__ of a tensor subclass"),
    ("library_kernel", "torch._C._dispatch_library")])
def test_no_code_of_the_learner_s_runs_inside_the_dispatch_handler(pool, folder, name, refused):
    """A subclass's __torch_dispatch__ and a kernel registered for an aten op would run
    where the dispatch guard's mode is popped: both are refused."""
    with pytest.raises(ForbiddenCall, match=refused):
        learner(pool, folder, SOFTMAX, "2.1").run(call, name=name, x=X)


def test_a_finalizer_computes_nothing_where_the_guard_looks_away():
    """The garbage collector runs finalizers (``__del__``) at any allocation, wherever the
    code is: inside the guard's handlers and while a stand-in computes, too. There and
    inside the dispatch handler it waits; inside the torch-function handler, before the
    guard's mode is back, every op is refused. So no finalizer computes what the exercise
    may not call."""
    stand_in, entries, inner = trusted.computations()
    guard = allowed_ops.guard_factory(entries, inner)
    mode, _ = guard(SMOOTHING, "6.2")
    ran, computed = [], []  # the finalizers run while the guard was on; those that computed
    inside = [False]

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            ran.append(inside[0])
            try:
                torch.nn.functional.cross_entropy(X, torch.zeros(3, dtype=torch.long),
                                                  label_smoothing=0.1)
            except allowed_ops.ForbiddenOpUsed:
                return
            computed.append(inside[0])

    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)
    try:
        with mode:
            inside[0] = True
            for _ in range(300):
                Cycle()
                X.exp().sum()
            for _ in range(300):
                Cycle()
                stand_in["2.1"](lambda: None, X, -1)
            inside[0] = False
    finally:
        gc.set_threshold(*threshold)
        inside[0] = False
    assert sum(ran) > 100, "few finalizers ran while the guard was on: this proves nothing"
    assert not any(computed), f"{sum(computed)} finalizers computed the label smoothing"


# ---------------------------------------------------------------- the grader's stand-ins


def test_code_that_reaches_a_stand_in_s_computation_gets_no_exemption_for_its_own_ops():
    """The guard exempts an op by the code object of the frame that called it: a stand-in's
    ``Call.forward`` or ``Call.backward``, or its computation called from there. Code of
    the learner's that reached the computation (with the source rules off: through a
    stand-in's ``__closure__``) and calls it with an ``alive`` of its own that computes
    softmax, or calls its inner ``softmax_of`` itself, is checked as its own: its frame is
    not trusted code. The stand-in still computes, forward and backward, exempt."""
    computed, entries, inner = trusted.computations()
    guard = allowed_ops.guard_factory(entries, inner)

    def cells(function):
        return dict(zip(function.__code__.co_freevars,
                        (cell.cell_contents for cell in function.__closure__), strict=True))

    softmax_of = cells(cells(computed["2.1"])["Call"].forward)["function"]
    assert softmax_of.__name__ == "softmax_of"
    x = X.clone().requires_grad_(True)
    for attack in (lambda: computed["2.1"](lambda: torch.softmax(X, -1), X, -1),
                   lambda: softmax_of(X, -1)):
        mode, hits = guard(SOFTMAX, "2.1")
        with mode, pytest.raises(allowed_ops.ForbiddenOpUsed, match="aten._softmax"):
            attack()
        assert hits == ["aten._softmax"]
    mode, hits = guard(SOFTMAX, "2.1")
    with mode:
        out = computed["2.1"](lambda: None, x, -1)
        (out * torch.arange(5.0, dtype=X.dtype)).sum().backward()
    assert not hits
    expected = X.clone().requires_grad_(True)
    (torch.softmax(expected, -1) * torch.arange(5.0, dtype=X.dtype)).sum().backward()
    assert torch.allclose(out, torch.softmax(X, -1)) and torch.allclose(x.grad, expected.grad)


def test_a_stand_in_runs_no_saved_tensor_hook_of_the_learner_s(pool, folder):
    with pytest.raises(LearnerRaised, match="saved-tensor hooks do not run while the grader"):
        learner(pool, folder, SOFTMAX, "2.2", ("2.1",)).run(
            call, name="stand_in_with_pack_hook", x=X)


def test_a_stand_in_computes_out_of_sight_of_the_learner_s_modes(pool, folder):
    seen = learner(pool, folder, SOFTMAX, "2.2", ("2.1",)).run(
        call, name="stand_in_under_a_mode", x=X)
    assert not {"softmax", "where", "isnan", "zeros_like"} & set(seen), seen


def test_a_stand_in_calls_nothing_the_learner_s_file_replaced(pool, folder):
    """``torch.where = spy`` at run time (which the source rules allow) changes nothing a
    stand-in calls: it took PyTorch's functions before any learner code ran."""
    assert learner(pool, folder, SOFTMAX, "2.2", ("2.1",)).run(
        call, name="stand_in_with_torch_replaced", x=X) == []


def test_a_hook_on_a_stand_in_module_is_the_learner_s_code(pool, folder):
    with pytest.raises(ForbiddenCall, match="aten.native_layer_norm"):
        learner(pool, folder, NORMS, "5.3", ("5.1",)).run(
            call, name="stand_in_module_hook", x=X.float())


def test_a_stand_in_s_computation_taken_whole_computes_nothing_later(pool, folder):
    """The class of a stand-in's computation reaches code that replaces
    ``torch.autograd.Function.apply`` (no double underscore needed: the source rules allow
    it), and its node is an output's ``grad_fn``. Called later, its forward (softmax, in a
    test of 2.1) computes nothing: it computes only while the stand-in applies it; and its
    backward computes only what its forward saved, out of the node's reach (a test of 2.3,
    which may not run a backward pass): the node's own request has ended, so it is
    refused, as a kept stand-in is."""
    kept = learner(pool, folder, (), "5.4", ("2.1",)).run(
        call, name="steals_the_computation", x=X)
    assert torch.allclose(kept, torch.softmax(X, -1))
    with pytest.raises(LearnerRaised, match="computes only when the stand-in itself is called"):
        learner(pool, folder, SOFTMAX, "2.1").run(call, name="stolen_forward", x=X)
    with pytest.raises(ForbiddenCall, match=r"stand-in for exercise 2\.1 \(\w+\), which a "
                                            r"test of exercise 5\.4 was handed"):
        learner(pool, folder, ("autograd",), "2.3").run(call, name="stolen_backward", x=X)


@pytest.mark.parametrize(("name", "exercise"), [
    ("kept_function", "2.1"), ("kept_class", "5.1"), ("kept_module", "5.1"),
    ("kept_graph", "2.1"), ("kept_quietly", "2.1")])
def test_a_stand_in_kept_past_its_test_refuses_to_work_and_names_who_kept_it(
        pool, folder, name, exercise):
    """A stand-in, a module made of one and a graph through one serve the test that was
    handed them: called in a later test (here a capstone's, which is handed none), each is
    refused, even when the code catches the refusal, and the message names the exercise
    whose test was handed it."""
    kept = learner(pool, folder, (), "5.4", ("2.1", "5.1")).run(call, name="keeps", x=X.float())
    assert torch.allclose(kept, torch.softmax(X.float(), -1))  # it works in its own test
    with pytest.raises(ForbiddenCall, match=rf"stand-in for exercise {exercise} \(\w+\), which "
                                            r"a test of exercise 5\.4 was handed"):
        learner(pool, folder, (), "6.6").run(call, name=name, x=X.float())
