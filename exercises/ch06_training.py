# Your work goes here: replace each `raise NotImplementedError(...)` with your code.
# Grade it: python -m annotated_transformer.grade --chapter 6
# Generated from solutions/ch06_training.py by `python -m annotated_transformer.stubs`.
# stub-digest: 7becb2cc7b8dd0e8
"""Chapter 6: training the Transformer: the learning-rate schedule, label smoothing,
teacher forcing and greedy decoding.

Vaswani et al. (2017), section 5.3 (the schedule) and 5.4 (label smoothing,
Szegedy et al. 2016). The model interface used by decoding:
``model.encode(src, src_mask) -> memory [B, Ls, D]``,
``model.decode(memory, src_mask, tgt, tgt_mask) -> hidden [B, Lt, D]`` and
``model.generator(hidden) -> logits [B, Lt, V]`` (or log-probabilities).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from annotated_transformer.batch import Batch
from annotated_transformer.parts import active_parts

__all__ = ["noam_lr", "LabelSmoothingLoss", "make_batch", "greedy_decode"]


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Exercise 6.1: ``factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``.

    The rate grows linearly for ``warmup_steps`` steps, then decays as ``1/sqrt(step)``;
    the two branches meet at ``step = warmup_steps``. Step 0 counts as step 1 (so the
    first rate is not 0). Returns a Python float.
    """
    # TODO Exercise 6.1: write noam_lr (see its docstring).
    raise NotImplementedError("Exercise 6.1: noam_lr is not implemented yet")


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
        # TODO Exercise 6.2: write LabelSmoothingLoss.__init__ (see its docstring).
        raise NotImplementedError("Exercise 6.2: LabelSmoothingLoss.__init__ is not implemented yet")

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits [N, V]``, ``target [N]`` (class ids) -> the mean loss, a scalar."""
        # TODO Exercise 6.2: write LabelSmoothingLoss.forward (see its docstring).
        raise NotImplementedError("Exercise 6.2: LabelSmoothingLoss.forward is not implemented yet")


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
    # TODO Exercise 6.3: write make_batch (see its docstring).
    raise NotImplementedError("Exercise 6.3: make_batch is not implemented yet")


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
    # TODO Exercise 6.4: write greedy_decode (see its docstring).
    raise NotImplementedError("Exercise 6.4: greedy_decode is not implemented yet")
