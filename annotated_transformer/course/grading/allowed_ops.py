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
imported, and keeps it where no name of an exercise file reaches (:mod:`.worker`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
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
    "in place": "add_ sub_ mul_ div_ neg_ clamp_ clamp_min_ clamp_max_ exp_ log_ sqrt_ "
                "pow_ relu_ sigmoid_ tanh_ abs_ floor_ round_ addcmul_ addcdiv_ lerp_ "
                "copysign_ masked_scatter_ tril_ triu_ transpose_ t_ squeeze_ unsqueeze_ "
                "detach_ requires_grad_ nan_to_num_ where_ fill_diagonal_ clamp_",
}
ELEMENTARY = frozenset(name for names in _GROUPS.values() for name in names.split())


def op_name(func) -> str:
    """``aten::_softmax.default`` -> ``_softmax``: the op, without its namespace and
    overload (any overload of an allowed op is allowed)."""
    return func._schema.name.split("::")[-1]


# What the guard records when its own modes were popped, disabled or covered.
TAMPERED = "the grader's own modes on PyTorch's mode stacks, which your code popped or disabled"


class ForbiddenOpUsed(RuntimeError):
    """The learner's code reached an op the exercise does not allow."""


def guard_factory():
    """A function ``guard(ops, exercise)`` that makes the guard of one probe, a context
    manager, and the list of what it refused; its attribute ``exempt()`` is a context
    manager inside which no op is checked (the grader's stand-ins compute there). It
    refuses every aten op outside ``ELEMENTARY`` (and the ``+op`` of ``ops``) and the other
    ops of ``ops``; an entry ``F.name:argument`` refuses ``torch.nn.functional.name``
    called with that argument other than its default, by keyword or by position (a module
    that calls it so, too); ``torch:name`` any function of PyTorch's named ``name``;
    ``autograd`` any op while a backward pass runs.
    Every refusal is recorded (a learner's ``try``/``except`` around the call cannot hide
    it) in a list that only the guard and its caller hold. Everything it needs is bound
    here, once, before any learner code runs, so that nothing an exercise file can later
    assign changes what it refuses."""
    import inspect

    import torch.nn.functional
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    elementary, name_of, error = ELEMENTARY, op_name, ForbiddenOpUsed
    frozen, text, listed, attribute = frozenset, str, list, getattr
    # The mode stacks' own functions, held here: the worker then takes them out of every
    # other name's reach (grading.switches), so only this guard pushes and pops its modes.
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
    exemption = [0]  # > 0 while a stand-in of the grader computes (grading.standins)

    @contextlib.contextmanager
    def exempt():
        """Ops are not checked inside: for the grader's stand-ins, which call no learner
        code while exempt."""
        exemption[0] += 1
        try:
            yield
        finally:
            exemption[0] -= 1

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
        allowed = ((elementary | frozen(op[1:] for op in ops if op.startswith("+")))
                   - frozen(op for op in ops if not op.startswith(("+", "F.", "torch:"))))
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
                if exemption[0]:
                    return func(*args, **(kwargs or {}))
                name = name_of(func)
                if name not in allowed:
                    refuse(f"aten.{name}")
                if no_backward and backward_running() != -1:
                    refuse(f"autograd (aten.{name} in a backward pass)")
                if not functions_on():
                    refuse(TAMPERED)
                return func(*args, **(kwargs or {}))

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                state.inside += 1  # PyTorch pops this mode while it runs: ops may run now
                try:
                    return self.checked(func, args, kwargs)
                finally:
                    state.inside -= 1

            def checked(self, func, args, kwargs):
                if named and not exemption[0]:
                    name = text(attribute(func, "__name__", "")).split(".")[0]
                    if name in named:
                        refuse(named[name])
                if func in arguments and not exemption[0]:
                    name, signature, argument = arguments[func]
                    given = signature.bind(*args, **(kwargs or {})).arguments
                    if argument in given and given[argument] != signature.parameters[
                            argument].default:
                        refuse(f"F.{name} with {argument}")
                return func(*args, **(kwargs or {}))

        class State:
            inside = 0  # how deep in Functions.__torch_function__ the thread is
            at = -1  # where Functions' mode sits on the torch-function stack

        state = State()

        def functions_on() -> bool:
            """Whether Functions' mode is on: in its place on the stack, or, while PyTorch
            runs its ``__torch_function__`` (which pops it for that time), just popped.
            Code that PyTorch calls back from there (a custom backward under
            ``Tensor.backward``) runs without it, under the dispatch guard alone."""
            if all_disabled():
                return False
            depth = depth_function()
            if depth > state.at and function_at(state.at) is guard_modes[0]:
                return True
            return state.inside > 0 and depth == state.at

        guard_modes: list[Any] = []

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

    guard.exempt = exempt
    return guard
