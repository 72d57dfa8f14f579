# Your work goes here: replace each `raise NotImplementedError(...)` with your code.
# Grade it: python -m annotated_transformer.grade --chapter 4
# Generated from solutions/ch04_masking.py by `python -m annotated_transformer.stubs`.
# stub-digest: 6e81f89cbfabe0eb
"""Chapter 4: masks for padding and for causality.

A mask is a ``torch.bool`` tensor, ``True`` where attention is **allowed**, that
broadcasts to the attention scores ``[B, H, Lq, Lk]`` (the convention of
``torch.nn.functional.scaled_dot_product_attention``; ``nn.MultiheadAttention``
uses the opposite one). Masked scores become ``-inf`` before the softmax (Chapter 2).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["padding_mask", "causal_mask", "target_mask"]


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Exercise 4.1: ``tokens [B, L] -> bool [B, 1, 1, L]``, ``True`` at real (non-pad) tokens.

    The two dimensions of size 1 broadcast over heads and queries: every query of
    every head may look at key ``j`` exactly when token ``j`` is not padding. On the
    device of ``tokens``.

    Hint: compare with ``pad_id``, then insert the two axes (``unsqueeze`` or ``[:, None, None]``).
    """
    # TODO Exercise 4.1: write padding_mask (see its docstring).
    raise NotImplementedError("Exercise 4.1: padding_mask is not implemented yet")


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """Exercise 4.2: ``bool [size, size]``, ``True`` on and below the diagonal.

    Query ``i`` may attend to key ``j`` exactly when ``j <= i``: a position sees itself
    and the past, never the future. Created on ``device``.

    Hint: ``torch.ones(size, size, dtype=torch.bool, device=device)`` and a triangle.
    """
    # TODO Exercise 4.2: write causal_mask (see its docstring).
    raise NotImplementedError("Exercise 4.2: causal_mask is not implemented yet")


def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Exercise 4.3: the decoder's self-attention mask, ``tokens [B, L] -> bool [B, 1, L, L]``.

    Query ``i`` of sequence ``b`` may attend to key ``j`` when ``j <= i`` (4.2) and token
    ``j`` of sequence ``b`` is not padding (4.1). On the device of ``tokens``.

    Hint: ``[B, 1, 1, L] & [L, L]`` broadcasts to ``[B, 1, L, L]``.
    """
    # TODO Exercise 4.3: write target_mask (see its docstring).
    raise NotImplementedError("Exercise 4.3: target_mask is not implemented yet")
