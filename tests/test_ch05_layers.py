"""Graded tests of chapter 5: LayerNorm, the feed-forward network, residual connections and
the encoder and decoder layers.

References: ``nn.LayerNorm``, ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``
(ReLU, ``batch_first=True``, dropout 0) with equal weights, in float64. PyTorch's masks are
True where attention is *blocked*; the tests translate. The PyTorch layers run in train mode
(with dropout 0, so deterministic) to keep them off their inference fast path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from checks import assert_close, assert_tensor

CHAPTER = 5
EXERCISES = {
    "5.1": "LayerNorm: per-position statistics, biased variance",
    "5.2": "PositionwiseFeedForward: linear2(dropout(relu(linear1(x))))",
    "5.3": "ResidualConnection: post-LN and pre-LN",
    "5.4": "EncoderLayer: self-attention and feed-forward",
    "5.5": "DecoderLayer: masked self-attention, cross-attention, feed-forward",
}
FORBIDDEN = {"5.1": ("LayerNorm", "layer_norm"), "5.4": ("TransformerEncoderLayer",),
             "5.5": ("TransformerDecoderLayer",)}
f64 = torch.float64


# ---------------------------------------------------------------- 5.1 LayerNorm


@pytest.mark.grade("5.1", points=3)
@pytest.mark.parametrize("shape, eps", [((2, 5, 8), 1e-5), ((4, 16), 1e-3), ((2, 3, 4, 6), 0.5)])
def test_layer_norm_matches_pytorch(impl, shape, eps):
    d_model = shape[-1]
    ours = impl.LayerNorm(d_model, eps=eps).double()
    theirs = nn.LayerNorm(d_model, eps=eps).double()
    with torch.no_grad():  # random affine parameters, so that weight and bias matter
        for module in (ours, theirs):
            module.weight.copy_(torch.linspace(0.5, 2.0, d_model))
            module.bias.copy_(torch.linspace(-1.0, 1.0, d_model))
    x = torch.randn(shape, dtype=f64) * 3 + 1
    assert_close(ours(x), theirs(x), f"LayerNorm({d_model}, eps={eps}) of x of shape "
                 f"{list(shape)}", hint="Statistics over the last dimension only; the biased "
                 "variance (divide by D, not D - 1); eps inside the square root; then * weight "
                 "+ bias.")


@pytest.mark.grade("5.1", points=1)
def test_layer_norm_parameters(impl):
    module = impl.LayerNorm(6)
    parameters = dict(module.named_parameters())
    assert set(parameters) == {"weight", "bias"}, (
        f"LayerNorm should have exactly the parameters weight and bias, got {sorted(parameters)}")
    assert_close(parameters["weight"], torch.ones(6), "weight at initialisation (ones, [d_model])")
    assert_close(parameters["bias"], torch.zeros(6), "bias at initialisation (zeros, [d_model])")


@pytest.mark.grade("5.1", points=1)
def test_layer_norm_gradients_match(impl):
    ours, theirs = impl.LayerNorm(8).double(), nn.LayerNorm(8).double()
    x = torch.randn(3, 4, 8, dtype=f64, requires_grad=True)
    upstream = torch.randn(3, 4, 8, dtype=f64)
    got = torch.autograd.grad((ours(x) * upstream).sum(), (x, ours.weight, ours.bias))
    want = torch.autograd.grad((theirs(x) * upstream).sum(), (x, theirs.weight, theirs.bias))
    for name, g, w in zip(("x", "weight", "bias"), got, want, strict=True):
        assert_close(g, w, f"the gradient with respect to {name}")


@pytest.mark.grade("5.1", points=1)
def test_layer_norm_ignores_the_rest_of_the_batch(impl):
    module = impl.LayerNorm(8).double()
    x = torch.randn(4, 5, 8, dtype=f64)
    alone = module(x[:1])
    other = x.clone()
    other[1:] = other[1:] * 100 + 7  # change every other sequence of the batch
    assert_close(module(other)[:1], alone, "LayerNorm of sequence 0 after changing the others",
                 hint="LayerNorm uses no statistics across the batch (that is BatchNorm).")


# ---------------------------------------------------------------- 5.2 feed-forward


@pytest.mark.grade("5.2", points=3)
def test_feed_forward_formula(impl):
    module = impl.PositionwiseFeedForward(8, 32).double()
    for name, shape in (("linear1", (32, 8)), ("linear2", (8, 32))):
        layer = getattr(module, name, None)
        assert isinstance(layer, nn.Linear) and tuple(layer.weight.shape) == shape, (
            f"{name} should be an nn.Linear with weight of shape {list(shape)}")
    x = torch.randn(2, 5, 8, dtype=f64)
    hidden = F.relu(x @ module.linear1.weight.T + module.linear1.bias)
    expected = hidden @ module.linear2.weight.T + module.linear2.bias
    assert_close(module(x), expected, "PositionwiseFeedForward(x)",
                 hint="max(0, x W1 + b1) W2 + b2: linear1, ReLU, linear2.")


@pytest.mark.grade("5.2", points=1)
def test_feed_forward_dropout_on_the_hidden_layer(impl):
    module = impl.PositionwiseFeedForward(8, 32, dropout=0.5).double()
    x = torch.randn(2, 5, 8, dtype=f64)
    module.eval()
    hidden = F.relu(module.linear1(x))
    assert_close(module(x), module.linear2(hidden), "PositionwiseFeedForward in eval mode",
                 hint="No dropout in eval mode: use nn.Dropout.")
    module.train()
    torch.manual_seed(5)
    got = module(x)
    torch.manual_seed(5)  # replay the same random draw on the hidden activations
    expected = module.linear2(F.dropout(hidden, 0.5, training=True))
    assert_close(got, expected, "PositionwiseFeedForward in train mode",
                 hint="Dropout goes between ReLU and linear2, on the [B, L, d_ff] activations.")


# ---------------------------------------------------------------- 5.3 residual connection


class Counting(nn.Module):
    """A linear sublayer that counts its calls."""

    def __init__(self, d_model):
        super().__init__()
        self.linear = nn.Linear(d_model, d_model).double()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


@pytest.mark.grade("5.3", points=3)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_residual_connection_formula(impl, norm_first):
    module = impl.ResidualConnection(8, norm_first=norm_first).double()
    assert isinstance(getattr(module, "norm", None), nn.Module), (
        "ResidualConnection should hold its LayerNorm as self.norm")
    with torch.no_grad():
        module.norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    sublayer = Counting(8)
    x = torch.randn(2, 4, 8, dtype=f64)
    norm = nn.LayerNorm(8).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    expected = x + sublayer.linear(norm(x)) if norm_first else norm(x + sublayer.linear(x))
    placement = "x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"
    assert_close(module(x, sublayer), expected, f"ResidualConnection(norm_first={norm_first})",
                 hint=f"With norm_first={norm_first} the result is {placement}.")
    assert sublayer.calls == 1, f"the sublayer should be called once, not {sublayer.calls} times"


@pytest.mark.grade("5.3", points=1)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_residual_dropout_on_the_sublayer_output(impl, norm_first):
    module = impl.ResidualConnection(8, dropout=0.5, norm_first=norm_first).double()
    sublayer = Counting(8)
    x = torch.randn(2, 4, 8, dtype=f64)
    norm = module.norm
    module.eval()
    clean = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
    assert_close(module(x, sublayer), clean, "ResidualConnection in eval mode (no dropout)")
    module.train()
    torch.manual_seed(3)
    got = module(x, sublayer)
    torch.manual_seed(3)
    if norm_first:
        expected = x + F.dropout(sublayer(norm(x)), 0.5)
    else:
        expected = norm(x + F.dropout(sublayer(x), 0.5))
    assert_close(got, expected, "ResidualConnection in train mode",
                 hint="Dropout applies to the sublayer's output, before it is added to x.")


# ---------------------------------------------------------------- 5.4 and 5.5 layers


def copy_attention(ours, theirs):
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                           ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def copy_layer(ours, theirs, attention_names):
    """Copy our layer's weights into PyTorch's, with our norms scrambled so that order matters."""
    with torch.no_grad():
        for ours_name, theirs_name in attention_names:
            copy_attention(getattr(ours, ours_name), getattr(theirs, theirs_name))
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        for i, residual in enumerate(ours.residuals):
            residual.norm.weight.copy_(torch.linspace(0.5, 1.5, residual.norm.weight.numel())
                                       .roll(i))
            residual.norm.bias.copy_(torch.linspace(-0.2, 0.2, residual.norm.bias.numel())
                                     .roll(i))
            norm = getattr(theirs, f"norm{i + 1}")
            norm.weight.copy_(residual.norm.weight)
            norm.bias.copy_(residual.norm.bias)


def check_structure(layer, residuals, attentions):
    for name in attentions + ("feed_forward",):
        assert isinstance(getattr(layer, name, None), nn.Module), f"the layer should hold {name}"
    assert isinstance(getattr(layer, "residuals", None), nn.ModuleList) and len(
        layer.residuals) == residuals, (
        f"residuals should be an nn.ModuleList of {residuals} ResidualConnection")


@pytest.mark.grade("5.4", points=4)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "padding mask"])
def test_encoder_layer_matches_pytorch(impl, norm_first, masked):
    ours = impl.EncoderLayer(16, 4, 32, norm_first=norm_first).double()
    check_structure(ours, 2, ("self_attn",))
    theirs = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                        norm_first=norm_first).double()
    copy_layer(ours, theirs, [("self_attn", "self_attn")])
    x = torch.randn(3, 6, 16, dtype=f64)
    lengths = torch.tensor([6, 4, 2])
    allowed = torch.arange(6) < lengths[:, None]  # [B, L]
    mask = allowed[:, None, None, :] if masked else None
    expected = theirs(x, src_key_padding_mask=~allowed if masked else None)
    assert_close(ours(x, mask), expected, f"EncoderLayer(norm_first={norm_first})"
                 + (" with a padding mask" if masked else ""),
                 hint="residuals[0] wraps self-attention (with the mask), residuals[1] the "
                 "feed-forward network, in that order.")


@pytest.mark.grade("5.5", points=4)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("masked", [False, True], ids=["no masks", "causal and padding masks"])
def test_decoder_layer_matches_pytorch(impl, norm_first, masked):
    ours = impl.DecoderLayer(16, 4, 32, norm_first=norm_first).double()
    check_structure(ours, 3, ("self_attn", "cross_attn"))
    theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                        norm_first=norm_first).double()
    copy_layer(ours, theirs, [("self_attn", "self_attn"), ("cross_attn", "multihead_attn")])
    x, memory = torch.randn(2, 5, 16, dtype=f64), torch.randn(2, 7, 16, dtype=f64)
    source_allowed = torch.arange(7) < torch.tensor([7, 3])[:, None]  # [B, Ls]
    target_allowed = torch.arange(5) < torch.tensor([5, 4])[:, None]  # [B, Lt]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    if masked:
        src_mask = source_allowed[:, None, None, :]
        tgt_mask = target_allowed[:, None, None, :] & causal
        expected = theirs(x, memory, tgt_mask=~causal, tgt_key_padding_mask=~target_allowed,
                          memory_key_padding_mask=~source_allowed)
        got = ours(x, memory, src_mask=src_mask, tgt_mask=tgt_mask)
    else:
        expected, got = theirs(x, memory), ours(x, memory)
    assert_close(got, expected, f"DecoderLayer(norm_first={norm_first})"
                 + (" with masks" if masked else ""),
                 hint="Self-attention over x with tgt_mask; then cross-attention with queries "
                 "from x and keys and values from memory, with src_mask; then feed-forward.")


@pytest.mark.grade("5.5", points=1)
def test_decoder_output_depends_on_the_memory(impl):
    layer = impl.DecoderLayer(8, 2, 16).double()
    x = torch.randn(1, 3, 8, dtype=f64)
    memory = torch.randn(1, 4, 8, dtype=f64)
    first, second = layer(x, memory), layer(x, memory * 2 + 1)
    assert not torch.allclose(first, second), (
        "changing the encoder's memory did not change the decoder's output: cross-attention "
        "must take its keys and values from memory")


@pytest.mark.grade("5.4", points=1)
def test_layers_keep_shape_and_dtype(impl):
    encoder = impl.EncoderLayer(8, 2, 16)
    out = assert_tensor(encoder(torch.randn(2, 3, 8)), "EncoderLayer(x)", shape=(2, 3, 8),
                        dtype=torch.float32)
    assert not torch.isnan(out).any(), "NaN in the encoder layer's output"
