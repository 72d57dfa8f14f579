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
    # BEGIN SOLUTION 4.1
    if tokens.dim() != 2:
        raise ValueError(f"tokens must have shape [B, L], got shape {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]  # [B, 1, 1, L]
    # END SOLUTION


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """Exercise 4.2: ``bool [size, size]``, ``True`` on and below the diagonal.

    Query ``i`` may attend to key ``j`` exactly when ``j <= i``: a position sees itself
    and the past, never the future. Created on ``device``.

    Hint: ``torch.ones(size, size, dtype=torch.bool, device=device)`` and a triangle.
    """
    # BEGIN SOLUTION 4.2
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative integer, got size={size!r}")
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()
    # END SOLUTION


def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Exercise 4.3: the decoder's self-attention mask, ``tokens [B, L] -> bool [B, 1, L, L]``.

    Query ``i`` of sequence ``b`` may attend to key ``j`` when ``j <= i`` (4.2) and token
    ``j`` of sequence ``b`` is not padding (4.1). On the device of ``tokens``.

    Hint: ``[B, 1, 1, L] & [L, L]`` broadcasts to ``[B, 1, L, L]``.
    """
    # BEGIN SOLUTION 4.3
    return padding_mask(tokens, pad_id) & causal_mask(tokens.size(-1), device=tokens.device)
    # END SOLUTION
