"""Graded tests of chapter 1: embeddings and positional encoding (exercises 1.1-1.4).

Reference values are computed here in float64 straight from the paper's formula,
never from the implementation under test.

The functions above the tests (``table_of``, ``positional_encoding_output``, ...) are
*probes*: they run in the grading worker, with ``impl`` the chapter module under test, and
return plain data. Everything else runs in the grader, which never imports the code under
test.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from checks import (
    KEEP_DTYPE,
    assert_close,
    assert_tensor,
    check_names,
    load_trusted,
    trusted_state,
)
from mistakes import DEVICE_CLASH, first_match, named, run_naming

CHAPTER = 1
EXERCISES = {
    "1.1": "positional_encoding: the sinusoid table",
    "1.2": "PositionalEncoding: add the table, then dropout",
    "1.3": "TokenEmbedding: lookup scaled by sqrt(d_model)",
    "1.4": "relative_position_matrix: a shift is a rotation",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"1.2": ("1.1",)}
f64 = torch.float64


# ---------------------------------------------------------------- probes (run in the worker)


def table_of(impl, max_len, d_model):
    return impl.positional_encoding(max_len, d_model)


def positional_encoding_output(impl, x, d_model, max_len):
    return impl.PositionalEncoding(d_model, max_len=max_len)(x)


def positional_encoding_eval_and_train(impl, x, d_model, max_len, dropout):
    module = impl.PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
    module.eval()
    evaluated = module(x)
    module.train()
    return {"eval": evaluated, "train": module(x)}


def positional_encoding_state(impl, d_model, max_len):
    module = impl.PositionalEncoding(d_model, max_len=max_len)
    return {"buffers": dict(module.named_buffers()),
            "parameters": [name for name, _ in module.named_parameters()],
            "state_dict": list(module.state_dict())}


def pe_buffer_after_to(impl):
    """Where the buffer ``pe`` is after ``.to(float64)``, then after ``.to("meta")`` (the
    "meta" device stands in for a GPU), and, once it moved there, where the output is for an
    input there (a table made in forward on the CPU would clash with it)."""

    def where(module):
        pe = getattr(module, "pe", None)
        return (str(pe.dtype), pe.device.type) if isinstance(pe, torch.Tensor) else (
            type(pe).__name__, None)

    module = impl.PositionalEncoding(8, max_len=30).to(torch.float64)
    dtype, _ = where(module)
    _, device = where(module.to("meta"))
    output = module(torch.zeros(2, 5, 8, device="meta")) if device == "meta" else None
    return {"dtype": dtype, "device": device,
            "output": output.device.type if isinstance(output, torch.Tensor) else None}


def positional_encoding_gradient(impl, x, upstream):
    """PositionalEncoding(D) in eval mode on ``x`` made a leaf that requires grad: its output,
    and the gradient of ``(output * upstream).sum()`` with respect to x (None when the output
    is off autograd's graph)."""
    module = impl.PositionalEncoding(x.size(-1), max_len=30).eval()
    x = x.clone().requires_grad_(True)
    output = module(x)
    on_graph = isinstance(output, torch.Tensor) and output.requires_grad
    return {"output": output,
            "grad": torch.autograd.grad((output * upstream).sum(), x)[0] if on_graph else None}


def embedding_output(impl, vocab_size, d_model, tokens, state):
    """TokenEmbedding with the grader's table ``state`` (when its state-dict names and shapes
    are the contract's): its output and its own state-dict names and shapes."""
    module = impl.TokenEmbedding(vocab_size, d_model).double()
    names = load_trusted(module, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    return {"output": module(tokens), "names": names}


def embedding_structure(impl, tokens):
    module = impl.TokenEmbedding(9, 6, padding_idx=0)
    embedding = getattr(module, "embedding", None)
    if not isinstance(embedding, nn.Embedding):
        return {"embedding": type(embedding).__name__}
    return {"embedding": "Embedding", "weight_shape": list(embedding.weight.shape),
            "padding_idx": embedding.padding_idx, "output": module(tokens)}


def embedding_gradient(impl, tokens, upstream, state):
    """TokenEmbedding(5, 4) in the dtype of ``state`` (the grader's table, loaded when its
    state-dict names and shapes are the contract's): its output, and the gradient of
    ``(output * upstream).sum()`` with respect to the table (None when the output is off
    autograd's graph or does not use the table)."""
    module = impl.TokenEmbedding(5, 4).to(state["embedding.weight"].dtype)
    names = load_trusted(module, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    output = module(tokens)
    weight = module.embedding.weight
    grad = (torch.autograd.grad((output * upstream).sum(), weight, allow_unused=True)[0]
            if isinstance(output, torch.Tensor) and output.requires_grad else None)
    return {"names": names, "output": output, "grad": grad}


def embedding_on_meta(impl, tokens):
    """The device of the output for a module and tokens on the "meta" device (a stand-in for
    a GPU: a tensor the module holds outside its parameters and buffers stays behind)."""
    module = impl.TokenEmbedding(9, 6).to("meta")
    return module(tokens.to("meta")).device.type


def rotation_of(impl, offset, d_model):
    return impl.relative_position_matrix(offset, d_model)


def reference_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), entry by entry, float64."""
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = torch.arange(max_len, dtype=torch.float64) / 10000 ** (2 * i / d_model)
        pe[:, 2 * i] = torch.sin(angle)
        pe[:, 2 * i + 1] = torch.cos(angle)
    return pe


def mistaken_tables(max_len: int, d_model: int) -> dict[str, torch.Tensor]:
    """``{mistake id: the table it gives}`` for the plausible mistakes of 1.1, in float64."""
    def table(start=0, exponent=lambda i: 2 * i / d_model, swap=False):
        pe = torch.empty(max_len, d_model, dtype=torch.float64)
        positions = torch.arange(start, start + max_len, dtype=torch.float64)
        for i in range(d_model // 2):
            angle = positions / 10000 ** exponent(i)
            first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
            pe[:, 2 * i], pe[:, 2 * i + 1] = first(angle), second(angle)
        return pe

    right = reference_table(max_len, d_model)
    return {"1.1/sine-cosine-swapped": table(swap=True),
            "1.1/exponent-i-over-d_model": table(exponent=lambda i: i / d_model),
            "1.1/exponent-by-column": table(exponent=lambda i: 2 * (2 * i) / d_model),
            "1.1/positions-from-1": table(start=1),
            "1.1/sines-then-cosines": torch.cat([right[:, 0::2], right[:, 1::2]], dim=1)}


def rotation(offset: int, d_model: int, frequency=None) -> torch.Tensor:
    """The block-diagonal rotation by ``offset * w_i`` (``frequency(i)``, default the paper's
    ``w_i = 1 / 10000^(2i/d_model)``), float64 [d_model, d_model]."""
    blocks = []
    for i in range(d_model // 2):
        w = frequency(i) if frequency else 1 / 10000 ** (2 * i / d_model)
        c, s = math.cos(offset * w), math.sin(offset * w)
        blocks.append(torch.tensor([[c, -s], [s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks)


# ---------------------------------------------------------------- 1.1 positional_encoding


@pytest.mark.grade("1.1", points=3, values=True)
@pytest.mark.parametrize("max_len, d_model", [(1, 2), (10, 6), (50, 64), (128, 512)])
def test_table_matches_formula(learner, max_len, d_model):
    pe = assert_tensor(learner.run(table_of, max_len=max_len, d_model=d_model),
                       "positional_encoding(...)", shape=(max_len, d_model))
    expected = reference_table(max_len, d_model)
    mistake = None if torch.allclose(pe.double(), expected, atol=2e-5, rtol=0) else first_match(
        pe, mistaken_tables(max_len, d_model), atol=2e-5, rtol=0)
    assert_close(pe, expected, f"PE for max_len={max_len}, d_model={d_model}", atol=2e-5,
                 rtol=0, hint=named(mistake) if mistake else "Is the exponent 2i/d_model (i "
                 "counts sin/cos pairs)? Sine in even columns, cosine in odd ones?")
    # Right values: the dtype is the contract's too (the model's parameters are float32).
    assert pe.dtype == torch.float32, named("1.1/not-float32", got=pe.dtype)


@pytest.mark.grade("1.1", points=1, values=True)
def test_long_table_within_float32_rounding(learner):
    pe = learner.run(table_of, max_len=5000, d_model=128)
    # float32 angles up to 5000 radians carry rounding of about 5000 * 2**-24 ~ 3e-4.
    assert_close(pe, reference_table(5000, 128), "PE for max_len=5000", atol=2e-3, rtol=0)


@pytest.mark.grade("1.1", points=1)
def test_even_columns_sine_odd_columns_cosine(learner):
    pe = assert_tensor(learner.run(table_of, max_len=20, d_model=8), "positional_encoding(20, 8)",
                       shape=(20, 8))
    assert_close(pe[0], torch.tensor([0.0, 1.0] * 4), "PE[0] (position 0)",
                 hint="At position 0 every sine is 0 and every cosine is 1: "
                 "even columns (0, 2, ...) take the sine, odd columns the cosine.")
    positions = torch.arange(20, dtype=torch.float64)
    assert_close(pe[:, 0], torch.sin(positions), "PE[:, 0] (the fastest sine)", atol=1e-5)
    assert_close(pe[:, 1], torch.cos(positions), "PE[:, 1] (the fastest cosine)", atol=1e-5)


@pytest.mark.grade("1.1", points=1)
def test_values_bounded(learner):
    pe = assert_tensor(learner.run(table_of, max_len=300, d_model=32),
                       "positional_encoding(300, 32)", shape=(300, 32))
    assert pe.abs().max() <= 1.0 + 1e-6, "every entry of PE is a sine or a cosine, so |PE| <= 1"


@pytest.mark.grade("1.1", points=1, errors=True)
@pytest.mark.parametrize("d_model", [7, 0, -4])
def test_rejects_bad_d_model(learner, d_model):
    message = learner.raises("ValueError", table_of, max_len=10, d_model=d_model)
    assert re.search("d_model", message), (
        f"the ValueError for d_model={d_model} should name d_model; it says: {message}")
    assert str(d_model) in message, "the error should say which d_model it received"


# ---------------------------------------------------------------- 1.2 PositionalEncoding


@pytest.mark.grade("1.2", points=2, values=True)
def test_adds_table_to_input(learner):
    x = torch.randn(3, 25, 16)
    expected = x.double() + reference_table(25, 16)
    assert_close(learner.run(positional_encoding_output, x=x, d_model=16, max_len=40), expected,
                 "PositionalEncoding(x)", atol=1e-5,
                 hint="forward should return x + pe[:L] (L = x.size(1)).")


@pytest.mark.grade("1.2", points=2)
def test_table_is_a_buffer_not_a_parameter(learner):
    state = learner.run(positional_encoding_state, d_model=8, max_len=30)
    buffers = state["buffers"]
    assert "pe" not in state["parameters"], named("1.2/table-learned")
    assert "pe" in buffers, named("1.2/not-a-buffer") if not buffers else (
        f"the table should be a buffer named 'pe' (register_buffer); buffers found: {list(buffers)}"
    )
    assert_tensor(buffers["pe"], "the buffer pe", shape=(30, 8))
    assert not state["parameters"], (
        "PositionalEncoding should have no parameters: the sinusoid table is fixed, not learned"
    )
    assert "pe" in state["state_dict"], "pe should be persistent (saved in the state_dict)"


@pytest.mark.grade("1.2", points=1)
def test_table_and_output_move_with_to(learner):
    where = run_naming(learner, pe_buffer_after_to, DEVICE_CLASH, "1.2/device-not-kept")
    assert where["dtype"] == "torch.float64", (
        f"module.to(dtype) should convert the pe buffer; after .to(torch.float64) pe is "
        f"{where['dtype']}")
    assert where["device"] == "meta", "module.to(device) should move the pe buffer"
    assert where["output"] == "meta", (
        f"PositionalEncoding on the meta device (a stand-in for a GPU) returns "
        f"{where['output']} for an input there, not a tensor on meta: add the buffer self.pe, "
        f"which module.to(device) moves, never a table made in forward on the CPU")


@pytest.mark.grade("1.2", points=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_keeps_input_dtype(learner, dtype):
    out = learner.run(positional_encoding_output, x=torch.zeros(2, 5, 8, dtype=dtype), d_model=8,
                      max_len=30)
    promoted = isinstance(out, torch.Tensor) and out.dtype != dtype and dtype != torch.float32
    assert not promoted, named("1.2/dtype-promoted", dtype=dtype, got=out.dtype)
    assert_tensor(out, "PositionalEncoding(x)", shape=(2, 5, 8), dtype=dtype)
    # Half precision keeps about 3 (float16) or 2 (bfloat16) significant digits.
    atol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype, 1e-5)
    assert_close(out, reference_table(5, 8).expand(2, 5, 8), f"PositionalEncoding(x) for x of "
                 f"zeros in {dtype}", atol=atol, rtol=0,
                 hint="Convert the table to x's dtype (self.pe[:L].to(x.dtype)) before adding.")


@pytest.mark.grade("1.2", points=1, values=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_gradient_reaches_the_input(learner, dtype):
    x = torch.randn(2, 6, 8, dtype=f64, requires_grad=True)
    upstream = torch.randn(2, 6, 8, dtype=f64)
    result = learner.run(positional_encoding_gradient, x=x.detach().to(dtype),
                         upstream=upstream.to(dtype))
    what = f"PositionalEncoding(x) for {dtype} x"
    output = assert_tensor(result["output"], what, shape=(2, 6, 8), dtype=dtype)
    right = torch.allclose(output.double(), x.detach() + reference_table(6, 8), atol=1e-5)
    assert result["grad"] is not None, (named("1.2/detached") if right else
                                        f"{what} that requires grad is off autograd's graph")
    (expected,) = torch.autograd.grad(((x + reference_table(6, 8)) * upstream).sum(), x)
    assert_close(result["grad"], expected, f"the gradient of {what} with respect to x",
                 hint="The table is a constant: d(x + pe)/dx is the identity.")


@pytest.mark.grade("1.2", points=2, values=True)
def test_dropout_after_the_sum_and_off_in_eval(learner):
    x = torch.randn(4, 50, 32, dtype=torch.float64)
    total = x + reference_table(50, 32)
    result = learner.run(positional_encoding_eval_and_train, x=x, d_model=32, max_len=50,
                         dropout=0.5)
    evaluated = assert_tensor(result["eval"], "PositionalEncoding(x) in eval mode", shape=x.shape)
    assert_close(evaluated, total, "PositionalEncoding(x) in eval mode", atol=1e-5,
                 hint=named("1.2/dropout-in-eval") if (evaluated == 0).double().mean() > 0.3
                 else "Dropout must be off in eval mode: use nn.Dropout.")
    out = assert_tensor(result["train"], "PositionalEncoding(x) in train mode", shape=x.shape)
    table = reference_table(50, 32)
    # dropout(x) + pe: the dropped entries are pe (up to a float32 table's rounding)
    x_dropped = (out.double() - table).abs() < 1e-4
    before = 0.3 < x_dropped.double().mean() < 0.7 and torch.allclose(
        out[~x_dropped].double(), (2 * x + table)[~x_dropped], atol=1e-4)
    assert not before, named("1.2/dropout-before-the-table")
    dropped = out == 0
    assert 0.3 < dropped.double().mean() < 0.7, (
        f"with dropout=0.5 about half the entries should be zeroed in train mode; "
        f"{dropped.double().mean():.0%} were"
    )
    assert_close(out[~dropped], 2 * total[~dropped], "the entries kept by dropout", atol=1e-5,
                 hint="Dropout applies to the sum x + pe (kept entries scaled by 1/(1-p)).")


@pytest.mark.grade("1.2", points=1, errors=True)
def test_too_long_sequence_names_both_lengths(learner):
    message = learner.raises("ValueError", positional_encoding_output, x=torch.zeros(1, 13, 8),
                             d_model=8, max_len=12)
    assert "13" in message and "12" in message, (
        f"the ValueError should name the sequence length (13) and max_len (12); it says {message!r}"
    )


# ---------------------------------------------------------------- 1.3 TokenEmbedding


@pytest.mark.grade("1.3", points=2, values=True)
@pytest.mark.parametrize("d_model", [4, 64])
def test_lookup_scaled_by_sqrt_d_model(learner, d_model):
    tokens = torch.randint(0, 11, (3, 7))
    state = trusted_state({"embedding.weight": (11, d_model)})
    weight = state["embedding.weight"]
    result = learner.run(embedding_output, vocab_size=11, d_model=d_model, tokens=tokens,
                         state=state)
    check_names(result["names"], state, "TokenEmbedding", hint="Hold the table as "
                "self.embedding = nn.Embedding(vocab_size, d_model).")
    expected, looked_up = weight[tokens] * math.sqrt(d_model), weight[tokens]
    mistake = None if torch.allclose(result["output"].double(), expected) else first_match(
        result["output"], {"1.3/no-scale": looked_up, "1.3/scaled-by-d_model": looked_up * d_model,
                           "1.3/divided-by-sqrt-d_model": looked_up / math.sqrt(d_model)})
    assert_close(result["output"], expected, "TokenEmbedding(tokens)",
                 hint=named(mistake) if mistake else "The paper multiplies the embedding by "
                 "sqrt(d_model).")


@pytest.mark.grade("1.3", points=1)
def test_holds_an_embedding_with_padding_idx(learner):
    result = learner.run(embedding_structure, tokens=torch.tensor([[0, 3, 0]]))
    assert result["embedding"] == "Embedding", (
        "TokenEmbedding should hold its table as self.embedding = nn.Embedding(vocab_size, "
        f"d_model); self.embedding is a {result['embedding']}"
    )
    assert result["weight_shape"] == [9, 6], "the table should be [vocab_size, d_model]"
    assert result["padding_idx"] == 0, "pass padding_idx on to nn.Embedding"
    out = assert_tensor(result["output"], "TokenEmbedding(tokens)", shape=(1, 3, 6))
    assert_close(out[0, 0], torch.zeros(6), "the embedding of the padding token")


@pytest.mark.grade("1.3", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_gradient_reaches_the_table(learner, dtype):
    tokens, upstream = torch.tensor([[1, 2, 1], [4, 0, 2]]), torch.randn(2, 3, 4, dtype=f64)
    state = trusted_state({"embedding.weight": (5, 4)})
    result = learner.run(embedding_gradient, tokens=tokens, upstream=upstream.to(dtype),
                         state={name: value.to(dtype) for name, value in state.items()})
    check_names(result["names"], state, "TokenEmbedding")
    what = f"TokenEmbedding(tokens) with a {dtype} table"
    weight = state["embedding.weight"].to(dtype).double().requires_grad_(True)
    output = assert_tensor(result["output"], what, shape=(2, 3, 4))
    right = torch.allclose(output.double(), weight.detach()[tokens] * 2)  # sqrt(d_model) = 2
    assert output.dtype == dtype, (
        named("1.3/dtype-changed", got=output.dtype, dtype=dtype) if right else
        f"{what} should have dtype {dtype}, the table's, but it has {output.dtype}. "
        f"{KEEP_DTYPE}")
    assert result["grad"] is not None, (named("1.3/detached") if right else
                                        "no gradient reached embedding.weight")
    (expected,) = torch.autograd.grad((weight[tokens] * 2 * upstream).sum(), weight)
    assert_close(result["grad"], expected, f"the gradient of embedding.weight ({dtype})",
                 hint="d(out)/d(weight) is sqrt(d_model) for each use of a token.")


@pytest.mark.grade("1.3", points=1)
def test_output_on_the_tokens_device(learner):
    device = run_naming(learner, embedding_on_meta, DEVICE_CLASH, "1.3/device-not-kept",
                        tokens=torch.tensor([[0, 3, 8]]))
    assert device == "meta", (
        f"TokenEmbedding on the meta device (a stand-in for a GPU) returns a tensor on "
        f"{device}: a tensor the module keeps outside its parameters and buffers is not moved "
        f"by module.to(device); scale by the Python number math.sqrt(d_model)")


# ---------------------------------------------------------------- 1.4 relative_position_matrix


@pytest.mark.grade("1.4", points=3, values=True)
@pytest.mark.parametrize("offset", [0, 1, 5, -3, 40])
def test_shift_is_a_matrix_product(learner, offset):
    d_model, positions = 16, torch.arange(50, 90)
    m = assert_tensor(learner.run(rotation_of, offset=offset, d_model=d_model),
                      f"relative_position_matrix({offset}, {d_model})", shape=(d_model, d_model))
    table = reference_table(200, d_model)
    shifted = table[positions] @ m.double()
    mistake = None if torch.allclose(shifted, table[positions + offset], atol=1e-4, rtol=0) else (
        first_match(m, {"1.4/identity": torch.eye(d_model, dtype=torch.float64),
                        "1.4/rotation-transposed": rotation(offset, d_model).T,
                        "1.4/angle-without-frequency": rotation(offset, d_model, float)},
                    atol=1e-5))
    assert_close(shifted, table[positions + offset], f"PE[pos] @ M for offset={offset}", atol=1e-4,
                 rtol=0, hint=named(mistake) if mistake else "Each (sin, cos) column pair "
                 "should be rotated by offset * w_i: check the signs and which of the two "
                 "entries gets -sin.")
    # Right values: the dtype is the contract's too (PE's, float32).
    assert m.dtype == torch.float32, named("1.4/not-float32", got=m.dtype)


@pytest.mark.grade("1.4", points=1)
def test_matrix_is_block_diagonal_rotation(learner):
    m = assert_tensor(learner.run(rotation_of, offset=7, d_model=8),
                      "relative_position_matrix(7, 8)", shape=(8, 8)).double()
    blocks = torch.block_diag(*[m[i:i + 2, i:i + 2] for i in range(0, 8, 2)])
    assert_close(m, blocks, "relative_position_matrix(7, 8)",
                 hint="M only mixes each sine with its own cosine: zeros outside the 2x2 blocks.")
    assert_close(m @ m.T, torch.eye(8, dtype=torch.float64), "M @ M.T", atol=1e-5,
                 hint="A rotation is orthogonal.")
