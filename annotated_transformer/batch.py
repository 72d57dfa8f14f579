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
    """

    src: Tensor
    src_mask: Tensor
    tgt_input: Tensor
    tgt_labels: Tensor
    tgt_mask: Tensor
    num_tokens: int
