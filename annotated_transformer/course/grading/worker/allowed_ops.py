"""What the code of a guarded exercise may reach at PyTorch's dispatcher: an allow-list.

An exercise that asks the learner to write an op PyTorch already has (softmax, LayerNorm,
attention, a layer, label smoothing) is graded with every aten op outside ``ELEMENTARY``
refused while its probe runs, and the exercise's own forbidden ops refused too (a test
file's ``FORBIDDEN_OPS``). An entry there that starts with ``+`` allows one more op for
that exercise (6.2, a loss, may reach ``_log_softmax``; its ``nll_loss`` stays refused).
Two kinds of entry refuse what PyTorch computes with elementary ops, which the dispatcher
cannot tell from an honest answer: ``torch:name``, any function of PyTorch's called
``name`` (``torch.rms_norm``, ``F.rms_norm``, ``torch.ops.aten.rms_norm``, a module that
calls one), seen at the torch-function level; ``autograd``, any op of a backward pass
(``Tensor.backward``, ``torch.autograd.grad``, ``torch.func.jacrev``) and forward-mode
autograd (``torch.func.jacfwd``, ``jvp``: a dual tensor).
``ELEMENTARY`` holds the building blocks of an honest answer and of the probes that call
it: arithmetic and elementwise functions, reductions, matrix products, views, indexing,
copies and creation, random draws and dropout, embedding lookup, and the backward ops of
these. A fused kernel (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``,
``native_layer_norm``, ``_softmax``) is not among them, so it is refused whatever Python
name reached it: ``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``, a helper of
another chapter's file, an argument passed by position. Ops that PyTorch decomposes before
dispatch (``linear``, ``einsum``, ``cross_entropy``) arrive as the ops they decompose into.

The worker builds its guard from this module when it starts, before any learner code is
imported, and keeps it where no name of an exercise file reaches (:mod:`.process`).

The guard looks away in two places only, and no code of the learner's runs in either:

- **Inside its own handlers.** PyTorch pops a mode while that mode's handler runs. The
  torch-function handler puts its mode back before it looks at the call and runs it with
  the next check skipped (``torch._C._skip_one_hop_torch_function``, what
  ``torch.overrides.redispatch_function`` does): whatever the call runs in turn is seen
  again. The dispatch handler cannot (its mode would see its own call again), so it runs
  nothing of the learner's: no tensor subclass reaches it, no kernel of the learner's is
  registered (:mod:`.switches`), no collection of garbage runs meanwhile.
- **At an op that the grader's stand-ins call** (:mod:`.standins`): one whose calling
  Python frame runs one of the code objects the guard was built with (those of
  ``trusted.computations``; no switch, nothing to enter). They compute on tensors the
  worker made, with every torch function override off, saved-tensor hooks refused and no
  collection of garbage; why no op of the learner's has such a frame:
  :func:`.trusted.computations`.

Every callback PyTorch lets code register, and what keeps it from running unguarded:

- ``torch.autograd.graph.saved_tensors_hooks`` (and ``save_on_cpu``): pack hooks run while
  an op saves its inputs, unpack hooks in the backward pass; both inside a torch function's
  call, which the guard's mode now sees; while a stand-in computes, saved-tensor hooks are off
  (an op that would run one raises).
- ``Tensor.register_hook``, ``register_post_accumulate_grad_hook``, ``retain_grad``, a
  node's ``register_hook`` and ``register_prehook``, ``torch.autograd.graph.
  register_multi_grad_hook``, the engine's ``queue_callback``, a custom
  ``torch.autograd.Function``'s ``forward``, ``setup_context``, ``backward`` and ``jvp``,
  ``torch.utils.checkpoint``'s recomputation: they run in the backward pass or the forward
  of a call that ``Tensor.backward``, ``torch.autograd.grad`` or ``Function.apply`` (torch
  functions) started, with the mode in place. A stand-in hands its callers detached
  results and computes on detached copies: no hook of the learner's is on its graph.
- ``nn.Module`` hooks (forward, forward pre, backward, full backward, state-dict and
  load-state-dict hooks, their global ``register_module_*`` forms) and parametrizations:
  they run where the module is called, in the learner's code; a stand-in's computation
  calls no module.
- ``__torch_function__`` of a tensor subclass or any argument, and a
  ``TorchFunctionMode`` of the learner's: the guard's mode comes first and skips them;
  while a stand-in computes every torch function override is off; it takes tensors of
  exactly ``Tensor`` and ``Parameter`` only.
- ``__torch_dispatch__`` of a tensor subclass: refused wherever it meets the dispatch
  guard; a ``TorchDispatchMode`` of the learner's cannot be pushed (:mod:`.switches`).
- ``torch.library`` kernels, fallbacks and definitions (an aten op's CPU kernel replaced
  by a Python function would run inside the dispatch handler): refused (:mod:`.switches`).
- Python's own: a finalizer (``__del__``, ``weakref.finalize``) run by the garbage
  collector is held off inside the dispatch handler and while a stand-in computes. Trace
  and profile functions and audit hooks are refused by the worker's audit hook
  (:mod:`.process`); signal handlers and ``warnings.showwarning`` need ``signal`` or
  ``warnings``, which the source rules refuse: the limit stated in ``book/instructor.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import CodeType
from typing import Any

_GROUPS = {
    "arithmetic": "add sub rsub mul div neg reciprocal pow remainder fmod floor_divide abs "
                  "sign sgn square addcmul addcdiv lerp true_divide",
    "elementwise": "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan tanh sinh cosh "
                   "asin acos atan atan2 sigmoid relu gelu silu erf erfc erfinv floor ceil "
                   "round trunc frac clamp clamp_min clamp_max clip maximum minimum fmax fmin "
                   "hypot xlogy threshold hardtanh leaky_relu elu softplus",
    "comparison": "eq ne lt le gt ge isnan isinf isfinite isneginf isposinf logical_and "
                  "logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_not "
                  "bitwise_xor where nan_to_num signbit isclose equal allclose",
    "reduction": "sum mean amax amin max min argmax argmin prod var std var_mean std_mean "
                 "norm linalg_vector_norm cumsum cumprod any all count_nonzero aminmax "
                 "median nansum nanmean topk sort argsort kthvalue unique_consecutive "
                 "_unique2 unique_dim",
    "linear algebra": "mm bmm matmul addmm addbmm baddbmm addmv mv dot vdot outer ger "
                      "_unsafe_view tril triu diag diagonal diag_embed trace",
    "views": "view reshape _reshape_alias expand expand_as permute transpose t squeeze "
             "unsqueeze flatten unflatten contiguous clone detach alias slice select narrow "
             "split split_with_sizes chunk unbind movedim as_strided unfold view_as "
             "numpy_T T lift_fresh lift_fresh_copy _to_copy to copy_ copy _copy_from "
             "_copy_from_and_resize resize_ set_ _local_scalar_dense item type_as "
             "view_as_real view_as_complex real imag conj resolve_conj resolve_neg "
             "_conj _neg_view is_same_size fill_ fill zero_ _has_compatible_shallow_copy_type",
    "indexing": "index index_put index_put_ _index_put_impl_ index_select gather scatter "
                "scatter_ scatter_add scatter_add_ scatter_reduce masked_fill masked_fill_ "
                "masked_select masked_scatter take take_along_dim nonzero nonzero_static "
                "index_add index_add_ index_copy index_fill repeat repeat_interleave tile "
                "cat stack hstack vstack flip roll pad constant_pad_nd sym_size sym_stride "
                "sym_numel sym_storage_offset searchsorted bucketize",
    "creation": "empty empty_like empty_strided new_empty new_empty_strided new_zeros "
                "new_ones new_full zeros zeros_like ones ones_like full full_like arange "
                "linspace logspace eye scalar_tensor tensor rand rand_like randn randn_like "
                "randint randint_like randperm normal normal_ uniform_ bernoulli bernoulli_ "
                "multinomial exponential_ random_ one_hot _efficientzerotensor",
    "layers": "embedding embedding_dense_backward native_dropout native_dropout_backward "
              "dropout feature_dropout alpha_dropout",
    "backward": "threshold_backward sigmoid_backward tanh_backward gelu_backward "
                "silu_backward hardtanh_backward leaky_relu_backward elu_backward "
                "softplus_backward pow_backward mul_backward sum_backward "
                "expand_backward select_backward slice_backward index_select_backward "
                "masked_fill_backward gather_backward _unsafe_index_put "
                "new_empty_strided embedding_backward",
    "in place only": "copysign_ requires_grad_ fill_diagonal_",
}
# The guard allows the in-place form of each too (``rsqrt_`` with ``rsqrt``), unless refused.
ELEMENTARY = frozenset(name for names in _GROUPS.values() for name in names.split())


def op_name(func) -> str:
    """``aten::_softmax.default`` -> ``_softmax``: the op, without its namespace and
    overload (any overload of an allowed op is allowed)."""
    return func._schema.name.split("::")[-1]


# What the guard records when its own modes were popped, disabled or covered.
TAMPERED = "the grader's own modes on PyTorch's mode stacks, which your code popped or disabled"


class ForbiddenOpUsed(RuntimeError):
    """The learner's code reached an op the exercise does not allow."""


def guard_factory(entries: frozenset[CodeType] = frozenset(),
                  inner: frozenset[CodeType] = frozenset()):
    """A function ``guard(ops, exercise)`` that makes the guard of one probe, a context
    manager, and the list of what it refused. It checks no aten op called from a Python
    frame that runs a code object of ``entries`` (the stand-ins' ``Call.forward`` and
    ``Call.backward``), or of ``inner`` called from there (their computations), and
    otherwise refuses every aten op outside ``ELEMENTARY`` (and the ``+op`` of ``ops``)
    and the other ops of ``ops``; an entry ``F.name:argument`` refuses
    ``torch.nn.functional.name`` called with that argument other than its default, by
    keyword or by position (a module that calls it so, too); ``torch:name`` any function of
    PyTorch's named ``name``; ``autograd`` any op while a backward pass runs.
    Every refusal is recorded (a learner's ``try``/``except`` around the call cannot hide
    it) in a list that only the guard and its caller hold. Everything it needs is bound
    here, once, before any learner code runs, so that nothing an exercise file can later
    assign changes what it refuses."""
    import gc
    import inspect

    import torch.nn.functional
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    elementary, name_of, error = ELEMENTARY, op_name, ForbiddenOpUsed
    frozen, text, listed, attribute, type_of = frozenset, str, list, getattr, type
    numbers = (int, float)
    # The mode stacks' own functions, held here: the worker then takes them out of every
    # other name's reach (grading.worker.switches), so only this guard pushes and pops its modes.
    stacks = torch._C
    push_dispatch, pop_dispatch = (stacks._push_on_torch_dispatch_stack,
                                   stacks._pop_torch_dispatch_stack)
    push_function, pop_function = (stacks._push_on_torch_function_stack,
                                   stacks._pop_torch_function_stack)
    depth_dispatch, depth_function = (stacks._len_torch_dispatch_stack,
                                      stacks._len_torch_function_stack)
    function_at = stacks._get_function_stack_at
    all_disabled = stacks._is_torch_function_all_disabled
    backward_running = stacks._current_graph_task_id  # -1 outside autograd's backward pass
    skip_one_hop = stacks._skip_one_hop_torch_function  # runs a call, its check skipped
    set_skip = stacks._set_skip_next_torch_function  # (False: what a call left unconsumed)
    tensor_base = stacks.TensorBase
    calling_frame = sys._getframe  # (1): the frame that called the op, in the handler
    collecting, stop_collecting, collect = gc.isenabled, gc.disable, gc.enable
    plain, parameter = torch.Tensor, torch.nn.Parameter
    functional = {name: (value, inspect.signature(value))
                  for name, value in vars(torch.nn.functional).items()
                  if inspect.isfunction(value) and not name.startswith("_")}

    def guard(ops: Iterable[str], exercise: str) -> tuple[Any, list[str]]:
        ops = listed(text(op) for op in ops)
        arguments = {}  # the function, its signature and the argument it may not be given
        for op in ops:
            if op.startswith("F."):
                name, _, argument = op[2:].partition(":")
                function, signature = functional[name]
                arguments[function] = (name, signature, argument)
        no_backward = "autograd" in ops
        # {function name: what the learner reads}; forward-mode autograd starts with a dual
        named = {op[6:]: op[6:] for op in ops if op.startswith("torch:")}
        if no_backward:
            named["_make_dual"] = "autograd (its forward mode)"
        refused = frozen(op for op in ops if not op.startswith(("+", "F.", "torch:")))
        allowed = (elementary | frozen(op[1:] for op in ops if op.startswith("+"))) - refused
        hits: list[str] = []
        where = text(exercise)

        def refuse(what: str) -> None:
            hits.append(what)
            raise error(f"Exercise {where} asks you to write this yourself, but your code "
                        f"reached PyTorch's {what}, which an answer to it does not need "
                        f"(through torch's own function or module)")

        class Ops(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # Else PyTorch wraps __torch_dispatch__ to keep its compiler out, and its
                # first op imports that compiler: 2.3 s of a learner's wait, for nothing
                # here (an exercise file may not reach the compiler).
                return False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                # PyTorch pops this mode while this runs: the op below runs nothing of the
                # learner's (a subclass's own __torch_dispatch__, a finalizer).
                for tensor_type in types:
                    if tensor_type is not plain and tensor_type is not parameter:
                        refuse("__torch_dispatch__ of a tensor subclass")
                # The Python frame that called the op's C++ function (PyTorch calls this
                # handler from C++, unwrapped: _should_skip_dynamo): the stand-ins' code
                # (grading.worker.trusted.computations) is exempt, no other.
                caller = calling_frame(1)
                code = caller.f_code  # (each read is an audit event: read once)
                while code in inner:
                    caller = caller.f_back
                    code = caller.f_code if caller is not None else None
                if code not in entries:
                    name = name_of(func)
                    if name not in allowed and (name[-1:] != "_" or name in refused
                                                or name[:-1] not in allowed):
                        refuse(f"aten.{name}")  # (an op's in-place form is allowed with it)
                    if no_backward and backward_running() != -1:
                        refuse(f"autograd (aten.{name} in a backward pass)")
                    if not functions_on():
                        refuse(TAMPERED)
                was_collecting = collecting()
                stop_collecting()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    if was_collecting:
                        collect()

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                # PyTorch pops this mode while this runs; it goes back on at once, so that
                # whatever the call runs in turn (a hook, a backward, an argument's
                # __eq__) is seen too, and the call runs with its own check skipped.
                set_skip(False)
                kwargs = kwargs or {}
                hop, state.hop = state.hop, None
                if hop is not None and hop[0] is func and same(hop[1], args):
                    # The call came back at once, as itself: a method of Tensor written in
                    # Python that calls the C++ method of its name (unflatten), which
                    # PyTorch dispatches as the Python one, runs that C++ method, its check
                    # skipped. Anything else (a few of torch._C's functions check twice,
                    # such as _set_grad_enabled) runs with the mode off, where every op is
                    # refused (functions_on).
                    name = text(attribute(func, "__name__", ""))
                    if attribute(tensor_base, name, None) is None:
                        return func(*args, **kwargs)
                    func = attribute(tensor_base, name)
                push_function(self)
                try:
                    self.check(func, args, kwargs)
                    state.hop = (func, args)
                    return skip_one_hop(func, types, args, kwargs)
                finally:
                    state.hop = None
                    set_skip(False)
                    if depth_function() != state.at + 1 or function_at(state.at) is not self:
                        hits.append(TAMPERED)
                    while depth_function() > state.at:
                        pop_function()

            def check(self, func, args, kwargs):
                if named:
                    name = text(attribute(func, "__name__", "")).split(".")[0]
                    if name in named:
                        refuse(named[name])
                if func in arguments:
                    name, signature, argument = arguments[func]
                    given = signature.bind(*args, **kwargs).arguments
                    default = signature.parameters[argument].default
                    # Compared only as a built-in number: a value of the learner's class
                    # would answer the comparison with a method of its own.
                    if argument in given and not (type_of(given[argument]) in numbers
                                                  and given[argument] == default):
                        refuse(f"F.{name} with {argument}")

        class State:
            at = -1  # where Functions' mode sits on the torch-function stack
            hop: tuple[Any, Any] | None = None  # the call being run with its check skipped

        state = State()

        def functions_on() -> bool:
            """Whether Functions' mode is in its place on the stack (its handler puts it
            back while it runs)."""
            return (not all_disabled() and depth_function() > state.at
                    and function_at(state.at) is guard_modes[0])

        guard_modes: list[Any] = []

        def same(these: Any, those: Any) -> bool:
            """Whether two argument tuples hold the same objects (identity only: nothing of
            the learner's runs)."""
            return len(these) == len(those) and all(
                a is b for a, b in zip(these, those, strict=True))

        class Guard:
            """On: the two modes pushed on their stacks; off: popped, each checked to be
            the one pushed (another one on top means the stacks were tampered with)."""

            def __enter__(self) -> None:
                self.depths = (depth_function(), depth_dispatch())
                self.modes = (Functions(), Ops())
                guard_modes[:] = self.modes
                state.at = self.depths[0]
                push_function(self.modes[0])
                push_dispatch(self.modes[1])

            def __exit__(self, *exc: object) -> None:
                if (depth_function(), depth_dispatch()) != (self.depths[0] + 1,
                                                            self.depths[1] + 1):
                    hits.append(TAMPERED)
                while depth_dispatch() > self.depths[1]:
                    pop_dispatch(None)
                while depth_function() > self.depths[0]:
                    pop_function()

        return Guard(), hits

    return guard
