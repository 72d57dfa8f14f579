"""The stand-ins' computations: the only code whose ops the dispatch guard exempts.

Made once, when the worker starts and before any learner code runs (:func:`computations`);
the guard is built from their code objects (:func:`.allowed_ops.guard_factory`), and the
stand-ins of each request (:mod:`.standins`) compute through them. Why no op of the
learner's can ever count as theirs is said in :func:`computations`.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from types import CodeType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor



NOT_CALLED = "the grader's stand-in computes only when the stand-in itself is called"


def computations() -> tuple[dict[str, Callable[..., Any]], frozenset[CodeType],
                                frozenset[CodeType]]:
    """``({exercise: computation}, entries, inner)``: what the stand-ins compute with ops the
    guard would refuse, each one autograd node, forward and backward, and the code objects
    the guard exempts (:func:`.allowed_ops.guard_factory`): an op is exempt when the Python
    frame that called it runs ``Call.forward`` or ``Call.backward`` (``entries``), or code
    of theirs or of a computation (``inner``: ``softmax_of``, ``attend``, ``heads_of``, the
    lambdas, their comprehensions) called from there. Made once, before any learner code
    runs: every function they call is a C++ one taken now. A computation takes first a
    function ``alive()``, which raises when its stand-in's request has ended (called before
    the forward and the backward, before anything is switched off), then tensors of exactly
    ``Tensor`` or ``Parameter`` and plain numbers (a learner's file that replaces
    ``torch.where`` changes nothing they call; the dropout a caller passes to attention runs
    outside). (PyTorch is imported here, when the worker starts.)

    Why no op of the learner's is ever exempt: the frame that calls an op is the frame of
    the code that called PyTorch's C++ function. The trusted code calls only C++ functions
    bound here, on exact ``Tensor``/``Parameter`` arguments, with every torch-function
    override off (no subclass's or mode's Python runs), saved-tensor hooks refused and the
    garbage collector (which runs finalizers) off; whatever of the learner's runs anyway (an
    ``alive`` of its own, an ``__index__`` of an argument) runs in a frame of its own code,
    not trusted. A code object cannot be changed, nor a frame's ``f_code`` set; a function
    rebuilt around a trusted code object (``types.FunctionType``, ``f.__code__ = ...``) is
    refused by the worker's audit hook (:mod:`.process`). What this does not stop: code that
    reaches these functions (a stand-in's ``__closure__``, the worker's frames: both refused
    by the source rules) can call a computation with arguments of its own, or rebind its
    cells (``applying``, ``saved``, ``function``): compute a stand-in's result unnoted, or a
    backward pass of its own graph unchecked. Python's builtins the trusted code calls are
    bound here too."""
    import gc

    import torch
    from torch._C import TensorBase, _nn

    tensor_types, numbers = (torch.Tensor, torch.nn.Parameter), (bool, int, float)
    detach, requires_grad_, size = (TensorBase.detach, TensorBase.requires_grad_,
                                    TensorBase.size)
    grad_enabled, set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled
    run_backward = torch.autograd.Variable._execution_engine.run_backward
    softmax, where, isnan, zeros_like, full_like = (torch.softmax, torch.where, torch.isnan,
                                                    torch.zeros_like, torch.full_like)
    matmul, transpose, div, unflatten, flatten = (torch.matmul, torch.transpose, torch.div,
                                                  torch.unflatten, torch.flatten)
    linear, dropout, layer_norm, cross_entropy = (_nn.linear, torch.dropout, torch.layer_norm,
                                                  _nn.cross_entropy_loss)
    sqrt, minus_infinity = math.sqrt, float("-inf")
    mean = 1  # cross_entropy_loss's reduction, as F.cross_entropy passes it (its stub says str)
    no_torch_function = torch._C.DisableTorchFunction  # every override off, modes too
    autograd = torch._C._autograd
    hooks_message = autograd._saved_tensors_hooks_get_disabled_error_message
    hooks_off = autograd._saved_tensors_hooks_disable
    hooks_on = autograd._saved_tensors_hooks_enable
    collecting, stop_collecting, collect = gc.isenabled, gc.disable, gc.enable
    # Python's own functions too: a name looked up when the code runs is looked up in this
    # module's namespace first, which a learner's file can assign to.
    type_of, tupled, zipped, numbered, length = type, tuple, zip, enumerate, len
    error = RuntimeError

    @contextlib.contextmanager
    def alone() -> Iterator[None]:
        """No code of the learner's runs inside: every torch function override (a mode, a
        subclass) is off, an op that would run a saved-tensor hook raises, and the garbage
        collector (which runs finalizers) waits. (It exempts nothing: code of the learner's
        that entered it would find its every op refused, the guard's mode being off.)"""
        was_collecting, message = collecting(), hooks_message()
        stop_collecting()
        hooks_off("saved-tensor hooks do not run while the grader's stand-in computes (it "
                  "stands in for an earlier exercise and runs no code of yours)")
        try:
            with no_torch_function():
                yield
        finally:
            if message is None:
                hooks_on()
            else:
                hooks_off(message)
            if was_collecting:
                collect()

    def trusted(function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (of tensors and numbers) computed alone, forward and backward, as
        one autograd node, on detached copies of its inputs. ``Call`` is within reach of
        a learner's code that replaces ``torch.autograd.Function.apply``, and its node is
        a stand-in's output's ``grad_fn``: its forward computes only while ``call`` applies
        it, and its backward only what that forward saved, here, out of the node's reach."""
        applying = [0]  # > 0 while call() applies Call
        saved: MutableMapping[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()

        class Call(torch.autograd.Function):  # (made now, before any learner code)
            @staticmethod
            def forward(ctx, alive, *args):
                if not applying[0]:
                    raise error(NOT_CALLED)
                alive()
                wanted = ctx.needs_input_grad[1:]
                was = grad_enabled()
                with alone():
                    set_grad_enabled(True)
                    try:
                        inputs = [requires_grad_(detach(a), need) if type_of(a) in tensor_types
                                  else a for a, need in zipped(args, wanted, strict=True)]
                        out = function(*inputs)
                    finally:
                        set_grad_enabled(was)
                outputs = out if type_of(out) is tupled else (out,)
                saved[ctx] = (alive, inputs, outputs)
                return tupled(detach(o) for o in outputs) if type_of(out) is tupled else detach(out)

            @staticmethod
            def backward(ctx, *grads):
                if ctx not in saved:
                    raise error(NOT_CALLED)
                alive, inputs, outputs = saved[ctx]
                alive()
                wanted = [i for i, a in numbered(inputs)
                          if type_of(a) in tensor_types and a.requires_grad]
                pairs = [(o, g) for o, g in zipped(outputs, grads, strict=True)
                         if g is not None and o.requires_grad]
                found: list[Tensor | None] = [None] * length(inputs)
                if wanted and pairs:
                    with alone():
                        computed = run_backward(
                            tupled(o for o, _ in pairs), tupled(g for _, g in pairs), False,
                            False, tupled(inputs[i] for i in wanted), True, False)
                    for i, grad in zipped(wanted, computed, strict=True):
                        found[i] = grad
                return (None, *found)

        entries.update((Call.forward.__code__, Call.backward.__code__))
        inner.update(nested(function.__code__))

        def call(alive: Callable[[], None], *args: Any) -> Any:
            # Only what runs no code of its own is computed alone: tensors of exactly
            # Tensor or Parameter (a subclass's methods would run exempt), plain numbers.
            for arg in args:
                if not (type_of(arg) in tensor_types or arg is None or type_of(arg) in numbers):
                    raise TypeError(f"the grader's stand-in takes tensors and numbers, got a "
                                    f"{type_of(arg).__name__}")
            applying[0] += 1
            try:
                return Call.apply(alive, *args)
            finally:
                applying[0] -= 1

        return call

    entries: set[CodeType] = set()
    inner: set[CodeType] = set()

    def softmax_of(x: Tensor, dim: int) -> Tensor:
        out = softmax(x, dim)  # a slice of -inf only: NaN, which the course makes 0
        return where(isnan(out), zeros_like(out), out)

    def attend(query, key, value, mask, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, heads,
               p, training):
        """Multi-head attention from PyTorch's ops, with the course's mask (``True`` =
        allowed; a query with no key attends to nothing) and its weights per head."""
        def heads_of(x, weight, bias):  # [B, L, D] -> [B, H, L, d_k]
            return transpose(unflatten(linear(x, weight, bias), -1, (heads, -1)), 1, 2)

        q, k, v = heads_of(query, q_w, q_b), heads_of(key, k_w, k_b), heads_of(value, v_w, v_b)
        scores = div(matmul(q, transpose(k, -2, -1)), sqrt(size(q, -1)))
        if mask is not None:
            scores = where(mask, scores, full_like(scores, minus_infinity))
        weights = dropout(softmax_of(scores, -1), p, training)
        return linear(flatten(transpose(matmul(weights, v), 1, 2), -2), o_w, o_b), weights

    computed = {
        "2.1": trusted(softmax_of),
        "3.3": trusted(attend),
        "5.1": trusted(lambda x, weight, bias, eps: layer_norm(
            x, (size(x, -1),), weight, bias, eps)),
        "6.2": trusted(lambda logits, target, ignore, smoothing: cross_entropy(
            logits, target, None, mean, ignore, smoothing)),  # type: ignore[arg-type]
    }
    for entry in tuple(entries):  # their comprehensions, which call detach
        inner.update(nested(entry) - {entry})
    return computed, frozenset(entries), frozenset(inner)


def nested(code: CodeType) -> set[CodeType]:
    """``code`` and every code object defined inside it (functions, comprehensions)."""
    found = {code}
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= nested(constant)
    return found
