"""Teacher forcing: what a model reads of a batch (:class:`LabelledInputs`), and the
decoder-only model's inputs and labels.

An encoder-decoder reads chapter 6's ``make_batch`` (a
:class:`~annotated_transformer.batch.Batch`); a decoder-only model reads the prompt
and the answer joined into one sequence (:func:`language_model_batch`). Either way the
model's :meth:`~annotated_transformer.model.Model.teacher_forcing` returns a
:class:`LabelledInputs`: the arguments of its forward pass and the labels its logits are
scored against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from annotated_transformer.data.task import pad_rows
from annotated_transformer.data.vocab import PAD


def language_model_batch(prompt: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
    """Decoder-only teacher forcing: ``prompt [B, Lp]`` and ``answer [B, La]`` (both padded)
    joined per row into one sequence; returns ``(inputs, labels)``, both ``[B, L-1]``:
    the sequence without its last token, and without its first with every prompt label
    set to PAD (only the answer is scored)."""
    rows, labels = [], []
    for p, a in zip(prompt.tolist(), answer.tolist(), strict=True):
        p = [t for t in p if t != PAD]
        a = [t for t in a if t != PAD]
        rows.append(p + a)
        labels.append([PAD] * (len(p) - 1) + a)
    sequence, labels = pad_rows(rows), pad_rows(labels)
    return sequence[:, :-1].to(prompt.device), labels[:, : sequence.size(1) - 1].to(prompt.device)


@dataclass
class LabelledInputs:
    """What a model reads of a batch: ``args`` for its forward pass (encoder-decoder:
    ``src [B, Ls], tgt_input [B, Lt], src_mask [B, 1, 1, Ls], tgt_mask [B, 1, Lt, Lt]``;
    decoder-only: ``tokens [B, L], mask [B, 1, L, L]``) and the ``labels [B, Lt]`` that its
    logits ``[B, Lt, V]`` are scored against (PAD is not scored). Every tensor is batch
    first."""

    args: tuple[Tensor, ...]
    labels: Tensor

    def rows(self, start: int, step: int) -> LabelledInputs:
        """Rows ``start, start + step, ...`` of every tensor (one process's share)."""
        return LabelledInputs(tuple(a[start::step] for a in self.args), self.labels[start::step])

    def to(self, device: torch.device) -> LabelledInputs:
        """On ``device``. To a GPU the tensors go through pinned memory with
        ``non_blocking=True``: the copy is queued behind the work already there, and the
        host goes on without waiting for it."""
        if device.type != "cuda":
            return LabelledInputs(tuple(a.to(device) for a in self.args), self.labels.to(device))

        def move(tensor: Tensor) -> Tensor:
            if tensor.device.type == "cpu":
                tensor = tensor.pin_memory()
            return tensor.to(device, non_blocking=True)
        return LabelledInputs(tuple(move(a) for a in self.args), move(self.labels))

    def num_tokens(self) -> int:
        """The labels that are scored (read back from the device when they are on one)."""
        return int((self.labels != PAD).sum())
