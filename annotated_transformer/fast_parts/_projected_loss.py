"""The generator and the label-smoothed loss in one pass over chunks of rows.

``loss = LabelSmoothingLoss(F.linear(hidden, weight, bias), target)`` over a vocabulary of
8,000 builds logits ``[N, V]`` (87 MB for 2,720 tokens), reads them again for the
log-softmax, its backward and the smoothing, and writes a gradient of the same size. Here
the rows go through in chunks of :data:`CHUNK_ROWS` whose logits stay in the processor's
cache: for each chunk the logits, their log-sum-exp and the loss, and, when a gradient
is wanted, at once the gradient of the loss with respect to the chunk's logits
(``softmax - smoothed target``), which the same pass turns into the chunk's rows of the
hidden states' gradient and adds into the weight's and the bias's. Backward only scales
what the forward kept (``[N, D]``, ``[V, D]``, ``[V]``) by the incoming gradient; the
logits are never stored, and no matrix product is computed twice. Rows whose target is
ignored contribute nothing to the loss and nothing to any gradient, so they are left out.

The mathematics is the reference's (Exercise 6.2): for a row with logits ``z`` and target
``t``, ``loss = (1 - s) * (lse(z) - z_t) + s * (lse(z) - mean(z))``; its gradient with
respect to ``z`` is ``softmax(z) - (1 - s) * onehot(t) - s / V``. The mean is over the rows
whose target counts (zero when none does).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ROWS = 128
"""Rows a chunk: 128 x 8,000 float32 logits are 4 MB, which stay in a 2-core machine's
level-3 cache; measured on it, from 64 to 512 rows the step time is within 2%."""


def projected_label_smoothing(hidden: Tensor, weight: Tensor, bias: Tensor | None,
                              target: Tensor, smoothing: float,
                              ignore_index: int | None) -> Tensor:
    """The mean label-smoothed loss of ``F.linear(hidden [N, D], weight [V, D], bias [V])``
    against ``target [N]``, in chunks (a gradient flows to ``hidden``, ``weight``, ``bias``)."""
    wanted = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad
                   for t in (hidden, weight, bias))
    if not any(wanted):
        return _chunks(hidden, weight, bias, target, smoothing, ignore_index, wanted)[0]
    return _Projected.apply(hidden, weight, bias, target, smoothing, ignore_index)


def _chunks(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
            smoothing: float, ignore_index: int | None, wanted: tuple[bool, ...]
            ) -> tuple[Tensor, list[Tensor | None]]:
    """``(mean loss, [the gradients of its sum over the counted rows, None where not
    wanted])``, one chunk of rows at a time."""
    if ignore_index is None:
        rows = torch.arange(target.numel(), device=target.device)
    else:
        rows = (target != ignore_index).nonzero().squeeze(1)
    count = max(rows.numel(), 1)
    vocab = weight.size(0)
    grads = [torch.zeros_like(t) if want else None
             for t, want in zip((hidden, weight, bias), wanted, strict=True)]
    grad_hidden, grad_weight, grad_bias = grads
    total = hidden.new_zeros(())
    weight_t = weight.t()
    for start in range(0, rows.numel(), CHUNK_ROWS):
        chunk = rows[start:start + CHUNK_ROWS]
        h, t = hidden.index_select(0, chunk), target.index_select(0, chunk)
        logits = torch.addmm(bias, h, weight_t) if bias is not None else h @ weight_t
        lse = torch.logsumexp(logits, dim=1)  # [c]
        picked = logits.gather(1, t.unsqueeze(1))  # z_t, [c, 1]
        # (1 - s)(lse - z_t) + s (lse - sum(z) / V), summed over the chunk's rows
        total = total + (lse.sum() - (1.0 - smoothing) * picked.sum()
                         - smoothing / vocab * logits.sum())
        if not any(wanted):
            continue
        grad = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in the logits' memory
        grad.scatter_add_(1, t.unsqueeze(1), torch.full_like(picked, smoothing - 1.0))
        if smoothing:
            grad.sub_(smoothing / vocab)
        if grad_hidden is not None:
            grad_hidden.index_copy_(0, chunk, grad @ weight)
        if grad_weight is not None:
            grad_weight.addmm_(grad.t(), h)
        if grad_bias is not None:
            grad_bias.add_(grad.sum(0))
    return total / count, [g.div_(count) if g is not None else None for g in grads]


class _Projected(torch.autograd.Function):
    """Forward computes the loss and its gradients; backward scales the gradients."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                smoothing: float, ignore_index: int | None) -> Tensor:
        loss, grads = _chunks(hidden, weight, bias, target, smoothing, ignore_index,
                              tuple(ctx.needs_input_grad[:3]))
        ctx.present = tuple(g is not None for g in grads)
        ctx.save_for_backward(*(g for g in grads if g is not None))
        return loss

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_output if present else None for present in ctx.present]
        return (*grads, None, None, None)
