"""Graded tests of chapter 1: embeddings and positional encoding (exercises 1.1-1.4).

Reference values are computed here in float64 straight from the paper's formula,
never from the implementation under test.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from checks import assert_close, assert_tensor

CHAPTER = 1
EXERCISES = {
    "1.1": "positional_encoding: the sinusoid table",
    "1.2": "PositionalEncoding: add the table, then dropout",
    "1.3": "TokenEmbedding: lookup scaled by sqrt(d_model)",
    "1.4": "relative_position_matrix: a shift is a rotation",
}


def reference_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), entry by entry, float64."""
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = torch.arange(max_len, dtype=torch.float64) / 10000 ** (2 * i / d_model)
        pe[:, 2 * i] = torch.sin(angle)
        pe[:, 2 * i + 1] = torch.cos(angle)
    return pe


# ---------------------------------------------------------------- 1.1 positional_encoding


@pytest.mark.grade("1.1", points=3)
@pytest.mark.parametrize("max_len, d_model", [(1, 2), (10, 6), (50, 64), (128, 512)])
def test_table_matches_formula(impl, max_len, d_model):
    pe = assert_tensor(impl.positional_encoding(max_len, d_model), "positional_encoding(...)",
                       shape=(max_len, d_model), dtype=torch.float32)
    assert_close(pe, reference_table(max_len, d_model), f"PE for max_len={max_len}, "
                 f"d_model={d_model}", atol=2e-5, rtol=0,
                 hint="Is the exponent 2i/d_model (i counts sin/cos pairs)? "
                 "Sine in even columns, cosine in odd ones?")


@pytest.mark.grade("1.1", points=1)
def test_long_table_within_float32_rounding(impl):
    pe = impl.positional_encoding(5000, 128)
    # float32 angles up to 5000 radians carry rounding of about 5000 * 2**-24 ~ 3e-4.
    assert_close(pe, reference_table(5000, 128), "PE for max_len=5000", atol=2e-3, rtol=0)


@pytest.mark.grade("1.1", points=1)
def test_even_columns_sine_odd_columns_cosine(impl):
    pe = impl.positional_encoding(20, 8)
    assert_close(pe[0], torch.tensor([0.0, 1.0] * 4), "PE[0] (position 0)",
                 hint="At position 0 every sine is 0 and every cosine is 1: "
                 "even columns (0, 2, ...) take the sine, odd columns the cosine.")
    positions = torch.arange(20, dtype=torch.float64)
    assert_close(pe[:, 0], torch.sin(positions), "PE[:, 0] (the fastest sine)", atol=1e-5)
    assert_close(pe[:, 1], torch.cos(positions), "PE[:, 1] (the fastest cosine)", atol=1e-5)


@pytest.mark.grade("1.1", points=1)
def test_values_bounded(impl):
    pe = impl.positional_encoding(300, 32)
    assert pe.abs().max() <= 1.0 + 1e-6, "every entry of PE is a sine or a cosine, so |PE| <= 1"


@pytest.mark.grade("1.1", points=1)
@pytest.mark.parametrize("d_model", [7, 0, -4])
def test_rejects_bad_d_model(impl, d_model):
    with pytest.raises(ValueError, match="d_model") as info:
        impl.positional_encoding(10, d_model)
    assert str(d_model) in str(info.value), "the error should say which d_model it received"


# ---------------------------------------------------------------- 1.2 PositionalEncoding


@pytest.mark.grade("1.2", points=2)
def test_adds_table_to_input(impl):
    module = impl.PositionalEncoding(16, max_len=40)
    x = torch.randn(3, 25, 16)
    expected = x.double() + reference_table(25, 16)
    assert_close(module(x), expected, "PositionalEncoding(x)", atol=1e-5,
                 hint="forward should return x + pe[:L] (L = x.size(1)).")


@pytest.mark.grade("1.2", points=2)
def test_table_is_a_buffer_not_a_parameter(impl):
    module = impl.PositionalEncoding(8, max_len=30)
    buffers = dict(module.named_buffers())
    assert "pe" in buffers, (
        f"the table should be a buffer named 'pe' (register_buffer); buffers found: {list(buffers)}"
    )
    assert_tensor(buffers["pe"], "the buffer pe", shape=(30, 8))
    assert not list(module.parameters()), (
        "PositionalEncoding should have no parameters: the sinusoid table is fixed, not learned"
    )
    assert "pe" in module.state_dict(), "pe should be persistent (saved in the state_dict)"


@pytest.mark.grade("1.2", points=1)
def test_table_moves_with_to(impl):
    module = impl.PositionalEncoding(8, max_len=30).to(torch.float64)
    assert module.pe.dtype == torch.float64, "module.to(dtype) should convert the pe buffer"
    module = module.to("meta")
    assert module.pe.device.type == "meta", "module.to(device) should move the pe buffer"


@pytest.mark.grade("1.2", points=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keeps_input_dtype(impl, dtype):
    module = impl.PositionalEncoding(8, max_len=30)
    out = module(torch.zeros(2, 5, 8, dtype=dtype))
    assert_tensor(out, "PositionalEncoding(x)", shape=(2, 5, 8), dtype=dtype)


@pytest.mark.grade("1.2", points=2)
def test_dropout_after_the_sum_and_off_in_eval(impl):
    module = impl.PositionalEncoding(32, max_len=50, dropout=0.5)
    x = torch.randn(4, 50, 32, dtype=torch.float64)
    total = x + reference_table(50, 32)
    module.eval()
    assert_close(module(x), total, "PositionalEncoding(x) in eval mode", atol=1e-5,
                 hint="Dropout must be off in eval mode: use nn.Dropout.")
    module.train()
    out = module(x)
    dropped = out == 0
    assert 0.3 < dropped.double().mean() < 0.7, (
        f"with dropout=0.5 about half the entries should be zeroed in train mode; "
        f"{dropped.double().mean():.0%} were"
    )
    assert_close(out[~dropped], 2 * total[~dropped], "the entries kept by dropout", atol=1e-5,
                 hint="Dropout applies to the sum x + pe (kept entries scaled by 1/(1-p)).")


@pytest.mark.grade("1.2", points=1)
def test_too_long_sequence_names_both_lengths(impl):
    module = impl.PositionalEncoding(8, max_len=12)
    with pytest.raises(ValueError) as info:
        module(torch.zeros(1, 13, 8))
    message = str(info.value)
    assert "13" in message and "12" in message, (
        f"the ValueError should name the sequence length (13) and max_len (12); it says {message!r}"
    )


# ---------------------------------------------------------------- 1.3 TokenEmbedding


@pytest.mark.grade("1.3", points=2)
@pytest.mark.parametrize("d_model", [4, 64])
def test_lookup_scaled_by_sqrt_d_model(impl, d_model):
    module = impl.TokenEmbedding(11, d_model).double()
    tokens = torch.randint(0, 11, (3, 7))
    expected = module.embedding.weight[tokens] * math.sqrt(d_model)
    assert_close(module(tokens), expected, "TokenEmbedding(tokens)",
                 hint="The paper multiplies the embedding by sqrt(d_model).")


@pytest.mark.grade("1.3", points=1)
def test_holds_an_embedding_with_padding_idx(impl):
    module = impl.TokenEmbedding(9, 6, padding_idx=0)
    assert isinstance(getattr(module, "embedding", None), nn.Embedding), (
        "TokenEmbedding should hold its table as self.embedding = nn.Embedding(vocab_size, d_model)"
    )
    assert module.embedding.weight.shape == (9, 6), "the table should be [vocab_size, d_model]"
    assert module.embedding.padding_idx == 0, "pass padding_idx on to nn.Embedding"
    out = module(torch.tensor([[0, 3, 0]]))
    assert_close(out[0, 0], torch.zeros(6), "the embedding of the padding token")


@pytest.mark.grade("1.3", points=1)
def test_gradient_reaches_the_table(impl):
    module = impl.TokenEmbedding(5, 4)
    module(torch.tensor([[1, 2]])).sum().backward()
    grad = module.embedding.weight.grad
    assert grad is not None, "no gradient reached embedding.weight"
    assert_close(grad[1], torch.full((4,), 2.0), "the gradient of the used row",
                 hint="d(out)/d(weight) is sqrt(d_model) for each use of a token.")


# ---------------------------------------------------------------- 1.4 relative_position_matrix


@pytest.mark.grade("1.4", points=3)
@pytest.mark.parametrize("offset", [0, 1, 5, -3, 40])
def test_shift_is_a_matrix_product(impl, offset):
    d_model, positions = 16, torch.arange(50, 90)
    m = assert_tensor(impl.relative_position_matrix(offset, d_model),
                      f"relative_position_matrix({offset}, {d_model})",
                      shape=(d_model, d_model), dtype=torch.float32)
    table = reference_table(200, d_model)
    assert_close(table[positions] @ m.double(), table[positions + offset],
                 f"PE[pos] @ M for offset={offset}", atol=1e-4, rtol=0,
                 hint="Each (sin, cos) column pair should be rotated by offset * w_i: "
                 "check the signs and which of the two entries gets -sin.")


@pytest.mark.grade("1.4", points=1)
def test_matrix_is_block_diagonal_rotation(impl):
    m = impl.relative_position_matrix(7, 8).double()
    blocks = torch.block_diag(*[m[i:i + 2, i:i + 2] for i in range(0, 8, 2)])
    assert_close(m, blocks, "relative_position_matrix(7, 8)",
                 hint="M only mixes each sine with its own cosine: zeros outside the 2x2 blocks.")
    assert_close(m @ m.T, torch.eye(8, dtype=torch.float64), "M @ M.T", atol=1e-5,
                 hint="A rotation is orthogonal.")
