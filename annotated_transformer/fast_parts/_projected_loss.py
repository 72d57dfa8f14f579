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

CHUNK_ROWS = 512
"""Rows a chunk: 512 x 8,000 float32 logits are 16 MB, which stay in the 32 MB level-3
cache of the 2-core machine the course is measured on. There (forward and backward of
2,720 rows, d_model 256, a busy machine), 512 rows took 392 ms on one thread and 232 on
two; 256 rows 404 and 254, 128 rows 430 and 293; the generator then the loss 594 and 354."""


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
    """``(mean loss, [its gradients, None where not wanted])``, one chunk of rows at a time.

    Per row, with ``e = exp(z - max z)`` and ``S = sum(e)``: ``lse = max z + log S``;
    ``sum(z) = h . sum_v(W_v) + sum(b)`` (no pass over the logits); the gradient with
    respect to the logits ``e / S - (1 - s) onehot(t) - s / V`` is applied to the matrix
    products term by term: ``e`` goes through them (scaled by ``1 / S`` on the small side),
    and the one-hot and uniform terms are added to the ``[N, D]``, ``[V, D]`` and ``[V]``
    gradients directly (a row of ``W`` per target, a sum of rows)."""
    if ignore_index is None:
        rows = torch.arange(target.numel(), device=target.device)
    else:
        rows = (target != ignore_index).nonzero().squeeze(1)
    count = max(rows.numel(), 1)
    vocab = weight.size(0)
    grad_hidden, grad_weight, grad_bias = (
        torch.zeros_like(t) if want else None
        for t, want in zip((hidden, weight, bias), wanted, strict=True))
    column_sum = weight.sum(0)  # [D]: sum_v W_v, so sum_v z_v = h . column_sum + sum(b)
    bias_sum = bias.sum() if bias is not None else 0.0
    total = hidden.new_zeros(())
    weight_t = weight.t()
    buffer = hidden.new_empty(min(CHUNK_ROWS, rows.numel()), vocab)
    for start in range(0, rows.numel(), CHUNK_ROWS):
        chunk = rows[start:start + CHUNK_ROWS]
        h, t = hidden.index_select(0, chunk), target.index_select(0, chunk)
        logits = buffer[:chunk.numel()]
        if bias is not None:
            torch.addmm(bias, h, weight_t, out=logits)
        else:
            torch.mm(h, weight_t, out=logits)
        picked = logits.gather(1, t.unsqueeze(1)).squeeze(1)  # z_t
        largest = logits.amax(dim=1, keepdim=True)
        exps = logits.sub_(largest).exp_()  # e, in the logits' memory
        sums = exps.sum(dim=1)  # S
        lse = largest.squeeze(1) + sums.log()
        # (1 - s)(lse - z_t) + s (lse - sum(z) / V), summed over the chunk's rows
        total = total + (lse.sum() - (1.0 - smoothing) * picked.sum()
                         - smoothing / vocab * (h.mv(column_sum).sum() + bias_sum * t.numel()))
        if not any(wanted):
            continue
        inverse = sums.reciprocal().unsqueeze(1)  # 1 / S, [c, 1]
        if grad_hidden is not None:  # (e / S) W - (1 - s) W_t - (s / V) sum_v W_v
            rows_grad = torch.mm(exps, weight).mul_(inverse)
            rows_grad.add_(weight.index_select(0, t), alpha=smoothing - 1.0)
            if smoothing:
                rows_grad.sub_(column_sum, alpha=smoothing / vocab)
            grad_hidden.index_copy_(0, chunk, rows_grad)
        if grad_weight is not None:  # (e / S)^T h; the one-hot and uniform terms below
            grad_weight.addmm_(exps.t(), h * inverse)
        if grad_bias is not None:
            grad_bias.add_(exps.t().mv(inverse.squeeze(1)))
    if grad_weight is not None or grad_bias is not None:
        counted_hidden = hidden.index_select(0, rows)
        counted_target = target.index_select(0, rows)
    if grad_weight is not None:  # - (1 - s) h_n into row t_n; - (s / V) sum_n h_n into every row
        grad_weight.index_add_(0, counted_target, counted_hidden, alpha=smoothing - 1.0)
        if smoothing:
            grad_weight.sub_(counted_hidden.sum(0), alpha=smoothing / vocab)
    if grad_bias is not None:
        grad_bias.sub_(torch.bincount(counted_target, minlength=vocab).to(grad_bias.dtype),
                       alpha=1.0 - smoothing)
        if smoothing:
            grad_bias.sub_(smoothing / vocab * rows.numel())
    return total / count, [g.div_(count) if g is not None else None
                           for g in (grad_hidden, grad_weight, grad_bias)]


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
