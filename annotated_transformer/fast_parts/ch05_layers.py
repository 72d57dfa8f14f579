"""Chapter 5, fast: ``F.layer_norm``, and layers that skip what does nothing.

The same modules, submodule names and state-dict keys as the reference. LayerNorm is
one fused kernel (forward and backward) instead of the eight operations of its
formula; a dropout of probability 0, or any dropout in ``eval()`` mode, is not called
at all; the layers apply their residual connections without building a closure per
call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.fast_parts._ops import module_dropout as _dropout
from annotated_transformer.parts import active_parts

__all__ = [
    "LayerNorm",
    "PositionwiseFeedForward",
    "ResidualConnection",
    "EncoderLayer",
    "DecoderLayer",
]




class LayerNorm(nn.Module):
    """Exercise 5.1 as ``F.layer_norm``: parameters ``weight`` (ones), ``bias`` (zeros)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., D] -> [..., D]``."""
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class PositionwiseFeedForward(nn.Module):
    """Exercise 5.2: ``linear2(dropout(relu(linear1(x))))``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        return self.linear2(_dropout(F.relu(self.linear1(x)), self.dropout))


class ResidualConnection(nn.Module):
    """Exercise 5.3: post-LN ``norm(x + dropout(sublayer(x)))``, pre-LN
    ``x + dropout(sublayer(norm(x)))``; ``norm`` is the fast :class:`LayerNorm`."""

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``x [B, L, D]``, ``sublayer: [B, L, D] -> [B, L, D]`` -> ``[B, L, D]``."""
        if self.norm_first:
            return x + _dropout(sublayer(self.norm(x)), self.dropout)
        return self.norm(x + _dropout(sublayer(x), self.dropout))

    def around(self, x: Tensor, y: Tensor | None) -> Tensor:
        """The connection's output given the sublayer's output ``y``: post-LN ``norm(x +
        dropout(y))``, pre-LN ``x + dropout(y)`` (for pre-LN, ``y`` was computed from
        ``self.pre(x)``)."""
        if self.norm_first:
            return x + _dropout(y, self.dropout)
        norm = self.norm
        return F.layer_norm(x + _dropout(y, self.dropout), norm.weight.shape, norm.weight,
                            norm.bias, norm.eps)

    def pre(self, x: Tensor) -> Tensor:
        """What the sublayer reads: ``norm(x)`` for pre-LN, ``x`` for post-LN."""
        if self.norm_first:
            norm = self.norm
            return F.layer_norm(x, norm.weight.shape, norm.weight, norm.bias, norm.eps)
        return x


class EncoderLayer(nn.Module):
    """Exercise 5.4: self-attention and feed-forward, each in a residual connection.

    ``self_attn`` is Chapter 3's ``MultiHeadAttention`` from the active parts (the fast
    one under ``Parts("fast")``): given the same tensor three times, it packs its
    projections."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()
        self.self_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList(
            [ResidualConnection(d_model, dropout, norm_first) for _ in range(2)]
        )

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        attend, feed = self.residuals
        y = attend.pre(x)
        x = attend.around(x, self.self_attn(y, y, y, mask))
        return feed.around(x, self.feed_forward(feed.pre(x)))


class DecoderLayer(nn.Module):
    """Exercise 5.5: masked self-attention, cross-attention to the memory, feed-forward."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()
        self.self_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList(
            [ResidualConnection(d_model, dropout, norm_first) for _ in range(3)]
        )

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``x [B, Lt, D]``, ``memory [B, Ls, D]`` -> ``[B, Lt, D]``."""
        attend, cross, feed = self.residuals
        y = attend.pre(x)
        x = attend.around(x, self.self_attn(y, y, y, tgt_mask))
        x = cross.around(x, self.cross_attn(cross.pre(x), memory, memory, src_mask))
        return feed.around(x, self.feed_forward(feed.pre(x)))
