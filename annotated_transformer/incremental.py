"""Incremental decoding: each layer's keys and values of the prefix kept, not recomputed.

Decoding adds one token per step, and the decoders of the course (Chapter 6's
``greedy_decode``, Chapter 7's ``beam_search``, :func:`~annotated_transformer.sampling.
complete`) run the decoder on the whole prefix at every step: at step ``t`` every layer
projects, attends and transforms all ``t`` positions again, ``O(t)`` work per layer for
one new token, ``O(T^2)`` for an output of ``T``. Yet with the causal mask nothing at a
position ``i < t`` depends on a later token, so every layer's output at ``i`` (and the keys
and values it makes of it) is the same at every later step. A :class:`DecoderCache`
keeps them and computes only the new position:

- **self-attention**: the new position's query attends to the keys and values of every
  position so far; the new key and value are appended to the layer's cache
  ``[N, H, t, d_k]``;
- **cross-attention**: the keys and values of the encoder's memory, projected once per
  source instead of once per step;
- **the feed-forward network, the residuals and the norms** act on each position alone:
  only the new one is computed.

So a step costs ``O(1)`` matrix products of one row per layer plus attention over ``t``
keys, instead of ``O(t)`` products. The result is the same as recomputing (up to the
rounding of matrix products of another shape): the same formula on the same numbers,
only not computed twice.

It works with the decoders unchanged. Within :func:`cached` a model's ``decode`` (an
encoder-decoder) or :meth:`DecoderCache.next_logits` (a decoder-only model) recognises
each row of the prefix as the extension of a row it has seen, on the same memory row:
greedy decoding keeps its rows, beam search reorders them (``ys[parent]``), and the
caches are reordered the same way. A prefix it has not seen is computed whole once
(and cached). ``decode`` still returns ``[N, t, D]``: the earlier positions' outputs are
cached too.

Which parts it works with: it computes a layer from the parts' own modules, by the
chapters' contract (Chapter 3's ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``,
``num_heads``, ``attention`` and ``dropout``, its ``split_heads`` and ``merge_heads``;
Chapter 5's ``residuals``, ``self_attn``, ``cross_attn`` and ``feed_forward``, in that
order), and a new position's self-attention with the parts' ``attention_step`` (Chapter
8's exercise) where they have one that works (checked on its first use; a stub or a
wrong one leaves it to this module's own computation). On the first step it checks its
result against the model's own forward pass; parts that lack a name, or whose forward
computes something else, make it fall back to recomputing the whole prefix, which is
always right. So do a target mask that is not causal and decoding in training mode
(dropout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # the first step's check: same up to rounding


class NotCacheable(Exception):
    """These parts, this mask or this mode cannot be computed incrementally."""


def row_groups(*tensors: Tensor | None) -> Tensor:
    """``[N]`` ids: rows ``i`` and ``j`` share an id when every tensor's rows ``i`` and ``j``
    are equal (a tensor with one row, or ``None``, is the same for every row)."""
    rows = max(t.size(0) for t in tensors if t is not None)
    columns = [t.reshape(t.size(0), -1).to(torch.float64) for t in tensors
               if t is not None and t.size(0) == rows]
    if not columns:
        return torch.zeros(rows, dtype=torch.long, device=tensors[0].device)
    return torch.unique(torch.cat(columns, dim=1), dim=0, return_inverse=True)[1]


IDENTITY = slice(None)  # the parents of rows that kept their places (greedy decoding)


def find_parents(previous: Tensor, new: Tensor) -> Tensor | slice | None:
    """For each row of ``new [N, 1 + t0]`` (a group id, then tokens), a row of
    ``previous [M, 1 + t0]`` equal to it (:data:`IDENTITY` when every row is where it
    was); ``None`` when a row has none."""
    if previous.shape == new.shape and torch.equal(previous, new):
        return IDENTITY  # greedy: the same rows, nothing to gather
    inverse = torch.unique(torch.cat([previous, new]), dim=0, return_inverse=True)[1]
    first = torch.full((int(inverse.max()) + 1,), -1, dtype=torch.long, device=new.device)
    first.scatter_(0, inverse[:previous.size(0)],
                   torch.arange(previous.size(0), device=new.device))
    parents = first[inverse[previous.size(0):]]
    return None if bool((parents < 0).any()) else parents


def causal_rows(mask: Tensor | None, start: int, length: int) -> Tensor | None:
    """The rows ``start..length-1`` (the new queries) of a self-attention mask over
    ``length`` positions, 2-D ``[L, L]`` or 4-D ``[B|1, H|1, L|1, L]``; ``NotCacheable``
    when the mask lets a position see a later one (or there is none, for ``length > 1``)."""
    if mask is None:
        if length > 1:
            raise NotCacheable("no target mask: every position sees every other")
        return None
    square = mask if mask.dim() == 2 else mask.reshape(-1, *mask.shape[-2:])
    if square.size(-2) == 1:
        if length > 1:
            raise NotCacheable("a target mask without a row per query")
        return mask
    if bool(torch.triu(square.bool(), diagonal=1).any()):
        raise NotCacheable("the target mask lets a position see a later one")
    rows = mask[start:] if mask.dim() == 2 else mask[..., start:, :]
    return None if bool(rows.all()) else rows  # all allowed: the same as no mask


class Attention:
    """Chapter 3's ``MultiHeadAttention`` computed from its parts (by the chapter's
    contract), with the keys and values given."""

    def __init__(self, module: nn.Module, parts) -> None:
        self.m = module
        self.heads = module.num_heads
        self.split, self.merge = parts.split_heads, parts.merge_heads
        for name in ("q_proj", "k_proj", "v_proj", "out_proj", "attention", "dropout"):
            if not hasattr(module, name):
                raise NotCacheable(f"its attention has no {name}")
        # A module whose attention is PyTorch's (the fast parts' says so): its fused kernel
        # serves a query that needs no weights (one new position over the cached keys)
        # without a batch of tiny matrix products per head. The first step's check still
        # compares the result with the module's own forward pass.
        self.fused = getattr(module, "attention_is_pytorchs", False) is True

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x [N, L, D]`` -> keys and values ``[N, H, L, d_k]``."""
        return (self.split(self.m.k_proj(x), self.heads),
                self.split(self.m.v_proj(x), self.heads))

    def __call__(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None
                 ) -> Tensor:
        """Queries ``x [N, n, D]`` over ``keys``, ``values [N, H, Lk, d_k]`` -> ``[N, n, D]``."""
        q = self.split(self.m.q_proj(x), self.heads)
        if self.fused and not self.m.training:
            heads = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        else:
            heads, _ = self.m.attention(q, keys, values, mask=mask, dropout=self.m.dropout)
        return self.m.out_proj(self.merge(heads))


class DecoderCache:
    """The decoder of ``model`` computed one new position at a time (see the module).

    ``decode(memory, src_mask, tgt, tgt_mask)`` for an encoder-decoder, ``next_logits(
    tokens, mask)`` for a decoder-only model. ``enabled`` turns false, for good, when
    the parts or the inputs cannot be cached; ``recomputed`` counts the calls that ran
    the whole prefix."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.enabled, self.checked, self.recomputed = True, False, 0
        # the target's embedding, the layers, the last norm (the model says which)
        self.embed, self.layers, self.norm = model.incremental_parts()
        self.encoder_decoder = False  # True once a memory is given (cross-attention)
        self.memory: Tensor | None = None
        self.src_mask: Tensor | None = None
        self.wrapped: list | None = None  # per layer (layer, self-attention, cross)
        # the parts' exercise 8.3 for one new position: None until asked, False once it
        # is missing, raises or differs (checked on its first use)
        self.step, self.step_checked = None, False
        self.reset()

    def reset(self) -> None:
        self.keys: list[Tensor] = []  # per layer [N, H, t, d_k]
        self.values: list[Tensor] = []
        self.hidden: Tensor | None = None  # [N, t, D], the last norm's output
        self.seen: Tensor | None = None  # [N, 1 + t]: memory group, then tokens

    # ---------------------------------------------------------------- the layers

    def attentions(self) -> list:
        """Per layer: the layer, its self-attention and its cross-attention (``None`` in
        a decoder-only model) as :class:`Attention`."""
        if self.wrapped is None:
            parts = self.model.parts
            self.wrapped = [(layer, Attention(layer.self_attn, parts),
                             Attention(layer.cross_attn, parts) if self.encoder_decoder
                             else None) for layer in self.layers]
        return self.wrapped

    def set_memory(self, memory: Tensor, src_mask: Tensor | None) -> None:
        """Project the memory's keys and values once per layer (cross-attention)."""
        self.encoder_decoder = True
        self.memory, self.src_mask = memory, src_mask
        self.cross = [cross.keys_values(memory) for _, _, cross in self.attentions()]
        self.groups = row_groups(memory, src_mask)
        self.reset()

    def run_layers(self, x: Tensor, mask: Tensor | None, keys: list[Tensor] | None,
                   values: list[Tensor] | None) -> Tensor:
        """The decoder on the new positions ``x [N, n, D]`` (embedded), their keys and
        values appended to those given (``None``: none before); returns the last norm's
        output ``[N, n, D]`` and stores the layers' keys and values."""
        new_keys, new_values = [], []
        for i, (layer, self_attn, cross_attn) in enumerate(self.attentions()):
            def attend(y: Tensor, i=i, self_attn=self_attn) -> Tensor:
                if keys is not None and y.size(1) == 1 and mask is None \
                        and not self_attn.fused:
                    found = self.parts_step(self_attn, y, keys[i], values[i])
                    if found is not None:
                        new_keys.append(found[1])
                        new_values.append(found[2])
                        return found[0]
                k, v = self_attn.keys_values(y)
                if keys is not None:
                    k, v = torch.cat([keys[i], k], dim=2), torch.cat([values[i], v], dim=2)
                new_keys.append(k)
                new_values.append(v)
                return self_attn(y, k, v, mask)
            residuals = layer.residuals
            x = residuals[0](x, attend)
            if cross_attn is not None:
                x = residuals[1](x, lambda y, i=i, c=cross_attn: c(y, *self.cross[i],
                                                                    self.src_mask))
            x = residuals[-1](x, layer.feed_forward)
        self.keys, self.values = new_keys, new_values
        return self.norm(x)

    def parts_step(self, attn: Attention, y: Tensor, keys: Tensor, values: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor] | None:
        """One new position ``y [N, 1, D]`` through the parts' ``attention_step`` (chapter
        8: the learner's with ``Parts.learner()``): the output and the keys and values with
        the new ones appended; ``None`` where the parts have none that works (a stub, a
        chapter missing, a result that differs from this module's on its first use), and
        then it is not asked again."""
        if self.step is False:
            return None
        try:
            if self.step is None:
                self.step = self.model.parts.attention_step
            output, (k, v) = self.step(attn.m, y, (keys, values))
            if not self.step_checked:
                new_k, new_v = attn.keys_values(y)
                k_ref, v_ref = torch.cat([keys, new_k], dim=2), torch.cat([values, new_v], dim=2)
                expected = (attn(y, k_ref, v_ref, None), k_ref, v_ref)
                if any(a.shape != b.shape or not torch.allclose(a, b, **TOLERANCE)
                       for a, b in zip((output, k, v), expected, strict=True)):
                    raise NotCacheable("the parts' attention_step computes something else")
                self.step_checked = True
        except Exception:  # the parts' own code: anything it raises means "not this way"
            self.step = False
            return None
        return output, k, v

    # ---------------------------------------------------------------- the steps

    def extend(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """The last norm's output ``[N, t, D]`` for ``tokens [N, t]``: the new columns
        computed, the earlier ones taken from the cache (reordered to their rows)."""
        model = self.model
        if model.training:
            raise NotCacheable("the model is in training mode (dropout)")
        length = tokens.size(1)
        groups = self.groups if self.encoder_decoder else torch.zeros(
            tokens.size(0), dtype=torch.long, device=tokens.device)
        start, parents = 0, None
        if self.seen is not None and 1 < length and self.seen.size(1) <= length:
            start = self.seen.size(1) - 1
            key = torch.cat([groups[:, None], tokens[:, :start]], dim=1)
            parents = find_parents(self.seen, key)
            if parents is None:
                start = 0
        rows = causal_rows(mask, start, length)
        embedded = self.embed(tokens)  # [N, t, D]: positions need the whole row
        if parents is None:
            hidden = self.run_layers(embedded, rows, None, None)
        else:
            keys = [k[parents] for k in self.keys]  # a view when IDENTITY
            values = [v[parents] for v in self.values]
            new = self.run_layers(embedded[:, start:], rows, keys, values)
            hidden = torch.cat([self.hidden[parents], new], dim=1)
        self.hidden = hidden
        self.seen = torch.cat([groups[:, None], tokens], dim=1)
        return hidden

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        """``model.decode``'s result ``[N, t, D]``, computed incrementally."""
        model = self.model
        if self.enabled:
            try:
                if memory is not self.memory or src_mask is not self.src_mask:
                    self.set_memory(memory, src_mask)
                hidden = self.extend(tgt, tgt_mask)
                if not self.checked:
                    self.check(hidden, model.full_decode(memory, src_mask, tgt, tgt_mask))
                return hidden
            except NotCacheable:
                self.enabled = False
            except (AttributeError, TypeError, IndexError, RuntimeError, ValueError):
                self.enabled = False  # parts that do not follow the contract
        self.recomputed += 1
        return model.full_decode(memory, src_mask, tgt, tgt_mask)

    def next_logits(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """A decoder-only model's logits at the last position ``[N, V]``, for ``tokens``
        ``[N, t]`` and ``mask`` as ``model(tokens, mask)`` takes them: the whole prefix, so
        a decoding loop swaps one call for the other. Of the prefix, only the positions not
        seen before in that row (the whole prompt at the prefill, then the newest) go
        through the layers; a row it has not seen, or a prefix reordered or cropped, is
        matched as the module's docstring says or computed whole."""
        model = self.model
        if self.enabled:
            try:
                hidden = self.extend(tokens, mask)
                if not self.checked:
                    full = model(tokens, mask)
                    self.check(model.generator(hidden), full)
                return model.generator(hidden[:, -1])
            except NotCacheable:
                self.enabled = False
            except (AttributeError, TypeError, IndexError, RuntimeError, ValueError):
                self.enabled = False
        self.recomputed += 1
        return model(tokens, mask)[:, -1]

    def check(self, cached: Tensor, full: Tensor) -> None:
        """The first step: the incremental result must be the forward pass's."""
        if cached.shape != full.shape or not torch.allclose(cached, full, **TOLERANCE):
            raise NotCacheable("these parts compute something else than the contract's "
                               "layer (checked on the first step)")
        self.checked = True


@contextlib.contextmanager
def cached(model: nn.Module, enabled: bool = True) -> Iterator[DecoderCache | None]:
    """Within this block ``model.decode`` is incremental (a :class:`DecoderCache`); with
    ``enabled=False``, or for a model that does not say what its decoder is made of
    (``incremental_parts``), nothing changes (the whole prefix is recomputed)."""
    if not enabled or not hasattr(model, "incremental_parts"):  # e.g. nn.Transformer's
        yield None
        return
    cache = DecoderCache(model)
    previous = getattr(model, "decoder_cache", None)
    model.decoder_cache = cache
    try:
        yield cache
    finally:
        model.decoder_cache = previous
