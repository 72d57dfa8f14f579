"""Chapter 3: multi-head attention, and splitting ``d_model`` into heads.

Vaswani et al. (2017), section 3.2.2:

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

with ``d_k = d_v = d_model / h``. One ``nn.Linear(d_model, d_model)`` per projection
holds all the heads' ``W_i`` side by side; splitting its output into ``h`` slices of
width ``d_k`` gives each head its own subspace.
"""

from __future__ import annotations

import torch  # noqa: F401 (the exercise may need it)
from torch import Tensor, nn

from annotated_transformer.parts import active_parts

__all__ = ["split_heads", "merge_heads", "MultiHeadAttention"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Exercise 3.1: ``x [B, L, D] -> [B, H, L, D/H]``, head ``h`` holding features ``h*d_k..``.

    Head ``h`` of position ``l`` is ``x[b, l, h*d_k:(h+1)*d_k]`` with ``d_k = D // H``.
    Raises ``ValueError`` naming both numbers when ``D`` is not divisible by
    ``num_heads``. The input need not be contiguous.

    Hint: first ``[B, L, H, d_k]`` (split the last axis), then swap ``L`` and ``H``.
    Going straight to ``[B, H, L, d_k]`` with one ``view`` mixes positions into heads.
    """
    # BEGIN SOLUTION 3.1
    if x.dim() != 3:
        raise ValueError(f"x must have shape [B, L, D], got shape {tuple(x.shape)}")
    batch, length, d_model = x.shape
    if num_heads <= 0 or d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
    return x.reshape(batch, length, num_heads, d_model // num_heads).transpose(1, 2)
    # END SOLUTION


def merge_heads(x: Tensor) -> Tensor:
    """Exercise 3.2: ``x [B, H, L, d_k] -> [B, L, H*d_k]``, the inverse of :func:`split_heads`.

    ``merge_heads(split_heads(x, H))`` equals ``x``. The input is usually not
    contiguous (it comes out of a transpose).

    Hint: swap ``H`` and ``L`` back first; ``reshape`` copies when it must, ``view`` fails.
    """
    # BEGIN SOLUTION 3.2
    if x.dim() != 4:
        raise ValueError(f"x must have shape [B, H, L, d_k], got shape {tuple(x.shape)}")
    batch, heads, length, d_k = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * d_k)
    # END SOLUTION


class MultiHeadAttention(nn.Module):
    """Exercise 3.3: ``h`` heads of scaled dot-product attention, each in its own subspace.

    Four ``nn.Linear(d_model, d_model, bias=bias)``: ``q_proj``, ``k_proj``, ``v_proj``
    and ``out_proj``. ``forward(query [B, Lq, D], key [B, Lk, D], value [B, Lk, D],
    mask=None) -> [B, Lq, D]``:

    1. project: ``q_proj(query)``, ``k_proj(key)``, ``v_proj(value)``;
    2. split each into heads (3.1): ``[B, H, L, d_k]``;
    3. attend with ``self.attention`` (Exercise 2.2) and ``self.dropout`` on the weights;
    4. merge the heads (3.2) and apply ``out_proj``.

    After each forward, ``self.attention_weights`` holds the weights, detached,
    ``[B, H, Lq, Lk]``. A mask is boolean, ``True`` = allowed, 4-D ``[B or 1, 1 or H,
    Lq or 1, Lk]`` or 2-D ``[Lq, Lk]``; anything else raises ``ValueError``. May not use
    ``nn.MultiheadAttention`` (nor ``nn.Transformer`` and its layers, which hold one),
    ``F.scaled_dot_product_attention`` or a PyTorch softmax: attend with Exercise 2.2.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        # Chapter 2's attention, bound now: the reference or yours, as the builder chose.
        self.attention = active_parts().scaled_dot_product_attention
        # BEGIN SOLUTION 3.3
        if num_heads <= 0 or d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model, self.num_heads = d_model, num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: Tensor | None = None
        # END SOLUTION

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """``query [B, Lq, D]``, ``key`` and ``value [B, Lk, D]`` -> ``[B, Lq, D]``."""
        # BEGIN SOLUTION 3.3
        if mask is not None and mask.dim() not in (2, 4):
            raise ValueError(f"mask must be 2-D [Lq, Lk] or 4-D [B, H, Lq, Lk] (dimensions "
                             f"of size 1 broadcast); got shape {tuple(mask.shape)}")
        q = split_heads(self.q_proj(query), self.num_heads)  # [B, H, Lq, d_k]
        k = split_heads(self.k_proj(key), self.num_heads)  # [B, H, Lk, d_k]
        v = split_heads(self.v_proj(value), self.num_heads)  # [B, H, Lk, d_k]
        heads, weights = self.attention(q, k, v, mask=mask, dropout=self.dropout)
        self.attention_weights = weights.detach()  # [B, H, Lq, Lk]
        return self.out_proj(merge_heads(heads))  # [B, Lq, D]
        # END SOLUTION
