"""Chapter 5, fast: ``F.layer_norm``, and layers that skip what does nothing.

Every class is the reference's subclass and overrides only ``forward``: the
constructors, submodule names, state-dict keys and argument checks are the
reference's own. LayerNorm is one fused kernel (forward and backward) instead of the
eight operations of its formula; the feed-forward network's ReLU and dropout are one
autograd function (``_ops.relu_dropout``), a residual connection's dropout and sum one
``addcmul`` (``_ops.add_dropout``); a dropout of probability 0, or any dropout in
``eval()`` mode, is not called at all; the layers apply their residual connections
without building a closure per call.

The reference's layers build their sublayers from the reference's classes (the
``ResidualConnection`` and its ``LayerNorm``, the ``PositionwiseFeedForward``), so the
fast layers compute with those sublayers' parameters directly (:func:`normalize`,
:func:`feed_forward`, :func:`before` and :func:`around`) rather than call their
``forward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.fast_parts._ops import add_dropout, relu_dropout
from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 5)

__all__ = ["LayerNorm", "PositionwiseFeedForward", "ResidualConnection", "EncoderLayer",
           "DecoderLayer", "Encoder", "Decoder", "embeddings",
           "EncoderDecoder"]  # the reference's parts, faster


def normalize(norm: nn.Module, x: Tensor) -> Tensor:
    """``norm(x)`` for a LayerNorm (``weight``, ``bias``, ``eps``), as ``F.layer_norm``."""
    return F.layer_norm(x, norm.weight.shape, norm.weight, norm.bias, norm.eps)


def feed_forward(layer: nn.Module, x: Tensor) -> Tensor:
    """``linear2(dropout(relu(linear1(x))))`` of a feed-forward network, ``[B, L, D]``."""
    return layer.linear2(relu_dropout(layer.linear1(x), layer.dropout))


def before(residual: nn.Module, x: Tensor) -> Tensor:
    """What a residual connection's sublayer reads: ``norm(x)`` pre-LN, ``x`` post-LN."""
    return normalize(residual.norm, x) if residual.norm_first else x


def around(residual: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """A residual connection's output given its sublayer's output ``y`` (computed from
    ``before(residual, x)``): pre-LN ``x + dropout(y)``, post-LN ``norm(x + dropout(y))``."""
    if residual.norm_first:
        return add_dropout(x, y, residual.dropout)
    return normalize(residual.norm, add_dropout(x, y, residual.dropout))


class LayerNorm(_reference.LayerNorm):
    """Exercise 5.1 as ``F.layer_norm``: parameters ``weight`` (ones), ``bias`` (zeros)."""

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., D] -> [..., D]``."""
        return normalize(self, x)


class PositionwiseFeedForward(_reference.PositionwiseFeedForward):
    """Exercise 5.2: ``linear2(dropout(relu(linear1(x))))``."""

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        return feed_forward(self, x)


class ResidualConnection(_reference.ResidualConnection):
    """Exercise 5.3: post-LN ``norm(x + dropout(sublayer(x)))``, pre-LN
    ``x + dropout(sublayer(norm(x)))``."""

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``x [B, L, D]``, ``sublayer: [B, L, D] -> [B, L, D]`` -> ``[B, L, D]``."""
        return around(self, x, sublayer(before(self, x)))


class EncoderLayer(_reference.EncoderLayer):
    """Exercise 5.4: self-attention and feed-forward, each in a residual connection.

    ``self_attn`` is Chapter 3's ``MultiHeadAttention`` from the parts the layer is built
    with (the fast one under ``Parts("fast")``): given the same tensor three times, it
    packs its projections."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        attend, feed = self.residuals
        y = before(attend, x)
        x = around(attend, x, self.self_attn(y, y, y, mask))
        return around(feed, x, feed_forward(self.feed_forward, before(feed, x)))


class DecoderLayer(_reference.DecoderLayer):
    """Exercise 5.5: masked self-attention, cross-attention to the memory, feed-forward."""

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``x [B, Lt, D]``, ``memory [B, Ls, D]`` -> ``[B, Lt, D]``."""
        attend, cross, feed = self.residuals
        y = before(attend, x)
        x = around(attend, x, self.self_attn(y, y, y, tgt_mask))
        x = around(cross, x, self.cross_attn(before(cross, x), memory, memory, src_mask))
        return around(feed, x, feed_forward(self.feed_forward, before(feed, x)))


class Encoder(_reference.Encoder):
    """Exercise 5.6: the reference's stack, whose layers and norm come from the parts it is
    built with (these fast ones under ``Parts("fast")``)."""


class Decoder(_reference.Decoder):
    """Exercise 5.7: the reference's stack, of the fast layers under ``Parts("fast")``."""


embeddings = _reference.embeddings  # Chapter 1's parts in a row: of the fast ones here


class EncoderDecoder(_reference.EncoderDecoder):
    """Exercise 5.8: the reference's model, of the fast stacks under ``Parts("fast")``."""
