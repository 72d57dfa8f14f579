# Your work goes here: replace each `raise NotImplementedError(...)` with your code.
# Grade it: python -m annotated_transformer.grade --chapter 1
# Generated from solutions/ch01_positional_encoding.py by `python -m annotated_transformer.stubs`.
# stub-digest: b9d589c6fe9367d0
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
    # TODO Exercise 1.1: write positional_encoding (see its docstring).
    raise NotImplementedError("Exercise 1.1: positional_encoding is not implemented yet")


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
        # TODO Exercise 1.2: write PositionalEncoding.__init__ (see its docstring).
        raise NotImplementedError("Exercise 1.2: PositionalEncoding.__init__ is not implemented yet")

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``: ``dropout(x + pe[:L])``."""
        # TODO Exercise 1.2: write PositionalEncoding.forward (see its docstring).
        raise NotImplementedError("Exercise 1.2: PositionalEncoding.forward is not implemented yet")


class TokenEmbedding(nn.Module):
    """Exercise 1.3: token ids to vectors, scaled by ``sqrt(d_model)``.

    ``forward(tokens [B, L]) -> [B, L, D]`` equals ``embedding(tokens) * sqrt(d_model)``
    (section 3.4 of the paper: the scale keeps the embeddings as large as the
    positional encoding added to them). The lookup table is ``self.embedding``, an
    ``nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)``.
    """

    def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None) -> None:
        super().__init__()
        # TODO Exercise 1.3: write TokenEmbedding.__init__ (see its docstring).
        raise NotImplementedError("Exercise 1.3: TokenEmbedding.__init__ is not implemented yet")

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens [B, L]`` (integer ids) ``-> [B, L, D]``."""
        # TODO Exercise 1.3: write TokenEmbedding.forward (see its docstring).
        raise NotImplementedError("Exercise 1.3: TokenEmbedding.forward is not implemented yet")


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
    # TODO Exercise 1.4: write relative_position_matrix (see its docstring).
    raise NotImplementedError("Exercise 1.4: relative_position_matrix is not implemented yet")
