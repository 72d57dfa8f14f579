"""The plausible mistakes the graded tests recognise: a stable id and what a learner reads.

One table for the course. A graded test that recognises a mistake (its result equals what
that mistake computes) fails with :func:`named`: the message names the mistake and its fix,
and ends with the id in brackets, ``[mistake 2.2/divided-by-d_k]``, which the grader reads
back into every report (``grading.messages.mistake_of``) and ``regrade`` counts over a class.
A wrong variant in ``tests/variants/`` declares the id it makes (``mistake=``); the suite
checks that the grader names it. Ids never change once released: a class summary compares
them across years.
"""

from __future__ import annotations

import torch

MISTAKES = {
    # 2.1 softmax
    "2.1/no-maximum-subtracted": "This is exp(x) / sum(exp(x)) with no maximum subtracted: "
    "exp(1000) overflows to inf and inf / inf is NaN. Subtract each slice's maximum first: "
    "exp(x - m) / sum(exp(x - m)) is the same value.",
    "2.1/empty-slice-unguarded": "A slice that is all -inf gives NaN: its maximum is -inf "
    "(-inf - (-inf) is NaN), so replace a -inf maximum by 0 before subtracting; its exps are "
    "then all 0 and so is their sum, so guard the sum too (divide by "
    "torch.where(total == 0, 1, total)): the slice becomes all zeros.",
    "2.1/sum-over-everything": "The sum runs over every entry of x instead of along dim: take "
    "it with x.sum(dim, keepdim=True) (and the maximum with x.amax(dim, keepdim=True)).",
    "2.1/dim-ignored": "This is the softmax over the last axis whatever dim is: take the "
    "maximum and the sum over dim, with keepdim=True.",
    # 2.2 scaled_dot_product_attention
    "2.2/no-scaling": "These are the weights with no scaling, softmax(Q K^T): divide the "
    "scores by sqrt(d_k) = {sqrt_d_k} before the softmax.",
    "2.2/divided-by-d_k": "These are the weights with the scores divided by d_k instead of "
    "sqrt(d_k): divide by sqrt(d_k) = {sqrt_d_k}, not {d_k}.",
    "2.2/softmax-over-queries": "These are the weights with the softmax over the queries "
    "(dim=-2): take it over the keys (dim=-1), so that each query's weights sum to 1.",
    "2.2/mask-true-hides": "Your weights hide the keys where the mask is True: here True "
    "means attention allowed (PyTorch's nn.MultiheadAttention masks say the opposite), so "
    "fill the scores with -inf where the mask is False: scores.masked_fill(~mask, -inf).",
    "2.2/mask-after-softmax": "The mask is applied after the softmax, so the weights of the "
    "allowed keys no longer sum to 1: fill the masked scores with -inf before the softmax.",
    # 3.3 MultiHeadAttention
    "3.3/no-out-proj": "This is the output without out_proj: apply out_proj to the merged "
    "heads (the last step).",
    "3.3/values-by-k-proj": "This is the output with the values projected by k_proj: project "
    "value with v_proj.",
    # 4.1 padding_mask
    "4.1/inverted": "Your mask is True at the padding and False at the real tokens, the "
    "opposite of the course's convention (True = attention allowed): compare tokens != pad_id, "
    "not ==.",
    "4.1/masks-queries": "Your mask has the shape [B, 1, L, 1]: it hides the padded queries "
    "(rows), not the padded keys (columns). Put the length last: [B, 1, 1, L].",
    # 4.2 causal_mask
    "4.2/upper-triangle": "This is the upper triangle (triu): position i would see the later "
    "positions j > i and not the earlier ones. Keep the lower triangle, tril: j <= i.",
    "4.2/true-hides": "Your mask is True where attention is hidden (the convention of "
    "nn.Transformer's masks, triu(1)); here True means allowed: use tril(), or negate yours.",
    "4.2/no-diagonal": "The diagonal is False: a position must see itself (j <= i, not j < i). "
    "Use tril() with diagonal=0.",
    # 4.3 target_mask
    "4.3/float-mask": "a mask is a torch.bool tensor, and &, | and ~ combine bool masks; one of "
    "yours is {dtype} (make it with dtype=torch.bool, or compare: tokens != pad_id)",
    "4.3/causal-only": "This is the causal mask alone: the padded keys are still visible. "
    "Combine it with the padding mask: padding_mask(tokens, pad_id) & causal_mask(L).",
    "4.3/padding-only": "This is the padding mask alone, expanded: the decoder sees the future. "
    "Combine it with the causal mask: padding_mask(tokens, pad_id) & causal_mask(L).",
    "4.3/or-for-and": "The padding and causal masks are combined with | (either allows): "
    "attention must be allowed by both, so combine them with &.",
    "4.3/padding-on-queries": "The padding hides the padded queries (rows) instead of the padded "
    "keys (columns): use the padding mask [B, 1, 1, L] of 4.1, not [B, 1, L, 1].",
    # 5.1 LayerNorm
    "5.1/weight-and-bias-unused": "This is x normalised, but weight and bias are not applied: "
    "return normalised x * self.weight + self.bias.",
    "5.1/unbiased-variance": "This is LayerNorm with the unbiased variance (divided by D - 1): "
    "LayerNorm divides by D, so use x.var(-1, unbiased=False, keepdim=True) (correction=0).",
    "5.1/eps-outside-sqrt": "This is LayerNorm with eps added after the square root: add it to "
    "the variance inside, sqrt(var + eps).",
    # 5.5 DecoderLayer
    "5.5/masks-swapped": "{call} raised a size mismatch only when given masks: {error}. The "
    "package calls layer(x, memory, src_mask, tgt_mask), in that order; tgt_mask "
    "[B, 1, Lt, Lt] goes to the self-attention over x, src_mask [B, 1, 1, Ls] to the "
    "cross-attention (it masks the memory's keys).",
    "5.5/cross-attention-queries": "{call} raised a size mismatch: {error}. Cross-attention "
    "takes its queries from the decoder (x) and its keys and values from the memory: "
    "cross_attn(y, memory, memory, src_mask), whose output has x's length Lt.",
    # 7.1 beam_search
    "7.1/penalty-counts-bos": "This is the best sequence when n counts BOS in the length "
    "penalty ((5 + n) / 6) ** length_penalty: n counts the generated tokens only (EOS "
    "included, BOS not).",
    "7.1/beam-of-bos-copies": "Your beam started with beam_size live copies of BOS, so it "
    "filled with the same hypothesis several times: start with one live hypothesis (the others "
    "at score -inf) so that each step keeps beam_size different ones.",
}


def named(mistake: str, **values: object) -> str:
    """The message of ``mistake`` (its ``{placeholders}`` filled from ``values``), ending with
    its id in brackets."""
    return f"{MISTAKES[mistake].format(**values)} [mistake {mistake}]"


def first_match(value: object, candidates: dict[str, torch.Tensor], atol: float = 1e-6,
                rtol: float = 1e-5) -> str | None:
    """The id of the first candidate mistake whose result ``value`` equals (shape and values;
    bool tensors exactly), None for none."""
    if not isinstance(value, torch.Tensor):
        return None
    for mistake, mistaken in candidates.items():
        if value.shape != mistaken.shape:
            continue
        if value.dtype == torch.bool or mistaken.dtype == torch.bool:
            if value.dtype == mistaken.dtype and torch.equal(value, mistaken):
                return mistake
        elif torch.allclose(value.double(), mistaken.double(), atol=atol, rtol=rtol):
            return mistake
    return None
