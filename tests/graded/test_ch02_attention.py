"""Graded tests of chapter 2: softmax, scaled dot-product attention, softmax's Jacobian.

References: ``torch.softmax``, ``F.scaled_dot_product_attention`` and
``torch.autograd.functional.jacobian``, in float64.

The functions above the tests (``softmax_of``, ``attention_of``, ...) are *probes*: they run
in the grading worker, with ``impl`` the chapter module under test, and return plain data.
Everything else runs in the grader, which never imports the code under test.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from checks import ATTENTION_OPS, LOGSUMEXP_OPS, SOFTMAX_OPS, assert_close, assert_tensor
from mistakes import DEVICE_CLASH, first_match, named, run_naming

CHAPTER = 2
EXERCISES = {
    "2.1": "softmax: stable, all -inf slices give zeros",
    "2.2": "scaled_dot_product_attention: softmax(QK^T / sqrt(d_k)) V",
    "2.3": "softmax_jacobian: diag(p) - p p^T",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"2.2": ("2.1",)}
# What each exercise may not use: the op it asks the learner to write (see the docstrings).
SOFTMAX_NAMES = ("softmax", "softmin", "log_softmax", "Softmax", "Softmin", "LogSoftmax",
                 "gumbel_softmax")
# 2.3 builds J from p: autograd would compute it from a softmax (dispatch cannot tell the
# learner's own softmax differentiated by autograd from a formula, so only names refuse it).
JACOBIAN_NAMES = ("jacobian", "jacrev", "jacfwd", "hessian", "vjp", "jvp", "grad", "backward")
FORBIDDEN = {"2.1": (*SOFTMAX_NAMES, "logsumexp"),
             "2.2": (*SOFTMAX_NAMES, "logsumexp", "scaled_dot_product_attention"),
             "2.3": JACOBIAN_NAMES}
# The same, refused at PyTorch's dispatch level while the exercise's code runs, with every op
# through which PyTorch computes the result (checks.py): softmax by any name, logsumexp (whose
# gradient is the softmax and whose Hessian is 2.3's Jacobian), the fused attention; and, for
# 2.3, autograd itself: no backward pass and no dual tensor while it runs, so a Jacobian of a
# softmax of the learner's own (every op elementary) is refused too (grading/worker/allowed_ops.py).
FORBIDDEN_OPS = {"2.1": (*SOFTMAX_OPS, *LOGSUMEXP_OPS),
                 "2.2": (*SOFTMAX_OPS, *LOGSUMEXP_OPS, *ATTENTION_OPS),
                 "2.3": (*SOFTMAX_OPS, *LOGSUMEXP_OPS, "autograd")}
f64 = torch.float64


# ---------------------------------------------------------------- probes (run in the worker)


def softmax_of(impl, x, dim=None):
    return impl.softmax(x) if dim is None else impl.softmax(x, dim=dim)


BROADCAST = re.compile(r"The size of tensor a \(\d+\) must match the size of tensor b")


def run_softmax(learner, **inputs):
    """``learner.run(softmax_of, ...)``; a maximum or a sum that cannot broadcast back
    against ``x`` is explained: it lost its dimension (an error of the code all the same)."""
    return run_naming(learner, softmax_of, BROADCAST, "2.1/keepdim-forgotten", **inputs)


def softmax_gradient(impl, x, upstream):
    """softmax of ``x`` made a leaf that requires grad: its output, and the gradient of
    ``(output * upstream).sum()`` with respect to x (None when the output is off the graph)."""
    x = x.clone().requires_grad_(True)
    output = impl.softmax(x)
    on_graph = isinstance(output, torch.Tensor) and output.requires_grad
    return {"output": output,
            "grad": torch.autograd.grad((output * upstream).sum(), x)[0] if on_graph else None}


def softmax_on_meta(impl, x):
    """The "meta" device stands in for a GPU: a tensor made on the CPU would clash with it."""
    return impl.softmax(x.to("meta")).device.type


def attention_of(impl, q, k, v, mask=None):
    result = impl.scaled_dot_product_attention(q, k, v, mask=mask)
    if not (isinstance(result, tuple) and len(result) == 2):
        return {"returned": type(result).__name__}
    return {"output": result[0], "weights": result[1]}


def attention_with_dropout(impl, q, k, v, keep):
    calls = []

    def dropout(w):
        calls.append(tuple(w.shape))
        if w.shape != keep.shape:  # not the weights: the test names what it was given
            return w
        return w * keep * 2.0

    output, weights = impl.scaled_dot_product_attention(q, k, v, dropout=dropout)
    return {"output": output, "weights": weights, "calls": calls}


def attention_gradients(impl, q, k, v, mask, upstream):
    """The attention of leaves that require grad: its output, and the gradients of
    ``(output * upstream).sum()`` with respect to q, k and v (None for one the output is not
    connected to)."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    output = impl.scaled_dot_product_attention(q, k, v, mask)[0]
    grads = (torch.autograd.grad((output * upstream).sum(), (q, k, v), allow_unused=True)
             if isinstance(output, torch.Tensor) and output.requires_grad else (None,) * 3)
    return {"output": output, "grads": grads}


def attention_on_meta(impl, q, k, v, mask):
    """The "meta" device stands in for a GPU: tensors made on the CPU would clash with it."""
    output, weights = impl.scaled_dot_product_attention(
        *(t.to("meta") for t in (q, k, v)), mask=mask.to("meta"))
    return output.device.type, weights.device.type


def jacobian_of(impl, p):
    return impl.softmax_jacobian(p)


def jacobian_on_graph(impl, p):
    """The Jacobian at ``p`` made a leaf that requires grad (as a softmax's output in training
    is on the graph), and whether it came back on the graph."""
    p = p.requires_grad_(True)
    jacobian = impl.softmax_jacobian(p)
    if not isinstance(jacobian, torch.Tensor):
        return {"jacobian": jacobian}
    return {"jacobian": jacobian, "on_graph": jacobian.requires_grad}


def jacobian_on_meta(impl, p):
    """The "meta" device stands in for a GPU: a tensor made on the CPU would clash with it."""
    return impl.softmax_jacobian(p.to("meta")).device.type


def reference_weights(query, key, mask=None):
    """softmax(Q K^T / sqrt(d_k)) with masked keys at weight 0 and empty rows all zero."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)


def mistaken_weights(query, key, mask=None, value=None):
    """``{what went wrong: the weights it gives}`` for the plausible mistakes of 2.2, computed
    from the same inputs (a table of the mistakes the tests tell apart)."""
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1)

    def weights(scaled, dim=-1):
        if mask is not None:
            scaled = scaled.masked_fill(~mask, float("-inf"))
        return torch.softmax(scaled, dim=dim).nan_to_num(nan=0.0)

    sqrt_d_k = f"{math.sqrt(d_k):.3g}"
    found = {
        named("2.2/no-scaling", sqrt_d_k=sqrt_d_k): weights(scores),
        named("2.2/divided-by-d_k", sqrt_d_k=sqrt_d_k, d_k=d_k): weights(scores / d_k),
        named("2.2/softmax-over-queries"): weights(scores / math.sqrt(d_k), dim=-2),
    }
    if query.dim() >= 4 and query.size(-3) > 1:  # [..., H, L, d_k]: the width of all heads
        heads = query.size(-3)
        found[named("2.2/divided-by-sqrt-d_model", d_model=heads * d_k, heads=heads,
                    d_k=d_k)] = weights(scores / math.sqrt(heads * d_k))
    if value is not None and value.size(-1) != d_k:
        found[named("2.2/scaled-by-d_v", d_v=value.size(-1), d_k=d_k)] = weights(
            scores / math.sqrt(value.size(-1)))
    if mask is not None:
        scaled = scores / math.sqrt(d_k)
        found[named("2.2/mask-true-hides")] = torch.softmax(
            scaled.masked_fill(mask, float("-inf")), dim=-1).nan_to_num(nan=0.0)
        found[named("2.2/mask-after-softmax")] = torch.softmax(scaled, -1).masked_fill(~mask, 0)
        found[named("2.2/masked-scores-zeroed")] = torch.softmax(scaled.masked_fill(~mask, 0.0),
                                                                 dim=-1)
    return found


def check_weights(weights, query, key, name, hint, mask=None, value=None):
    """``weights`` against the reference; when they differ and match a known mistake, the
    message names that mistake instead of the general ``hint``."""
    expected = reference_weights(query, key, mask)
    if (isinstance(weights, torch.Tensor) and weights.shape == expected.shape
            and not torch.allclose(weights.double(), expected, atol=1e-6, rtol=1e-5)):
        for mistake, mistaken in mistaken_weights(query, key, mask, value).items():
            if torch.allclose(weights.double(), mistaken, atol=1e-6, rtol=1e-5):
                hint = mistake
                break
    assert_close(weights, expected, name, hint=hint)


# ---------------------------------------------------------------- 2.1 softmax


@pytest.mark.grade("2.1", points=3, values=True)
@pytest.mark.parametrize("shape, dim", [((7,), 0), ((4, 9), -1), ((4, 9), 0), ((2, 3, 5), 1),
                                        ((2, 3, 5), -1), ((2, 3, 4, 6), 2)])
def test_softmax_matches_torch(learner, shape, dim):
    x = torch.randn(shape, dtype=f64) * 3
    out = assert_tensor(run_softmax(learner, x=x, dim=dim), f"softmax(x, dim={dim})",
                        shape=shape, dtype=f64)
    mistakes = {"2.1/sum-over-everything": torch.exp(x - x.amax(dim, keepdim=True))
                / torch.exp(x - x.amax(dim, keepdim=True)).sum()}
    if dim % len(shape) != len(shape) - 1:
        mistakes["2.1/dim-ignored"] = torch.softmax(x, dim=-1)
    mistake = None if torch.allclose(out, torch.softmax(x, dim=dim)) else first_match(out,
                                                                                     mistakes)
    assert_close(out, torch.softmax(x, dim=dim), f"softmax(x, dim={dim}) for x of shape "
                 f"{list(shape)}", hint=named(mistake) if mistake else "Are the sum and the "
                 "maximum taken over `dim`, with keepdim=True so that they broadcast back?")


@pytest.mark.grade("2.1", points=1)
def test_softmax_default_dim_is_last(learner):
    x = torch.randn(3, 4, dtype=f64)
    assert_close(run_softmax(learner, x=x), torch.softmax(x, dim=-1),
                 "softmax(x) (default dim=-1)")


@pytest.mark.grade("2.1", points=2, values=True)
def test_softmax_does_not_overflow(learner):
    x = torch.tensor([[1000.0], [-1000.0]], dtype=f64) + torch.randn(2, 3, dtype=f64)
    out = run_softmax(learner, x=x)
    naive = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    overflowed = (isinstance(out, torch.Tensor) and out.shape == x.shape
                  and torch.allclose(out.double(), naive, equal_nan=True))
    assert_close(out, torch.softmax(x, dim=-1), "softmax of scores near +-1000",
                 hint=named("2.1/no-maximum-subtracted") if overflowed else
                 "exp(1000) overflows to inf: subtract each row's maximum first.")
    x32 = torch.randn(5, 8) * 200
    assert_close(run_softmax(learner, x=x32), torch.softmax(x32, dim=-1),
                 "softmax of float32 scores up to about 800", atol=1e-6,
                 hint="Subtract the maximum before exp.")


@pytest.mark.grade("2.1", points=2, values=True)
def test_all_minus_inf_slice_gives_zeros(learner):
    x = torch.randn(3, 5, dtype=f64)
    x[1] = float("-inf")
    x[2, :3] = float("-inf")
    expected = torch.softmax(x, dim=-1).nan_to_num(nan=0.0)
    out = run_softmax(learner, x=x)
    unguarded = (isinstance(out, torch.Tensor) and out.shape == x.shape
                 and bool(torch.isnan(out[1]).all())
                 and torch.allclose(out[[0, 2]].double(), expected[[0, 2]]))
    assert_close(out, expected, "softmax with row 1 all -inf and row 2 partly -inf",
                 hint=named("2.1/empty-slice-unguarded") if unguarded else
                 "A row with nothing allowed must give zeros: replace a -inf maximum by 0 "
                 "before subtracting, then guard the sum (0 on such a row) before dividing.")


@pytest.mark.grade("2.1", points=1, values=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_softmax_gradient_matches_torch(learner, dtype):
    x = torch.randn(4, 6, dtype=f64, requires_grad=True)
    upstream = torch.randn(4, 6, dtype=f64)
    result = learner.run(softmax_gradient, x=x.detach().to(dtype), upstream=upstream.to(dtype))
    what = f"softmax(x) for {dtype} x"
    expected = torch.softmax(x.detach().to(dtype).double(), -1)
    output = assert_tensor(result["output"], what, shape=(4, 6))
    assert_close(output, expected, what, atol=1e-6)
    # Right values: the dtype and the graph of the result are the contract's too.
    assert output.dtype == dtype, named("2.1/dtype-changed", dtype=dtype, got=output.dtype)
    assert result["grad"] is not None, named("2.1/detached")
    (want,) = torch.autograd.grad((torch.softmax(x, -1) * upstream).sum(), x)
    assert_close(result["grad"], want, f"the gradient of {what}", atol=1e-6 if dtype == f64
                 else 1e-5, hint="Build it from differentiable torch operations (no .detach(), "
                 "no numpy).")


@pytest.mark.grade("2.1", points=1)
def test_softmax_keeps_the_device(learner):
    device = run_naming(learner, softmax_on_meta, DEVICE_CLASH, "2.1/device-not-kept",
                        x=torch.randn(3, 5, dtype=f64))
    assert device == "meta", (
        f"softmax(x) for x on the meta device (a stand-in for a GPU) is on {device}: make new "
        f"tensors on x's device (torch.zeros_like(m), torch.where(total == 0, 1, total)), "
        f"never on the CPU by default")


# ---------------------------------------------------------------- 2.2 attention


SHAPES = [  # batch shape, Lq, Lk, d_k, d_v
    ((), 4, 4, 8, 8),
    ((3,), 5, 7, 8, 4),
    ((2, 4), 6, 3, 16, 16),
    ((2, 4), 1, 9, 64, 32),
]


@pytest.mark.grade("2.2", points=3, values=True)
@pytest.mark.parametrize("batch, lq, lk, d_k, d_v", SHAPES)
def test_attention_matches_pytorch(learner, batch, lq, lk, d_k, d_v):
    q = torch.randn(*batch, lq, d_k, dtype=f64)
    k = torch.randn(*batch, lk, d_k, dtype=f64)
    v = torch.randn(*batch, lk, d_v, dtype=f64)
    result = learner.run(attention_of, q=q, k=k, v=v)
    assert "returned" not in result, (
        f"scaled_dot_product_attention should return (output, weights), got "
        f"{result.get('returned')}"
    )
    output, weights = result["output"], result["weights"]
    assert_tensor(weights, "weights", shape=(*batch, lq, lk))
    check_weights(weights, q, k, "weights", hint="weights = softmax(Q K^T / sqrt(d_k)) over the "
                  "keys (the last axis); d_k is query.size(-1).", value=v)
    assert_close(output, F.scaled_dot_product_attention(q, k, v), "output",
                 hint="output = weights @ value.")


@pytest.mark.grade("2.2", points=1)
def test_weights_rows_sum_to_one(learner):
    q, k, v = (torch.randn(2, 5, 8, dtype=f64) for _ in range(3))
    weights = assert_tensor(learner.run(attention_of, q=q, k=k, v=v).get("weights"), "weights",
                            shape=(2, 5, 5))
    sums = weights.sum(-1)
    row = int((sums - 1).abs().argmax())
    assert torch.allclose(sums, torch.ones_like(sums)), (
        f"each row of weights must sum to 1 over the keys (dim=-1); a row sums to "
        f"{sums.flatten()[row].item():.4f}. Is softmax taken over the right dimension?"
    )


MASKS = {
    "padding [B, 1, 1, Lk]": lambda b, h, lq, lk: torch.arange(lk) < torch.tensor(
        [lk, lk - 2])[:b].view(b, 1, 1, 1),
    "causal [Lq, Lk]": lambda b, h, lq, lk: torch.ones(lq, lk, dtype=torch.bool).tril(),
    "random [B, H, Lq, Lk]": lambda b, h, lq, lk: torch.rand(b, h, lq, lk) > 0.4,
}


@pytest.mark.grade("2.2", points=3, values=True)
@pytest.mark.parametrize("kind", list(MASKS))
def test_mask_matches_pytorch(learner, kind):
    b, h, lq, lk, d = 2, 3, 6, 6, 8
    q, k, v = (torch.randn(b, h, n, d, dtype=f64) for n in (lq, lk, lk))
    mask = MASKS[kind](b, h, lq, lk)
    mask[..., 0] = True  # every query may see key 0, so PyTorch's reference has no empty row
    result = learner.run(attention_of, q=q, k=k, v=v, mask=mask)
    output, weights = result.get("output"), result.get("weights")
    check_weights(weights, q, k, f"weights with a {kind} mask", mask=mask, value=v,
                  hint="Masked scores must become -inf before the softmax (True = allowed), "
                  "so masked keys get weight exactly 0 and the rest still sum to 1.")
    assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                 f"output with a {kind} mask")


@pytest.mark.grade("2.2", points=2, values=True)
def test_fully_masked_query_gives_zeros_not_nan(learner):
    q, k, v = torch.randn(1, 3, 4, dtype=f64), torch.randn(1, 5, 4, dtype=f64), torch.randn(
        1, 5, 2, dtype=f64)
    mask = torch.ones(1, 3, 5, dtype=torch.bool)
    mask[0, 1] = False  # query 1 may attend to nothing
    mask[0, 2, 3:] = False  # query 2 to its first three keys
    result = learner.run(attention_of, q=q, k=k, v=v, mask=mask)
    output = assert_tensor(result.get("output"), "output", shape=(1, 3, 2))
    weights = assert_tensor(result.get("weights"), "weights", shape=(1, 3, 5))
    # A large negative fill leaves the masked keys of query 2 at weight 0 and query 1
    # uniform; a fill of 0 gives query 2's masked keys weight too.
    scores = q @ k.transpose(-2, -1) / math.sqrt(4)
    mistake = first_match(weights, {
        "2.2/large-negative-fill": torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1),
        "2.2/masked-scores-zeroed": torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)})
    hint = named(mistake) if mistake else ("Use -inf with your softmax from 2.1 (all -inf "
                                           "gives zeros).")
    assert_close(weights[0, 1], torch.zeros(5), "the weights of a query whose keys are all "
                 "masked", hint=hint)
    assert_close(weights[0, 2], reference_weights(q, k, mask)[0, 2], "the weights of a query "
                 "whose last two keys are masked", hint=hint)
    assert_close(output[0, 1], torch.zeros(2), "the output of a query whose keys are all masked")
    assert_close(weights[0, 0], reference_weights(q, k)[0, 0], "the weights of an unmasked query")


@pytest.mark.grade("2.2", points=2)
def test_dropout_is_applied_to_the_weights(learner):
    q, k, v = torch.randn(2, 4, 8, dtype=f64), torch.randn(2, 6, 8, dtype=f64), torch.randn(
        2, 6, 3, dtype=f64)
    keep = torch.rand(2, 4, 6) > 0.5
    result = learner.run(attention_with_dropout, q=q, k=k, v=v, keep=keep)
    output, weights, calls = result["output"], result["weights"], result["calls"]
    assert calls != [(2, 4, 3)], named("2.2/dropout-on-output")
    assert calls == [(2, 4, 6)], (
        f"dropout should be called once, on the weights [B, Lq, Lk] = [2, 4, 6]; it was called "
        f"on shapes {calls}"
    )
    dropped = reference_weights(q, k) * keep * 2.0
    before = first_match(weights, {"2.2/weights-before-dropout": reference_weights(q, k)})
    assert_close(weights, dropped, "the returned weights", hint=named(before) if before else
                 "Return the weights after dropout: the ones that multiplied value.")
    assert_close(output, dropped @ v, "output with dropout",
                 hint="Apply dropout to the weights, then multiply by value.")


@pytest.mark.grade("2.2", points=1, values=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_gradients_match_pytorch(learner, dtype):
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=f64, requires_grad=True) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    upstream = torch.randn(2, 2, 5, 4, dtype=f64)
    result = learner.run(attention_gradients, q=q.detach().to(dtype), k=k.detach().to(dtype),
                         v=v.detach().to(dtype), mask=mask, upstream=upstream.to(dtype))
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = torch.autograd.grad((reference * upstream).sum(), (q, k, v))
    output = assert_tensor(result["output"], f"output for {dtype} inputs", shape=(2, 2, 5, 4))
    grads = dict(zip("qkv", result["grads"], strict=True))
    cut = [name for name, grad in grads.items() if grad is None]
    right = torch.allclose(output.double(), reference.detach(), atol=1e-5)
    assert not (right and cut == ["q", "k"]), named("2.2/weights-detached")
    atol = 1e-6 if dtype == f64 else 1e-5
    for name, want in zip("qkv", expected, strict=True):
        assert grads[name] is not None, (
            f"no gradient reaches {name}: the output for {dtype} inputs that require grad is "
            f"not connected to {name} on autograd's graph. Build it from torch operations on "
            f"the inputs alone (no .detach(), .item(), NumPy or torch.no_grad())")
        assert_close(grads[name], want, f"the gradient with respect to {name} ({dtype})",
                     atol=atol)


@pytest.mark.grade("2.2", points=1, errors=True)
def test_mismatched_shapes_are_explained(learner):
    message = learner.raises("ValueError", attention_of, q=torch.randn(2, 3, 8),
                             k=torch.randn(2, 4, 6), v=torch.randn(2, 4, 6))
    assert re.search("d_k|query|key", message), (
        f"the ValueError for query [2, 3, 8] and key [2, 4, 6] should name d_k, query or key; "
        f"it says: {message}")
    message = learner.raises("ValueError", attention_of, q=torch.randn(2, 3, 8),
                             k=torch.randn(2, 4, 8), v=torch.randn(2, 5, 8))
    assert re.search("Lk|key|value", message), (
        f"the ValueError for key [2, 4, 8] and value [2, 5, 8] should name Lk, key or value; "
        f"it says: {message}")


# ---------------------------------------------------------------- 2.3 Jacobian


@pytest.mark.grade("2.3", points=3, values=True)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_jacobian_matches_autograd(learner, batch, dtype):
    n = 5
    z = torch.randn(*batch, n, dtype=f64) * 2
    p = torch.softmax(z, dim=-1).to(dtype)
    flat = z.reshape(-1, n)
    expected = torch.stack([torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), row)
                            for row in flat]).reshape(*batch, n, n)
    result = learner.run(jacobian_on_graph, p=p)
    jacobian, what = result.get("jacobian"), f"softmax_jacobian(p) for {dtype} p of shape " \
        f"{list(p.shape)}"
    p = p.double()
    diagonal, outer = torch.diag_embed(p), p.unsqueeze(-1) * p.unsqueeze(-2)
    mistake = None if torch.allclose(torch.as_tensor(jacobian).double(), expected) else first_match(
        jacobian, {"2.3/outer-added": diagonal + outer,
                   "2.3/diagonal-only": torch.diag_embed(p * (1 - p)),
                   "2.3/no-diagonal-term": -outer})
    assert_close(jacobian, expected, what, hint=named(mistake) if mistake else "J = diag(p) - "
                 "p p^T: the diagonal is p_i (1 - p_i), off the diagonal -p_i p_j.")
    # Right values: the dtype and the graph of its result are the contract's too.
    assert jacobian.dtype == dtype, (f"{what} should have dtype {dtype}, but it has "
                                     f"{jacobian.dtype}. {named('2.3/dtype-changed')}")
    assert result["on_graph"], (f"{what} that requires grad should be on autograd's graph "
                                f"(requires_grad=True), but it is not. {named('2.3/detached')}")


@pytest.mark.grade("2.3", points=1)
def test_jacobian_vanishes_when_saturated(learner):
    scores = torch.randn(4, dtype=f64) * 0.1
    scores[torch.randint(4, ())] += 30.0  # one score far above the others, at random
    p = torch.softmax(scores, dim=-1)
    jacobian = learner.run(jacobian_of, p=p)
    assert_tensor(jacobian, "softmax_jacobian(p)", shape=(4, 4))
    assert jacobian.abs().max() < 1e-12, (
        f"for a saturated softmax (p close to one-hot) every entry of the Jacobian is close "
        f"to 0; the largest is {jacobian.abs().max().item():.3g}"
    )
    device = run_naming(learner, jacobian_on_meta, DEVICE_CLASH, "2.3/device-not-kept", p=p)
    assert device == "meta", (
        f"softmax_jacobian(p) for p on the meta device (a stand-in for a GPU) is on {device}: "
        f"make new tensors on p's device (torch.eye(n, dtype=p.dtype, device=p.device)), "
        f"never on the CPU by default")


@pytest.mark.grade("2.2", points=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_keeps_dtype_and_device(learner, dtype):
    q, k, v = (torch.randn(2, 3, 4, dtype=dtype) for _ in range(3))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    result = learner.run(attention_of, q=q, k=k, v=v, mask=mask)
    output = assert_tensor(result.get("output"), f"output for {dtype} inputs", shape=(2, 3, 4))
    weights = assert_tensor(result.get("weights"), f"weights for {dtype} inputs", shape=(2, 3, 3))
    expected = reference_weights(q.double(), k.double(), mask)
    right = (torch.allclose(weights.double(), expected, atol=1e-5)
             and torch.allclose(output.double(), expected @ v.double(), atol=1e-5))
    for name, got in (("output", output), ("weights", weights)):
        assert got.dtype == dtype or not right, named("2.2/dtype-changed", dtype=dtype,
                                                      got=got.dtype)
        assert_tensor(got, f"{name} for {dtype} inputs", dtype=dtype)
    devices = run_naming(learner, attention_on_meta, DEVICE_CLASH, "2.2/device-not-kept", q=q,
                         k=k, v=v, mask=mask)
    assert devices == ("meta", "meta"), (
        f"output and weights for inputs on the meta device are on {list(devices)}. " + (
            named("2.2/device-not-kept") if right else "New tensors must be created on the "
            "inputs' device (e.g. torch.full_like(scores, ...)), never on the CPU by default."))
