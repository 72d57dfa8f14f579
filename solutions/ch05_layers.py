"""Chapter 5: residual connections, LayerNorm, the feed-forward network, the two layers, their
stacks, and the whole encoder-decoder Transformer built from them.

Vaswani et al. (2017), sections 3.1 and 3.3; He et al. (2016) for residual learning,
Ba et al. (2016) for layer normalization. The paper is post-LN:

    post-LN (the paper):        x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-LN (most later code):   x = x + Dropout(Sublayer(LayerNorm(x)))

``norm_first=False`` is post-LN, ``True`` is pre-LN, as in ``nn.TransformerEncoderLayer``.
Pre-LN leaves the residual stream unnormalised, so a pre-LN stack ends with one LayerNorm.
Shapes: ``x [B, L, D]``; the decoder's ``memory [B, Ls, D]``; token ids ``src [B, Ls]`` and
``tgt [B, Lt]``; ``V`` a vocabulary's size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from annotated_transformer.parts import active_parts

__all__ = [
    "LayerNorm",
    "PositionwiseFeedForward",
    "ResidualConnection",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "embeddings",
    "EncoderDecoder",
]


class LayerNorm(nn.Module):
    """Exercise 5.1: normalise each position's features, then scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, with ``mean`` and the
    *biased* ``var`` (divide by ``D``, not ``D - 1``) taken over the last dimension
    only: each position of each sequence alone, nothing over the batch. Parameters
    ``weight`` (ones) and ``bias`` (zeros) of shape ``[d_model]``. Matches
    ``torch.nn.LayerNorm(d_model, eps)``; may not use it or ``F.layer_norm``.

    Hint: ``x.mean(-1, keepdim=True)``; ``eps`` goes inside the square root.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        # BEGIN SOLUTION 5.1
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        # END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., D] -> [..., D]``."""
        # BEGIN SOLUTION 5.1
        mean = x.mean(dim=-1, keepdim=True)
        variance = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased: divide by D
        return (x - mean) / torch.sqrt(variance + self.eps) * self.weight + self.bias
        # END SOLUTION


class PositionwiseFeedForward(nn.Module):
    """Exercise 5.2: ``FFN(x) = max(0, x W1 + b1) W2 + b2``, applied to each position alone.

    ``linear1 = nn.Linear(d_model, d_ff)``, ``linear2 = nn.Linear(d_ff, d_model)``;
    ``forward(x [B, L, D]) = linear2(dropout(relu(linear1(x))))`` (dropout on the
    hidden activations, as ``nn.TransformerEncoderLayer`` does). The paper uses
    ``d_ff = 4 * d_model``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        # BEGIN SOLUTION 5.2
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        # END SOLUTION

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        # BEGIN SOLUTION 5.2
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))  # [B, L, d_ff] inside
        # END SOLUTION


class ResidualConnection(nn.Module):
    """Exercise 5.3: a sublayer with its residual connection, dropout and LayerNorm.

    Holds ``norm`` (a :class:`LayerNorm`, Exercise 5.1, not PyTorch's) and a dropout.
    ``forward(x, sublayer)`` calls ``sublayer`` once and returns

    - post-LN (``norm_first=False``, the paper): ``norm(x + dropout(sublayer(x)))``;
    - pre-LN (``norm_first=True``): ``x + dropout(sublayer(norm(x)))``.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        # BEGIN SOLUTION 5.3
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first
        # END SOLUTION

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``x [B, L, D]``, ``sublayer: [B, L, D] -> [B, L, D]`` -> ``[B, L, D]``."""
        # BEGIN SOLUTION 5.3
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
        # END SOLUTION


class EncoderLayer(nn.Module):
    """Exercise 5.4: self-attention, then the feed-forward network, each in a residual connection.

    ``self_attn``: Chapter 3's ``MultiHeadAttention(d_model, num_heads, dropout)`` from
    ``parts`` (bound below); ``feed_forward``: :class:`PositionwiseFeedForward`;
    ``residuals``: an ``nn.ModuleList`` of two :class:`ResidualConnection` (attention's,
    then the feed-forward's). ``forward(x [B, L, D], mask=None) -> [B, L, D]``; ``mask``
    (``True`` = allowed, e.g. the source padding mask ``[B, 1, 1, L]``) goes to the
    self-attention. Matches ``nn.TransformerEncoderLayer`` (ReLU, ``batch_first=True``,
    the same ``norm_first``) with equal weights; may not use it, ``nn.Transformer``'s
    parts or PyTorch's attention, softmax or norms: build it from your own parts.

    Hint: a residual connection takes the sublayer as a function of one tensor:
    ``lambda y: self.self_attn(y, y, y, mask)``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()  # Chapter 3's MultiHeadAttention: parts.MultiHeadAttention
        # BEGIN SOLUTION 5.4
        self.self_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList(
            [ResidualConnection(d_model, dropout, norm_first) for _ in range(2)]
        )
        # END SOLUTION

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        # BEGIN SOLUTION 5.4
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.residuals[1](x, self.feed_forward)
        # END SOLUTION


class DecoderLayer(nn.Module):
    """Exercise 5.5: masked self-attention, cross-attention to the memory, feed-forward.

    ``self_attn`` and ``cross_attn``: Chapter 3's ``MultiHeadAttention`` from ``parts``;
    ``feed_forward``; ``residuals``: three :class:`ResidualConnection`, in that order.
    ``forward(x [B, Lt, D], memory [B, Ls, D], src_mask=None, tgt_mask=None) -> [B, Lt, D]``:
    self-attention over ``x`` with ``tgt_mask`` (causal and padding, ``[B, 1, Lt, Lt]``);
    cross-attention with queries from the decoder (``x``) and keys and values from the
    encoder's ``memory``, with ``src_mask`` (the source padding, ``[B, 1, 1, Ls]``).
    Matches ``nn.TransformerDecoderLayer`` likewise; may not use it, ``nn.Transformer``'s
    parts or PyTorch's attention, softmax or norms.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()  # Chapter 3's MultiHeadAttention: parts.MultiHeadAttention
        # BEGIN SOLUTION 5.5
        self.self_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = parts.MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList(
            [ResidualConnection(d_model, dropout, norm_first) for _ in range(3)]
        )
        # END SOLUTION

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``x [B, Lt, D]``, ``memory [B, Ls, D]`` -> ``[B, Lt, D]``."""
        # BEGIN SOLUTION 5.5
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
        return self.residuals[2](x, self.feed_forward)
        # END SOLUTION


class Encoder(nn.Module):
    """Exercise 5.6: the encoder: ``num_layers`` encoder layers in turn, then a last norm.

    ``layers``: an ``nn.ModuleList`` of ``num_layers`` :class:`EncoderLayer` (5.4), each
    built anew (one layer listed ``num_layers`` times would share one set of weights);
    ``norm``: a :class:`LayerNorm` (5.1) when ``norm_first`` (pre-LN leaves the residual
    stream unnormalised: the stack normalises its output once), else ``nn.Identity()``
    (post-LN layers end normalised). ``forward(x [B, L, D], mask=None) -> [B, L, D]``: each
    layer with ``mask``, then ``norm``. Matches ``nn.TransformerEncoder(layer, num_layers,
    norm=nn.LayerNorm(d_model) if norm_first else None)`` with equal weights; may not use
    it, ``nn.Transformer``'s parts or PyTorch's attention, softmax or norms.

    Hint: build each layer from the parts the model is built with,
    ``active_parts().EncoderLayer``, or from this chapter's ``EncoderLayer``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                 dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()  # this chapter's layers, from the parts the model is built with
        # BEGIN SOLUTION 5.6
        self.layers = nn.ModuleList(
            [parts.EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
             for _ in range(num_layers)])
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()
        # END SOLUTION

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x [B, L, D] -> [B, L, D]``."""
        # BEGIN SOLUTION 5.6
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)
        # END SOLUTION


class Decoder(nn.Module):
    """Exercise 5.7: the decoder: ``num_layers`` decoder layers in turn, then a last norm.

    ``layers``: an ``nn.ModuleList`` of ``num_layers`` :class:`DecoderLayer` (5.5), each
    built anew; ``norm``: a :class:`LayerNorm` when ``norm_first``, else ``nn.Identity()``,
    as in :class:`Encoder`. ``forward(x [B, Lt, D], memory [B, Ls, D], src_mask=None,
    tgt_mask=None) -> [B, Lt, D]``: each layer reads the same ``memory`` (the encoder's
    output) with both masks, then ``norm``. Matches ``nn.TransformerDecoder(layer,
    num_layers, norm=...)`` likewise; may not use it.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                 dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        parts = active_parts()  # this chapter's layers, from the parts the model is built with
        # BEGIN SOLUTION 5.7
        self.layers = nn.ModuleList(
            [parts.DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
             for _ in range(num_layers)])
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()
        # END SOLUTION

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``x [B, Lt, D]``, ``memory [B, Ls, D]`` -> ``[B, Lt, D]``."""
        # BEGIN SOLUTION 5.7
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)
        # END SOLUTION


def embeddings(vocab_size: int, d_model: int, max_len: int = 5000, dropout: float = 0.0
               ) -> nn.Sequential:
    """Token ids ``[B, L]`` -> ``dropout(embedding * sqrt(d_model) + PE)`` ``[B, L, D]``:
    Chapter 1's ``TokenEmbedding`` (``tokens``) then its ``PositionalEncoding``
    (``positions``), from the parts the model is built with. Given, not an exercise: the
    names ``tokens`` and ``positions`` are those a checkpoint saves."""
    parts = active_parts()
    embed = nn.Sequential()
    embed.add_module("tokens", parts.TokenEmbedding(vocab_size, d_model))
    embed.add_module("positions", parts.PositionalEncoding(d_model, max_len, dropout))
    return embed


class EncoderDecoder(nn.Module):
    """Exercise 5.8: the Transformer of the paper's Figure 1, from the parts above.

    Its modules, by these names (a checkpoint saves them so):

    - ``src_embed``, ``tgt_embed``: each ``embeddings(vocab_size, d_model, max_len,
      dropout)`` (given above) of its own vocabulary;
    - ``encoder``: an :class:`Encoder` (5.6), ``decoder``: a :class:`Decoder` (5.7), each
      of ``num_layers`` layers, with ``dropout`` and ``norm_first``;
    - ``generator``: ``nn.Linear(d_model, tgt_vocab_size)``, the decoder's output to logits.

    Then every parameter with more than one dimension is initialised with
    ``nn.init.xavier_uniform_`` (as The Annotated Transformer does; the authors' code,
    tensor2tensor, draws the layers' matrices so and its embeddings from
    ``N(0, 1/d_model)``), and, with ``tie_embeddings``
    (section 3.4; Press and Wolf, 2017), one matrix serves all three: the target
    embedding's weight and the generator's weight *are* the source embedding's
    (``src_embed.tokens.embedding.weight``), one ``nn.Parameter``, not copies. Tying needs
    one vocabulary: ``ValueError`` naming both sizes otherwise.

    ``encode(src [B, Ls], src_mask) -> memory [B, Ls, D]``;
    ``decode(memory, src_mask, tgt [B, Lt], tgt_mask) -> [B, Lt, D]``;
    ``forward(src, tgt, src_mask=None, tgt_mask=None) -> logits [B, Lt, V]``: the
    generator's output itself, not probabilities (the loss of Chapter 6 takes logits). The
    masks are Chapter 4's (``True`` = attention allowed): the source's padding mask for the
    encoder and for the decoder's cross-attention, the target's mask for its
    self-attention. May not use ``nn.Transformer`` or its parts.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int, num_heads: int,
                 d_ff: int, num_layers: int, dropout: float = 0.0, norm_first: bool = False,
                 tie_embeddings: bool = True, max_len: int = 5000) -> None:
        super().__init__()
        parts = active_parts()  # this chapter's stacks, from the parts the model is built with
        # BEGIN SOLUTION 5.8
        if tie_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings needs one vocabulary, but src_vocab_size={src_vocab_size} "
                f"and tgt_vocab_size={tgt_vocab_size}")
        self.src_embed = embeddings(src_vocab_size, d_model, max_len, dropout)
        self.tgt_embed = embeddings(tgt_vocab_size, d_model, max_len, dropout)
        self.encoder = parts.Encoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.decoder = parts.Decoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        if tie_embeddings:
            shared = self.src_embed.tokens.embedding.weight
            self.tgt_embed.tokens.embedding.weight = shared
            self.generator.weight = shared
        # END SOLUTION

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src [B, Ls]`` -> ``memory [B, Ls, D]``."""
        # BEGIN SOLUTION 5.8
        return self.encoder(self.src_embed(src), src_mask)
        # END SOLUTION

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        """``memory [B, Ls, D]``, ``tgt [B, Lt]`` -> ``[B, Lt, D]``."""
        # BEGIN SOLUTION 5.8
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)
        # END SOLUTION

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``src [B, Ls]``, ``tgt [B, Lt]`` -> logits ``[B, Lt, V]``."""
        # BEGIN SOLUTION 5.8
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))
        # END SOLUTION
