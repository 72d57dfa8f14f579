"""The encoder-decoder Transformer, assembled from the parts of each chapter.

A tensor's way through it (Vaswani et al. 2017, Figure 1):

    src tokens [B, Ls] -> embedding * sqrt(D) + PE (ch. 1) -> N encoder layers (ch. 5)
        -> memory [B, Ls, D]
    tgt tokens [B, Lt] -> embedding * sqrt(D) + PE -> N decoder layers (self-attention
        with the target mask, cross-attention to the memory) -> hidden [B, Lt, D]
        -> generator (a linear layer) -> logits [B, Lt, V] -> loss (ch. 6)

The decoder-only ("generative") Transformer is the decoder without cross-attention:
    tokens [B, L] -> embedding * sqrt(D) + PE -> N layers of causal self-attention and
        feed-forward (chapter 5's encoder layer, given the causal mask) -> logits [B, L, V]

Which implementation each part comes from is a :class:`~annotated_transformer.parts.Parts`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor, nn

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


@dataclass
class TransformerConfig:
    """The shape of an encoder-decoder. The defaults are the paper's base model (Table 3)."""

    src_vocab_size: int
    tgt_vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    dropout: float = 0.1
    max_len: int = 512
    norm_first: bool = False  # post-LN, as in the paper
    tie_embeddings: bool = True  # one matrix for both embeddings and the generator

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}")
        if self.tie_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings needs one shared vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}; "
                f"pass tie_embeddings=False for separate vocabularies")

    @classmethod
    def base(cls, vocab_size: int = 37000, **changes) -> TransformerConfig:
        """The paper's base model with a shared vocabulary (about 63 M parameters at 37,000)."""
        return cls(vocab_size, vocab_size, **changes)

    @classmethod
    def small(cls, vocab_size: int, **changes) -> TransformerConfig:
        """A model for the small tasks of the course, trained in seconds on a CPU."""
        size = dict(num_layers=2, d_model=64, d_ff=256, num_heads=4, dropout=0.0,
                    norm_first=True)
        return cls(vocab_size, vocab_size, **{**size, **changes})


class EncoderDecoder(nn.Module):
    """The Transformer: ``encode``, ``decode`` and ``generator``, built from ``parts``.

    ``forward(src, tgt_input, src_mask, tgt_mask)`` returns logits ``[B, Lt, V]``;
    masks are boolean, ``True`` = attention allowed (Chapter 4's ``padding_mask`` for
    the source, ``target_mask`` for the target).
    """

    def __init__(self, config: TransformerConfig, parts: Parts | None = None) -> None:
        super().__init__()
        self.config = config
        self.parts = parts = parts or active_parts()
        c = config
        self.src_embed = build_embeddings(c.src_vocab_size, c.d_model, c.max_len, c.dropout,
                                          parts=parts)
        self.tgt_embed = build_embeddings(c.tgt_vocab_size, c.d_model, c.max_len, c.dropout,
                                          parts=parts)
        self.encoder_layers = nn.ModuleList(  # each binds its attention from these parts
            [parts.EncoderLayer(c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first)
             for _ in range(c.num_layers)])
        self.decoder_layers = nn.ModuleList(
            [parts.DecoderLayer(c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first)
             for _ in range(c.num_layers)])
        # Pre-LN leaves the residual stream unnormalised: one LayerNorm at each stack's end.
        self.encoder_norm = parts.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.decoder_norm = parts.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        self._init_weights()
        if c.tie_embeddings:  # Press & Wolf (2017), section 3.4 of the paper
            shared = self.src_embed.tokens.embedding.weight
            self.tgt_embed.tokens.embedding.weight = shared
            self.generator.weight = shared

    def _init_weights(self) -> None:
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src [B, Ls]`` -> ``memory [B, Ls, D]``."""
        x = self.src_embed(src)  # [B, Ls, D]
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        """``memory [B, Ls, D]``, ``tgt [B, Lt]`` -> ``hidden [B, Lt, D]``."""
        x = self.tgt_embed(tgt)  # [B, Lt, D]
        for layer in self.decoder_layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``src [B, Ls]``, ``tgt [B, Lt]`` -> logits ``[B, Lt, V]``."""
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


class DecoderOnlyTransformer(nn.Module):
    """A language model: the decoder without cross-attention, built from ``parts``.

    A decoder layer without its cross-attention is self-attention and a feed-forward
    network, which is what chapter 5's ``EncoderLayer`` computes; with Chapter 4's
    ``target_mask`` (padding and causality) every position sees only the ones before it.
    ``forward(tokens [B, L], mask [B, 1, L, L])`` returns logits ``[B, L, V]``. The config's
    ``src_vocab_size`` and ``tgt_vocab_size`` are the same vocabulary.
    """

    def __init__(self, config: TransformerConfig, parts: Parts | None = None) -> None:
        super().__init__()
        if config.src_vocab_size != config.tgt_vocab_size:
            raise ValueError("a decoder-only model has one vocabulary: src_vocab_size and "
                             "tgt_vocab_size must be equal")
        self.config = config
        self.parts = parts = parts or active_parts()
        c = config
        self.embed = build_embeddings(c.tgt_vocab_size, c.d_model, c.max_len, c.dropout,
                                      parts=parts)
        self.layers = nn.ModuleList(
            [parts.EncoderLayer(c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first)
             for _ in range(c.num_layers)])
        self.norm = parts.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        if c.tie_embeddings:
            self.generator.weight = self.embed.tokens.embedding.weight

    def forward(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """``tokens [B, L]``, ``mask`` (causal, ``True`` = allowed) -> logits ``[B, L, V]``."""
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        return self.generator(self.norm(x))


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
