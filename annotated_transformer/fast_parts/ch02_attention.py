"""Chapter 2, fast: PyTorch's softmax inside the same contract as the reference.

``torch.softmax`` gives NaN on a slice that is all ``-inf``; the contract (a query
with nothing to attend to gets zero weights) is kept by handing such inputs to the
reference, which is rare (no task of the course produces one) and exact. Inputs of the
wrong shape go to the reference too, which raises its own errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 2)

softmax_jacobian = _reference.softmax_jacobian

__all__ = ["softmax", "scaled_dot_product_attention", "softmax_jacobian"]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Exercise 2.1 on ``torch.softmax``: zeros, not NaN, for a slice that is all ``-inf``."""
    if x.numel() and bool(torch.isneginf(x.amax(dim=dim)).any()):
        return _reference.softmax(x, dim)
    return torch.softmax(x, dim=dim)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 mask: Tensor | None = None,
                                 dropout: Callable[[Tensor], Tensor] | None = None
                                 ) -> tuple[Tensor, Tensor]:
    """Exercise 2.2 with fewer operations: the scale folded into the masking, PyTorch's softmax.

    Returns ``(output [..., Lq, d_v], weights [..., Lq, Lk])`` like the reference (the
    weights are what the caller asked for, so no fused kernel can serve it; Chapter 3's
    fast ``MultiHeadAttention`` uses ``F.scaled_dot_product_attention`` when it needs no
    weights).
    """
    d_k = query.size(-1)
    if (key.size(-1) != d_k or key.size(-2) != value.size(-2)
            or (mask is not None and not bool(mask.any(dim=-1).all()))):
        # shapes that do not fit (the reference says what is wrong), or a query that sees
        # no key (the reference's softmax gives it zeros)
        return _reference.scaled_dot_product_attention(query, key, value, mask, dropout)
    scores = torch.matmul(query, key.transpose(-2, -1))  # [..., Lq, Lk]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores * (1.0 / math.sqrt(d_k)), dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return torch.matmul(weights, value), weights
