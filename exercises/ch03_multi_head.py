# Your work goes here: replace each `raise NotImplementedError(...)` with your code.
# Grade it: python -m annotated_transformer.grade --chapter 3
# Generated from solutions/ch03_multi_head.py by `python -m annotated_transformer.stubs`.
# stub-digest: a19d3b05217d29ef
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
    # TODO Exercise 3.1: write split_heads (see its docstring).
    raise NotImplementedError("Exercise 3.1: split_heads is not implemented yet")


def merge_heads(x: Tensor) -> Tensor:
    """Exercise 3.2: ``x [B, H, L, d_k] -> [B, L, H*d_k]``, the inverse of :func:`split_heads`.

    ``merge_heads(split_heads(x, H))`` equals ``x``. The input is usually not
    contiguous (it comes out of a transpose).

    Hint: swap ``H`` and ``L`` back first; ``reshape`` copies when it must, ``view`` fails.
    """
    # TODO Exercise 3.2: write merge_heads (see its docstring).
    raise NotImplementedError("Exercise 3.2: merge_heads is not implemented yet")


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
    ``nn.MultiheadAttention`` or ``F.scaled_dot_product_attention``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        # Chapter 2's attention, bound now: the reference or yours, as the builder chose.
        self.attention = active_parts().scaled_dot_product_attention
        # TODO Exercise 3.3: write MultiHeadAttention.__init__ (see its docstring).
        raise NotImplementedError("Exercise 3.3: MultiHeadAttention.__init__ is not implemented yet")

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """``query [B, Lq, D]``, ``key`` and ``value [B, Lk, D]`` -> ``[B, Lq, D]``."""
        # TODO Exercise 3.3: write MultiHeadAttention.forward (see its docstring).
        raise NotImplementedError("Exercise 3.3: MultiHeadAttention.forward is not implemented yet")
