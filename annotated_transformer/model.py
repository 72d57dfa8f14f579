"""The model, assembled from the parts of each chapter (see :mod:`annotated_transformer.parts`).

The way of a tensor through it: tokens ``[B, L]`` -> token embedding (1.3)
``[B, L, D]`` -> + positional encoding (1.2) ``[B, L, D]`` -> ... (later chapters
add the encoder and decoder layers, the generator and the loss).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from annotated_transformer.parts import Parts, active_parts


def build_embeddings(
    vocab_size: int,
    d_model: int,
    max_len: int = 5000,
    dropout: float = 0.0,
    padding_idx: int | None = None,
    parts: Parts | None = None,
) -> nn.Sequential:
    """Token ids ``[B, L]`` to ``embedding * sqrt(d_model) + PE`` ``[B, L, D]``, with dropout.

    Section 3.4 and 3.5 of the paper, built from chapter 1's ``TokenEmbedding``
    and ``PositionalEncoding`` of ``parts`` (default: :func:`active_parts`).
    """
    parts = parts or active_parts()
    return nn.Sequential(
        OrderedDict(
            tokens=parts.TokenEmbedding(vocab_size, d_model, padding_idx=padding_idx),
            positions=parts.PositionalEncoding(d_model, max_len=max_len, dropout=dropout),
        )
    )
