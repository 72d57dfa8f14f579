"""A batch prepared for teacher forcing (Exercise 6.3 builds it)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Batch:
    """Source, shifted target and their masks (``True`` = attention allowed).

    - ``src [B, Ls]`` and ``src_mask [B, 1, 1, Ls]`` (padding);
    - ``tgt_input [B, Lt-1]``: the target without its last token (it starts with BOS);
    - ``tgt_labels [B, Lt-1]``: the target without its first token (what to predict);
    - ``tgt_mask [B, 1, Lt-1, Lt-1]``: padding and causality for ``tgt_input``;
    - ``num_tokens``: how many labels are not padding (the loss's denominator).

    Exercise 6.5's ``train_step`` reads any batch as ``args``, the forward pass's inputs
    (``model(*batch.args)``: ``src, tgt_input, src_mask, tgt_mask``, the order of
    ``EncoderDecoder.forward``), and ``labels``, what its logits are scored against: so a
    ``Batch`` from ``make_batch`` goes to ``train_step`` as it is, as the package's own
    :class:`~annotated_transformer.teacher_forcing.LabelledInputs` do.
    """

    src: Tensor
    src_mask: Tensor
    tgt_input: Tensor
    tgt_labels: Tensor
    tgt_mask: Tensor
    num_tokens: int

    @property
    def args(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The encoder-decoder's inputs: ``(src, tgt_input, src_mask, tgt_mask)``."""
        return self.src, self.tgt_input, self.src_mask, self.tgt_mask

    @property
    def labels(self) -> Tensor:
        """``tgt_labels [B, Lt-1]``, what the logits ``[B, Lt-1, V]`` are scored against."""
        return self.tgt_labels
