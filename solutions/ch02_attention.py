"""Chapter 2: scaled dot-product attention, and why the scores are divided by sqrt(d_k).

Vaswani et al. (2017), section 3.2.1:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Shapes: ``query [..., Lq, d_k]``, ``key [..., Lk, d_k]``, ``value [..., Lk, d_v]``;
``...`` is any batch shape, typically ``[B]`` or ``[B, H]``. A mask is boolean,
``True`` where attention is allowed, broadcastable to the scores ``[..., Lq, Lk]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["softmax", "scaled_dot_product_attention", "softmax_jacobian"]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Exercise 2.1: ``softmax(x)_i = exp(x_i) / sum_j exp(x_j)`` along ``dim``, computed stably.

    Subtract the maximum of each slice first: ``exp(x_i - m) / sum_j exp(x_j - m)`` is the
    same value and never overflows (``exp(1000)`` is ``inf`` in float64). A slice whose
    entries are all ``-inf`` (a query with nothing to attend to) gives all zeros, not NaN.
    Same shape and dtype as ``x``. May not call ``torch.softmax``, ``F.softmax`` or
    ``Tensor.softmax``, nor ``torch.logsumexp`` (softmax is its gradient).

    Hint: ``x.amax(dim, keepdim=True)`` is ``-inf`` on an all ``-inf`` slice, and
    ``-inf - (-inf)`` is NaN: replace such a maximum by 0 before subtracting. That slice's
    exps are then all 0, and so is their sum (0 / 0 is NaN too): guard the sum as well,
    dividing by ``torch.where(total == 0, 1, total)``, so that the slice is all zeros.
    """
    # BEGIN SOLUTION 2.1
    maximum = x.amax(dim=dim, keepdim=True)
    maximum = torch.where(torch.isfinite(maximum), maximum, torch.zeros_like(maximum))
    exps = torch.exp(x - maximum)
    total = exps.sum(dim=dim, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)
    # END SOLUTION


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Exercise 2.2: ``softmax(Q K^T / sqrt(d_k)) V``, returning ``(output, weights)``.

    ``query [..., Lq, d_k]``, ``key [..., Lk, d_k]``, ``value [..., Lk, d_v]`` ->
    ``output [..., Lq, d_v]`` and ``weights [..., Lq, Lk]`` (each row sums to 1 over
    the keys). Where the boolean ``mask`` (broadcastable to ``[..., Lq, Lk]``) is
    ``False`` the score is ``-inf``, so that key gets weight 0; a query whose keys
    are all masked gets zero weights and a zero output. ``dropout``, when given, is
    applied to the weights before they multiply ``value``, and the weights returned
    are those that did. Raises ``ValueError`` when ``query`` and ``key`` disagree on
    ``d_k`` or ``key`` and ``value`` on ``Lk``. May not call
    ``F.scaled_dot_product_attention``, a PyTorch softmax or ``torch.logsumexp``: use
    Exercise 2.1.

    Hint: ``key.transpose(-2, -1)`` turns ``[..., Lk, d_k]`` into ``[..., d_k, Lk]``;
    ``torch.where(mask, scores, -inf)`` masks and broadcasts in one step.
    """
    # BEGIN SOLUTION 2.2
    d_k = query.size(-1)
    if key.size(-1) != d_k:
        raise ValueError(f"query and key must share d_k (their last dimension): query has "
                         f"shape {tuple(query.shape)}, key has shape {tuple(key.shape)}")
    if key.size(-2) != value.size(-2):
        raise ValueError(f"key and value must have the same length Lk: key has shape "
                         f"{tuple(key.shape)}, value has shape {tuple(value.shape)}")
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # [..., Lq, Lk]
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    weights = softmax(scores, dim=-1)  # [..., Lq, Lk]
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # [..., Lq, d_v], [..., Lq, Lk]
    # END SOLUTION


def softmax_jacobian(p: Tensor) -> Tensor:
    """Exercise 2.3: the Jacobian of softmax at probabilities ``p [..., n]``: ``[..., n, n]``.

    With ``p = softmax(z)``, ``d p_i / d z_j = p_i (delta_ij - p_j)``, that is
    ``J = diag(p) - p p^T`` for every vector of the batch. When one ``p_i`` is close to
    1 (a saturated softmax) every entry of ``J`` is close to 0: no gradient reaches
    the scores. May not call a PyTorch softmax or ``torch.logsumexp`` (``J`` is its
    Hessian), nor compute ``J`` by autograd (``torch.autograd.functional.jacobian``,
    ``torch.func.jacrev``): build it from ``p``.

    Hint: ``torch.diag_embed(p)`` builds ``diag(p)`` batched; ``p.unsqueeze(-1) *
    p.unsqueeze(-2)`` is the outer product ``p p^T``.
    """
    # BEGIN SOLUTION 2.3
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    # END SOLUTION
