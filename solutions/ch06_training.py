"""Chapter 6: training the Transformer: the learning-rate schedule, label smoothing,
teacher forcing, greedy decoding and the training step.

Vaswani et al. (2017), section 5.3 (the schedule) and 5.4 (label smoothing,
Szegedy et al. 2016). The model interface used by decoding:
``model.encode(src, src_mask) -> memory [B, Ls, D]``,
``model.decode(memory, src_mask, tgt, tgt_mask) -> hidden [B, Lt, D]`` and
``model.generator(hidden) -> logits [B, Lt, V]`` (or log-probabilities).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from annotated_transformer.batch import Batch
from annotated_transformer.parts import active_parts

__all__ = ["noam_lr", "LabelSmoothingLoss", "make_batch", "greedy_decode", "train_step"]


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Exercise 6.1: ``factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``.

    The rate grows linearly for ``warmup_steps`` steps, then decays as ``1/sqrt(step)``;
    the two branches meet at ``step = warmup_steps``. Step 0 counts as step 1 (so the
    first rate is not 0). Returns a Python float.
    """
    # BEGIN SOLUTION 6.1
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)
    # END SOLUTION


class LabelSmoothingLoss(nn.Module):
    """Exercise 6.2: cross-entropy against a smoothed target distribution.

    The target puts ``1 - smoothing`` on the right class and spreads ``smoothing``
    uniformly over all ``V`` classes (the right one included), so
    ``loss_n = (1 - smoothing) * (-log p[target_n]) + smoothing * mean_v(-log p[v])``,
    with ``log p = log_softmax(logits)``. ``forward(logits [N, V], target [N]) -> scalar``:
    the mean of ``loss_n`` over the targets that are not ``ignore_index``
    (``None`` ignores nothing); zero when every target is ignored. Equals
    ``F.cross_entropy(logits, target, ignore_index=..., label_smoothing=smoothing)``;
    may not pass ``label_smoothing=`` to PyTorch.

    Hint: ``torch.log_softmax`` never takes ``log(0)``, unlike ``KLDivLoss`` on a
    target with zeros.
    """

    def __init__(self, smoothing: float = 0.1, ignore_index: int | None = None) -> None:
        super().__init__()
        # BEGIN SOLUTION 6.2
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got smoothing={smoothing!r}")
        self.smoothing = smoothing
        self.ignore_index = ignore_index
        # END SOLUTION

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits [N, V]``, ``target [N]`` (class ids) -> the mean loss, a scalar."""
        # BEGIN SOLUTION 6.2
        log_probs = torch.log_softmax(logits, dim=-1)  # [N, V]
        if self.ignore_index is None:
            keep = torch.ones_like(target, dtype=torch.bool)
        else:
            keep = target != self.ignore_index
        safe_target = torch.where(keep, target, torch.zeros_like(target))  # any valid class id
        nll = -log_probs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # [N]
        uniform = -log_probs.mean(dim=-1)  # [N]
        loss = (1.0 - self.smoothing) * nll + self.smoothing * uniform
        loss = torch.where(keep, loss, torch.zeros_like(loss))
        return loss.sum() / keep.sum().clamp(min=1)
        # END SOLUTION


def make_batch(src: Tensor, tgt: Tensor, pad_id: int) -> Batch:
    """Exercise 6.3: a :class:`~annotated_transformer.batch.Batch` for teacher forcing.

    ``src [B, Ls]``, ``tgt [B, Lt]`` (each target starts with BOS). The decoder reads
    ``tgt_input = tgt[:, :-1]`` and learns to predict ``tgt_labels = tgt[:, 1:]``: at
    every position the next token, all positions at once. ``src_mask`` is Chapter 4's
    ``padding_mask(src)`` ``[B, 1, 1, Ls]``, ``tgt_mask`` its ``target_mask(tgt_input)``
    ``[B, 1, Lt-1, Lt-1]``; ``num_tokens`` counts the labels that are not ``pad_id``.

    Hint: the masks come from ``active_parts().padding_mask`` and
    ``active_parts().target_mask`` (Chapter 4, yours or the reference).
    """
    # BEGIN SOLUTION 6.3
    parts = active_parts()
    tgt_input, tgt_labels = tgt[:, :-1], tgt[:, 1:]
    return Batch(
        src=src,
        src_mask=parts.padding_mask(src, pad_id),
        tgt_input=tgt_input,
        tgt_labels=tgt_labels,
        tgt_mask=parts.target_mask(tgt_input, pad_id),
        num_tokens=int((tgt_labels != pad_id).sum()),
    )
    # END SOLUTION


@torch.no_grad()
def greedy_decode(model: nn.Module, src: Tensor, src_mask: Tensor, max_len: int, bos_id: int,
                  eos_id: int, pad_id: int) -> Tensor:
    """Exercise 6.4: decode a batch one token at a time, always taking the likeliest token.

    Encode once (``model.encode(src, src_mask)``); start every row with ``bos_id``; at
    each step run ``model.decode(memory, src_mask, ys, tgt_mask)`` on everything decoded
    so far, with ``tgt_mask`` Chapter 4's causal mask (``[L, L]``, never ``None``), and
    append the argmax of ``model.generator`` at the last position. A row that has
    produced ``eos_id`` gets ``pad_id`` from then on. Stop when every row has produced
    EOS or the output has ``max_len`` columns (BOS included). Returns
    ``[B, <= max_len]`` with ``src``'s dtype and device.
    """
    # BEGIN SOLUTION 6.4
    causal_mask = active_parts().causal_mask
    memory = model.encode(src, src_mask)  # [B, Ls, D]
    ys = torch.full((src.size(0), 1), bos_id, dtype=src.dtype, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len and not finished.all():
        hidden = model.decode(memory, src_mask, ys, causal_mask(ys.size(1), device=src.device))
        next_token = model.generator(hidden[:, -1]).argmax(dim=-1)  # [B]
        next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        ys = torch.cat([ys, next_token.unsqueeze(1).to(ys.dtype)], dim=1)
        finished |= next_token == eos_id
    return ys
    # END SOLUTION


def train_step(model: nn.Module, batch: Any, loss_fn: nn.Module,
               optimizer: torch.optim.Optimizer, scheduler: Any,
               clip_norm: float | None = 1.0) -> Tensor:
    """Exercise 6.5: one update of ``model`` on ``batch``; returns the loss before it.

    ``batch.args`` are the model's inputs and ``batch.labels [B, L]`` what it should
    predict (PAD where nothing is scored): a ``Batch`` from 6.3's ``make_batch`` has both
    (``args`` = ``(src, tgt_input, src_mask, tgt_mask)``, ``labels`` = ``tgt_labels``), and so
    do the package's own batches. ``model(*batch.args)`` gives logits
    ``[B, L, V]``, and ``loss_fn(logits [B*L, V], labels [B*L])`` their mean loss (6.2's
    ignores PAD). In this order: the model in training mode; the gradients zeroed
    (``optimizer.zero_grad()``: ``backward`` adds to what is there); the loss; its gradient
    (``loss.backward()``); the gradients scaled so that their total norm is at most
    ``clip_norm`` (``nn.utils.clip_grad_norm_(model.parameters(), clip_norm)``; none when
    ``clip_norm`` is None or 0), before the update reads them; ``optimizer.step()``; and
    ``scheduler.step()``, the next step's learning rate. Returns the loss detached, a
    scalar tensor (``.item()`` here would make the host wait for the device every step).
    """
    # BEGIN SOLUTION 6.5
    model.train()
    optimizer.zero_grad()
    logits = model(*batch.args)  # [B, L, V]
    loss = loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()
    # END SOLUTION
