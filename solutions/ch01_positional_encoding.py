"""Chapter 1: token embeddings and sinusoidal positional encoding.

Vaswani et al. (2017), section 3.4 (embeddings) and 3.5 (positional encoding):

    PE[pos, 2i]     = sin(pos / 10000^(2i / d_model))
    PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))

Shapes: ``B`` batch, ``L`` length, ``D`` = ``d_model``, ``V`` vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "positional_encoding",
    "PositionalEncoding",
    "TokenEmbedding",
    "relative_position_matrix",
]


def _check_d_model(d_model: int) -> None:
    if not isinstance(d_model, int) or d_model <= 0 or d_model % 2:
        raise ValueError(
            f"d_model must be a positive even integer (sine and cosine come in pairs), "
            f"got d_model={d_model!r}"
        )


def positional_encoding(max_len: int, d_model: int) -> Tensor:
    """Exercise 1.1: the sinusoidal table ``PE`` of shape ``[max_len, d_model]``, float32.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))`` and
    ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model))`` for ``pos`` in ``0..max_len-1``
    and ``i`` in ``0..d_model/2-1``. Raises ``ValueError`` unless ``d_model`` is
    positive and even, or when ``max_len`` is negative.

    Hint: build a column of positions ``[max_len, 1]`` and a row of frequencies
    ``[d_model/2]``; their product broadcasts to the angles ``[max_len, d_model/2]``.
    Even columns take the sine, odd columns the cosine (slicing ``0::2``, ``1::2``).
    """
    # BEGIN SOLUTION 1.1
    _check_d_model(d_model)
    if not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"max_len must be a non-negative integer, got max_len={max_len!r}")
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # [max_len, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # [D/2]
    inv_freq = torch.exp(-math.log(10000.0) * two_i / d_model)  # 1 / 10000^(2i/D)
    angles = position * inv_freq  # [max_len, D/2]
    pe = torch.empty(max_len, d_model, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe
    # END SOLUTION


class PositionalEncoding(nn.Module):
    """Exercise 1.2: add the sinusoidal table to a batch of embeddings, then dropout.

    ``forward(x [B, L, D]) -> dropout(x + PE[:L])`` in ``x``'s dtype and device.
    The table (Exercise 1.1) is a persistent buffer named ``pe`` of shape
    ``[max_len, d_model]``: saved with the model and moved by ``.to()``, but not a
    parameter (it is not learned). A sequence longer than ``max_len`` raises
    ``ValueError`` naming both lengths.

    Hint: ``self.register_buffer("pe", table)``; ``nn.Dropout`` is off in ``eval()`` mode.
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        # BEGIN SOLUTION 1.2
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", positional_encoding(max_len, d_model))
        # END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``: ``dropout(x + pe[:L])``."""
        # BEGIN SOLUTION 1.2
        if x.dim() != 3:
            raise ValueError(f"x must have shape [B, L, D], got shape {tuple(x.shape)}")
        length, max_len = x.size(1), self.pe.size(0)
        if length > max_len:
            raise ValueError(
                f"sequence length L={length} is longer than max_len={max_len}; "
                f"build PositionalEncoding with max_len >= {length}"
            )
        if x.size(2) != self.pe.size(1):
            raise ValueError(
                f"x has d_model={x.size(2)} but the table has d_model={self.pe.size(1)}"
            )
        return self.dropout(x + self.pe[:length].to(x.dtype))
        # END SOLUTION


class TokenEmbedding(nn.Module):
    """Exercise 1.3: token ids to vectors, scaled by ``sqrt(d_model)``.

    ``forward(tokens [B, L]) -> [B, L, D]`` equals ``embedding(tokens) * sqrt(d_model)``
    (section 3.4 of the paper: the scale keeps the embeddings as large as the
    positional encoding added to them). The lookup table is ``self.embedding``, an
    ``nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)``.
    """

    def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None) -> None:
        super().__init__()
        # BEGIN SOLUTION 1.3
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        # END SOLUTION

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens [B, L]`` (integer ids) ``-> [B, L, D]``."""
        # BEGIN SOLUTION 1.3
        return self.embedding(tokens) * math.sqrt(self.d_model)
        # END SOLUTION


def relative_position_matrix(offset: int, d_model: int) -> Tensor:
    """Exercise 1.4: the matrix ``M [d_model, d_model]`` with ``PE[pos + offset] = PE[pos] @ M``.

    It holds for every ``pos``, which is why a sinusoidal encoding lets attention
    use relative positions. With ``w_i = 1 / 10000^(2i/d_model)`` and
    ``t = offset * w_i``, each pair of columns ``(2i, 2i+1)`` is rotated by the
    2x2 block ``[[cos t, -sin t], [sin t, cos t]]`` placed on the diagonal of ``M``
    (rows ``2i, 2i+1``, columns ``2i, 2i+1``); every other entry is zero. Float32.

    Hint: check the identity ``sin(a + t) = sin a cos t + cos a sin t`` and
    ``cos(a + t) = cos a cos t - sin a sin t`` against a row vector times ``M``.
    """
    # BEGIN SOLUTION 1.4
    _check_d_model(d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    t = offset * torch.exp(-math.log(10000.0) * two_i / d_model)  # [D/2]
    cos_t, sin_t = torch.cos(t), torch.sin(t)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    m[even, even] = cos_t  # sin(a) contributes cos(t) to sin(a + t)
    m[even, even + 1] = -sin_t  # sin(a) contributes -sin(t) to cos(a + t)
    m[even + 1, even] = sin_t  # cos(a) contributes sin(t) to sin(a + t)
    m[even + 1, even + 1] = cos_t  # cos(a) contributes cos(t) to cos(a + t)
    return m.to(torch.float32)
    # END SOLUTION
