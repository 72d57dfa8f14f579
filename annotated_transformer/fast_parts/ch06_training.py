"""Chapter 6, fast: the loss as one fused ``F.cross_entropy`` with label smoothing, and,
given the generator's weights, the generator and the loss in one pass over chunks of rows
(:meth:`LabelSmoothingLoss.projected`, which a model's ``loss`` uses when its loss has it).

The schedule, the batch and greedy decoding are the reference's (they are not where a
training step spends its time). The training step is the reference's, with the loss the
model computes itself when it can (``model.loss``: the fast loss's generator inside it),
the gradients zeroed to None and clipped with the ``foreach`` kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.fast_parts._projected_loss import projected_label_smoothing
from annotated_transformer.parts import is_compiling, load_chapter
from annotated_transformer.teacher_forcing import LabelledInputs

_reference = load_chapter("solutions", 6)

noam_lr = _reference.noam_lr
make_batch = _reference.make_batch
greedy_decode = _reference.greedy_decode

__all__ = ["noam_lr", "LabelSmoothingLoss", "make_batch", "greedy_decode", "train_step"]


class LabelSmoothingLoss(_reference.LabelSmoothingLoss):
    """Exercise 6.2 as ``F.cross_entropy(..., label_smoothing=smoothing)``, summed and divided
    by the number of targets that count, so that a batch whose targets are all ignored
    gives zero (where the mean gives NaN). The constructor and its checks are the
    reference's."""

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits [N, V]``, ``target [N]`` (class ids) -> the mean loss, a scalar."""
        if self.ignore_index is None:
            total = F.cross_entropy(logits, target, label_smoothing=self.smoothing,
                                    reduction="sum")
            return total / max(target.numel(), 1)
        total = F.cross_entropy(logits, target, ignore_index=self.ignore_index,
                                label_smoothing=self.smoothing, reduction="sum")
        return total / (target != self.ignore_index).sum().clamp(min=1)

    def projected(self, hidden: Tensor, weight: Tensor, bias: Tensor | None,
                  target: Tensor) -> Tensor:
        """``self(F.linear(hidden, weight, bias), target)``: ``hidden [N, D]``, the
        generator's ``weight [V, D]`` and ``bias [V]``. On a CPU the logits are computed
        a chunk of rows at a time and never stored, the gradient with them
        (:mod:`~annotated_transformer.fast_parts._projected_loss`); elsewhere, under
        ``torch.compile`` or autocast, as written."""
        if (hidden.device.type != "cpu" or is_compiling() or torch.is_autocast_enabled("cpu")
                or hidden.dim() != 2 or target.dim() != 1):
            return self(F.linear(hidden, weight, bias), target)
        return projected_label_smoothing(hidden, weight, bias, target, self.smoothing,
                                         self.ignore_index)

    def scored_features(self, model: nn.Module, batch: LabelledInputs) -> tuple[Tensor, Tensor]:
        """``(hidden [N, D], labels [N])``: what ``model``'s generator reads for ``batch``
        and the labels it is scored against. For an encoder-decoder of the fast parts in
        training on a CPU, only the scored positions, computed on those positions alone
        (:mod:`~annotated_transformer.fast_parts._packed`); otherwise every position."""
        from annotated_transformer.fast_parts._packed import scored_features

        packed = scored_features(model, batch.args, batch.labels, self.ignore_index)
        if packed is not None:
            return packed
        hidden = model.features(*batch.args)  # [B, L, D]
        return hidden.reshape(-1, hidden.size(-1)), batch.labels.reshape(-1)

    def model_loss(self, model: nn.Module, batch: LabelledInputs) -> Tensor:
        """``model``'s mean loss on ``batch`` (what ``Model.loss`` computes): the scored
        features (:meth:`scored_features`) through the generator inside the loss
        (:meth:`projected`). The same value and gradients as the logits then the loss."""
        hidden, labels = self.scored_features(model, batch)
        return self.projected(hidden, model.generator.weight, model.generator.bias, labels)


def train_step(model: nn.Module, batch: LabelledInputs, loss_fn: nn.Module,
               optimizer: torch.optim.Optimizer, scheduler, clip_norm: float | None = 1.0
               ) -> Tensor:
    """Exercise 6.5, as the reference, the loss from ``model.loss(batch, loss_fn)`` when the
    model has one (the package's :class:`~annotated_transformer.train.Trainee`)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    own = getattr(model, "loss", None)
    if own is not None:
        loss = own(batch, loss_fn)
    else:
        logits = model(*batch.args)  # [B, L, V]
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    return loss.detach()
