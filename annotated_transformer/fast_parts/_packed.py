"""An encoder-decoder's training loss computed on the positions it depends on only.

A batch of sentences padded to its longest has positions whose results nothing reads:
the source's padding (masked as keys everywhere), and on the target side every position
whose label is not scored (the padding, and the position that reads EOS): causal
attention lets no scored position see it. In the recipe's Multi30k batches that is 3% of
the source and 28% of the target's positions (``bench --recipe-shape``). Everything
that works position by position (the embeddings, LayerNorm, the projections of
attention, the feed-forward network, the generator and the loss) runs here on the
positions that count, packed into ``[T, D]`` (T tokens, no padding); attention alone sees
the padded layout ``[B, H, L, d_k]``, the packed rows scattered into zeros and gathered
back. The loss and every gradient are the padded model's (``tests/library/test_packed_loss.py``
checks them in float64 against the reference parts); only dropout draws its masks for
fewer positions.

It serves the fast parts' ``LabelSmoothingLoss.model_loss`` in training, on a CPU, for an
encoder-decoder whose layers are all the fast parts' (``None`` otherwise: the caller
then runs the model as it is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from annotated_transformer.fast_parts import ch01_positional_encoding as ch01
from annotated_transformer.fast_parts import ch03_multi_head as ch03
from annotated_transformer.fast_parts import ch05_layers as ch05
from annotated_transformer.fast_parts._ops import module_dropout
from annotated_transformer.parts import is_compiling


@dataclass(frozen=True)
class Layout:
    """Where the packed rows ``[T, ...]`` sit in the padded ``[B, L, ...]``: their flat
    indices ``rows [T]`` (row-major over ``B x L``), and the attention mask of the padded
    layout, ``[B, Lq or 1, L]`` (every query sees a key)."""

    rows: Tensor
    batch: int
    length: int
    mask: Tensor

    def heads(self, packed: Tensor, count: int, num_heads: int) -> tuple[Tensor, ...]:
        """``[T, count*D]`` (``count`` projections side by side) -> ``count`` tensors
        ``[H, B, L, d_k]``, zeros where nothing is packed, each contiguous: the padded
        layout in the order of the heads, so that attention's products copy nothing."""
        split = _ToHeads.apply(packed, self.rows, self.batch * self.length,
                               count * num_heads)
        return split.view(count, num_heads, self.batch, self.length, -1).unbind(0)

    def merged(self, heads: Tensor) -> Tensor:
        """``[H, B, L, d_k] -> [T, H*d_k]``: the heads merged at the packed rows."""
        return _FromHeads.apply(heads.reshape(heads.size(0), -1, heads.size(-1)), self.rows)

    def positions(self) -> Tensor:
        """Each packed row's position in its sentence, ``[T]``."""
        return self.rows % self.length


def _scatter(packed: Tensor, rows: Tensor, size: int, heads: int) -> Tensor:
    """``packed [T, heads*d_k]`` -> ``[heads, size, d_k]``: row ``t`` to ``rows[t]``,
    zeros elsewhere."""
    d_k = packed.size(1) // heads
    out = packed.new_zeros(heads, size, d_k)
    out.permute(1, 0, 2).index_copy_(0, rows, packed.reshape(-1, heads, d_k))
    return out


def _gather(heads: Tensor, rows: Tensor) -> Tensor:
    """``[heads, size, d_k]`` -> ``[T, heads*d_k]``: the rows ``rows``."""
    count, _, d_k = heads.shape
    return heads.permute(1, 0, 2).index_select(0, rows).view(-1, count * d_k)


class _ToHeads(torch.autograd.Function):
    """:func:`_scatter`, whose gradient is :func:`_gather` (and the other way round)."""

    @staticmethod
    def forward(ctx, packed: Tensor, rows: Tensor, size: int, heads: int) -> Tensor:
        ctx.save_for_backward(rows)
        return _scatter(packed, rows, size, heads)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (rows,) = ctx.saved_tensors
        return _gather(grad, rows), None, None, None


class _FromHeads(torch.autograd.Function):
    """:func:`_gather`, whose gradient is :func:`_scatter`."""

    @staticmethod
    def forward(ctx, heads: Tensor, rows: Tensor) -> Tensor:
        ctx.save_for_backward(rows)
        ctx.size, ctx.heads = heads.size(1), heads.size(0)
        return _gather(heads, rows)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (rows,) = ctx.saved_tensors
        return _scatter(grad, rows, ctx.size, ctx.heads), None


def scored_features(model: nn.Module, args: tuple[Tensor, ...], labels: Tensor,
                    ignore_index: int | None) -> tuple[Tensor, Tensor] | None:
    """``(hidden [T, D], labels [T])``: the decoder's output at the scored positions of
    ``args = (src, tgt_input, src_mask, tgt_mask)`` and their labels, computed on those
    positions only; ``None`` when this model or batch is not one this handles (see the
    module's docstring), or when the scored positions read one that is not scored."""
    if len(args) != 4 or not _packable(model):
        return None
    src, tgt, src_mask, tgt_mask = args
    longest = min(e.positions.pe.size(0) for e in (model.src_embed, model.tgt_embed))
    if src.dim() != 2 or tgt.dim() != 2 or max(src.size(1), tgt.size(1)) > longest:
        return None  # the model says what is wrong
    layouts = _layouts(src, tgt, src_mask, tgt_mask, labels, ignore_index)
    if layouts is None:
        return None
    source, target = layouts
    x = _embed(model.src_embed, src, source)
    for layer in model.encoder.layers:
        x = _encoder_layer(layer, x, source)
    memory = model.encoder.norm(x)  # [Ts, D]
    x = _embed(model.tgt_embed, tgt, target)
    for layer in model.decoder.layers:
        x = _decoder_layer(layer, x, memory, target, source)
    return model.decoder.norm(x), labels.reshape(-1).index_select(0, target.rows)


def _packable(model: nn.Module) -> bool:
    """An encoder-decoder in training, not decoding, on a CPU, eager, built of the fast
    parts, whose attention keeps no weights."""
    if getattr(model, "kind", None) != "encoder-decoder" or model.decoder_cache is not None:
        return False
    if is_compiling() or model.generator.weight.device.type != "cpu":
        return False
    layers = (*model.encoder.layers, *model.decoder.layers)
    if not all(isinstance(layer, ch05.EncoderLayer) for layer in model.encoder.layers) or \
            not all(isinstance(layer, ch05.DecoderLayer) for layer in model.decoder.layers):
        return False
    if any(getattr(layer, "_compiled_call_impl", None) is not None for layer in layers):
        return False  # compiled layers run as compiled
    attentions = [m for layer in layers for m in layer.modules()
                  if isinstance(m, ch03.MultiHeadAttention)]
    if not all(_keeps_no_weights(m) for m in attentions):
        return False
    return all(isinstance(e.positions, ch01.PositionalEncoding)
               for e in (model.src_embed, model.tgt_embed))


def _keeps_no_weights(attention: nn.Module) -> bool:
    keep = attention.keep_weights
    return keep is False or (keep is None and attention.training)


def _layouts(src: Tensor, tgt: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None,
             labels: Tensor, ignore_index: int | None) -> tuple[Layout, Layout] | None:
    """The source's layout (the keys ``src_mask [B, 1, 1, Ls]`` allows) and the target's
    (the scored positions), or ``None`` when the masks are of another form, a source has
    no key, or a scored position may see one that is not scored."""
    batch, src_len = src.shape
    tgt_len = tgt.size(1)
    if (src_mask is None or src_mask.dtype != torch.bool
            or src_mask.shape != (batch, 1, 1, src_len) or tgt_mask is None
            or tgt_mask.dtype != torch.bool or labels.shape != (batch, tgt_len)
            or tgt_mask.shape not in ((tgt_len, tgt_len), (batch, 1, tgt_len, tgt_len))):
        return None
    source_keys = src_mask.reshape(batch, src_len)
    if not bool(source_keys.any(dim=1).all()):
        return None  # a source with nothing to attend to: the reference's zeros
    scored = (torch.ones_like(labels, dtype=torch.bool) if ignore_index is None
              else labels != ignore_index)  # [B, Lt]
    allowed = tgt_mask.expand(batch, 1, tgt_len, tgt_len)[:, 0]  # [B, Lt, Lt]
    if bool((allowed & scored[:, :, None] & ~scored[:, None, :]).any()):
        return None  # a scored position reads one that is not
    if not bool((allowed.any(dim=-1) | ~scored).all()):
        return None  # a scored position with no key
    # queries nobody reads see every key, so that their (discarded) weights stay finite
    target_mask = allowed | ~scored[:, :, None]  # [B, Lt, Lt]: broadcast over the heads
    source = Layout(source_keys.reshape(-1).nonzero().squeeze(1), batch, src_len,
                    source_keys.unsqueeze(1))  # [B, 1, Ls]
    target = Layout(scored.reshape(-1).nonzero().squeeze(1), batch, tgt_len, target_mask)
    return source, target


def _embed(embeddings: nn.Module, tokens: Tensor, layout: Layout) -> Tensor:
    """Chapter 1's ``dropout(embedding(tokens) * sqrt(D) + pe)`` of the packed tokens."""
    x = embeddings.tokens(tokens.reshape(-1).index_select(0, layout.rows))  # [T, D]
    encoding = embeddings.positions
    x = x + encoding.pe.index_select(0, layout.positions()).to(x.dtype)
    return module_dropout(x, encoding.dropout)


def _self_attention(attention: nn.Module, y: Tensor, layout: Layout) -> Tensor:
    """``attention(y, y, y, mask)`` on packed ``y [T, D]``: one projection, packed."""
    projected = ch03._linear_packed(y, (attention.q_proj, attention.k_proj, attention.v_proj))
    q, k, v = layout.heads(projected, 3, attention.num_heads)
    return _output(attention, attention.attend(q, k, v, layout.mask, False), layout)


def _cross_attention(attention: nn.Module, y: Tensor, memory: Tensor, target: Layout,
                     source: Layout) -> Tensor:
    """``attention(y, memory, memory, src_mask)`` on packed ``y [Tt, D]``, ``memory [Ts, D]``."""
    (q,) = target.heads(attention.q_proj(y), 1, attention.num_heads)
    k, v = source.heads(ch03._linear_packed(memory, (attention.k_proj, attention.v_proj)), 2,
                        attention.num_heads)
    return _output(attention, attention.attend(q, k, v, source.mask, False), target)


def _output(attention: nn.Module, heads: Tensor, layout: Layout) -> Tensor:
    """The heads ``[H, B, L, d_k]`` merged at the packed rows, through the output
    projection."""
    return attention.out_proj(layout.merged(heads))


def _encoder_layer(layer: nn.Module, x: Tensor, source: Layout) -> Tensor:
    """Chapter 5's encoder layer on packed ``x [Ts, D]``."""
    attend, feed = layer.residuals
    x = ch05.around(attend, x, _self_attention(layer.self_attn, ch05.before(attend, x),
                                               source))
    return ch05.around(feed, x, ch05.feed_forward(layer.feed_forward, ch05.before(feed, x)))


def _decoder_layer(layer: nn.Module, x: Tensor, memory: Tensor, target: Layout,
                   source: Layout) -> Tensor:
    """Chapter 5's decoder layer on packed ``x [Tt, D]`` and ``memory [Ts, D]``."""
    attend, cross, feed = layer.residuals
    x = ch05.around(attend, x, _self_attention(layer.self_attn, ch05.before(attend, x),
                                               target))
    x = ch05.around(cross, x, _cross_attention(layer.cross_attn, ch05.before(cross, x),
                                               memory, target, source))
    return ch05.around(feed, x, ch05.feed_forward(layer.feed_forward, ch05.before(feed, x)))
