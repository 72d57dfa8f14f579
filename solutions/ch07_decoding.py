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
    # BEGIN SOLUTION 7.1
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got beam_size={beam_size!r}")
    causal_mask = active_parts().causal_mask
    batch, k, device = src.size(0), beam_size, src.device
    rows = torch.arange(batch, device=device)

    def penalty(n: int) -> float:  # n generated tokens, EOS included
        return ((5 + n) / 6) ** length_penalty

    # Hypothesis j of row b is row b * k + j of memory, src_mask and ys.
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # [B*k, Ls, D]
    if src_mask is not None:
        src_mask = src_mask.repeat_interleave(k, dim=0)  # [B*k, 1, 1, Ls]
    ys = torch.full((batch * k, 1), bos_id, dtype=src.dtype, device=device)  # [B*k, t]
    # Sums of log-probabilities; -inf marks an empty slot (float32 or the model's dtype,
    # whichever is wider, by type promotion).
    scores = torch.full((batch, k), float("-inf"), device=device)  # [B, k]
    scores[:, 0] = 0.0  # BOS alone, once per row
    best_score = torch.full((batch,), float("-inf"), device=device)  # [B], penalised
    best = torch.full((batch, max_len), pad_id, dtype=src.dtype, device=device)
    best[:, 0] = bos_id
    best_len = torch.ones(batch, dtype=torch.long, device=device)

    def keep_best(final: Tensor) -> None:
        """Remember each row's best of ``final [B, k]`` (penalised; -inf: not finished)."""
        nonlocal best_score
        step_best, which = final.max(dim=-1)  # [B]
        better = step_best > best_score
        length = ys.size(1)  # never shorter than an earlier best: nothing stale remains
        best[better, :length] = ys.view(batch, k, length)[rows, which][better]
        best_len[better] = length
        best_score = torch.where(better, step_best, best_score)

    # A row is done once no live hypothesis can beat its best finished one: a sum of
    # log-probabilities only falls as tokens are added, and a penalty that grows with n
    # (length_penalty >= 0) is at most penalty(max_len - 1), so a live hypothesis of sum s
    # ends with a score of at most s / penalty(max_len - 1). Stopping there changes nothing
    # in the result, and saves the steps up to max_len.
    while ys.size(1) < max_len and scores.isfinite().any():
        if length_penalty >= 0 and bool(
                (best_score >= scores.amax(dim=-1) / penalty(max_len - 1)).all()):
            break
        length = ys.size(1)
        hidden = model.decode(memory, src_mask, ys, causal_mask(length, device=device))
        log_probs = torch.log_softmax(model.generator(hidden[:, -1]), dim=-1)  # [B*k, V]
        vocab = log_probs.size(-1)
        extensions = (scores.view(-1, 1) + log_probs).view(batch, k * vocab)
        scores, index = extensions.topk(k, dim=-1)  # [B, k]; index = slot * V + token
        token = index % vocab
        parent = (rows.unsqueeze(1) * k + index // vocab).view(-1)  # [B*k] rows of ys
        ys = torch.cat([ys[parent], token.view(-1, 1).to(ys.dtype)], dim=1)
        ended = (token == eos_id) & scores.isfinite()  # an empty slot never finishes
        keep_best(torch.where(ended, scores / penalty(length), float("-inf")))
        scores = scores.masked_fill(ended, float("-inf"))  # finished for good: slot freed
    keep_best(scores / penalty(ys.size(1) - 1))  # out of columns: the live ones finish
    return best[:, :int(best_len.max())]
    # END SOLUTION
