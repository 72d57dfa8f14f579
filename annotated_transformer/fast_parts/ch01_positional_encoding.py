"""Chapter 1, fast: the reference, with the cheaper dropout mask of the fast parts.

The table, the embedding and the relative-position matrix are the reference's; only
``PositionalEncoding``'s dropout draws its mask as :func:`~annotated_transformer.
fast_parts._ops.dropout` does (the same distribution to within ``2**-17``, a fraction of
the cost on a CPU).
"""

from __future__ import annotations

from torch import Tensor

from annotated_transformer.fast_parts._ops import module_dropout
from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 1)

positional_encoding = _reference.positional_encoding
TokenEmbedding = _reference.TokenEmbedding
relative_position_matrix = _reference.relative_position_matrix

__all__ = [
    "positional_encoding",
    "PositionalEncoding",
    "TokenEmbedding",
    "relative_position_matrix",
]


class PositionalEncoding(_reference.PositionalEncoding):
    """Exercise 1.2: ``dropout(x + pe[:L])``; the same buffer ``pe``, the same errors."""

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        if x.dim() != 3 or x.size(1) > self.pe.size(0) or x.size(2) != self.pe.size(1):
            return super().forward(x)  # the reference explains what is wrong
        return module_dropout(x + self.pe[: x.size(1)].to(x.dtype), self.dropout)
