"""Graded tests of chapter 5: LayerNorm, the feed-forward network, residual connections, the
encoder and decoder layers, their stacks, and the whole encoder-decoder.

References: ``nn.LayerNorm``, ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``
(ReLU, ``batch_first=True``, dropout 0) with equal weights, in float64; a stack is those
layers in turn and, pre-LN, an ``nn.LayerNorm``, as ``nn.TransformerEncoder`` computes.
PyTorch's masks are True where attention is *blocked*; the tests translate. The PyTorch
layers run in train mode (with dropout 0, so deterministic) to keep them off their inference
fast path.

The functions above the tests (``layer_norm_of``, ``encoder_layer_run``, ...) are *probes*:
they run in the grading worker, with ``impl`` the chapter module under test, and return
plain data (outputs, gradients, state-dict names). Everything else runs in the grader, which
never imports the code under test. The weights are the grader's own
(``checks.trusted_state``, from the test's seed): a probe loads them into the learner's
module by its state-dict names (the contract), and the grader loads the same into
PyTorch's own modules to compute the expected values; the learner's own initialisation is
checked on its own.
"""

from __future__ import annotations

import math
import re
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from checks import (
    ATTENTION_OPS,
    KEEP_DTYPE,
    LAYER_OPS,
    LOGSUMEXP_OPS,
    NORM_OPS,
    SOFTMAX_OPS,
    assert_close,
    assert_tensor,
    check_initialisation,
    check_names,
    load_trusted,
    replay_embedding,
    replay_layer,
    replay_norm,
    replay_stack,
    trusted_state,
    untied_how,
)
from mistakes import DEVICE_CLASH, first_match, mistake_of, named, run_naming
from torch_models import TorchEncoderDecoder, sinusoidal_table

CHAPTER = 5
EXERCISES = {
    "5.1": "LayerNorm: per-position statistics, biased variance",
    "5.2": "PositionwiseFeedForward: linear2(dropout(relu(linear1(x))))",
    "5.3": "ResidualConnection: post-LN and pre-LN",
    "5.4": "EncoderLayer: self-attention and feed-forward",
    "5.5": "DecoderLayer: masked self-attention, cross-attention, feed-forward",
    "5.6": "Encoder: N encoder layers, then a last norm for pre-LN",
    "5.7": "Decoder: N decoder layers on the same memory, then a last norm for pre-LN",
    "5.8": "EncoderDecoder: embeddings, stacks, generator, tied weights",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"5.3": ("5.1",), "5.4": ("3.3", "5.1", "5.2", "5.3"),
             "5.5": ("3.3", "5.1", "5.2", "5.3"), "5.6": ("5.1", "5.4"), "5.7": ("5.1", "5.5"),
             "5.8": ("1.2", "1.3", "5.6", "5.7")}
TRANSFORMERS = ("Transformer", "TransformerEncoder", "TransformerDecoder",
                "TransformerEncoderLayer", "TransformerDecoderLayer")
# rms_norm decomposes into the ops an honest answer uses: only its name can be refused.
FORBIDDEN = {"5.1": ("LayerNorm", "layer_norm", "native_layer_norm", "rms_norm", "RMSNorm",
                     *TRANSFORMERS),
             "5.4": TRANSFORMERS, "5.5": TRANSFORMERS, "5.6": TRANSFORMERS,
             "5.7": TRANSFORMERS, "5.8": TRANSFORMERS}
# The same, refused at PyTorch's dispatch level while the exercise's code runs, with every op
# through which PyTorch computes the result (checks.py): LayerNorm's own op and the norms
# that could stand in for it (5.3's norm is the learner's LayerNorm of 5.1); in a layer,
# also PyTorch's attention (fused or by its softmax) and its fused encoder layer, so that
# nn.TransformerEncoderLayer, nn.TransformerDecoderLayer or nn.Transformer's parts, in
# train or eval mode, are refused. A layer's attention is the learner's own of 3.3.
# rms_norm computes with the ops an honest LayerNorm uses: it is refused by its name, at the
# torch-function level (torch.rms_norm, F.rms_norm, nn.RMSNorm, torch.ops.aten.rms_norm).
NORMS = (*NORM_OPS, "torch:rms_norm")
LAYER_FAMILY = (*LAYER_OPS, *ATTENTION_OPS, *SOFTMAX_OPS, *LOGSUMEXP_OPS, *NORMS)
# 5.8 composes the stacks (the grader's stand-ins while it is graded): PyTorch's fused layers
# and attention are refused; a softmax and its gradient are allowed (+), so that a generator
# that returns log-probabilities is named as that mistake (its gradients are taken too).
FORBIDDEN_OPS = {"5.1": NORMS, "5.3": NORMS, "5.4": LAYER_FAMILY, "5.5": LAYER_FAMILY,
                 "5.6": LAYER_FAMILY, "5.7": LAYER_FAMILY,
                 "5.8": (*LAYER_OPS, *ATTENTION_OPS, "+_log_softmax", "+_softmax",
                         "+_log_softmax_backward_data", "+_softmax_backward_data")}
f64 = torch.float64
# A training pass with dropout is replayed from this seed, in the worker and here
# (checks.replay_stack): every module that should drop must draw, in the contract's order.
REPLAY_SEED, DROPOUT = 11, 0.25


# ---------------------------------------------------------------- probes (run in the worker)


def layer_norm_of(impl, x, eps, weight, bias):
    """LayerNorm(D, eps) with the given weight and bias (when it has them), applied to x."""
    module = impl.LayerNorm(x.shape[-1], eps=eps).double()
    parameters = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in (("weight", weight), ("bias", bias)):
            if name in parameters:
                parameters[name].copy_(value)
    return {"output": module(x), "parameters": sorted(parameters)}


def layer_norm_parameters(impl, d_model):
    return dict(impl.LayerNorm(d_model).named_parameters())


def layer_norm_gradients(impl, x, upstream):
    """LayerNorm(D) in x's dtype: its output, and the gradients with respect to x, weight and
    bias (None for one the output ignores)."""
    module = impl.LayerNorm(x.shape[-1]).to(x.dtype)
    parameters = dict(module.named_parameters())
    inputs = {"x": x.clone().requires_grad_(True),
              **{name: parameters[name] for name in ("weight", "bias") if name in parameters}}
    output = module(inputs["x"])
    grads = torch.autograd.grad((output * upstream).sum(), list(inputs.values()),
                                allow_unused=True)
    return {"output": output.detach(), **dict(zip(inputs, grads, strict=True))}


def layer_norm_of_batches(impl, x, other):
    """The same module on sequence 0 alone and on a batch whose other sequences changed."""
    module = impl.LayerNorm(x.shape[-1]).double()
    return {"alone": module(x[:1]), "changed": module(other)}


def feed_forward_run(impl, x, state, dropout=0.0):
    """The linears' kinds and shapes, the state-dict names, and the output with the
    grader's weights ``state`` (eval and train mode)."""
    module = impl.PositionwiseFeedForward(8, 32, dropout=dropout).double()
    linears = {}
    for name in ("linear1", "linear2"):
        layer = getattr(module, name, None)
        linears[name] = (list(layer.weight.shape) if isinstance(layer, nn.Linear) else None)
    if None in linears.values():
        return {"linears": linears}
    names = load_trusted(module, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"linears": linears, "names": names}
    module.eval()
    evaluated = module(x)
    module.train()
    torch.manual_seed(5)
    return {"linears": linears, "names": names, "eval": evaluated, "train": module(x)}


def fresh_state(impl, name, args):
    """The state dict of ``impl.<name>(*args)`` as its constructor initialises it."""
    return dict(getattr(impl, name)(*args).state_dict())


class Counting(nn.Module):
    """A linear sublayer that counts its calls."""

    def __init__(self, d_model):
        super().__init__()
        self.linear = nn.Linear(d_model, d_model).double()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def residual_run(impl, x, norm_first, norm, sublayer, dropout=0.0):
    """ResidualConnection around a Counting sublayer, the norm and the sublayer holding the
    grader's weights ``norm`` and ``sublayer``: outputs in eval mode and (with dropout) in
    train mode, the number of calls."""
    module = impl.ResidualConnection(8, dropout=dropout, norm_first=norm_first).double()
    if not isinstance(getattr(module, "norm", None), nn.Module):
        return {"has_norm": False}
    names = load_trusted(module.norm, norm)
    if names != {n: list(v.shape) for n, v in norm.items()}:
        return {"has_norm": True, "names": names}
    weights, sublayer = sublayer, Counting(8)
    sublayer.linear.load_state_dict(weights)
    module.eval()
    result = {"has_norm": True, "eval": module(x, sublayer), "calls": sublayer.calls}
    if dropout:
        module.train()
        torch.manual_seed(3)
        result["train"] = module(x, sublayer)
    return {**result, "names": names}


def layer_structure(layer, attentions, residuals):
    found = {name: isinstance(getattr(layer, name, None), nn.Module)
             for name in (*attentions, "feed_forward")}
    stack = getattr(layer, "residuals", None)
    found["residuals"] = len(stack) if isinstance(stack, nn.ModuleList) else None
    return found, all(found[name] for name in (*attentions, "feed_forward")) and (
        found["residuals"] == residuals)


SIZE_ERROR = re.compile(r"size|shape|match|length|disagree|dimension", re.IGNORECASE)


def size_error(error):
    """The message of a size mismatch raised by the code under test, None for anything else
    (a stub's NotImplementedError, or another error, is raised on to the grader)."""
    if isinstance(error, NotImplementedError) or not SIZE_ERROR.search(str(error)):
        return None
    return str(error)


def encoder_layer_run(impl, x, norm_first, state, mask=None):
    """EncoderLayer(16, 4, 32) with the grader's weights ``state``, called as the package
    calls it: ``layer(x, mask)``. Its structure, state-dict names and output."""
    layer = impl.EncoderLayer(16, 4, 32, norm_first=norm_first).double()
    structure, ok = layer_structure(layer, ("self_attn",), 2)
    if not ok:
        return {"structure": structure}
    names = load_trusted(layer, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"structure": structure, "names": names}
    return {"structure": structure, "names": names, "output": layer(x, mask)}


def encoder_layer_output(impl, x):
    return impl.EncoderLayer(x.shape[-1], 2, 16)(x)


def decoder_layer_run(impl, x, memory, norm_first, state, src_mask=None, tgt_mask=None):
    """DecoderLayer(16, 4, 32) with the grader's weights ``state``, called as the package
    calls it: ``layer(x, memory, src_mask, tgt_mask)``. Its structure, state-dict names and
    output; for a size mismatch, its message and whether the layer also fails without
    masks."""
    layer = impl.DecoderLayer(16, 4, 32, norm_first=norm_first).double()
    structure, ok = layer_structure(layer, ("self_attn", "cross_attn"), 3)
    if not ok:
        return {"structure": structure}
    names = load_trusted(layer, state)
    result = {"structure": structure, "names": names}
    if names != {n: list(v.shape) for n, v in state.items()}:
        return result
    return {**result, **decoder_call(layer, x, memory, src_mask, tgt_mask)}


def decoder_call(layer, x, memory, src_mask=None, tgt_mask=None):
    """``layer(x, memory, src_mask, tgt_mask)``; for a size mismatch, its message, whether
    the layer runs without masks (then a mask went to the wrong attention) and, when it
    does, whether its output there ignores the memory (then the cross-attention attends to
    x, and the memory's mask cannot fit it)."""
    masked = src_mask is not None or tgt_mask is not None
    try:
        return {"output": layer(x, memory, src_mask, tgt_mask) if masked else layer(x, memory)}
    except (RuntimeError, ValueError) as error:
        message = size_error(error)
        if message is None:
            raise
    masks_only = memory_unused = False
    if masked:
        try:
            unmasked = layer(x, memory)
            masks_only = True
            memory_unused = bool(torch.allclose(unmasked, layer(x, memory * 2 + 1)))
        except (RuntimeError, ValueError) as error:
            if size_error(error) is None:
                raise
    return {"size_error": message, "masks_only": masks_only, "memory_unused": memory_unused}


def decoder_memory_effect(impl, x, memory):
    """The same decoder layer on the same x with two different memories."""
    layer = impl.DecoderLayer(x.shape[-1], 2, 16).double()
    first = decoder_call(layer, x, memory)
    return first if "size_error" in first else {
        "first": first["output"], "second": decoder_call(layer, x, memory * 2 + 1).get("output")}


# ---------------------------------------------------------------- 5.1 LayerNorm


def mistaken_layer_norms(x, eps, weight, bias):
    """``{mistake id: the output it gives}`` for the plausible mistakes of 5.1."""
    mean = x.mean(-1, keepdim=True)
    variance = x.var(-1, keepdim=True, unbiased=False)

    def over(dims):
        return (x - x.mean(dims, keepdim=True)) / torch.sqrt(
            x.var(dims, keepdim=True, unbiased=False) + eps) * weight + bias

    return {
        "5.1/weight-and-bias-unused": F.layer_norm(x, (x.size(-1),), eps=eps),
        "5.1/unbiased-variance":
            (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias,
        "5.1/eps-outside-sqrt": (x - mean) / (variance.sqrt() + eps) * weight + bias,
        # Of a 2-D x, dim 0 is the batch and the positions alike: only 3-D x tells them apart.
        **({"5.1/statistics-over-the-batch": over(0), "5.1/statistics-over-positions": over(-2),
            "5.1/statistics-over-positions-too": over((-2, -1))} if x.dim() >= 3 else {}),
    }



@pytest.mark.grade("5.1", points=3, values=True)
@pytest.mark.parametrize("shape, eps", [((2, 5, 8), 1e-5), ((4, 16), 1e-3), ((2, 3, 4, 6), 0.5)])
def test_layer_norm_matches_pytorch(learner, shape, eps):
    d_model = shape[-1]
    theirs = nn.LayerNorm(d_model, eps=eps).double()
    weight, bias = torch.linspace(0.5, 2.0, d_model), torch.linspace(-1.0, 1.0, d_model)
    with torch.no_grad():  # random affine parameters, so that weight and bias matter
        theirs.weight.copy_(weight)
        theirs.bias.copy_(bias)
    x = torch.randn(shape, dtype=f64) * 3 + 1
    result = learner.run(layer_norm_of, x=x, eps=eps, weight=weight, bias=bias)
    assert result["parameters"], named("5.1/no-parameters")
    assert {"weight", "bias"} <= set(result["parameters"]), (
        f"LayerNorm should have the parameters weight and bias, got {result['parameters']}")
    hint = ("Statistics over the last dimension only; the biased variance (divide by D, not "
            "D - 1); eps inside the square root; then * weight + bias.")
    output = result["output"]
    mistake = first_match(output, mistaken_layer_norms(x, eps, weight, bias))
    if mistake is not None:
        hint = named(mistake)
    assert_close(output, theirs(x), f"LayerNorm({d_model}, eps={eps}) of x of shape "
                 f"{list(shape)}", hint=hint)


@pytest.mark.grade("5.1", points=1)
def test_layer_norm_parameters(learner):
    parameters = learner.run(layer_norm_parameters, d_model=6)
    assert set(parameters) == {"weight", "bias"}, (
        f"LayerNorm should have exactly the parameters weight and bias, got {sorted(parameters)}")
    assert_close(parameters["weight"], torch.ones(6), "weight at initialisation (ones, [d_model])")
    assert_close(parameters["bias"], torch.zeros(6), "bias at initialisation (zeros, [d_model])")


@pytest.mark.grade("5.1", points=1, values=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_layer_norm_gradients_match(learner, dtype):
    theirs = nn.LayerNorm(8).double()
    x = torch.randn(3, 4, 8, dtype=f64, requires_grad=True)
    upstream = torch.randn(3, 4, 8, dtype=f64)
    got = learner.run(layer_norm_gradients, x=x.detach().to(dtype), upstream=upstream.to(dtype))
    output = assert_tensor(got["output"], f"LayerNorm(8) of {dtype} x", shape=x.shape)
    right = torch.allclose(output.double(), theirs(x.detach().to(dtype).double()), atol=1e-5)
    assert output.dtype == dtype, (
        named("5.1/dtype-changed", dtype=dtype, got=output.dtype) if right else
        f"LayerNorm(8) in {dtype} gives an output of dtype {output.dtype}, not {dtype}. "
        f"{KEEP_DTYPE}")
    want = torch.autograd.grad((theirs(x) * upstream).sum(), (x, theirs.weight, theirs.bias))
    for name, w in zip(("x", "weight", "bias"), want, strict=True):
        assert name in got, (
            f"LayerNorm should have the parameter {name}, got only {sorted(set(got) - {'x'})}")
        assert got[name] is not None, (
            f"the output does not depend on {name}: its gradient is None. forward must use "
            f"self.{name} (the result is normalised x * weight + bias)" if name != "x" else
            "the output does not depend on x")
        assert_close(got[name], w, f"the gradient with respect to {name}")


@pytest.mark.grade("5.1", points=1)
def test_layer_norm_ignores_the_rest_of_the_batch(learner):
    x = torch.randn(4, 5, 8, dtype=f64)
    other = x.clone()
    other[1:] = other[1:] * 100 + 7  # change every other sequence of the batch
    result = learner.run(layer_norm_of_batches, x=x, other=other)
    changed = assert_tensor(result["changed"], "LayerNorm of the changed batch", shape=(4, 5, 8))
    assert_close(changed[:1], result["alone"], "LayerNorm of sequence 0 after changing the "
                 "others", hint="LayerNorm uses no statistics across the batch (that is "
                 "BatchNorm).")


# ---------------------------------------------------------------- 5.2 feed-forward


FEED_FORWARD = {"linear1.weight": (32, 8), "linear1.bias": (32,), "linear2.weight": (8, 32),
                "linear2.bias": (8,)}


def linears_from(state):
    """PyTorch's nn.Linear modules holding the weights ``state`` of linear1 and linear2."""
    linear1, linear2 = nn.Linear(8, 32).double(), nn.Linear(32, 8).double()
    for name, linear in (("linear1", linear1), ("linear2", linear2)):
        linear.load_state_dict({"weight": state[f"{name}.weight"], "bias": state[f"{name}.bias"]})
    return linear1, linear2


def check_linears(result, state):
    for name, shape in (("linear1", [32, 8]), ("linear2", [8, 32])):
        assert result["linears"][name] == shape, (
            f"{name} should be an nn.Linear with weight of shape {shape}")
    check_names(result["names"], state, "PositionwiseFeedForward")


@pytest.mark.grade("5.2", points=2, values=True)
def test_feed_forward_formula(learner):
    x = torch.randn(2, 5, 8, dtype=f64)
    state = trusted_state(FEED_FORWARD)
    result = learner.run(feed_forward_run, x=x, state=state)
    check_linears(result, state)
    hidden = F.relu(x @ state["linear1.weight"].T + state["linear1.bias"])
    expected = hidden @ state["linear2.weight"].T + state["linear2.bias"]
    pre_activation = x @ state["linear1.weight"].T + state["linear1.bias"]
    mistake = None if torch.allclose(result["eval"].double(), expected) else first_match(
        result["eval"], {"5.2/no-activation": pre_activation @ state["linear2.weight"].T
                         + state["linear2.bias"],
                         "5.2/gelu": F.gelu(pre_activation) @ state["linear2.weight"].T
                         + state["linear2.bias"]})
    assert_close(result["eval"], expected, "PositionwiseFeedForward(x)", hint=named(mistake)
                 if mistake else "max(0, x W1 + b1) W2 + b2: linear1, ReLU, linear2.")


@pytest.mark.grade("5.2", points=1)
def test_feed_forward_dropout_on_the_hidden_layer(learner):
    x = torch.randn(2, 5, 8, dtype=f64)
    state = trusted_state(FEED_FORWARD)
    result = learner.run(feed_forward_run, x=x, state=state, dropout=0.5)
    check_linears(result, state)
    linear1, linear2 = linears_from(state)
    with torch.no_grad():
        hidden = F.relu(linear1(x))
        assert_close(result["eval"], linear2(hidden), "PositionwiseFeedForward in eval mode",
                     hint="No dropout in eval mode: use nn.Dropout.")
        torch.manual_seed(5)  # replay the same random draw on the hidden activations
        expected = linear2(F.dropout(hidden, 0.5, training=True))
        torch.manual_seed(5)  # the same draw on the output
        on_output = F.dropout(linear2(hidden), 0.5, training=True)
    mistake = first_match(result["train"], {"5.2/dropout-on-output": on_output})
    assert_close(result["train"], expected, "PositionwiseFeedForward in train mode",
                 hint=named(mistake) if mistake else "Dropout goes between ReLU and linear2, "
                 "on the [B, L, d_ff] activations.")


@pytest.mark.grade("5.2", points=1)
def test_feed_forward_own_initialisation(learner):
    check_initialisation(learner.run(fresh_state, name="PositionwiseFeedForward", args=[8, 32]),
                         "PositionwiseFeedForward")


# ---------------------------------------------------------------- 5.3 residual connection


def residual_weights(d_model=8):
    """The grader's weights for the residual's norm and for the sublayer."""
    state = trusted_state({"norm.weight": (d_model,), "norm.bias": (d_model,),
                           "linear.weight": (d_model, d_model), "linear.bias": (d_model,)})
    return ({"weight": state["norm.weight"], "bias": state["norm.bias"]},
            {"weight": state["linear.weight"], "bias": state["linear.bias"]})


def modules_from(norm_state, sublayer_state, d_model=8):
    """PyTorch's LayerNorm and Linear holding the weights of the norm and the sublayer."""
    norm, linear = nn.LayerNorm(d_model).double(), nn.Linear(d_model, d_model).double()
    norm.load_state_dict(norm_state)
    linear.load_state_dict(sublayer_state)
    return norm, linear


def check_has_norm(result, norm_state):
    assert result["has_norm"], "ResidualConnection should hold its LayerNorm as self.norm"
    check_names(result["names"], norm_state, "ResidualConnection's norm",
                hint="self.norm should be your LayerNorm of Exercise 5.1")


@pytest.mark.grade("5.3", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_residual_connection_formula(learner, norm_first):
    x = torch.randn(2, 4, 8, dtype=f64)
    norm_state, sublayer_state = residual_weights()
    result = learner.run(residual_run, x=x, norm_first=norm_first, norm=norm_state,
                         sublayer=sublayer_state)
    check_has_norm(result, norm_state)
    norm, sublayer = modules_from(norm_state, sublayer_state)
    with torch.no_grad():
        expected = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
        post, pre = norm(x + sublayer(x)), x + sublayer(norm(x))
        on_branch = x + norm(sublayer(x))
    placement = "x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"
    mistakes = ({"5.3/always-post-ln": post} if norm_first else
                {"5.3/placements-swapped": pre, "5.3/norm-on-the-branch": on_branch})
    mistake = None if torch.allclose(result["eval"].double(), expected) else first_match(
        result["eval"], mistakes)
    assert_close(result["eval"], expected, f"ResidualConnection(norm_first={norm_first})",
                 hint=named(mistake) if mistake else
                 f"With norm_first={norm_first} the result is {placement}.")
    assert result["calls"] == 1, named("5.3/sublayer-called-twice", calls=result["calls"])


@pytest.mark.grade("5.3", points=1)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_residual_dropout_on_the_sublayer_output(learner, norm_first):
    x = torch.randn(2, 4, 8, dtype=f64)
    norm_state, sublayer_state = residual_weights()
    result = learner.run(residual_run, x=x, norm_first=norm_first, norm=norm_state,
                         sublayer=sublayer_state, dropout=0.5)
    check_has_norm(result, norm_state)
    norm, sublayer = modules_from(norm_state, sublayer_state)
    with torch.no_grad():
        clean = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
        assert_close(result["eval"], clean, "ResidualConnection in eval mode (no dropout)")
        torch.manual_seed(3)
        if norm_first:
            expected = x + F.dropout(sublayer(norm(x)), 0.5)
        else:
            expected = norm(x + F.dropout(sublayer(x), 0.5))
        torch.manual_seed(3)  # the same draw on the sum
        if norm_first:
            on_sum = F.dropout(x + sublayer(norm(x)), 0.5)
        else:
            on_sum = norm(F.dropout(x + sublayer(x), 0.5))
    mistake = first_match(result["train"], {"5.3/dropout-on-the-sum": on_sum})
    assert_close(result["train"], expected, "ResidualConnection in train mode",
                 hint=named(mistake) if mistake else
                 "Dropout applies to the sublayer's output, before it is added to x.")


# ---------------------------------------------------------------- 5.4 and 5.5 layers


def layer_weights(attentions, residuals, d_model=16, d_ff=32):
    """The grader's weights for a layer (the contract's state-dict names): each attention's
    four projections, the feed-forward network and each residual's norm, all distinct, so
    that their order matters."""
    shapes = {f"{attention}.{p}_proj.{kind}": (d_model, d_model) if kind == "weight"
              else (d_model,) for attention in attentions for p in ("q", "k", "v", "out")
              for kind in ("weight", "bias")}
    shapes.update({"feed_forward.linear1.weight": (d_ff, d_model),
                   "feed_forward.linear1.bias": (d_ff,),
                   "feed_forward.linear2.weight": (d_model, d_ff),
                   "feed_forward.linear2.bias": (d_model,)})
    shapes.update({f"residuals.{i}.norm.{kind}": (d_model,) for i in range(residuals)
                   for kind in ("weight", "bias")})
    return trusted_state(shapes)


def check_structure(structure, residuals):
    for name, present in structure.items():
        if name != "residuals":
            assert present, f"the layer should hold {name}"
    assert structure["residuals"] == residuals, (
        f"residuals should be an nn.ModuleList of {residuals} ResidualConnection")


def check_layer_names(own, state, attentions, what):
    """The learner's layer has the contract's state-dict names and shapes: a missing
    projection of an attention is named as such, anything else by :func:`check_names`."""
    for ours in attentions:
        names = [f"{ours}.{p}_proj.weight" for p in "qkv"] + [f"{ours}.out_proj.weight"]
        missing = [name for name in names if name not in own]
        assert not missing, (
            f"{ours} should be Chapter 3's MultiHeadAttention (q_proj, k_proj, v_proj, "
            f"out_proj); the layer's state dict has no {missing[0]}")
    check_names(own, state, what)


def load_into(theirs, state, attentions, residuals):
    """Load the weights ``state`` (the course's names) into PyTorch's layer: in_proj =
    cat(q, k, v), norm{i + 1} from residuals[i].norm, linear1 and linear2 from
    feed_forward."""
    mapped = {}
    for ours, their in attentions:
        for kind in ("weight", "bias"):
            mapped[f"{their}.in_proj_{kind}"] = torch.cat(
                [state[f"{ours}.{p}_proj.{kind}"] for p in "qkv"])
            mapped[f"{their}.out_proj.{kind}"] = state[f"{ours}.out_proj.{kind}"]
    for i in range(residuals):
        for kind in ("weight", "bias"):
            mapped[f"norm{i + 1}.{kind}"] = state[f"residuals.{i}.norm.{kind}"]
    for name in ("linear1", "linear2"):
        for kind in ("weight", "bias"):
            mapped[f"{name}.{kind}"] = state[f"feed_forward.{name}.{kind}"]
    theirs.load_state_dict(mapped)
    return theirs


@pytest.mark.grade("5.4", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "padding mask"])
def test_encoder_layer_matches_pytorch(learner, norm_first, masked):
    x = torch.randn(3, 6, 16, dtype=f64)
    lengths = torch.tensor([6, 4, 2])
    allowed = torch.arange(6) < lengths[:, None]  # [B, L]
    mask = allowed[:, None, None, :] if masked else None
    state = layer_weights(["self_attn"], 2)
    result = learner.run(encoder_layer_run, x=x, norm_first=norm_first, state=state, mask=mask)
    check_structure(result["structure"], 2)
    check_layer_names(result["names"], state, ["self_attn"], "EncoderLayer")
    theirs = load_into(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                                  norm_first=norm_first).double(),
                       state, [("self_attn", "self_attn")], 2)
    mistakes = {}
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=~allowed if masked else None)
        if masked:
            mistakes["5.4/mask-not-passed"] = theirs(x)
        if norm_first:
            post = load_into(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                                        norm_first=False).double(),
                             state, [("self_attn", "self_attn")], 2)
            mistakes["5.4/norm-first-not-passed-on"] = post(
                x, src_key_padding_mask=~allowed if masked else None)
    output = result["output"]
    mistake = mistake_of(output, expected, mistakes)
    assert_close(output, expected, f"EncoderLayer(norm_first={norm_first})"
                 + (" with a padding mask" if masked else "") + ", called as layer(x, mask)",
                 hint=named(mistake) if mistake else "residuals[0] wraps self-attention (with "
                 "the mask), residuals[1] the feed-forward network, in that order.")


def explain_size_error(result, call):
    """Fail with what a size mismatch inside the decoder layer usually means."""
    if "size_error" not in result:
        return
    if result.get("memory_unused"):
        raise AssertionError(f"{call} raised a size mismatch: {result['size_error']}. "
                             + named("5.5/memory-unused"))
    if result["masks_only"]:
        raise AssertionError(named("5.5/masks-swapped", call=call, error=result["size_error"]))
    raise AssertionError(named("5.5/cross-attention-queries", call=call,
                               error=result["size_error"]))


@pytest.mark.grade("5.5", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("masked", [False, True], ids=["no masks", "causal and padding masks"])
def test_decoder_layer_matches_pytorch(learner, norm_first, masked):
    x, memory = torch.randn(2, 5, 16, dtype=f64), torch.randn(2, 7, 16, dtype=f64)  # Lt != Ls
    source_allowed = torch.arange(7) < torch.tensor([7, 3])[:, None]  # [B, Ls]
    target_allowed = torch.arange(5) < torch.tensor([5, 4])[:, None]  # [B, Lt]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    masks = {}
    if masked:
        masks = {"src_mask": source_allowed[:, None, None, :],
                 "tgt_mask": target_allowed[:, None, None, :] & causal}
    state = layer_weights(["self_attn", "cross_attn"], 3)
    result = learner.run(decoder_layer_run, x=x, memory=memory, norm_first=norm_first,
                         state=state, **masks)
    check_structure(result["structure"], 3)
    check_layer_names(result["names"], state, ["self_attn", "cross_attn"], "DecoderLayer")
    call = ("DecoderLayer(x [2, 5, 16], memory [2, 7, 16]"
            + (", src_mask [2, 1, 1, 7], tgt_mask [2, 1, 5, 5])" if masked else ")"))
    explain_size_error(result, call)
    theirs = load_into(nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                                  norm_first=norm_first).double(),
                       state, [("self_attn", "self_attn"), ("cross_attn", "multihead_attn")], 3)
    mistakes = {}
    with torch.no_grad():
        if masked:
            expected = theirs(x, memory, tgt_mask=~causal, tgt_key_padding_mask=~target_allowed,
                              memory_key_padding_mask=~source_allowed)
            mistakes["5.5/self-attention-unmasked"] = theirs(
                x, memory, memory_key_padding_mask=~source_allowed)
        else:
            expected = theirs(x, memory)
    mistake = first_match(result["output"], mistakes)
    assert_close(result["output"], expected, f"DecoderLayer(norm_first={norm_first})"
                 + (" with masks, called as layer(x, memory, src_mask, tgt_mask)" if masked
                    else ""),
                 hint=named(mistake) if mistake else
                 "Self-attention over x with tgt_mask; then cross-attention with queries "
                 "from x and keys and values from memory, with src_mask; then feed-forward.")


@pytest.mark.grade("5.5", points=1)
def test_decoder_output_depends_on_the_memory(learner):
    x = torch.randn(1, 3, 8, dtype=f64)
    memory = torch.randn(1, 4, 8, dtype=f64)
    result = learner.run(decoder_memory_effect, x=x, memory=memory)
    explain_size_error(result, "DecoderLayer(x [1, 3, 8], memory [1, 4, 8])")
    first = assert_tensor(result["first"], "DecoderLayer(x, memory)", shape=(1, 3, 8))
    second = assert_tensor(result["second"], "DecoderLayer(x, memory * 2 + 1)", shape=(1, 3, 8))
    assert not torch.allclose(first, second), named("5.5/memory-unused")


@pytest.mark.grade("5.4", points=1)
def test_layers_keep_shape_and_dtype(learner):
    out = assert_tensor(learner.run(encoder_layer_output, x=torch.randn(2, 3, 8)),
                        "EncoderLayer(x)", shape=(2, 3, 8), dtype=torch.float32)
    assert not torch.isnan(out).any(), "NaN in the encoder layer's output"


@pytest.mark.grade("5.4", points=1)
def test_encoder_layer_own_initialisation(learner):
    check_initialisation(learner.run(fresh_state, name="EncoderLayer", args=[16, 4, 32]),
                         "EncoderLayer")


@pytest.mark.grade("5.5", points=1)
def test_decoder_layer_own_initialisation(learner):
    check_initialisation(learner.run(fresh_state, name="DecoderLayer", args=[16, 4, 32]),
                         "DecoderLayer")


# ---------------------------------------------------------------- 5.6 and 5.7 stacks


def stack_run(impl, name, x, norm_first, state, num_layers=2, memory=None, masks=None,
              dropout=0.0):
    """Encoder or Decoder (``name``) of ``num_layers`` layers (16, 4, 32) with the grader's
    weights ``state``, called as the package calls it: ``encoder(x, mask)``, ``decoder(x,
    memory, src_mask, tgt_mask)``; with ``dropout``, in training mode after
    ``torch.manual_seed(REPLAY_SEED)``. Its structure (how many layers, how many distinct
    ones, a norm), state-dict names and output; for a decoder's size mismatch, its message
    and the output with the two masks handed over swapped (what a stack that swaps them
    computes right)."""
    stack = getattr(impl, name)(16, 4, 32, num_layers, dropout=dropout,
                                norm_first=norm_first).double()
    layers = getattr(stack, "layers", None)
    structure = {"layers": len(layers) if isinstance(layers, nn.ModuleList) else None,
                 "distinct": len({id(layer) for layer in layers})
                 if isinstance(layers, nn.ModuleList) else None,
                 "norm": isinstance(getattr(stack, "norm", None), nn.Module)}
    if structure["layers"] != num_layers or structure["distinct"] != num_layers:
        return {"structure": structure}
    names = load_trusted(stack, state)
    result = {"structure": structure, "names": names}
    if names != {n: list(v.shape) for n, v in state.items()}:
        return result
    masks = masks or {}
    stack.train()

    def call(src_mask, tgt_mask):
        torch.manual_seed(REPLAY_SEED)
        if memory is None:
            return stack(x, masks.get("mask"))
        return stack(x, memory, src_mask, tgt_mask)

    try:
        return {**result, "output": call(masks.get("src_mask"), masks.get("tgt_mask"))}
    except (RuntimeError, ValueError) as error:
        if memory is None or size_error(error) is None:
            raise
        try:
            swapped = call(masks.get("tgt_mask"), masks.get("src_mask"))
        except (RuntimeError, ValueError):
            raise error from None
        return {**result, "size_error": str(error), "swapped": swapped}


def stack_weights(attentions, residuals, norm_first, num_layers=2):
    """The grader's weights of a stack: each layer's (:func:`layer_weights`) under
    ``layers.{i}.``, and the last norm's when ``norm_first``."""
    state = {}
    for i in range(num_layers):
        state.update({f"layers.{i}.{k}": v
                      for k, v in layer_weights(attentions, residuals).items()})
    if norm_first:
        state.update(trusted_state({"norm.weight": (16,), "norm.bias": (16,)}))
    return state


def check_stack(result, name, exercise, num_layers=2):
    structure = result["structure"]
    assert structure["layers"] is not None, (
        f"{name}.layers should be an nn.ModuleList of its {num_layers} layers")
    assert structure["layers"] == num_layers, (
        f"{name}(..., num_layers={num_layers}) has {structure['layers']} layers")
    assert structure["distinct"] == num_layers, named(f"{exercise}/layers-shared",
                                                      count=num_layers)
    assert structure["norm"], (f"{name}.norm should be a LayerNorm (pre-LN) or nn.Identity() "
                               f"(post-LN)")


def torch_stack(layers, state, norm_first, attentions, residuals):
    """PyTorch's layers (``layers``: fresh ones, float64) with the stack's weights, and its
    last norm (an ``nn.LayerNorm`` pre-LN, else nothing)."""
    loaded = [load_into(layer, {k.removeprefix(f"layers.{i}."): v for k, v in state.items()
                                if k.startswith(f"layers.{i}.")}, attentions, residuals)
              for i, layer in enumerate(layers)]
    norm = nn.Identity()
    if norm_first:
        norm = nn.LayerNorm(16).double()
        norm.load_state_dict({"weight": state["norm.weight"], "bias": state["norm.bias"]})
    return loaded, norm


def check_last_norm(result, state, name, exercise, norm_first):
    """A pre-LN stack whose state dict lacks exactly the last norm's weight and bias holds
    no LayerNorm there (nn.Identity() whatever norm_first is): named so."""
    own = set(result["names"])
    assert not (norm_first and set(state) - own == {"norm.weight", "norm.bias"}
                and own <= set(state)), named(f"{exercise}/norm-always-identity", name=name)


def stack_case(norm_first, dropout):
    """How a stack test built and ran the stack, for its messages."""
    return (f"(norm_first={norm_first})" + (f" in training with dropout={dropout}" if dropout
                                             else ""))


STACK_CASES = pytest.mark.parametrize(
    "masked, dropout", [(False, 0.0), (True, 0.0), (True, DROPOUT)],
    ids=["no mask", "masked", f"masked, dropout {DROPOUT} in training"])


@pytest.mark.grade("5.6", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@STACK_CASES
def test_encoder_matches_pytorch(learner, norm_first, masked, dropout):
    x = torch.randn(3, 6, 16, dtype=f64)
    allowed = torch.arange(6) < torch.tensor([6, 4, 2])[:, None]  # [B, L]
    mask = allowed[:, None, None, :] if masked else None
    state = stack_weights(["self_attn"], 2, norm_first)
    result = learner.run(stack_run, name="Encoder", x=x, norm_first=norm_first, state=state,
                         masks={"mask": mask} if masked else None, dropout=dropout)
    check_stack(result, "Encoder", "5.6")
    check_last_norm(result, state, "Encoder", "5.6", norm_first)
    check_names(result["names"], state, "Encoder",
                hint="" if norm_first else "A post-LN stack has no last norm: nn.Identity().")
    layers, norm = torch_stack(
        [nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                    norm_first=norm_first).double() for _ in range(2)],
        state, norm_first, [("self_attn", "self_attn")], 2)

    def replay(**mistaken):
        """The stack's output in training mode, seeded as the worker's run (a mistake's with
        ``mistaken``)."""
        torch.manual_seed(REPLAY_SEED)
        return replay_stack(x, state, **{"heads": 4, "p": dropout, "norm_first": norm_first,
                                         "self_mask": mask, **mistaken})

    with torch.no_grad():
        if dropout:
            expected = replay()
        else:
            y = x
            for layer in layers:
                y = layer(y, src_key_padding_mask=None if mask is None else ~allowed)
            expected = norm(y)
        mistakes = {"5.6/mask-not-passed": replay(self_mask=None)} if masked else {}
        if dropout:
            mistakes["5.6/dropout-not-passed-on"] = replay(p=0.0)
        if norm_first:
            mistakes["5.6/no-final-norm"] = replay(norm_first=False, layers_norm_first=True)
            mistakes["5.6/norm-first-not-passed-on"] = replay(layers_norm_first=False)
        mistakes["5.6/layers-not-chained"] = replay(chained=False)
    output = result["output"]
    mistake = mistake_of(output, expected, mistakes)
    assert_close(output, expected, f"Encoder{stack_case(norm_first, dropout)}"
                 + (" with a padding mask" if masked else "") + ", called as encoder(x, mask)",
                 hint=named(mistake) if mistake else "Each layer in turn (each reads the last "
                 "one's output), with the mask, then the last norm.")


def explain_stack_size_error(result, expected, call):
    """A decoder stack that raised a size mismatch: named when it computes the right output
    with the two masks handed over swapped (it swaps them on their way to the layers)."""
    if "size_error" not in result:
        return
    swapped = result["swapped"]
    if isinstance(swapped, torch.Tensor) and swapped.shape == expected.shape and (
            torch.allclose(swapped.double(), expected)):
        raise AssertionError(named("5.7/masks-swapped", call=call, error=result["size_error"]))
    raise AssertionError(f"{call} raised a size mismatch: {result['size_error']}. Each layer "
                         f"takes layer(x, memory, src_mask, tgt_mask): the source's mask "
                         f"[B, 1, 1, Ls] for cross-attention, the target's [B, 1, Lt, Lt] for "
                         f"self-attention.")


@pytest.mark.grade("5.7", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@STACK_CASES
def test_decoder_matches_pytorch(learner, norm_first, masked, dropout):
    x, memory = torch.randn(2, 5, 16, dtype=f64), torch.randn(2, 7, 16, dtype=f64)
    source_allowed = torch.arange(7) < torch.tensor([7, 3])[:, None]  # [B, Ls]
    target_allowed = torch.arange(5) < torch.tensor([5, 4])[:, None]  # [B, Lt]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    src_mask = source_allowed[:, None, None, :] if masked else None
    tgt_mask = target_allowed[:, None, None, :] & causal if masked else None
    state = stack_weights(["self_attn", "cross_attn"], 3, norm_first)
    result = learner.run(stack_run, name="Decoder", x=x, norm_first=norm_first, state=state,
                         memory=memory, dropout=dropout,
                         masks={"src_mask": src_mask, "tgt_mask": tgt_mask} if masked else None)
    check_stack(result, "Decoder", "5.7")
    check_last_norm(result, state, "Decoder", "5.7", norm_first)
    check_names(result["names"], state, "Decoder",
                hint="" if norm_first else "A post-LN stack has no last norm: nn.Identity().")
    layers, norm = torch_stack(
        [nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                    norm_first=norm_first).double() for _ in range(2)],
        state, norm_first, [("self_attn", "self_attn"), ("cross_attn", "multihead_attn")], 3)
    self_blocked = (~(target_allowed[:, None, :] & causal)).repeat_interleave(4, dim=0)
    cross_blocked = (~source_allowed[:, None, :]).expand(2, 5, 7).repeat_interleave(4, dim=0)

    def replay(**mistaken):
        """The stack's output in training mode, seeded as the worker's run (a mistake's with
        ``mistaken``)."""
        torch.manual_seed(REPLAY_SEED)
        return replay_stack(x, state, **{"heads": 4, "p": dropout, "norm_first": norm_first,
                                         "self_mask": tgt_mask, "memory": memory,
                                         "cross_mask": src_mask, **mistaken})

    with torch.no_grad():
        if dropout:
            expected = replay()
        else:
            y = x
            for layer in layers:
                y = layer(y, memory, tgt_mask=self_blocked if masked else None,
                          memory_mask=cross_blocked if masked else None)
            expected = norm(y)
        mistakes = {}
        if masked:
            mistakes.update({"5.7/masks-not-passed": replay(self_mask=None, cross_mask=None),
                             "5.7/target-mask-not-passed": replay(self_mask=None),
                             "5.7/source-mask-not-passed": replay(cross_mask=None)})
        if dropout:
            mistakes["5.7/dropout-not-passed-on"] = replay(p=0.0)
        if norm_first:
            mistakes["5.7/no-final-norm"] = replay(norm_first=False, layers_norm_first=True)
            mistakes["5.7/norm-first-not-passed-on"] = replay(layers_norm_first=False)
        mistakes["5.7/layers-not-chained"] = replay(chained=False)
    call = (f"Decoder{stack_case(norm_first, dropout)}"
            + (" with masks, called as decoder(x, memory, src_mask, tgt_mask)" if masked
               else ", called as decoder(x, memory)"))
    explain_stack_size_error(result, expected, call)
    output = result["output"]
    mistake = mistake_of(output, expected, mistakes)
    assert_close(output, expected, call, hint=named(mistake) if mistake else "Each layer in "
                 "turn (each reads the last one's output) on the same memory, with both "
                 "masks, then the last norm.")


def stack_depths(impl, name):
    """How many layers a stack has for num_layers = 1 and 3, and its output's shape."""
    shapes = {}
    for depth in (1, 3):
        stack = getattr(impl, name)(8, 2, 16, depth)
        x = torch.randn(2, 3, 8)
        out = stack(x) if name == "Encoder" else stack(x, torch.randn(2, 4, 8))
        shapes[depth] = {"layers": len(getattr(stack, "layers", ())), "output": out}
    return shapes


@pytest.mark.grade("5.6", points=1)
def test_encoder_depth_and_shape(learner):
    found = learner.run(stack_depths, name="Encoder")
    for depth, seen in found.items():
        assert seen["layers"] == depth, f"Encoder(..., num_layers={depth}) has " \
                                        f"{seen['layers']} layers"
        assert_tensor(seen["output"], f"Encoder(num_layers={depth})(x)", shape=(2, 3, 8),
                      dtype=torch.float32)


@pytest.mark.grade("5.7", points=1)
def test_decoder_depth_and_shape(learner):
    found = learner.run(stack_depths, name="Decoder")
    for depth, seen in found.items():
        assert seen["layers"] == depth, f"Decoder(..., num_layers={depth}) has " \
                                        f"{seen['layers']} layers"
        assert_tensor(seen["output"], f"Decoder(num_layers={depth})(x, memory)",
                      shape=(2, 3, 8), dtype=torch.float32)


# ---------------------------------------------------------------- 5.8 the encoder-decoder

VOCAB, MAX_LEN = 11, 12


def model_run(impl, state, tie, norm_first, src, tgt, src_mask, tgt_mask, memory,
              dropout=0.0):
    """The learner's EncoderDecoder (V = 11, d_model 16, 4 heads, d_ff 32, 2 layers, with
    ``dropout``) with the grader's weights ``state``: its state-dict names, then ``encode``
    and ``decode`` (of the grader's ``memory``) in training mode, each after
    ``torch.manual_seed(REPLAY_SEED)``, and ``forward`` (in evaluation mode when it has
    dropout), as the package calls them; a size mismatch in ``forward``, its message."""
    model = impl.EncoderDecoder(VOCAB, VOCAB, 16, 4, 32, 2, dropout=dropout,
                                norm_first=norm_first, tie_embeddings=tie,
                                max_len=MAX_LEN).double()
    names = load_trusted(model, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    model.train()
    torch.manual_seed(REPLAY_SEED)
    encoded = model.encode(src, src_mask)
    torch.manual_seed(REPLAY_SEED)
    result = {"names": names, "memory": encoded,
              "hidden": model.decode(memory, src_mask, tgt, tgt_mask)}
    model.train(not dropout)
    try:
        return {**result, "logits": model(src, tgt, src_mask, tgt_mask)}
    except (RuntimeError, ValueError) as error:
        if size_error(error) is None:
            raise
        return {**result, "forward_error": str(error)}


def model_weights(norm_first, tie):
    """The grader's weights of the whole model, by the contract's names: distinct embeddings
    and generator, or (``tie``) one matrix under all three names; the sinusoidal tables."""
    state = {}
    for stack, attentions, residuals in (("encoder", ["self_attn"], 2),
                                         ("decoder", ["self_attn", "cross_attn"], 3)):
        state.update({f"{stack}.{k}": v
                      for k, v in stack_weights(attentions, residuals, norm_first).items()})
    matrices = trusted_state({"src": (VOCAB, 16), "tgt": (VOCAB, 16), "generator": (VOCAB, 16),
                              "generator.bias": (VOCAB,)})
    shared = matrices["src"]
    state.update({"src_embed.tokens.embedding.weight": shared,
                  "tgt_embed.tokens.embedding.weight": shared if tie else matrices["tgt"],
                  "generator.weight": shared if tie else matrices["generator"],
                  "generator.bias": matrices["generator.bias"]})
    for side in ("src", "tgt"):
        state[f"{side}_embed.positions.pe"] = sinusoidal_table(MAX_LEN, 16).double()
    return state


def torch_model(state, norm_first, tie):
    config = types.SimpleNamespace(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, num_layers=2,
                                   d_model=16, d_ff=32, num_heads=4, dropout=0.0,
                                   max_len=MAX_LEN, norm_first=norm_first,
                                   tie_embeddings=tie)
    model = TorchEncoderDecoder(config).double().train()  # dropout 0: train mode keeps
    model.load_course_state_dict(state)  # PyTorch's layers off their inference fast path
    return model


def model_replays(tokens, state, side, p, **stack):
    """``{what had no dropout: output}``: a side (``"src"``: encode, ``"tgt"``: decode) of the
    model replayed in training mode with its dropout left out of the embeddings, the stack
    or both, seeded as the worker's run; ``""`` for the right output."""
    stack_prefix = "encoder." if side == "src" else "decoder."
    found = {}
    for what, embedding_p, stack_p in (("", p, p), ("the embeddings", 0.0, p),
                                       ("the stack", p, 0.0),
                                       ("the embeddings and the stack", 0.0, 0.0)):
        torch.manual_seed(REPLAY_SEED)
        x = replay_embedding(tokens, state, f"{side}_embed.", embedding_p)
        found[what] = replay_stack(x, state, stack_prefix, heads=4, p=stack_p, **stack)
    return found


def check_dropout_reached(output, replays, what, dropout):
    """``output`` is the training pass replayed (``replays[""]``), or a message naming the
    parts that drew no dropout."""
    missing = first_match(output, {k: v for k, v in replays.items() if k})
    assert_close(output, replays[""], f"{what} in training with dropout={dropout}",
                 hint=named("5.8/dropout-not-passed-on", call=what, parts=missing)
                 if missing else "Every part draws its dropout: the embeddings, then each "
                 "layer's sublayers in turn.")


@pytest.mark.grade("5.8", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("tie, dropout", [(True, 0.0), (False, 0.0), (False, DROPOUT)],
                         ids=["tied", "untied", f"untied, dropout {DROPOUT} in training"])
def test_encoder_decoder_matches_pytorch(learner, norm_first, tie, dropout):
    src = torch.randint(3, VOCAB, (2, 7))
    tgt = torch.randint(3, VOCAB, (2, 5))
    source_allowed = torch.arange(7) < torch.tensor([7, 4])[:, None]  # [B, Ls]
    src_mask = source_allowed[:, None, None, :]
    tgt_mask = (torch.arange(5) < torch.tensor([5, 3])[:, None])[:, None, None, :] & torch.ones(
        5, 5, dtype=torch.bool).tril()
    state = model_weights(norm_first, tie)
    theirs = torch_model(state, norm_first, tie)
    with torch.no_grad():
        memory = theirs.encode(src, src_mask)
    result = learner.run(model_run, state=state, tie=tie, norm_first=norm_first, src=src,
                         tgt=tgt, src_mask=src_mask, tgt_mask=tgt_mask, memory=memory,
                         dropout=dropout)
    check_names(result["names"], state, f"EncoderDecoder(tie_embeddings={tie})",
                hint="src_embed and tgt_embed are each embeddings(...), given in the file; "
                "the stacks are encoder and decoder; the last layer is generator.")
    call = f"EncoderDecoder(norm_first={norm_first}, tie_embeddings={tie}, dropout={dropout})"
    with torch.no_grad():
        hidden = theirs.decode(memory, src_mask, tgt, tgt_mask)
        logits = theirs.projection(hidden)
        if dropout:
            check_dropout_reached(result["memory"], model_replays(
                src, state, "src", dropout, norm_first=norm_first, self_mask=src_mask),
                f"{call}.encode(src, src_mask)", dropout)
            check_dropout_reached(result["hidden"], model_replays(
                tgt, state, "tgt", dropout, norm_first=norm_first, self_mask=tgt_mask,
                memory=memory, cross_mask=src_mask),
                f"{call}.decode(memory, src_mask, tgt, tgt_mask)", dropout)
        # The hidden states of each mistake, then its logits.
        wrong = {"5.8/cross-attention-unmasked": theirs.decode(memory, None, tgt, tgt_mask)}
        if not tie:
            theirs.tgt_embed.weight = theirs.src_embed.weight
            wrong["5.8/target-read-by-source-embedding"] = theirs.decode(
                memory, src_mask, tgt, tgt_mask)
        wrong_logits = {"5.8/log-probabilities": F.log_softmax(logits, dim=-1),
                        **{m: theirs.projection(h) for m, h in wrong.items()}}
        wrong["5.8/generator-in-decode"] = logits
    if not dropout:
        assert_close(result["memory"], memory, f"{call}.encode(src, src_mask)",
                     hint="The encoder reads src_embed(src), with the source's mask.")
        found = result["hidden"]
        mistake = mistake_of(found, hidden, wrong)
        assert mistake != "5.8/generator-in-decode", named(mistake)  # its shape is [B, Lt, V]
        assert_close(found, hidden, f"{call}.decode(memory, src_mask, tgt, tgt_mask)",
                     hint=named(mistake) if mistake else "The decoder reads tgt_embed(tgt) and "
                     "the memory, with both masks.")
    assert "forward_error" not in result, (
        f"{call}(src, tgt, src_mask, tgt_mask) raised a size mismatch: "
        f"{result['forward_error']}. forward is generator(decode(encode(src, src_mask), "
        f"src_mask, tgt, tgt_mask)): decode gives [B, Lt, D], the generator [B, Lt, V].")
    output = result["logits"]
    mistake = mistake_of(output, logits, wrong_logits)
    assert_close(output, logits, f"{call}(src, tgt, src_mask, tgt_mask)"
                 + (" in evaluation mode" if dropout else ""),
                 hint=named(mistake) if mistake else "generator(decode(encode(src, src_mask), "
                 "src_mask, tgt, tgt_mask)).")


def model_ties(impl):
    """Which of the three matrices are one parameter, tied and untied; the error for two
    vocabularies tied."""
    found = {}
    for tie in (True, False):
        model = impl.EncoderDecoder(VOCAB, VOCAB, 8, 2, 16, 1, tie_embeddings=tie)
        weights = dict(model.named_parameters(remove_duplicate=False))
        source = weights.get("src_embed.tokens.embedding.weight")
        target, generator = (weights.get(name) for name in (
            "tgt_embed.tokens.embedding.weight", "generator.weight"))
        found[tie] = {"names": source is not None,
                      "target": target is source, "generator": generator is source,
                      "how": {"target": untied_how(target, source),
                              "generator": untied_how(generator, source)},
                      "count": sum(p.numel() for p in model.parameters())}
    try:
        impl.EncoderDecoder(VOCAB, VOCAB + 2, 8, 2, 16, 1, tie_embeddings=True)
        found["two vocabularies"] = None
    except ValueError as error:
        found["two vocabularies"] = str(error)
    return found


@pytest.mark.grade("5.8", points=1)
def test_encoder_decoder_ties_one_matrix(learner):
    found = learner.run(model_ties)
    tied, untied = found[True], found[False]
    assert tied["names"], (
        "EncoderDecoder has no src_embed.tokens.embedding.weight: build src_embed and "
        "tgt_embed with embeddings(...), given in the file, whose modules are named tokens "
        "and positions (a checkpoint saves them by these names).")
    apart = [name for name in ("target", "generator") if not tied[name]]
    assert not apart, named("5.8/not-tied", missing=" and ".join(
        f"the {name}'s" for name in apart) + (" weights" if len(apart) > 1 else " weight"),
        how="; ".join(f"the {name}'s is {tied['how'][name]}" for name in apart))
    assert not untied["target"] and not untied["generator"], (
        "EncoderDecoder(tie_embeddings=False) shares the source embedding's matrix: untied, "
        "tgt_embed and generator keep matrices of their own.")
    assert untied["count"] - tied["count"] == 2 * VOCAB * 8, (
        f"tied, the model should have 2 x V x d_model = {2 * VOCAB * 8} parameters fewer than "
        f"untied; it has {untied['count'] - tied['count']} fewer: one nn.Parameter, shared.")
    assert found["two vocabularies"] is not None, (
        "EncoderDecoder(11, 13, ..., tie_embeddings=True) should raise ValueError: one matrix "
        "cannot serve two vocabularies.")
    assert "11" in found["two vocabularies"] and "13" in found["two vocabularies"], (
        f"the ValueError should name both vocabulary sizes (11 and 13); it says: "
        f"{found['two vocabularies']!r}")


def model_initialisation(impl):
    torch.manual_seed(0)
    model = impl.EncoderDecoder(40, 40, 16, 4, 32, 2, tie_embeddings=False)
    return {name: value for name, value in model.state_dict().items() if value.dim() == 2
            and not name.endswith(".pe")}


@pytest.mark.grade("5.8", points=1)
def test_encoder_decoder_xavier_initialisation(learner):
    state = learner.run(model_initialisation)
    assert state, "EncoderDecoder has no weight matrices"
    for name, weight in state.items():
        fan_out, fan_in = weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        largest = weight.abs().max().item()
        assert largest <= bound * (1 + 1e-6), named(
            "5.8/not-xavier", name=name, largest=f"{largest:.3g}", bound=f"{bound:.3g}")
        assert largest > 0.5 * bound, (
            f"{name} [{fan_out}, {fan_in}] is at most {largest:.3g} at initialisation, far "
            f"inside Xavier's bound {bound:.3g}: use nn.init.xavier_uniform_.")


# ---------------------------------------------------------------- 5.2 to 5.8: dtype, device,
# gradients. Each module, built and converted with .double() then .to(dtype) (float32: back
# with .float()), holds the grader's weights in that dtype; its output keeps the dtype, and
# the gradients of (output * upstream).sum() for its float inputs and every parameter are
# autograd's of the same computation written with PyTorch's own ops (checks.replay_*), in
# float64. Then, moved to the "meta" device (a stand-in for a GPU: a tensor made on the CPU
# clashes with it), its output is there.

CONTRACT_TOLERANCES = {f64: {"atol": 1e-6, "rtol": 1e-5},
                       torch.float32: {"atol": 1e-4, "rtol": 1e-4}}


def contract_module(impl, exercise):
    """The module of ``exercise`` as the contract tests build it: pre-LN, dropout 0 (5.3's
    sublayer is the grader's nn.Linear, held apart: it is no parameter of the residual)."""
    if exercise == "5.2":
        return impl.PositionwiseFeedForward(8, 32, dropout=0.0)
    if exercise == "5.3":
        return impl.ResidualConnection(8, dropout=0.0, norm_first=True)
    if exercise in ("5.4", "5.5"):
        layer = impl.EncoderLayer if exercise == "5.4" else impl.DecoderLayer
        return layer(16, 4, 32, dropout=0.0, norm_first=True)
    if exercise in ("5.6", "5.7"):
        stack = impl.Encoder if exercise == "5.6" else impl.Decoder
        return stack(16, 4, 32, 2, dropout=0.0, norm_first=True)
    return impl.EncoderDecoder(VOCAB, VOCAB, 16, 4, 32, 2, dropout=0.0, norm_first=True,
                               tie_embeddings=False, max_len=MAX_LEN)


def contract_run(impl, exercise, state, inputs, masks, upstream, sublayer=None, on_meta=True):
    """``exercise``'s module (:func:`contract_module`) in the dtype of ``upstream``, with the
    grader's weights ``state`` (loaded when the names and shapes are the contract's), called
    as the package calls it on ``inputs`` (``{name: tensor}``, in order; the float ones made
    leaves that require grad) then ``masks`` (a list, None for a mask not given); 5.3's
    ``sublayer``, the grader's nn.Linear weights. Its output, the gradients of
    ``(output * upstream).sum()`` for the float inputs and every parameter (None for one
    the output does not reach), and (``on_meta``) the output's device on the "meta" device,
    with no masks given (where the code under test makes any tensor of its own; PyTorch
    computes on the meta device in Python, slowly: once). For a size mismatch, its message
    (the tests of the values tell what it means)."""
    dtype = upstream.dtype
    module = contract_module(impl, exercise).double().to(dtype)
    names = load_trusted(module, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    leaves = {name: value.clone().requires_grad_(True) if value.is_floating_point() else value
              for name, value in inputs.items()}
    parameters = {name: value for name, value in leaves.items() if value.requires_grad}
    parameters.update(module.named_parameters())
    extra = []
    if sublayer is not None:
        linear = nn.Linear(8, 8).to(dtype)
        linear.load_state_dict(sublayer)
        parameters.update({f"sublayer.{n}": v for n, v in linear.named_parameters()})
        extra = [linear]

    def call(tensors, given):
        return module(*tensors, *extra, *given)

    try:
        output = call(leaves.values(), masks)
    except (RuntimeError, ValueError) as error:
        message = size_error(error)
        if message is None:
            raise
        return {"names": names, "size_error": message}
    on_graph = (isinstance(output, torch.Tensor) and output.requires_grad
                and output.shape == upstream.shape)  # a wrong shape is the grader's to tell
    grads = (torch.autograd.grad((output * upstream).sum(), list(parameters.values()),
                                 allow_unused=True) if on_graph else [None] * len(parameters))
    result = {"names": names, "output": sent(output),
              "grads": {name: None if g is None else g.detach()
                        for name, g in zip(parameters, grads, strict=True)}}
    if on_meta:
        for part in (module, *extra):
            part.to("meta")
        moved = call([value.to("meta") for value in inputs.values()], [None] * len(masks))
        result["device"] = moved.device.type if isinstance(moved, torch.Tensor) else None
    return result


def sent(value):
    """A tensor, detached; anything else that is not plain data, by the name of its type."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    return None if value is None else {"not a tensor": type(value).__name__}


def padding_mask(lengths, length):
    """``[B, 1, 1, L]``, True at the first ``lengths[b]`` positions (Chapter 4's)."""
    return (torch.arange(length) < torch.tensor(lengths)[:, None])[:, None, None, :]


def target_mask(lengths, length):
    """``[B, 1, L, L]``: padding and causal (Chapter 4's)."""
    return padding_mask(lengths, length) & torch.ones(length, length, dtype=torch.bool).tril()


def contract_case(exercise):
    """``(state, inputs, masks, sublayer, reference)`` of a contract test: the grader's
    weights, the inputs (float64, or token ids), the masks handed over after them, 5.3's
    sublayer weights, and ``reference(weights, inputs)``: the output in PyTorch's own ops
    from ``{name: tensor}`` of the weights (state-dict names; 5.3's sublayer's as
    ``sublayer.weight``, ``sublayer.bias``) and of the inputs."""
    replay = {"heads": 4, "p": 0.0, "norm_first": True}
    if exercise == "5.2":
        return (trusted_state(FEED_FORWARD), {"x": torch.randn(2, 3, 8, dtype=f64)}, [], None,
                lambda w, i: F.linear(F.relu(F.linear(
                    i["x"], w["linear1.weight"], w["linear1.bias"])), w["linear2.weight"],
                    w["linear2.bias"]))
    if exercise == "5.3":
        norm, sublayer = residual_weights()
        return ({f"norm.{n}": v for n, v in norm.items()}, {"x": torch.randn(2, 3, 8, dtype=f64)},
                [], sublayer,
                lambda w, i: i["x"] + F.linear(replay_norm(i["x"], w, "norm."),
                                               w["sublayer.weight"], w["sublayer.bias"]))
    source, target = padding_mask([5, 3], 5), target_mask([4, 2], 4)
    x, memory = torch.randn(2, 4, 16, dtype=f64), torch.randn(2, 5, 16, dtype=f64)
    if exercise in ("5.4", "5.6"):
        weights = (layer_weights(["self_attn"], 2) if exercise == "5.4"
                   else stack_weights(["self_attn"], 2, norm_first=True))
        run = replay_layer if exercise == "5.4" else replay_stack
        return (weights, {"x": torch.randn(2, 5, 16, dtype=f64)}, [source], None,
                lambda w, i: run(i["x"], w, "", self_mask=source, **replay))
    if exercise in ("5.5", "5.7"):
        weights = (layer_weights(["self_attn", "cross_attn"], 3) if exercise == "5.5"
                   else stack_weights(["self_attn", "cross_attn"], 3, norm_first=True))
        run = replay_layer if exercise == "5.5" else replay_stack
        return (weights, {"x": x, "memory": memory}, [source, target], None,
                lambda w, i: run(i["x"], w, "", self_mask=target, memory=i["memory"],
                                 cross_mask=source, **replay))
    tokens = {"src": torch.randint(3, VOCAB, (2, 5)), "tgt": torch.randint(3, VOCAB, (2, 4))}

    def model(w, i):
        encoded = replay_stack(replay_embedding(i["src"], w, "src_embed.", 0.0), w,
                               "encoder.", self_mask=source, **replay)
        hidden = replay_stack(replay_embedding(i["tgt"], w, "tgt_embed.", 0.0), w, "decoder.",
                              self_mask=target, memory=encoded, cross_mask=source, **replay)
        return F.linear(hidden, w["generator.weight"], w["generator.bias"])

    return model_weights(norm_first=True, tie=False), tokens, [source, target], None, model


CONTRACT_CALLS = {"5.2": "PositionwiseFeedForward(8, 32)(x)",
                  "5.3": "ResidualConnection(8, norm_first=True)(x, sublayer)",
                  "5.4": "EncoderLayer(16, 4, 32, norm_first=True)(x, mask)",
                  "5.5": "DecoderLayer(16, 4, 32, norm_first=True)(x, memory, src_mask, "
                         "tgt_mask)",
                  "5.6": "Encoder(16, 4, 32, 2, norm_first=True)(x, mask)",
                  "5.7": "Decoder(16, 4, 32, 2, norm_first=True)(x, memory, src_mask, tgt_mask)",
                  "5.8": "EncoderDecoder(11, 11, 16, 4, 32, 2, norm_first=True, "
                         "tie_embeddings=False)(src, tgt, src_mask, tgt_mask)"}
# Mistakes of these contracts that a variant makes: the device's is named by PyTorch's words
# for a clash (mistakes.run_naming), the others by their signature (:func:`gradient_mistake`).
DEVICE_MISTAKES = {"5.2": "5.2/device-not-kept", "5.4": "5.4/device-not-kept",
                   "5.6": "5.6/device-not-kept", "5.8": "5.8/device-not-kept"}


def check_contract(learner, exercise, dtype):
    """``exercise``'s module in ``dtype``: its output keeps the dtype and is right, its
    gradients (inputs and every parameter) are autograd's of the reference in float64, and
    (float32, the dtype a model trains in: once is enough) on the meta device its output is
    there."""
    state, inputs, masks, sublayer, reference = contract_case(exercise)
    weights = {name: value.clone().requires_grad_(not name.endswith(".pe"))
               for name, value in {**state, **{f"sublayer.{n}": v for n, v in
                                               (sublayer or {}).items()}}.items()}
    leaves = {name: value.clone().requires_grad_(value.is_floating_point())
              for name, value in inputs.items()}
    expected = reference(weights, leaves)
    upstream = torch.randn(expected.shape, dtype=f64)
    arguments = {"exercise": exercise, "state": {n: v.to(dtype) for n, v in state.items()},
                 "inputs": {n: v.to(dtype) if v.is_floating_point() else v
                            for n, v in inputs.items()},
                 "masks": masks, "upstream": upstream.to(dtype),
                 "sublayer": sublayer and {n: v.to(dtype) for n, v in sublayer.items()},
                 "on_meta": dtype == torch.float32}
    if exercise in DEVICE_MISTAKES:
        result = run_naming(learner, contract_run, DEVICE_CLASH, DEVICE_MISTAKES[exercise],
                            **arguments)
    else:
        result = learner.run(contract_run, **arguments)
    call = CONTRACT_CALLS[exercise]
    check_names(result["names"], state, call.split("(")[0])
    what = f"{call} in {dtype}"
    assert "size_error" not in result, (
        f"{what} raised a size mismatch: {result.get('size_error')}. The tests of its values "
        f"tell what goes where; this one checks its dtype, device and gradients")
    tolerance = CONTRACT_TOLERANCES[dtype]
    output = assert_tensor(result["output"], what, shape=expected.shape)
    right = torch.allclose(output.double(), expected.detach(), **tolerance)
    assert output.dtype == dtype, (
        named("5.8/dtype-changed", dtype=dtype, got=output.dtype)
        if right and exercise == "5.8" else
        f"{what} (its weights and inputs in {dtype}) gives {output.dtype}, not {dtype}. "
        f"{KEEP_DTYPE}")
    assert_close(output, expected, what, **tolerance)
    wanted = [name for name, value in {**weights, **leaves}.items() if value.requires_grad]
    grads = dict(zip(wanted, torch.autograd.grad((expected * upstream).sum(),
                                                 [{**weights, **leaves}[n] for n in wanted]),
                     strict=True))
    mistake = gradient_mistake(exercise, result["grads"], grads, reference, weights, leaves,
                               upstream, tolerance)
    for name, want in grads.items():
        got = result["grads"].get(name)
        assert got is not None, named(mistake) if mistake else (
            f"no gradient reaches {name} through {what}: is it used in forward, as an "
            f"nn.Parameter (or input) on autograd's graph (no .detach(), .item(), .tolist(), "
            f"NumPy or torch.no_grad() on the way)?")
        assert_close(got, want, f"the gradient of {what} with respect to {name}",
                     hint=named(mistake) if mistake else "", **tolerance)
    assert dtype != torch.float32 or result["device"] == "meta", (
        f"{call} moved to the meta device (a stand-in for a GPU), with its inputs there"
        + (" and no masks," if masks else "") + f" gives its output on {result['device']}: "
        f"make every new tensor on the inputs' device (device=x.device, torch.zeros_like(x)), "
        f"never on the CPU by default, and move nothing to the CPU")


def gradient_mistake(exercise, got, wanted, reference, weights, inputs, upstream, tolerance):
    """The id of a known mistake whose gradients ``got`` are (their output was right):
    ``X.Y/memory-detached``, no gradient reaches the memory (5.5, 5.7) or the encoder and
    the source embedding behind it (5.8) while every other one is right; ``5.3/skip-
    detached``, x's is the gradient through the sublayer's branch alone (x detached where
    it is added back). None for none."""
    if exercise == "5.3":
        x = inputs["x"].detach().requires_grad_(True)
        branch = reference(weights, {"x": x}) - x + x.detach()
        (skipped,) = torch.autograd.grad((branch * upstream).sum(), x)
        return first_match(got.get("x"), {"5.3/skip-detached": skipped.to(upstream.dtype)},
                           **tolerance)
    behind = {"5.5": ("memory",), "5.7": ("memory",), "5.8": ("encoder.", "src_embed.")}
    if exercise not in behind:
        return None
    cut = {name for name in wanted if name.startswith(behind[exercise])}
    if {name for name in wanted if got.get(name) is None} != cut:
        return None
    rest_right = all(
        got[name].shape == want.shape and torch.allclose(got[name].double(), want, **tolerance)
        for name, want in wanted.items() if name not in cut)
    return f"{exercise}/memory-detached" if rest_right else None


@pytest.mark.grade("5.2", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_feed_forward_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.2", dtype)


@pytest.mark.grade("5.3", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_residual_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.3", dtype)


@pytest.mark.grade("5.4", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_encoder_layer_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.4", dtype)


@pytest.mark.grade("5.5", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_decoder_layer_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.5", dtype)


@pytest.mark.grade("5.6", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_encoder_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.6", dtype)


@pytest.mark.grade("5.7", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_decoder_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.7", dtype)


@pytest.mark.grade("5.8", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_encoder_decoder_keeps_dtype_device_and_gradients(learner, dtype):
    check_contract(learner, "5.8", dtype)
