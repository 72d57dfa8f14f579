"""Graded tests of chapter 3: splitting into heads, merging them, multi-head attention.

Reference: ``torch.nn.MultiheadAttention(batch_first=True)`` with the same weights, in
float64. PyTorch's masks are True where attention is *blocked*: the tests translate. The
weights are the grader's own (``checks.trusted_state``), loaded into the learner's module
by its state-dict names (the contract: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``);
the learner's own initialisation is checked on its own.

The functions above the tests (``split_heads_of``, ``attention_module_run``, ...) are
*probes*: they run in the grading worker, with ``impl`` the chapter module under test, and
return plain data. Everything else runs in the grader, which never imports the code under
test: it loads the weights it sends the probe into PyTorch's own module and compares.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from annotated_transformer.course.grading.outcomes import LearnerRaised

from checks import (
    ATTENTION_OPS,
    LOGSUMEXP_OPS,
    SOFTMAX_OPS,
    assert_close,
    assert_tensor,
    check_initialisation,
    load_trusted,
    trusted_state,
)
from mistakes import DEVICE_CLASH, first_match, named, run_naming

CHAPTER = 3
EXERCISES = {
    "3.1": "split_heads: [B, L, D] -> [B, H, L, d_k]",
    "3.2": "merge_heads: [B, H, L, d_k] -> [B, L, D]",
    "3.3": "MultiHeadAttention: project, split, attend, merge, project",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"3.3": ("2.2", "3.1", "3.2")}
FORBIDDEN = {"3.3": ("MultiheadAttention", "scaled_dot_product_attention",
                     "multi_head_attention_forward", "Transformer", "TransformerEncoder",
                     "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer")}
# The same, refused at PyTorch's dispatch level while the exercise's code runs: the fused
# attention of nn.MultiheadAttention and of F.scaled_dot_product_attention, and the softmax
# of its slow path (nn.MultiheadAttention with need_weights=True, reached by any road, e.g.
# nn.Transformer(...).encoder.layers[0].self_attn). The attention of 3.3 is the learner's
# own of Exercise 2.2.
FORBIDDEN_OPS = {"3.3": (*ATTENTION_OPS, *SOFTMAX_OPS, *LOGSUMEXP_OPS)}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
f64 = torch.float64


def reference_split(x, heads):
    """Head h of position l is x[b, l, h*d_k:(h+1)*d_k], built slice by slice."""
    d_k = x.size(-1) // heads
    return torch.stack([x[..., h * d_k:(h + 1) * d_k] for h in range(heads)], dim=1)


# ---------------------------------------------------------------- probes (run in the worker)


def sent(value):
    """A tensor as it is; anything else that is not plain data, by the name of its type."""
    if value is None or isinstance(value, (torch.Tensor, tuple, list)):
        return value
    return {"not a tensor": type(value).__name__}


def split_heads_of(impl, x, heads):
    return sent(impl.split_heads(x, heads))


def split_heads_of_transposed(impl, x, heads):
    """split_heads of ``x.transpose(0, 1)``: a non-contiguous input."""
    return sent(impl.split_heads(x.transpose(0, 1), heads))


def merge_heads_of_split(impl, x, heads):
    """merge_heads of ``x`` split slice by slice: a non-contiguous [B, H, L, d_k]."""
    return sent(impl.merge_heads(reference_split(x, heads)))


def split_or_merge(impl, exercise, x, heads):
    """split_heads of ``x`` (``exercise`` "3.1"), or merge_heads of ``x`` split slice by
    slice ("3.2")."""
    return (impl.split_heads(x, heads) if exercise == "3.1"
            else impl.merge_heads(reference_split(x, heads)))


def heads_gradient(impl, exercise, x, heads, upstream):
    """:func:`split_or_merge` of ``x`` made a leaf that requires grad: the result, and the
    gradient of ``(result * upstream).sum()`` with respect to x (None when the result is off
    autograd's graph)."""
    x = x.clone().requires_grad_(True)
    output = split_or_merge(impl, exercise, x, heads)
    on_graph = isinstance(output, torch.Tensor) and output.requires_grad
    return {"output": sent(output),
            "grad": torch.autograd.grad((output * upstream).sum(), x)[0] if on_graph else None}


def heads_on_meta(impl, exercise, x, heads):
    """The device of :func:`split_or_merge` of ``x`` moved to the "meta" device (a stand-in
    for a GPU: a tensor made on the CPU would clash with it)."""
    output = split_or_merge(impl, exercise, x.to("meta"), heads)
    return output.device.type if isinstance(output, torch.Tensor) else None


def module_contract(impl, query, memory, upstream, state):
    """MultiHeadAttention(16, 4) in the dtype of ``state`` (the grader's weights, loaded when
    the names and shapes are the contract's), on leaves that require grad: its output, its
    attention_weights, the gradients of ``(output * upstream).sum()`` with respect to query,
    memory (key and value) and every parameter (None for one it is not connected to), and
    the devices of the output and the weights on the "meta" device (a stand-in for a GPU)."""
    module = impl.MultiHeadAttention(16, 4).to(next(iter(state.values())).dtype)
    names = load_trusted(module, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    query, memory = (t.clone().requires_grad_(True) for t in (query, memory))
    output = module(query, memory, memory)
    weights = getattr(module, "attention_weights", None)
    inputs = {"query": query, "memory": memory, **dict(module.named_parameters())}
    grads = (torch.autograd.grad((output * upstream).sum(), list(inputs.values()),
                                 allow_unused=True)
             if isinstance(output, torch.Tensor) and output.requires_grad else [None] * len(inputs))
    module.to("meta")
    on_meta = module(query.detach().to("meta"), memory.detach().to("meta"),
                     memory.detach().to("meta"))
    return {"names": names, "output": sent(output), "weights": sent(weights),
            "grads": dict(zip(inputs, grads, strict=True)),
            "devices": [getattr(t, "device", None) and t.device.type
                        for t in (on_meta, getattr(module, "attention_weights", None))]}


def new_module(impl, d_model, heads):
    impl.MultiHeadAttention(d_model, heads)


def attention_module_run(impl, query, key, value, d_model, heads, bias=True, mask=None,
                         double=True, state=None):
    """A fresh MultiHeadAttention with the grader's weights ``state`` (when given and its
    names and shapes are the contract's), its output and its attention weights; the
    names and shapes of its own state dict."""
    module = impl.MultiHeadAttention(d_model, heads, bias=bias)
    if double:
        module = module.double()
    linear = {proj: isinstance(getattr(module, proj, None), nn.Linear) for proj in PROJECTIONS}
    names = ({n: list(v.shape) for n, v in module.state_dict().items()} if state is None
             else load_trusted(module, state))
    result = {"linear": linear, "names": names}
    if state is not None and names != {n: list(v.shape) for n, v in state.items()}:
        return result  # the grader names what differs
    output = module(query, key, value) if mask is None else module(query, key, value, mask=mask)
    weights = getattr(module, "attention_weights", None)
    return {**result, "output": sent(output), "weights": sent(weights),
            "weights_require_grad": bool(getattr(weights, "requires_grad", False))}


def fresh_state(impl, d_model, heads):
    """The state dict of a MultiHeadAttention as its constructor initialises it."""
    return dict(impl.MultiHeadAttention(d_model, heads).state_dict())


def parameter_names(impl, d_model, heads, bias):
    return [name for name, _ in impl.MultiHeadAttention(d_model, heads, bias=bias)
            .named_parameters()]


def parameter_gradients(impl, query, memory):
    module = impl.MultiHeadAttention(8, 2)
    module(query, memory, memory).pow(2).sum().backward()
    return {name: parameter.grad for name, parameter in module.named_parameters()}


def eval_and_training_runs(impl, x):
    module = impl.MultiHeadAttention(8, 2, dropout=0.5)
    module.eval()
    first, second = module(x, x, x), module(x, x, x)
    eval_weights = module.attention_weights
    module.train()
    module(x, x, x)
    return {"first": sent(first), "second": sent(second), "eval_weights": sent(eval_weights),
            "train_weights": sent(module.attention_weights)}


# ---------------------------------------------------------------- grader-side helpers


def tensor(value, name, shape=None):
    """``assert_tensor`` that also names what came back when it was not plain data."""
    if isinstance(value, dict) and "not a tensor" in value:
        raise AssertionError(f"{name} should be a torch.Tensor, but it is a "
                             f"{value['not a tensor']}")
    return assert_tensor(value, name, shape=shape)


def trusted_weights(d_model=16, bias=True):
    """The grader's weights for MultiHeadAttention(d_model, heads, bias=bias)."""
    suffixes = ("weight", "bias") if bias else ("weight",)
    return trusted_state({f"{p}.{w}": (d_model, d_model) if w == "weight" else (d_model,)
                          for p in PROJECTIONS for w in suffixes})


def check_names(result, state, d_model=16, bias=True):
    """The learner's module holds the contract's projections (names and shapes), each an
    nn.Linear: a missing projection is named, before any output is compared."""
    own, names = result["names"], sorted(result["names"])
    suffixes = ("weight", "bias") if bias else ("weight",)
    for proj in PROJECTIONS:
        present = result["linear"][proj] and all(f"{proj}.{w}" in own for w in suffixes)
        if proj == "out_proj":
            assert present, (
                f"MultiHeadAttention should hold out_proj, an nn.Linear(d_model, d_model) "
                f"applied after merging the heads; its parameters are {names}")
        else:
            assert present, (
                f"MultiHeadAttention should hold {proj} = nn.Linear(d_model, d_model); its "
                f"parameters are {names}")
        assert tuple(own[f"{proj}.weight"]) == (d_model, d_model), (
            f"{proj}.weight should have shape [{d_model}, {d_model}] (nn.Linear(d_model, "
            f"d_model)), but it has shape {list(own[f'{proj}.weight'])}")
    extra = sorted(set(own) - set(state))
    assert not extra, (
        f"MultiHeadAttention's state dict should hold only {sorted(state)}; it also has "
        f"{', '.join(extra)}")


def pytorch_twin(state, d_model=16, heads=4, bias=True):
    """PyTorch's nn.MultiheadAttention with the weights ``state`` (float64)."""
    theirs = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([state[f"{p}.weight"] for p in PROJECTIONS[:3]]))
        theirs.out_proj.weight.copy_(state["out_proj.weight"])
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([state[f"{p}.bias"] for p in PROJECTIONS[:3]]))
            theirs.out_proj.bias.copy_(state["out_proj.bias"])
    return theirs


def mistaken_outputs(state, query, memory, bias):
    """``{what went wrong: the output it gives}`` for the plausible mistakes of 3.3, computed
    by PyTorch's module with the same weights (a table of the mistakes told apart)."""
    found = {}
    without_out = pytorch_twin(state, bias=bias)
    with torch.no_grad():
        without_out.out_proj.weight.copy_(torch.eye(without_out.embed_dim, dtype=f64))
        if bias:
            without_out.out_proj.bias.zero_()
    found[named("3.3/no-out-proj")] = without_out
    heads_mixed = heads_without_transpose(state, query, memory, bias)
    original, state = state, dict(state)
    state["v_proj.weight"] = state["k_proj.weight"]
    if bias:
        state["v_proj.bias"] = state["k_proj.bias"]
    found[named("3.3/values-by-k-proj")] = pytorch_twin(state, bias=bias)
    state = dict(original)
    state["k_proj.weight"] = state["q_proj.weight"]
    if bias:
        state["k_proj.bias"] = state["q_proj.bias"]
    found[named("3.3/keys-by-q-proj")] = pytorch_twin(state, bias=bias)
    found[named("3.3/one-head")] = pytorch_twin(original, heads=1, bias=bias)
    with torch.no_grad():
        outputs = {mistake: module(query, memory, memory)[0] for mistake, module in found.items()}
    outputs[named("3.3/heads-without-transpose")] = heads_mixed
    outputs[named("3.3/scaled-by-sqrt-d_model")] = by_hand(original, query, memory, bias,
                                                           scale=16 ** 0.5)
    outputs[named("3.3/heads-merged-d_k-major")] = by_hand(original, query, memory, bias,
                                                           d_k_major=True)
    return outputs


def by_hand(state, query, memory, bias, heads=4, scale=None, d_k_major=False):
    """Multi-head attention computed here, scaled by ``scale`` (sqrt(d_k) unless given), the
    heads merged d_k-major (feature j of every head, then j + 1) with ``d_k_major``."""
    def project(name, x):
        out = x @ state[f"{name}.weight"].T
        return out + state[f"{name}.bias"] if bias else out

    q, k, v = (project(p, x).unflatten(-1, (heads, -1)).transpose(1, 2)
               for p, x in zip(PROJECTIONS[:3], (query, memory, memory), strict=True))
    weights = torch.softmax(q @ k.transpose(-2, -1) / (scale or q.size(-1) ** 0.5), dim=-1)
    out = weights @ v  # [B, H, Lq, d_k]
    merged = out.permute(0, 2, 3, 1) if d_k_major else out.transpose(1, 2)
    return project("out_proj", merged.flatten(2))


def heads_without_transpose(state, query, memory, bias, heads=4):
    """The output when heads are split by one reshape to [B, H, L, d_k] and merged by one
    reshape back (no transpose either way), float64."""
    def project(name, x):
        out = x @ state[f"{name}.weight"].T
        return out + state[f"{name}.bias"] if bias else out

    def split(x):
        return x.reshape(x.size(0), heads, x.size(1), x.size(2) // heads)

    q, k, v = (split(project(p, x)) for p, x in zip(PROJECTIONS[:3], (query, memory, memory),
                                                     strict=True))
    weights = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
    out = weights @ v
    return project("out_proj", out.reshape(out.size(0), out.size(2), -1))


def named_mistake(output, state, query, memory, bias, hint):
    """The message of the known mistake whose output ``output`` is, else ``hint``."""
    if isinstance(output, torch.Tensor):
        for mistake, mistaken in mistaken_outputs(state, query, memory, bias).items():
            if output.shape == mistaken.shape and torch.allclose(output.double(), mistaken,
                                                                 atol=1e-6, rtol=1e-5):
                return mistake
    return hint


# ---------------------------------------------------------------- 3.1 and 3.2


@pytest.mark.grade("3.1", points=3, values=True)
@pytest.mark.parametrize("batch, length, d_model, heads", [(2, 5, 8, 2), (1, 7, 12, 3),
                                                           (3, 4, 16, 16), (2, 6, 8, 1)])
def test_split_heads(learner, batch, length, d_model, heads):
    x = torch.randn(batch, length, d_model, dtype=f64)
    out = tensor(learner.run(split_heads_of, x=x, heads=heads), "split_heads(x)",
                 shape=(batch, heads, length, d_model // heads))
    d_k = d_model // heads
    expected = reference_split(x, heads)
    mistake = None if torch.allclose(out.double(), expected) else first_match(out, {
        "3.1/view-without-transpose": x.reshape(batch, heads, length, d_k),
        "3.1/d_k-major": x.reshape(batch, length, d_k, heads).permute(0, 3, 1, 2)})
    assert_close(out, expected, "split_heads(x)", hint=named(mistake) if mistake else
                 "Head h of position l is x[b, l, h*d_k:(h+1)*d_k]. Reshape to [B, L, H, d_k] "
                 "first, then transpose L and H.")


@pytest.mark.grade("3.1", points=1)
def test_split_heads_accepts_non_contiguous_input(learner):
    x = torch.randn(6, 2, 8, dtype=f64)  # transposed in the worker: [B=2, L=6, D=8], not contiguous
    out = tensor(learner.run(split_heads_of_transposed, x=x, heads=4),
                 "split_heads of a non-contiguous tensor")
    assert_close(out, reference_split(x.transpose(0, 1), 4),
                 "split_heads of a non-contiguous tensor")


@pytest.mark.grade("3.1", points=1, errors=True)
def test_split_heads_explains_indivisible_width(learner):
    message = learner.raises("ValueError", split_heads_of, x=torch.randn(2, 3, 10), heads=4)
    assert "10" in message and "4" in message, (
        f"the error should name d_model (10) and num_heads (4); it says {message!r}"
    )


@pytest.mark.grade("3.2", points=3, values=True)
@pytest.mark.parametrize("batch, heads, length, d_k", [(2, 2, 5, 4), (1, 3, 7, 4), (3, 8, 2, 2)])
def test_merge_heads(learner, batch, heads, length, d_k):
    x = torch.randn(batch, length, heads * d_k, dtype=f64)
    # the worker splits x slice by slice: a non-contiguous [B, H, L, d_k]
    out = tensor(run_naming(learner, merge_heads_of_split, VIEW_OF_TRANSPOSED,
                            "3.2/view-after-transpose", x=x, heads=heads), "merge_heads(split)")
    split = reference_split(x, heads)
    mistake = None if torch.allclose(out.double(), x) else first_match(out, {
        "3.2/reshape-without-transpose": split.reshape(batch, length, heads * d_k),
        "3.2/d_k-major": split.permute(0, 2, 3, 1).reshape(batch, length, heads * d_k)})
    assert_close(out, x, "merge_heads(split)", hint=named(mistake) if mistake else
                 "Transpose H and L back to [B, L, H, d_k], then reshape (view fails on "
                 "non-contiguous memory) to [B, L, H*d_k], head 0's features first.")


@pytest.mark.grade("3.2", points=1)
def test_merge_inverts_split_both_ways(learner):
    x = torch.randn(2, 5, 12, dtype=f64)
    heads = reference_split(x, 3)
    merged = tensor(learner.run(merge_heads_of_split, x=x, heads=3), "merge_heads(split_heads(x))")
    assert_close(merged, x, "merge_heads(split_heads(x))")
    assert_close(reference_split(merged, 3), heads, "split_heads(merge_heads(h))")


def check_heads_contract(learner, exercise, dtype):
    """The dtype, device and gradient of split_heads (3.1) or merge_heads (3.2): float32 or
    float64 ``x`` gives a result of its dtype, on its device, whose gradient is autograd's of
    the reference (a reshape passes each entry's gradient back to where it came from)."""
    x = torch.randn(2, 5, 12, dtype=f64, requires_grad=True)
    expected = reference_split(x, 3) if exercise == "3.1" else x * 1
    upstream = torch.randn(expected.shape, dtype=f64)
    result = learner.run(heads_gradient, exercise=exercise, x=x.detach().to(dtype), heads=3,
                         upstream=upstream.to(dtype))
    what = ("split_heads(x, 3)" if exercise == "3.1" else "merge_heads(h)") + f" for {dtype} x"
    output = tensor(result["output"], what, shape=expected.shape)
    assert_close(output, expected.detach().to(dtype), what)
    # Right values: the dtype and the graph of the result are the contract's too.
    assert output.dtype == dtype, (f"{what} is {output.dtype}. "
                                   f"{named(f'{exercise}/dtype-changed')}")
    assert result["grad"] is not None, named(f"{exercise}/detached")
    (want,) = torch.autograd.grad((expected * upstream).sum(), x)
    assert_close(result["grad"], want, f"the gradient of {what} with respect to x")
    device = learner.run(heads_on_meta, exercise=exercise, x=x.detach().to(dtype), heads=3)
    assert device == "meta", (
        f"{what} on the meta device (a stand-in for a GPU) is on {device}: make new tensors "
        f"on x's device, or better, only reshape and transpose x itself")


@pytest.mark.grade("3.1", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_split_heads_keeps_dtype_device_and_gradient(learner, dtype):
    check_heads_contract(learner, "3.1", dtype)


@pytest.mark.grade("3.2", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_merge_heads_keeps_dtype_device_and_gradient(learner, dtype):
    check_heads_contract(learner, "3.2", dtype)


# ---------------------------------------------------------------- 3.3 MultiHeadAttention

# PyTorch's words for view() of a tensor whose memory is out of order (a transpose).
VIEW_OF_TRANSPOSED = re.compile(r"view size is not compatible with input tensor's size and "
                                r"stride")
# PyTorch's words for operands whose sizes do not line up (a product, a sum, a reshape).
SIZE_MISMATCH = re.compile(r"Expected size for first two dimensions|must match the size of "
                           r"tensor b|shapes cannot be multiplied|is invalid for input of size")


@pytest.mark.grade("3.3", points=2, values=True)
@pytest.mark.parametrize("lq, lk", [(5, 5), (4, 7)], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_pytorch(learner, lq, lk, bias):
    query = torch.randn(3, lq, 16, dtype=f64)
    memory = query if lq == lk else torch.randn(3, lk, 16, dtype=f64)
    state = trusted_weights(bias=bias)
    try:
        result = learner.run(attention_module_run, query=query, key=memory, value=memory,
                             d_model=16, heads=4, bias=bias, state=state)
    except LearnerRaised as error:
        if lq == lk or SIZE_MISMATCH.search(error.message) is None:
            raise
        raise LearnerRaised(error.types, f"in cross-attention, query [3, {lq}, 16] with key and "
                            f"value [3, {lk}, 16] (the keys and values come from key and value "
                            f"through k_proj and v_proj, the queries from query): "
                            f"{error.message}", error.where) from None
    check_names(result, state, bias=bias)
    theirs = pytorch_twin(state, bias=bias)
    expected, weights = theirs(query, memory, memory, average_attn_weights=False)
    out = tensor(result["output"], "MultiHeadAttention(query, key, value)")
    hint = ("Project, split into heads, attend, merge, then out_proj. Are query, key and "
            "value each projected by their own layer?")
    if out.shape == expected.shape and not torch.allclose(out.double(), expected, atol=1e-6,
                                                          rtol=1e-5):
        hint = named_mistake(out, state, query, memory, bias, hint)
    assert_close(out, expected, "MultiHeadAttention(query, key, value)", hint=hint)
    averaged = first_match(result["weights"], {"3.3/weights-averaged": weights.mean(1)})
    assert not averaged, named("3.3/weights-averaged")
    tensor(result["weights"], "attention_weights", shape=(3, 4, lq, lk))
    assert_close(result["weights"], weights, "attention_weights (one map per head)")


@pytest.mark.grade("3.3", points=3, values=True)
@pytest.mark.parametrize("kind", ["padding [B, 1, 1, Lk]", "causal [Lq, Lk]",
                                  "per head [B, H, Lq, Lk]"])
def test_masks_match_pytorch(learner, kind):
    x = torch.randn(2, 6, 16, dtype=f64)
    if kind.startswith("padding"):
        lengths = torch.tensor([6, 4])
        mask = (torch.arange(6) < lengths[:, None]).view(2, 1, 1, 6)
        blocked = {"key_padding_mask": ~mask.view(2, 6)}
    elif kind.startswith("causal"):
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        blocked = {"attn_mask": ~mask}
    else:
        mask = torch.rand(2, 4, 6, 6) > 0.5
        mask[..., 0] = True
        blocked = {"attn_mask": ~mask.reshape(8, 6, 6)}
    state = trusted_weights()
    result = learner.run(attention_module_run, query=x, key=x, value=x, d_model=16, heads=4,
                         mask=mask, state=state)
    check_names(result, state)
    expected, _ = pytorch_twin(state)(x, x, x, **blocked)
    out = tensor(result["output"], f"MultiHeadAttention with a {kind} mask")
    assert_close(out, expected, f"MultiHeadAttention with a {kind} mask",
                 hint="Pass the mask on to the attention of 2.2 unchanged: it broadcasts over "
                 "heads and queries ([B, H, Lq, Lk]). True means allowed.")


@pytest.mark.grade("3.3", points=1)
def test_weights_rows_sum_to_one(learner):
    result = learner.run(attention_module_run, query=torch.randn(2, 5, 8),
                         key=torch.randn(2, 3, 8), value=torch.randn(2, 3, 8), d_model=8,
                         heads=2, double=False)
    weights = tensor(result["weights"], "attention_weights", shape=(2, 2, 5, 3))
    assert not result["weights_require_grad"], (
        "attention_weights should be detached (weights.detach())")
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 5)), (
        "each row of attention_weights should sum to 1 over the keys")


@pytest.mark.grade("3.3", points=1)
def test_own_initialisation_is_random_at_a_sensible_scale(learner):
    check_initialisation(learner.run(fresh_state, d_model=16, heads=4), "MultiHeadAttention")


@pytest.mark.grade("3.3", points=1)
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_names(learner, bias):
    names = set(learner.run(parameter_names, d_model=8, heads=2, bias=bias))
    expected = {f"{p}.{w}" for p in PROJECTIONS
                for w in (("weight", "bias") if bias else ("weight",))}
    assert names == expected, f"parameters should be {sorted(expected)}, got {sorted(names)}"


@pytest.mark.grade("3.3", points=1)
def test_gradients_reach_every_projection(learner):
    query, memory = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    grads = learner.run(parameter_gradients, query=query, memory=memory)
    for name, grad in grads.items():
        assert grad is not None and grad.abs().sum() > 0, (
            f"no gradient reached {name}: is it used in forward?")


@pytest.mark.grade("3.3", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_keeps_dtype_device_and_gradients(learner, dtype):
    query = torch.randn(2, 4, 16, dtype=f64, requires_grad=True)
    memory = torch.randn(2, 5, 16, dtype=f64, requires_grad=True)
    upstream = torch.randn(2, 4, 16, dtype=f64)
    state = trusted_weights()
    result = run_naming(learner, module_contract, DEVICE_CLASH, "3.3/device-not-kept",
                        query=query.detach().to(dtype), memory=memory.detach().to(dtype),
                        upstream=upstream.to(dtype),
                        state={name: value.to(dtype) for name, value in state.items()})
    check_names({**result, "linear": dict.fromkeys(PROJECTIONS, True)}, state)
    what = f"MultiHeadAttention in {dtype}"
    output = tensor(result["output"], f"the output of {what}", shape=(2, 4, 16))
    assert_tensor(output, f"the output of {what}", dtype=dtype)
    weights = tensor(result["weights"], f"attention_weights of {what}", shape=(2, 4, 4, 5))
    assert_tensor(weights, f"attention_weights of {what}", dtype=dtype)
    theirs = pytorch_twin(state)
    reference = theirs(query, memory, memory)[0]
    right = torch.allclose(output.double(), reference.detach(), atol=1e-5)
    assert result["devices"] == ["meta", "meta"], (
        f"{what} moved to the meta device, with inputs there, gives its output and "
        f"attention_weights on {result['devices']}. " + (
            named("3.3/device-not-kept") if right else "Make every tensor on the inputs' "
            "device, and keep attention_weights where it was computed (no .cpu())."))
    wanted = {"query": query, "memory": memory, "in_proj_weight": theirs.in_proj_weight,
              "in_proj_bias": theirs.in_proj_bias, "out_proj.weight": theirs.out_proj.weight,
              "out_proj.bias": theirs.out_proj.bias}
    grads = dict(zip(wanted, torch.autograd.grad((reference * upstream).sum(),
                                                 list(wanted.values())), strict=True))
    expected = {name: grads[name] for name in ("query", "memory", "out_proj.weight",
                                               "out_proj.bias")}
    for i, proj in enumerate(PROJECTIONS[:3]):
        expected[f"{proj}.weight"] = grads["in_proj_weight"][16 * i:16 * (i + 1)]
        expected[f"{proj}.bias"] = grads["in_proj_bias"][16 * i:16 * (i + 1)]
    atol = 1e-6 if dtype == f64 else 1e-4
    for name, want in expected.items():
        got = result["grads"].get(name)
        assert got is not None, named("3.3/detached", name=name) if right else (
            f"no gradient reaches {name} through the output of {what}: is it used in forward, "
            f"and on autograd's graph (no .detach(), NumPy or torch.no_grad() on the way)?")
        assert_close(got, want, f"the gradient with respect to {name} ({dtype})", atol=atol,
                     rtol=1e-4 if dtype == torch.float32 else 1e-5)


@pytest.mark.grade("3.3", points=1)
def test_dropout_on_the_weights_only_in_training(learner):
    x = torch.randn(2, 6, 8)
    result = learner.run(eval_and_training_runs, x=x)
    first = tensor(result["first"], "the output in eval mode")
    second = tensor(result["second"], "the output in eval mode")
    assert torch.equal(first, second), "in eval mode the output must not be random"
    eval_weights = tensor(result["eval_weights"], "attention_weights in eval mode",
                          shape=(2, 2, 6, 6))
    assert torch.allclose(eval_weights.sum(-1), torch.ones(2, 2, 6)), (
        "in eval mode each row of attention_weights should sum to 1 (no dropout)")
    assert not torch.allclose(eval_weights, eval_weights[..., :1].expand_as(eval_weights)), (
        "in eval mode every weight of a row of attention_weights is the same: the weights "
        "should come from the scores, softmax(Q K^T / sqrt(d_k))")
    weights = tensor(result["train_weights"], "attention_weights in training",
                     shape=(2, 2, 6, 6))
    zeros = (weights == 0).double().mean().item()
    assert zeros > 0 or not torch.allclose(weights.sum(-1), torch.ones(2, 2, 6)), named(
        "3.3/no-dropout")
    assert 0.3 < zeros < 0.7, (
        f"with dropout=0.5 in training about half the attention weights should be dropped "
        f"(zero); {zeros:.0%} are. Pass dropout to the attention, applied to the weights.")


@pytest.mark.grade("3.3", points=1, errors=True)
def test_bad_shapes_are_explained(learner):
    message = learner.raises("ValueError", new_module, d_model=10, heads=4)
    assert re.search("10|4", message), (
        f"the ValueError for MultiHeadAttention(10, 4) should name d_model (10) or num_heads "
        f"(4); it says: {message}")
    x = torch.randn(2, 3, 8)
    message = learner.raises("ValueError", attention_module_run, query=x, key=x, value=x,
                             d_model=8, heads=2, mask=torch.ones(2, 3, 3, dtype=torch.bool),
                             double=False)
    assert re.search("mask", message), (
        f"a 3-D mask [2, 3, 3] is ambiguous (is the first axis the batch or the heads?): the "
        f"ValueError should say the mask must be 2-D [Lq, Lk] or 4-D [B, H, Lq, Lk]; it says: "
        f"{message}")
