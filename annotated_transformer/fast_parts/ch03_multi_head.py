"""Chapter 3, fast: multi-head attention with packed projections and fused attention.

The same module as the reference (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``,
the same state-dict keys and shapes, the same ``forward``), computed with fewer
operations:

- self-attention (``query is key is value``) projects once with the three weight
  matrices concatenated at forward time, ``[3D, D]``: one larger matrix product
  instead of three (the gradient flows back to the three ``nn.Linear`` as usual);
  cross-attention (``key is value``) packs ``k_proj`` and ``v_proj`` the same way;
- a mask becomes an additive bias (``0`` or ``-inf``) once, and every layer that
  gets the same mask tensor reuses it;
- when no one asks for the weights, ``F.scaled_dot_product_attention`` (PyTorch's
  fused kernel, which never stores the ``[B, H, Lq, Lk]`` weights) where it wins: on a
  GPU always; on a CPU from :data:`SDPA_MIN_LENGTH` keys on, and only without dropout
  on the weights (with dropout, PyTorch's CPU kernel falls back to the explicit formula
  and a slower random mask, so the explicit formula here is faster at every length).
  Otherwise two matrix products and a softmax.

``attention_weights``. The fused kernel does not return the weights, so a module keeps
them only when asked: ``keep_weights=None`` (the default) keeps them in ``eval()`` mode,
which is when the attention-map tool and decoding run, and not in training;
``True`` always, ``False`` never. When they are not kept, ``attention_weights`` is
``None``.

Masks follow the course's convention, which is also ``F.scaled_dot_product_attention``'s:
``True`` = allowed. A query whose keys are all masked gets zero weights and a zero
output, as in the reference: such masks (rare: no task of the course makes one) are
detected once per mask and computed by the reference's ``forward``.

The class is the reference's subclass: its constructor, submodules and argument checks
are the reference's own, and so are the errors for a mask of the wrong shape (such a mask
goes to the reference's ``forward``).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.fast_parts._ops import dropout as _dropout
from annotated_transformer.fast_parts._ops import is_compiling
from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 3)
split_heads = _reference.split_heads
merge_heads = _reference.merge_heads

__all__ = ["split_heads", "merge_heads", "MultiHeadAttention"]

SDPA_MIN_LENGTH = 128
"""On a CPU, from this many keys on attention without weights or dropout runs
``F.scaled_dot_product_attention``. Measured on a 2-core CPU (forward and backward,
``B=8, H=8, d_k=64``, one thread): the explicit formula is 10-15% faster than the fused
kernel at 16 to 64 keys, even at 128, 1.1-1.3x slower at 256 and 1.7-2x at 512-1,024."""


class _MaskBiases:
    """Per mask tensor: whether some query has no key, and its additive bias per dtype.

    A training step builds its masks once and passes the same tensors to every layer;
    remembering the last few (by identity and version, through a weak reference) turns
    the bias and the empty-row test into once-per-step work."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: dict[int, tuple] = {}

    def _entry(self, mask: Tensor) -> tuple:
        """``(weak reference, version, has an empty row, {dtype: bias})`` of ``mask``."""
        entry = self.entries.get(id(mask))
        if entry is None or entry[0]() is not mask or entry[1] != mask._version:
            has_empty_row = not bool(mask.any(dim=-1).all())
            if len(self.entries) >= self.size:
                self.entries.clear()
            entry = (weakref.ref(mask), mask._version, has_empty_row, {})
            self.entries[id(mask)] = entry
        return entry

    def has_empty_row(self, mask: Tensor) -> bool:
        """Whether some query of ``mask`` sees no key."""
        return self._entry(mask)[2]

    def get(self, mask: Tensor, dtype: torch.dtype) -> Tensor:
        """The additive bias ``[mask's shape]`` in ``dtype``: 0 where allowed, ``-inf``
        where not."""
        biases = self._entry(mask)[3]
        if dtype not in biases:
            bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            biases[dtype] = bias.masked_fill_(~mask, float("-inf"))
        return biases[dtype]


_biases = _MaskBiases()


def _softmax(scores: Tensor) -> Tensor:
    """``torch.softmax(scores, -1)``; for fewer than 16 keys (which PyTorch's CPU kernel does
    not vectorise: 5x slower per element than at 16) its formula in four operations.
    Every row has a key here (rows without one never reach this), so the maximum is finite."""
    if 4 < scores.size(-1) < 16 and scores.device.type == "cpu":
        exps = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
        return exps / exps.sum(dim=-1, keepdim=True)
    return torch.softmax(scores, dim=-1)


def _linear_packed(x: Tensor, layers: tuple[nn.Linear, ...]) -> Tensor:
    """``cat([layer(x) for layer in layers], -1)`` as one matrix product."""
    weight = torch.cat([layer.weight for layer in layers])
    biases = [layer.bias for layer in layers]
    bias = None if biases[0] is None else torch.cat(biases)
    return F.linear(x, weight, bias)


class MultiHeadAttention(_reference.MultiHeadAttention):
    """Exercise 3.3, fast: the reference's module (its constructor, its submodules, its
    checks) with a faster ``forward``.

    ``(d_model, num_heads, dropout=0.0, bias=True)``; ``forward(query [B, Lq, D],
    key [B, Lk, D], value [B, Lk, D], mask=None) -> [B, Lq, D]``. ``keep_weights``
    (attribute): ``None`` keeps ``attention_weights`` in ``eval()`` mode only, ``True``
    always, ``False`` never. ``sdpa_min_length`` (attribute): from how many keys on
    the fused kernel runs (``None``: :data:`SDPA_MIN_LENGTH` on a CPU, 0 elsewhere).
    """

    keep_weights: bool | None = None  # set on a module to change its own
    sdpa_min_length: int | None = None
    attention_is_pytorchs = True  # incremental decoding may call F.scaled_dot_product_attention

    def _fused_wins(self, key: Tensor, dropout: float) -> bool:
        """Whether ``F.scaled_dot_product_attention`` is the faster way here."""
        cpu = key.device.type == "cpu"
        if cpu and dropout:  # PyTorch's CPU kernel has no dropout: it falls back
            return False
        least = self.sdpa_min_length
        if least is None:
            least = SDPA_MIN_LENGTH if cpu else 0
        return key.size(-2) >= least

    def _heads(self, x: Tensor, count: int) -> tuple[Tensor, ...]:
        """``[B, L, count*D]`` -> ``count`` tensors ``[B, H, L, d_k]`` (views)."""
        batch, length, _ = x.shape
        heads = x.view(batch, length, count, self.num_heads, self.d_model // self.num_heads)
        return heads.permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """``query [B, Lq, D]``, ``key`` and ``value [B, Lk, D]`` -> ``[B, Lq, D]``."""
        keep = (not self.training) if self.keep_weights is None else self.keep_weights
        if mask is not None and (mask.dim() not in (2, 4) or (
                not is_compiling() and _biases.has_empty_row(mask))):
            # a mask of the wrong shape (the reference says what is wrong) or with a query
            # that sees no key (the reference's formula gives it zeros)
            output = super().forward(query, key, value, mask)
            if not keep:
                self.attention_weights = None
            return output
        if query is key and key is value:  # self-attention: one projection
            q, k, v = self._heads(_linear_packed(query, (self.q_proj, self.k_proj,
                                                         self.v_proj)), 3)
        else:
            (q,) = self._heads(self.q_proj(query), 1)
            if key is value:  # cross-attention: keys and values from the same memory
                k, v = self._heads(_linear_packed(key, (self.k_proj, self.v_proj)), 2)
            else:
                (k,) = self._heads(self.k_proj(key), 1)
                (v,) = self._heads(self.v_proj(value), 1)
        return self.out_proj(merge_heads(self.attend(q, k, v, mask, keep)))  # [B, Lq, D]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, keep: bool
               ) -> Tensor:
        """The heads ``[B, H, Lq, d_k]`` of the projected ``q [B, H, Lq, d_k]``, ``k`` and
        ``v [B, H, Lk, d_k]`` under ``mask`` (every query sees a key); the weights kept in
        ``attention_weights`` when ``keep``."""
        dropout = self.dropout.p if self.training else 0.0
        bias = None
        if mask is not None:
            bias = (_mask_bias_traced(mask, q.dtype) if is_compiling()
                    else _biases.get(mask, q.dtype))
        if keep or not self._fused_wins(k, dropout):
            scores = torch.matmul(q, k.transpose(-2, -1))  # [B, H, Lq, Lk]
            scale = 1.0 / math.sqrt(q.size(-1))
            scores = scores * scale if bias is None else torch.add(bias, scores, alpha=scale)
            weights = _softmax(scores)
            if mask is not None and is_compiling():
                weights = weights * mask.any(dim=-1, keepdim=True)  # rows with no key: zeros
            if dropout:
                weights = _dropout(weights, dropout)
            self.attention_weights = weights.detach() if keep else None
            return torch.matmul(weights, v)  # [B, H, Lq, d_k]
        self.attention_weights = None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


def _mask_bias_traced(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The bias inside ``torch.compile``: no cache, and finite, so that a row with no key
    gives finite weights (zeroed after the softmax) instead of NaN."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min)
