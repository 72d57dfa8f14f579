"""Operations the fast parts share (not a chapter: the parts registry reads only ``chNN_*.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.parts import is_compiling

_INT16_SPAN, _INT32_SPAN = 2**16, 2**32


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with a cheaper random mask on the CPU.

    On a CPU, ``F.dropout`` draws one Bernoulli variable per element from the Mersenne
    Twister, about 10 ns each: in a small model that is a fifth of a training step. Here
    one draw of 64 random bits (``Tensor.random_`` over the full 64-bit range, the same
    generator, so ``torch.manual_seed`` still fixes the masks) serves four elements: an
    element is kept when its 16 random bits, read as an integer, are at least
    ``round(p * 2**16)`` above the smallest one, which happens with probability ``1 - p``
    up to ``2**-17`` (0.9 becomes 0.899994 for ``p = 0.1``); kept elements are scaled by
    ``1 / (1 - p)``, as ``F.dropout`` does. A ``p`` within ``2**-17`` of 0 or 1 takes 32
    bits an element, ``2**-33`` from ``p``. Other devices, and ``torch.compile``, use
    ``F.dropout`` (their kernels draw counter-based random numbers already)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or is_compiling():
        return F.dropout(x, p, training=True)
    return x * scaled_mask(x, p)


def relu_dropout(x: Tensor, module: nn.Dropout) -> Tensor:
    """``module_dropout(F.relu(x), module)`` as one autograd function: the same values and
    gradients (ReLU's gradient is 0 where ``x <= 0``), the forward pass two operations on
    ``x``'s size and the backward pass one, reading the output (:class:`_ReluTimes`)."""
    p = module.p
    if not (p and module.training) or x.device.type != "cpu" or p >= 1.0 or is_compiling():
        return module_dropout(F.relu(x), module)
    return _ReluTimes.apply(x, scaled_mask(x, p), 1.0 / (1.0 - p))


class _ReluTimes(torch.autograd.Function):
    """``relu(x) * mask`` for a dropout mask of 0 and ``scale``: the gradient is the
    incoming one times ``scale`` where the output is positive, 0 elsewhere (where
    ``x <= 0`` or the mask dropped it), so the backward pass reads the output, which the
    next layer keeps anyway, rather than a mask of its own."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        out = torch.clamp_min(x, 0).mul_(mask)
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, out, 0).mul_(ctx.scale), None, None


def add_dropout(x: Tensor, y: Tensor, module: nn.Dropout) -> Tensor:
    """``x + module_dropout(y, module)`` (a residual connection) as one ``addcmul``: the
    sum, the mask and the scale in one pass, no scaled copy of ``y`` kept."""
    p = module.p
    if not (p and module.training) or y.device.type != "cpu" or p >= 1.0 or is_compiling():
        return x + module_dropout(y, module)
    return torch.addcmul(x, y, scaled_mask(y, p))


def scaled_mask(x: Tensor, p: float) -> Tensor:
    """Dropout's mask for ``x``: a tensor of ``x``'s shape and dtype, each element
    ``1 / (1 - p)`` with probability ``1 - p`` and 0 otherwise (see :func:`dropout`).

    The test "at least the threshold" is computed in the integers' own arithmetic
    (clamped to the threshold and the integer below it, less that integer: 1 or 0), not
    as a comparison: PyTorch's CPU kernels write a boolean, and turn one into floats,
    element by element, while clamping, subtracting and converting 16-bit integers run
    vectorised, several times faster."""
    dtype, span = torch.int16, _INT16_SPAN
    if not 0 < round(p * span) < span:  # too near 0 or 1 for 16 bits
        dtype, span = torch.int32, _INT32_SPAN
    per_draw = 64 // (8 * dtype.itemsize)  # elements a 64-bit draw serves
    count = x.numel()
    bits = torch.empty(-(-count // per_draw), dtype=torch.int64, device=x.device)
    bits = bits.random_(-(2**63), None).view(dtype)  # all 64 bits random
    bits = (bits[:count] if count % per_draw else bits).view(x.shape)
    kept = at_least(bits, round(p * span) - span // 2)
    return kept.to(x.dtype).mul_(1.0 / (1.0 - p))


def at_least(integers: Tensor, threshold: int) -> Tensor:
    """1 where ``integers >= threshold``, 0 elsewhere, in their dtype, in place: clamped to
    ``[threshold - 1, threshold]``, less ``threshold - 1`` (``threshold - 1`` must fit)."""
    return integers.clamp_(threshold - 1, threshold).sub_(threshold - 1)


def module_dropout(x: Tensor, module: nn.Dropout) -> Tensor:
    """``module(x)`` with :func:`dropout`, and no operation at all when it is off."""
    if module.p and module.training:
        return dropout(x, module.p)
    return x
