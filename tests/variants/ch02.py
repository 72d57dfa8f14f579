"""Chapter 2: plausible wrong answers and other correct answers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from variants import right, wrong

NEG_INF = float("-inf")

# ------------------------------------------------------------------ 2.1


@wrong("2.1", "softmax", "no maximum subtracted: exp overflows",
       mistake="2.1/no-maximum-subtracted")
def unstable(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


@wrong("2.1", "softmax", "all -inf slices give NaN",
       mistake="2.1/empty-slice-unguarded")
def nan_on_empty_rows(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


@wrong("2.1", "softmax", "sum over every entry instead of along dim",
       mistake="2.1/sum-over-everything")
def global_sum(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    return e / e.sum().clamp_min(1e-300)


@wrong("2.1", "softmax", "keepdim forgotten: the maximum and the sum do not broadcast back",
       mistake="2.1/keepdim-forgotten")
def keepdim_forgotten(x, dim=-1):
    m = x.amax(dim)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    total = e.sum(dim)
    return e / torch.where(total == 0, torch.ones_like(total), total)


@wrong("2.1", "softmax", "dim ignored: always the last axis",
       mistake="2.1/dim-ignored")
def always_last_axis(x, dim=-1):
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


@right("2.1", "softmax", "a log-sum-exp written out, then exp, zeros where the slice is empty")
def via_own_logsumexp(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))
    return torch.where(torch.isinf(lse), torch.zeros_like(x), torch.exp(x - lse))


# PyTorch's own softmax by other roads: each is refused at the dispatch level (forbidden).


@wrong("2.1", "softmax", "PyTorch's logsumexp: exp(x - logsumexp(x))", says="aten.logsumexp")
def via_torch_logsumexp(x, dim=-1):
    lse = torch.logsumexp(x, dim=dim, keepdim=True)
    return torch.where(torch.isinf(lse), torch.zeros_like(x), torch.exp(x - lse))


@wrong("2.1", "softmax", "the gradient of torch.logsumexp by autograd", says="aten.logsumexp")
def gradient_of_logsumexp(x, dim=-1):
    with torch.enable_grad():
        z = x.detach().requires_grad_(True)
        return torch.autograd.grad(torch.logsumexp(z, dim).sum(), z)[0]


@wrong("2.1", "softmax", "the gradient of torch.logsumexp by torch.func", says="aten.logsumexp")
def func_gradient_of_logsumexp(x, dim=-1):
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    grads = torch.func.vmap(torch.func.grad(lambda r: torch.logsumexp(r, -1)))(rows)
    return grads.reshape(moved.shape).movedim(-1, dim)


@wrong("2.1", "softmax", "torch.special.softmax", says="aten._softmax")
def special_softmax(x, dim=-1):
    return torch.special.softmax(x, dim).nan_to_num(nan=0.0)


@wrong("2.1", "softmax", "torch.masked.softmax with every entry allowed", says="aten._softmax")
def masked_softmax(x, dim=-1):
    return torch.masked.softmax(x, dim, mask=torch.ones_like(x, dtype=torch.bool)).nan_to_num(
        nan=0.0)


@wrong("2.1", "softmax", "the probabilities of torch.distributions.Categorical",
       says="may not use PyTorch's aten.")
def categorical_probs(x, dim=-1):
    moved = x.movedim(dim, -1)
    return torch.distributions.Categorical(logits=moved, validate_args=False).probs.movedim(
        -1, dim)


def _guarded(x, dim, zeros=torch.zeros_like):
    maximum = x.amax(dim, keepdim=True)
    maximum = torch.where(torch.isfinite(maximum), maximum, zeros(maximum))
    exps = torch.exp(x - maximum)
    total = exps.sum(dim, keepdim=True)
    return exps / torch.where(total == 0, torch.ones_like(total), total)


@wrong("2.1", "softmax", "computed in float64 for precision, never converted back",
       mistake="2.1/dtype-changed")
def float64_result(x, dim=-1):
    return _guarded(x.double(), dim)


@wrong("2.1", "softmax", "the zeros that replace a -inf maximum made on the CPU",
       mistake="2.1/device-not-kept")
def zeros_on_the_cpu(x, dim=-1):
    return _guarded(x, dim, zeros=lambda m: torch.zeros(m.shape))


@wrong("2.1", "softmax", "under torch.no_grad(): right values, no gradient reaches x",
       mistake="2.1/detached")
@torch.no_grad()
def without_gradient(x, dim=-1):
    return _guarded(x, dim)


@right("2.1", "softmax", "detached maximum and nan_to_num")
def detached_max_nan_to_num(x, dim=-1):
    m = x.max(dim=dim, keepdim=True).values.detach()
    e = torch.exp(x - m)
    return (e / e.sum(dim=dim, keepdim=True)).nan_to_num(nan=0.0)


# ------------------------------------------------------------------ 2.2


def _checked(q, k, v):
    if k.size(-1) != q.size(-1) or k.size(-2) != v.size(-2):
        raise ValueError(f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}")


def _attention(q, k, v, mask=None, dropout=None, *, scale=None, where="before", softmax_dim=-1,
               fill=NEG_INF, invert=False):
    from solutions.ch02_attention import softmax  # the reference softmax: only 2.2 varies here

    _checked(q, k, v)
    scale = math.sqrt(q.size(-1)) if scale is None else scale(q, k, v)
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None and invert:
        mask = ~mask
    if mask is not None and where == "before":
        scores = torch.where(mask, scores, torch.full_like(scores, fill))
    weights = softmax(scores, dim=softmax_dim)
    if mask is not None and where == "after":
        weights = weights.masked_fill(~mask, 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


@wrong("2.2", "scaled_dot_product_attention", "divided by d_k instead of sqrt(d_k)",
       mistake="2.2/divided-by-d_k")
def scaled_by_d_k(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, scale=lambda q, k, v: q.size(-1))


@wrong("2.2", "scaled_dot_product_attention", "no scaling at all",
       mistake="2.2/no-scaling")
def unscaled(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, scale=lambda q, k, v: 1.0)


@wrong("2.2", "scaled_dot_product_attention",
       "divided by sqrt of the width of all heads (d_model) instead of one head's d_k",
       mistake="2.2/divided-by-sqrt-d_model")
def scaled_by_sqrt_d_model(q, k, v, mask=None, dropout=None):
    heads = q.size(-3) if q.dim() >= 4 else 1
    return _attention(q, k, v, mask, dropout, scale=lambda q, k, v: math.sqrt(q.size(-1) * heads))


@wrong("2.2", "scaled_dot_product_attention", "scaled by the value's width d_v",
       mistake="2.2/scaled-by-d_v")
def scaled_by_d_v(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, scale=lambda q, k, v: math.sqrt(v.size(-1)))


@wrong("2.2", "scaled_dot_product_attention", "softmax over the queries (dim=-2)",
       mistake="2.2/softmax-over-queries")
def softmax_over_queries(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, softmax_dim=-2)


@wrong("2.2", "scaled_dot_product_attention", "mask applied after the softmax",
       mistake="2.2/mask-after-softmax")
def mask_after_softmax(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, where="after")


@wrong("2.2", "scaled_dot_product_attention", "-1e9 instead of -inf: empty rows become uniform",
       mistake="2.2/large-negative-fill")
def large_negative_fill(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, fill=-1e9)


@wrong("2.2", "scaled_dot_product_attention", "masked scores set to 0 instead of -inf",
       mistake="2.2/masked-scores-zeroed")
def zero_fill(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, fill=0.0)


@wrong("2.2", "scaled_dot_product_attention", "mask read as True = hidden (PyTorch's MHA way)",
       mistake="2.2/mask-true-hides")
def inverted_mask(q, k, v, mask=None, dropout=None):
    return _attention(q, k, v, mask, dropout, invert=True)


@wrong("2.2", "scaled_dot_product_attention", "returns the weights from before dropout",
       mistake="2.2/weights-before-dropout")
def weights_before_dropout(q, k, v, mask=None, dropout=None):
    output, weights = _attention(q, k, v, mask, None)
    if dropout is None:
        return output, weights
    return dropout(weights) @ v, weights


@wrong("2.2", "scaled_dot_product_attention", "dropout applied to the output",
       mistake="2.2/dropout-on-output")
def dropout_on_output(q, k, v, mask=None, dropout=None):
    output, weights = _attention(q, k, v, mask, None)
    return (output if dropout is None else dropout(output)), weights


@wrong("2.2", "scaled_dot_product_attention", "the weights detached before they multiply value "
       "(as 3.3 keeps attention_weights): no gradient reaches query and key",
       mistake="2.2/weights-detached")
def weights_detached(q, k, v, mask=None, dropout=None):
    from solutions.ch02_attention import softmax

    _checked(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, NEG_INF))
    weights = softmax(scores).detach()
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


@wrong("2.2", "scaled_dot_product_attention", "the softmax taken in float64, never converted "
       "back: float32 inputs give float64 results", mistake="2.2/dtype-changed")
def float64_softmax(q, k, v, mask=None, dropout=None):
    output, weights = _attention(q.double(), k.double(), v.double(), mask, dropout)
    return output, weights


@right("2.2", "scaled_dot_product_attention", "einsum, query scaled first, masked_fill")
def einsum_masked_fill(q, k, v, mask=None, dropout=None):
    from solutions.ch02_attention import softmax

    _checked(q, k, v)
    scores = torch.einsum("...qd,...kd->...qk", q / math.sqrt(q.shape[-1]), k)
    if mask is not None:
        scores = scores.masked_fill(~mask.expand_as(scores) if mask.dim() <= scores.dim()
                                    else ~mask, NEG_INF)
    weights = softmax(scores, -1)
    if dropout:
        weights = dropout(weights)
    return torch.einsum("...qk,...kd->...qd", weights, v), weights


@right("2.2", "scaled_dot_product_attention", "torch.finfo(dtype).min, then empty rows zeroed")
def finfo_min_then_zero_rows(q: Tensor, k: Tensor, v: Tensor, mask=None, dropout=None):
    from solutions.ch02_attention import softmax

    _checked(q, k, v)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        weights = softmax(scores) * mask  # rows with nothing allowed become all zero
    else:
        weights = softmax(scores)
    weights = dropout(weights) if dropout is not None else weights
    return torch.matmul(weights, v), weights


@wrong("2.2", "scaled_dot_product_attention",
       "the weights as the gradient of torch.logsumexp of the scores", says="aten.logsumexp")
def weights_by_gradient(q, k, v, mask=None, dropout=None):
    _checked(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, NEG_INF))
    with torch.enable_grad():
        z = scores.detach().requires_grad_(True)
        weights = torch.autograd.grad(torch.logsumexp(z, -1).sum(), z)[0].nan_to_num(nan=0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


@wrong("2.2", "scaled_dot_product_attention", "PyTorch's attention math through the functional "
       "multi-head attention with identity projections", says="may not use PyTorch's aten.")
def functional_multi_head(q, k, v, mask=None, dropout=None):
    _checked(q, k, v)
    d = q.size(-1)
    eye = torch.eye(d, dtype=q.dtype)
    flat = [t.reshape(-1, t.size(-2), t.size(-1)).transpose(0, 1) for t in (q, k, v)]
    output, weights = torch.nn.functional.multi_head_attention_forward(
        flat[0], flat[1], flat[2], d, 1, torch.cat([eye, eye, eye]), None, None, None, False,
        0.0, eye, None, need_weights=True)
    return output, weights


# ------------------------------------------------------------------ 2.3


@wrong("2.3", "softmax_jacobian", "the outer product's sign flipped: diag(p) + p p^T",
       mistake="2.3/outer-added")
def plus_outer(p):
    return torch.diag_embed(p) + p.unsqueeze(-1) * p.unsqueeze(-2)


@wrong("2.3", "softmax_jacobian", "only the diagonal, p (1 - p)",
       mistake="2.3/diagonal-only")
def diagonal_only(p):
    return torch.diag_embed(p * (1 - p))


@wrong("2.3", "softmax_jacobian", "p p^T without diag(p)",
       mistake="2.3/no-diagonal-term")
def outer_only(p):
    return -p.unsqueeze(-1) * p.unsqueeze(-2)


@right("2.3", "softmax_jacobian", "einsum with an identity matrix")
def einsum_identity(p):
    eye = torch.eye(p.size(-1), dtype=p.dtype, device=p.device)
    return torch.einsum("...i,ij->...ij", p, eye) - torch.einsum("...i,...j->...ij", p, p)


@right("2.3", "softmax_jacobian", "p_i (delta_ij - p_j) by broadcasting")
def broadcast_delta(p):
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    return p[..., :, None] * (eye - p[..., None, :])


@wrong("2.2", "scaled_dot_product_attention", "the -inf fill made on the CPU in float32",
       mistake="2.2/device-not-kept")
def fill_on_default_device(q, k, v, mask=None, dropout=None):
    from solutions.ch02_attention import softmax

    _checked(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(NEG_INF).expand(scores.shape).clone())
    weights = softmax(scores)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v, weights


@wrong("2.3", "softmax_jacobian", "torch.autograd.functional.jacobian of torch.softmax at log p",
       says="aten._softmax")
def jacobian_of_torch_softmax(p):
    rows = p.reshape(-1, p.size(-1))
    jacobians = [torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), row.log())
                 for row in rows]
    return torch.stack(jacobians).reshape(*p.shape, p.size(-1))


def _own_softmax(z):
    """A softmax of elementary ops over the last axis (what autograd differentiates below)."""
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


@wrong("2.3", "softmax_jacobian", "autograd's Jacobian of a softmax written by hand, at log p",
       says="autograd")
def jacobian_of_own_softmax(p):
    rows = p.reshape(-1, p.size(-1))
    jacobians = [torch.autograd.functional.jacobian(_own_softmax, row.log()) for row in rows]
    return torch.stack(jacobians).reshape(*p.shape, p.size(-1))


@wrong("2.3", "softmax_jacobian", "torch.func.jacfwd of a softmax written by hand, at log p",
       says="forward mode")
def forward_jacobian_of_own_softmax(p):
    rows = p.reshape(-1, p.size(-1))
    return torch.func.vmap(torch.func.jacfwd(_own_softmax))(rows.log()).reshape(
        *p.shape, p.size(-1))


@wrong("2.3", "softmax_jacobian", "the Hessian of torch.logsumexp by torch.func at log p",
       says="autograd")
def hessian_of_logsumexp(p):
    rows = p.reshape(-1, p.size(-1))
    hessians = torch.func.vmap(torch.func.hessian(lambda z: torch.logsumexp(z, -1)))(rows.log())
    return hessians.reshape(*p.shape, p.size(-1))


@wrong("2.3", "softmax_jacobian", "an identity made in float64: float32 p gives a float64 J",
       mistake="2.3/dtype-changed")
def float64_identity(p):
    eye = torch.eye(p.size(-1), dtype=torch.float64, device=p.device)
    return p.unsqueeze(-1) * eye - p.unsqueeze(-1) * p.unsqueeze(-2)


@wrong("2.3", "softmax_jacobian", "computed on p.detach(): right values, off the graph",
       mistake="2.3/detached")
def detached_jacobian(p):
    q = p.detach()
    return torch.diag_embed(q) - q.unsqueeze(-1) * q.unsqueeze(-2)


@wrong("2.3", "softmax_jacobian", "the identity made on the CPU whatever p's device",
       mistake="2.3/device-not-kept")
def identity_on_the_cpu(p):
    eye = torch.eye(p.size(-1), dtype=p.dtype)
    return p.unsqueeze(-1) * eye - p.unsqueeze(-1) * p.unsqueeze(-2)
