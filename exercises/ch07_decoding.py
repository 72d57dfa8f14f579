# Your work goes here: replace each `raise NotImplementedError(...)` with your code.
# Grade it: python -m annotated_transformer.grade --chapter 7
# Generated from solutions/ch07_decoding.py by `python -m annotated_transformer.stubs`.
# stub-digest: 0a728e6c5da6ef49
"""Chapter 7: the Transformer at work: beam search.

Greedy decoding (6.4) commits to the likeliest token at every step, and a token that
looks best now can lead to a worse sequence. Beam search keeps the ``beam_size`` best
partial hypotheses of every row instead, and ranks the finished ones with the length
penalty of Wu et al. (2016), section 7, so that short outputs do not win merely because
they add up fewer (negative) log-probabilities. The paper decodes with a beam of 4 and
``length_penalty=0.6`` (section 6.1). The model interface is the one of 6.4:
``model.encode(src, src_mask) -> memory [B, Ls, D]``,
``model.decode(memory, src_mask, tgt, tgt_mask) -> hidden [B, Lt, D]`` and
``model.generator(hidden) -> logits [B, Lt, V]`` (or log-probabilities).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from annotated_transformer.parts import active_parts

__all__ = ["beam_search"]


@torch.no_grad()
def beam_search(model: nn.Module, src: Tensor, src_mask: Tensor, max_len: int, bos_id: int,
                eos_id: int, pad_id: int, beam_size: int = 4,
                length_penalty: float = 0.6) -> Tensor:
    """Exercise 7.1: decode a batch, keeping the ``beam_size`` best hypotheses of every row.

    ``src [B, Ls]``, ``src_mask [B, 1, 1, Ls]`` (4.1). A hypothesis is BOS followed by
    ``n`` generated tokens ``y_1 .. y_n``; its score is

        score = (log p(y_1) + ... + log p(y_n)) / ((5 + n) / 6) ** length_penalty

    where ``log p(y_t)`` is ``log_softmax`` of the generator's output after ``y_<t`` (the
    generator may return logits) and ``n`` counts EOS but not BOS.
    ``length_penalty=0`` gives the plain sum.

    Every row starts with one live hypothesis: BOS alone. At each step every live
    hypothesis is extended by every token of the vocabulary, and the ``beam_size`` best
    extensions of the row are kept (they all have the same length, so the sum of
    log-probabilities orders them). Those ending in ``eos_id`` are finished for good;
    the rest are the live hypotheses of the next step, which again keeps up to
    ``beam_size``. The search stops when no hypothesis is live or the hypotheses have
    ``max_len`` columns (BOS counted); the live ones then count as finished.

    Returns, per row, the finished hypothesis with the best score: ``[B, <= max_len]``,
    BOS in the first column, ``pad_id`` after EOS, as wide as its longest row, with
    ``src``'s dtype and device. With ``beam_size=1`` it is greedy decoding (6.4);
    ``beam_size < 1`` raises ``ValueError``. Uses the causal mask of Chapter 4, as 6.4.

    Hint: decode the ``B * beam_size`` hypotheses together (``repeat_interleave`` the
    memory and ``src_mask``), keep their running sums in a ``[B, beam_size]`` tensor
    with ``-inf`` in empty slots, and take ``topk`` over each row's
    ``beam_size * V`` extensions. At the start only one slot of a row may be live:
    ``beam_size`` copies of BOS would fill the beam with copies of one extension.
    """
    # TODO Exercise 7.1: write beam_search (see its docstring).
    raise NotImplementedError("Exercise 7.1: beam_search is not implemented yet")
