"""Operations the fast parts share (not a chapter: the parts registry reads only ``chNN_*.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.parts import is_compiling

_INT32_SPAN = 2**32


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with a cheaper random mask on the CPU.

    On a CPU, ``F.dropout`` draws one Bernoulli variable per element from the Mersenne
    Twister, about 10 ns each: in a small model that is a fifth of a training step. Here
    one draw of 64 random bits (``Tensor.random_`` over the full 64-bit range, the same
    generator, so ``torch.manual_seed`` still fixes the masks) serves two elements: an
    element is kept when its 32 random bits, read as an integer, are at least
    ``p * 2**32`` above the smallest one, which happens with probability ``1 - p`` up to
    ``2**-32``; kept elements are scaled by ``1 / (1 - p)``, as ``F.dropout`` does. Other
    devices, and ``torch.compile``, use ``F.dropout`` (their kernels draw counter-based
    random numbers already)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or is_compiling():
        return F.dropout(x, p, training=True)
    count = x.numel()
    bits = torch.empty((count + 1) // 2, dtype=torch.int64, device=x.device)
    bits = bits.random_(-(2**63), None).view(torch.int32)  # all 64 bits random
    bits = (bits[:count] if count % 2 else bits).view(x.shape)
    threshold = round(p * _INT32_SPAN) - 2**31
    scale = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ge(bits, threshold, out=scale)  # 1 where kept, 0 where dropped: one kernel
    return x * scale.mul_(1.0 / (1.0 - p))


def module_dropout(x: Tensor, module: nn.Dropout) -> Tensor:
    """``module(x)`` with :func:`dropout`, and no operation at all when it is off."""
    if module.p and module.training:
        return dropout(x, module.p)
    return x
