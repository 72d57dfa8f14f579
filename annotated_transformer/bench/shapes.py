"""The shapes the benchmark trains at, and the matrix-product FLOPs of one step."""

from __future__ import annotations

from dataclasses import dataclass, replace

from annotated_transformer.model import TransformerConfig


@dataclass(frozen=True)
class Shape:
    """A model's size and one training batch: ``batch`` sequences of ``length`` tokens
    each side (source, and target labels)."""

    name: str
    d_model: int
    num_heads: int
    num_layers: int
    d_ff: int
    vocab: int
    batch: int
    length: int
    norm_first: bool = False

    def config(self, dropout: float = 0.1) -> TransformerConfig:
        return TransformerConfig(self.vocab, self.vocab, num_layers=self.num_layers,
                                 d_model=self.d_model, d_ff=self.d_ff,
                                 num_heads=self.num_heads, dropout=dropout,
                                 max_len=max(64, self.length + 1), norm_first=self.norm_first)

    @property
    def tokens(self) -> int:
        """Target tokens (labels) a step."""
        return self.batch * self.length


SHAPES = (
    Shape("copy", d_model=64, num_heads=4, num_layers=2, d_ff=256, vocab=11, batch=80,
          length=10),
    Shape("medium", d_model=256, num_heads=8, num_layers=3, d_ff=1024, vocab=1000, batch=32,
          length=64),
    Shape("base", d_model=512, num_heads=8, num_layers=6, d_ff=2048, vocab=1000, batch=16,
          length=32),
    # The CPU recipe's model (recipes.CPU_TRANSLATION) on a batch like Multi30k's: at most
    # 2,048 tokens a side, captions of about 16 BPE tokens (bench --recipe-shape trains on
    # the real batches, padding included). Dropout 0.1, as every shape: the recipe's 0.05
    # draws the same masks at the same cost.
    Shape("multi30k-cpu", d_model=256, num_heads=4, num_layers=3, d_ff=1024, vocab=8000,
          batch=85, length=16, norm_first=True),
)


def model_flops(shape: Shape) -> float:
    """Matrix-product FLOPs of one training step (forward and backward) of an
    encoder-decoder of ``shape``, source and target both ``shape.length`` long (see
    :mod:`annotated_transformer.bench` for what is counted)."""
    tokens = shape.batch * shape.length
    return step_flops(shape, shape.batch, shape.length, shape.length, tokens, tokens, tokens)


def step_flops(shape: Shape, rows: int, src_len: int, tgt_len: int, src_tokens: int,
               tgt_tokens: int, generated: int) -> float:
    """Matrix-product FLOPs of one training step of ``shape``'s model on ``rows`` sequences
    padded to ``src_len`` and ``tgt_len``: the position-wise products on ``src_tokens`` and
    ``tgt_tokens`` positions (all of ``rows x length``, or only those that count), the
    generator on ``generated`` rows, attention on the padded layout."""
    d, f, n, v = shape.d_model, shape.d_ff, shape.num_layers, shape.vocab
    src, tgt, ls, lt = src_tokens, tgt_tokens, src_len, tgt_len
    attention = 2 * 2 * d  # QK^T and weights @ V: 2·d FLOPs each per (query, key) pair
    encoder = src * (4 * 2 * d * d + 2 * 2 * d * f) + rows * ls * ls * attention
    decoder = (tgt * (4 * 2 * d * d + 2 * 2 * d * f)  # self-attention projections, FFN
               + rows * lt * lt * attention  # self-attention
               + tgt * 2 * 2 * d * d + src * 2 * 2 * d * d  # cross: Q, out; K, V of memory
               + rows * lt * ls * attention)  # cross-attention
    forward = n * (encoder + decoder) + generated * 2 * d * v  # and the generator
    return 3.0 * forward


# The paper's base model at the paper's scale: a 37,000-token shared vocabulary and about
# 25,000 target tokens a step (section 5.1), as sequences of 32 tokens each side.
PAPER = Shape("paper", d_model=512, num_heads=8, num_layers=6, d_ff=2048, vocab=37000,
              batch=781, length=32)
PAPER_TOKENS = 25_000


def paper_shape(max_tokens: int | None, quick: bool) -> Shape:
    """:data:`PAPER` with about ``max_tokens`` target tokens a step (default 25,000);
    ``quick``: one layer, a small vocabulary and batch (only that the code runs)."""
    if quick:
        return replace(PAPER, num_layers=1, d_model=64, num_heads=4, d_ff=128, vocab=500,
                       batch=4, length=8)
    return replace(PAPER, batch=max(1, (max_tokens or PAPER_TOKENS) // PAPER.length))

