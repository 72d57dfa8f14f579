"""Chapter 1: plausible wrong answers and other correct answers."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from variants import right, wrong

# ------------------------------------------------------------------ 1.1


def _table(max_len, d_model, *, exponent=lambda i, d: 2 * i / d, start=0, swap=False):
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be positive and even, got {d_model}")
    pe = torch.zeros(max_len, d_model)
    pos = torch.arange(start, start + max_len, dtype=torch.float32)
    for i in range(d_model // 2):
        angle = pos / 10000 ** exponent(i, d_model)
        first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
        pe[:, 2 * i], pe[:, 2 * i + 1] = first(angle), second(angle)
    return pe


@wrong("1.1", "positional_encoding", "sine and cosine swapped", mistake="1.1/sine-cosine-swapped")
def sine_cosine_swapped(max_len, d_model):
    return _table(max_len, d_model, swap=True)


@wrong("1.1", "positional_encoding", "exponent i/d_model instead of 2i/d_model",
       mistake="1.1/exponent-i-over-d_model")
def exponent_i_over_d(max_len, d_model):
    return _table(max_len, d_model, exponent=lambda i, d: i / d)


@wrong("1.1", "positional_encoding", "exponent 2i/d_model where i is the column, not the pair",
       mistake="1.1/exponent-by-column")
def exponent_by_column(max_len, d_model):
    return _table(max_len, d_model, exponent=lambda i, d: 2 * (2 * i) / d)


@wrong("1.1", "positional_encoding", "positions counted from 1", mistake="1.1/positions-from-1")
def positions_from_one(max_len, d_model):
    return _table(max_len, d_model, start=1)


@wrong("1.1", "positional_encoding", "all sines first, then all cosines (concatenated)",
       mistake="1.1/sines-then-cosines")
def concatenated_halves(max_len, d_model):
    pe = _table(max_len, d_model)
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)


@wrong("1.1", "positional_encoding", "an odd d_model accepted silently")
def accepts_odd_d_model(max_len, d_model):
    return _table(max_len, d_model + d_model % 2)[:, :d_model] if d_model > 0 else torch.zeros(
        max_len, 0)


@right("1.1", "positional_encoding", "powers computed in float64 with numpy, then cast")
def numpy_float64(max_len, d_model):
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be positive and even, got d_model={d_model}")
    angles = np.arange(max_len)[:, None] / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    pe = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(max_len, d_model)
    return torch.from_numpy(pe).float()


@wrong("1.1", "positional_encoding", "computed in float64 with NumPy, never cast: a float64 table",
       mistake="1.1/not-float32")
def numpy_float64_not_cast(max_len, d_model):
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be positive and even, got d_model={d_model}")
    angles = np.arange(max_len)[:, None] / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    return torch.from_numpy(np.stack([np.sin(angles), np.cos(angles)], -1).reshape(max_len,
                                                                                  d_model))


@right("1.1", "positional_encoding", "interleaved with stack and flatten, pow instead of exp")
def stacked_pairs(max_len, d_model):
    if d_model % 2 or d_model < 1:
        raise ValueError(f"d_model={d_model} must be even and positive")
    freq = 1.0 / torch.pow(10000.0, torch.arange(0, d_model, 2).float() / d_model)
    angles = torch.outer(torch.arange(max_len).float(), freq)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)


# ------------------------------------------------------------------ 1.2


class _Reference(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", _table(max_len, d_model))

    def check(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError(f"length {x.size(1)} > max_len {self.pe.size(0)}")


@wrong("1.2", "PositionalEncoding", "the table is a learned parameter", mistake="1.2/table-learned")
class TableAsParameter(_Reference):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        nn.Module.__init__(self)
        self.dropout = nn.Dropout(dropout)
        self.pe = nn.Parameter(_table(max_len, d_model))

    def forward(self, x):
        self.check(x)
        return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))


@wrong("1.2", "PositionalEncoding", "a plain tensor attribute: not saved, not moved by .to()",
       mistake="1.2/not-a-buffer")
class TableAsAttribute(_Reference):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        nn.Module.__init__(self)
        self.dropout = nn.Dropout(dropout)
        self.pe = _table(max_len, d_model)

    def forward(self, x):
        self.check(x)
        return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))


@wrong("1.2", "PositionalEncoding", "dropout on x before the table is added",
       mistake="1.2/dropout-before-the-table")
class DropoutBeforeSum(_Reference):
    def forward(self, x):
        self.check(x)
        return self.dropout(x) + self.pe[: x.size(1)].to(x.dtype)


@wrong("1.2", "PositionalEncoding", "dropout with functional dropout left on in eval mode",
       mistake="1.2/dropout-in-eval")
class DropoutAlwaysOn(_Reference):
    def forward(self, x):
        self.check(x)
        return nn.functional.dropout(x + self.pe[: x.size(1)].to(x.dtype), self.dropout.p,
                                     training=True)


@wrong("1.2", "PositionalEncoding", "the result promoted to float32 table's dtype",
       mistake="1.2/dtype-promoted")
class Float32Result(_Reference):
    def forward(self, x):
        self.check(x)
        return self.dropout(x.float() + self.pe[: x.size(1)])


@wrong("1.2", "PositionalEncoding", "a too-long sequence fails inside broadcasting, unexplained")
class NoLengthCheck(_Reference):
    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))


@wrong("1.2", "PositionalEncoding", "x.data plus the table: right values, no gradient reaches x",
       mistake="1.2/detached")
class AddedToData(_Reference):
    def forward(self, x):
        self.check(x)
        return self.dropout(x.data + self.pe[: x.size(1)].to(x.dtype))


@wrong("1.2", "PositionalEncoding", "the buffer registered, but forward adds a table rebuilt on "
       "the CPU", mistake="1.2/device-not-kept")
class TableRebuiltInForward(_Reference):
    def forward(self, x):
        self.check(x)
        return self.dropout(x + _table(x.size(1), x.size(2)).to(x.dtype))


@right("1.2", "PositionalEncoding", "table stored as [1, max_len, D] would break the contract, "
       "so this one keeps [max_len, D] and unsqueezes in forward")
class UnsqueezeInForward(_Reference):
    def forward(self, x):
        batch, length, _ = x.shape
        if length > self.pe.shape[0]:
            raise ValueError(f"sequence of length {length} exceeds max_len={self.pe.shape[0]}")
        return self.dropout(x + self.pe.unsqueeze(0)[:, :length].type_as(x))


# ------------------------------------------------------------------ 1.3


class _Embedding(nn.Module):
    def __init__(self, vocab_size, d_model, padding_idx=None):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)


@wrong("1.3", "TokenEmbedding", "no sqrt(d_model) scale", mistake="1.3/no-scale")
class Unscaled(_Embedding):
    def forward(self, tokens):
        return self.embedding(tokens)


@wrong("1.3", "TokenEmbedding", "scaled by d_model instead of its square root",
       mistake="1.3/scaled-by-d_model")
class ScaledByD(_Embedding):
    def forward(self, tokens):
        return self.embedding(tokens) * self.d_model


@wrong("1.3", "TokenEmbedding", "divided by sqrt(d_model)", mistake="1.3/divided-by-sqrt-d_model")
class DividedBySqrtD(_Embedding):
    def forward(self, tokens):
        return self.embedding(tokens) / math.sqrt(self.d_model)


@wrong("1.3", "TokenEmbedding", "padding_idx not passed on")
class PaddingIgnored(_Embedding):
    def __init__(self, vocab_size, d_model, padding_idx=None):
        super().__init__(vocab_size, d_model)

    def forward(self, tokens):
        return self.embedding(tokens) * math.sqrt(self.d_model)


@wrong("1.3", "TokenEmbedding", "the scale a float64 tensor [1] on the tokens' device: a "
       "float32 table gives float64",
       mistake="1.3/dtype-changed")
class Float64Scale(_Embedding):
    def forward(self, tokens):
        scale = torch.tensor([self.d_model], dtype=torch.float64, device=tokens.device).sqrt()
        return self.embedding(tokens) * scale


@wrong("1.3", "TokenEmbedding", "the scale a tensor attribute: module.to(device) leaves it behind",
       mistake="1.3/device-not-kept")
class ScaleLeftOnTheCpu(_Embedding):
    def __init__(self, vocab_size, d_model, padding_idx=None):
        super().__init__(vocab_size, d_model, padding_idx)
        self.scale = torch.full((1,), math.sqrt(d_model))

    def forward(self, tokens):
        return self.embedding(tokens) * self.scale


@wrong("1.3", "TokenEmbedding", "looked up in embedding.weight.data: the table never learns",
       mistake="1.3/detached")
class LookupInData(_Embedding):
    def forward(self, tokens):
        return self.embedding.weight.data[tokens] * math.sqrt(self.d_model)


@right("1.3", "TokenEmbedding", "F.embedding on the table, scale d_model ** 0.5")
class Functional(_Embedding):
    def forward(self, tokens):
        weight = self.embedding.weight
        return nn.functional.embedding(tokens, weight, self.embedding.padding_idx) * (
            self.d_model ** 0.5)


# ------------------------------------------------------------------ 1.4


@wrong("1.4", "relative_position_matrix", "rotation in the wrong direction (M transposed)",
       mistake="1.4/rotation-transposed")
def transposed(offset, d_model):
    return _rotation(offset, d_model).T.contiguous()


@wrong("1.4", "relative_position_matrix", "angle offset * i instead of offset * w_i",
       mistake="1.4/angle-without-frequency")
def angle_ignores_frequency(offset, d_model):
    return _rotation(offset, d_model, frequency=lambda i, d: float(i))


@wrong("1.4", "relative_position_matrix", "the identity (assumes PE does not change with a shift)",
       mistake="1.4/identity")
def identity(offset, d_model):
    return torch.eye(d_model)


def _rotation(offset, d_model, frequency=lambda i, d: 1 / 10000 ** (2 * i / d)):
    blocks = []
    for i in range(d_model // 2):
        t = offset * frequency(i, d_model)
        blocks.append(torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]))
    return torch.block_diag(*blocks).float()


@wrong("1.4", "relative_position_matrix", "computed in float64, never cast back: a float64 M",
       mistake="1.4/not-float32")
def float64_matrix(offset, d_model):
    angles = [offset / 10000 ** (2 * i / d_model) for i in range(d_model // 2)]
    return torch.block_diag(*[torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t),
                                                                          math.cos(t)]],
                                           dtype=torch.float64) for t in angles])


@right("1.4", "relative_position_matrix", "block_diag of 2x2 rotations")
def block_rotations(offset, d_model):
    return _rotation(offset, d_model)


@right("1.4", "relative_position_matrix", "solved by least squares from the table itself")
def least_squares(offset, d_model):
    # Enough positions for the slowest pair to turn: a short table is ill-conditioned.
    pos = torch.arange(2000, dtype=torch.float64)[:, None]
    freq = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    def table(p):
        return torch.stack([torch.sin(p * freq), torch.cos(p * freq)], -1).flatten(1)
    return torch.linalg.lstsq(table(pos), table(pos + offset), driver="gelsd").solution.float()
