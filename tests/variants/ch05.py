"""Chapter 5: plausible wrong answers and other correct answers."""

from __future__ import annotations

import functools

import torch
from torch import nn

from annotated_transformer.parts import active_parts

from variants import right, wrong


def _normalize(x, eps):
    """(x - mean) / sqrt(biased variance + eps) over the last dimension, as LayerNorm does."""
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)


class _LayerNorm(nn.Module):
    """LayerNorm's eps, weight and bias; the variant's forward uses them or not."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))


def _layer_norm_class(normalize):
    class Variant(_LayerNorm):
        def forward(self, x):
            return normalize(x, self.eps) * self.weight + self.bias

    return Variant


# ------------------------------------------------------------------ 5.1

UnbiasedVariance = wrong("5.1", "LayerNorm", "unbiased variance (divide by D - 1)",
                         mistake="5.1/unbiased-variance")(
    type("UnbiasedVariance", (_layer_norm_class(
        lambda x, eps: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps)
    ),), {}))

EpsOutsideSqrt = wrong("5.1", "LayerNorm", "eps added outside the square root",
                        mistake="5.1/eps-outside-sqrt")(
    type("EpsOutsideSqrt", (_layer_norm_class(
        lambda x, eps: (x - x.mean(-1, keepdim=True))
        / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps)
    ),), {}))

InFloat64 = wrong("5.1", "LayerNorm", "normalised in float64 for precision: float32 in, float64 "
                  "out", mistake="5.1/dtype-changed")(type("InFloat64", (_layer_norm_class(
                      lambda x, eps: _normalize(x.double(), eps)),), {}))

OverTheBatch = wrong("5.1", "LayerNorm", "statistics over the batch (dim 0), like BatchNorm",
       mistake="5.1/statistics-over-the-batch")(
    type("OverTheBatch", (_layer_norm_class(
        lambda x, eps: (x - x.mean(0, keepdim=True))
        / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + eps)
    ),), {}))

OverPositions = wrong("5.1", "LayerNorm", "statistics over the positions (dim -2)",
                      mistake="5.1/statistics-over-positions")(
    type("OverPositions", (_layer_norm_class(
        lambda x, eps: (x - x.mean(-2, keepdim=True))
        / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + eps)
    ),), {}))

OverAllFeaturesAndPositions = wrong("5.1", "LayerNorm", "statistics over positions and features",
       mistake="5.1/statistics-over-positions-too")(
    type("OverAllFeaturesAndPositions", (_layer_norm_class(
        lambda x, eps: (x - x.mean((-2, -1), keepdim=True))
        / torch.sqrt(x.var((-2, -1), keepdim=True, unbiased=False) + eps)
    ),), {}))


@wrong("5.1", "LayerNorm", "no learnable weight and bias",
       mistake="5.1/no-parameters")
class NoAffine(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return _normalize(x, self.eps)


@wrong("5.1", "LayerNorm", "weight and bias created but never used",
       mistake="5.1/weight-and-bias-unused")
class AffineUnused(_LayerNorm):
    def forward(self, x):
        return _normalize(x, self.eps)


VarMeanRsqrt = right("5.1", "LayerNorm", "var_mean with correction=0 and rsqrt")(
    type("VarMeanRsqrt", (_layer_norm_class(
        lambda x, eps: (x - torch.var_mean(x, -1, correction=0, keepdim=True)[1])
        * torch.rsqrt(torch.var_mean(x, -1, correction=0, keepdim=True)[0] + eps)
    ),), {}))

MeanOfSquares = right("5.1", "LayerNorm", "E[x^2] - E[x]^2 in the same dtype")(
    type("MeanOfSquares", (_layer_norm_class(
        lambda x, eps: (x - x.mean(-1, keepdim=True))
        / ((x * x).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + eps).sqrt()
    ),), {}))


# ------------------------------------------------------------------ 5.2


class _FFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)


@wrong("5.2", "PositionwiseFeedForward", "no ReLU between the two layers",
       mistake="5.2/no-activation")
class NoActivation(_FFN):
    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


@wrong("5.2", "PositionwiseFeedForward", "GELU instead of the paper's ReLU",
       mistake="5.2/gelu")
class Gelu(_FFN):
    def forward(self, x):
        return self.linear2(self.dropout(nn.functional.gelu(self.linear1(x))))


@wrong("5.2", "PositionwiseFeedForward", "dropout on the output instead of the hidden layer",
       mistake="5.2/dropout-on-output")
class DropoutOnOutput(_FFN):
    def forward(self, x):
        return self.dropout(self.linear2(torch.relu(self.linear1(x))))


@right("5.2", "PositionwiseFeedForward", "clamp(min=0) and functional dropout")
class ClampFunctional(_FFN):
    def forward(self, x):
        hidden = self.linear1(x).clamp(min=0)
        return self.linear2(nn.functional.dropout(hidden, self.dropout.p, self.training))


@wrong("5.2", "PositionwiseFeedForward", "both linears initialised to zero",
       says="all zeros at initialisation")
class ZeroInitialised(ClampFunctional):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        for parameter in self.parameters():
            nn.init.zeros_(parameter)


# ------------------------------------------------------------------ 5.3


class _Residual(nn.Module):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        from solutions.ch05_layers import LayerNorm  # the course's own (5.3 may not use PyTorch's)

        super().__init__()
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first


@wrong("5.3", "ResidualConnection", "always post-LN: norm_first ignored",
       mistake="5.3/always-post-ln")
class AlwaysPostLN(_Residual):
    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


@wrong("5.3", "ResidualConnection", "the placements swapped: pre-LN when norm_first=False",
       mistake="5.3/placements-swapped")
class PlacementsSwapped(_Residual):
    def forward(self, x, sublayer):
        if not self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


@wrong("5.3", "ResidualConnection", "the norm on the sublayer's output only: x + norm(f(x))",
       mistake="5.3/norm-on-the-branch")
class NormOnBranch(_Residual):
    def forward(self, x, sublayer):
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return x + self.dropout(self.norm(sublayer(x)))


@wrong("5.3", "ResidualConnection", "dropout on the sum instead of the sublayer's output",
       mistake="5.3/dropout-on-the-sum")
class DropoutOnSum(_Residual):
    def forward(self, x, sublayer):
        if self.norm_first:
            return self.dropout(x + sublayer(self.norm(x)))
        return self.norm(self.dropout(x + sublayer(x)))


@wrong("5.3", "ResidualConnection", "the sublayer called twice",
       mistake="5.3/sublayer-called-twice")
class CalledTwice(_Residual):
    def forward(self, x, sublayer):
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        sublayer(x)  # e.g. a leftover debugging call
        return self.norm(x + self.dropout(sublayer(x)))


@right("5.3", "ResidualConnection", "one expression with the branch computed first")
class BranchFirst(_Residual):
    def forward(self, x, sublayer):
        branch = self.dropout(sublayer(self.norm(x) if self.norm_first else x))
        out = x + branch
        return out if self.norm_first else self.norm(out)


# ------------------------------------------------------------------ 5.4 and 5.5


def _parts():
    from annotated_transformer.parts import active_parts
    from solutions.ch05_layers import PositionwiseFeedForward, ResidualConnection

    return active_parts().MultiHeadAttention, PositionwiseFeedForward, ResidualConnection


class _Layer(nn.Module):
    """The sublayers of a layer, from the course's parts: self-attention, cross-attention
    when ``CROSS``, the feed-forward network, and one residual connection for each."""

    CROSS = False

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        attention, ffn, residual = _parts()
        self.self_attn = attention(d_model, num_heads, dropout=dropout)
        if self.CROSS:
            self.cross_attn = attention(d_model, num_heads, dropout=dropout)
        self.feed_forward = ffn(d_model, d_ff, dropout)
        self.residuals = nn.ModuleList([residual(d_model, dropout, norm_first)
                                        for _ in range(3 if self.CROSS else 2)])


class _Encoder(_Layer):
    CROSS = False


@wrong("5.4", "EncoderLayer", "the feed-forward network before the attention")
class FeedForwardFirst(_Encoder):
    def forward(self, x, mask=None):
        x = self.residuals[0](x, self.feed_forward)
        return self.residuals[1](x, lambda y: self.self_attn(y, y, y, mask))


@wrong("5.4", "EncoderLayer", "the mask not passed to self-attention",
       mistake="5.4/mask-not-passed")
class MaskDropped(_Encoder):
    def forward(self, x, mask=None):
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y))
        return self.residuals[1](x, self.feed_forward)


@wrong("5.4", "EncoderLayer", "norm_first not passed on: always post-LN",
       mistake="5.4/norm-first-not-passed-on")
class NormFirstIgnored(_Encoder):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first=False)

    def forward(self, x, mask=None):
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.residuals[1](x, self.feed_forward)


@right("5.4", "EncoderLayer", "a named method for the attention sublayer")
class NamedSublayer(_Encoder):
    def forward(self, x, mask=None):
        def attend(y):
            return self.self_attn(query=y, key=y, value=y, mask=mask)

        return self.residuals[1](self.residuals[0](x, attend), self.feed_forward)


class _Decoder(_Layer):
    CROSS = True


@wrong("5.5", "DecoderLayer", "cross-attention to its own input instead of the memory",
       mistake="5.5/memory-unused")
class AttendsToItself(_Decoder):
    MEMORY_MASK = False  # the cross-attention over x given tgt_mask (True: src_mask)

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        cross_mask = src_mask if self.MEMORY_MASK else tgt_mask
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.residuals[1](x, lambda y: self.cross_attn(y, y, y, cross_mask))
        return self.residuals[2](x, self.feed_forward)


@wrong("5.5", "DecoderLayer", "cross-attention to its own input, with the memory's mask",
       mistake="5.5/memory-unused")
class AttendsToItselfMemoryMask(AttendsToItself):
    MEMORY_MASK = True


@wrong("5.5", "DecoderLayer", "the two masks swapped", mistake="5.5/masks-swapped")
class MasksSwapped(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, src_mask))
        x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, tgt_mask))
        return self.residuals[2](x, self.feed_forward)


@wrong("5.5", "DecoderLayer", "cross-attention's queries from the memory, keys and values from x",
       mistake="5.5/cross-attention-queries")
class QueriesFromMemory(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.residuals[1](x, lambda y: self.cross_attn(memory, y, y, src_mask))
        return self.residuals[2](x, self.feed_forward)


@wrong("5.5", "DecoderLayer", "self-attention without its tgt_mask",
       mistake="5.5/self-attention-unmasked")
class SelfAttentionUnmasked(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y))
        x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
        return self.residuals[2](x, self.feed_forward)


@wrong("5.5", "DecoderLayer", "no self-attention sublayer")
class NoSelfAttention(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
        return self.residuals[2](x, self.feed_forward)


@right("5.5", "DecoderLayer", "keyword arguments and a loop over the sublayers")
class LoopOverSublayers(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        sublayers = [lambda y: self.self_attn(y, y, y, mask=tgt_mask),
                     lambda y: self.cross_attn(query=y, key=memory, value=memory, mask=src_mask),
                     self.feed_forward]
        for residual, sublayer in zip(self.residuals, sublayers, strict=True):
            x = residual(x, sublayer)
        return x


@wrong("5.4", "EncoderLayer", "every weight set to one constant", says="constant")
class ConstantWeights(NamedSublayer):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first)
        for parameter in self.parameters():
            nn.init.constant_(parameter, 0.01)


# PyTorch's own layers and norms by other roads: each is refused at the dispatch level.


@wrong("5.1", "LayerNorm", "the norm of PyTorch's nn.TransformerEncoderLayer",
       says="aten.native_layer_norm")
class TransformersNorm(_LayerNorm):
    def forward(self, x):
        norm = nn.TransformerEncoderLayer(x.size(-1), 1, layer_norm_eps=self.eps).norm1
        norm = norm.to(x.dtype)
        with torch.no_grad():
            norm.weight.copy_(self.weight)
            norm.bias.copy_(self.bias)
        return norm(x)


@wrong("5.1", "LayerNorm", "PyTorch's rms_norm of the centred input, reached by a computed name",
       says="rms_norm")
class CentredRmsNorm(_LayerNorm):
    def forward(self, x):
        rms = getattr(torch.nn.functional, "rms" + "_norm")  # no name to read in the file
        return rms(x - x.mean(-1, keepdim=True), (x.size(-1),), self.weight, self.eps) + self.bias


@wrong("5.3", "ResidualConnection", "PyTorch's nn.LayerNorm instead of the LayerNorm of 5.1",
       says="aten.native_layer_norm")
class TorchLayerNorm(BranchFirst):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__(d_model, dropout, norm_first)
        self.norm = nn.LayerNorm(d_model)


def _torch_layer(ours, theirs, attentions, residuals):
    """PyTorch's layer ``theirs`` holding the weights of the layer ``ours`` (the graded
    test's own mapping of the names; run in the worker, where the graded tests load)."""
    from test_ch05_layers import load_into

    state = ours.state_dict()
    theirs = load_into(theirs, state, attentions, residuals)
    return theirs.to(state["feed_forward.linear1.weight"].dtype)


@wrong("5.4", "EncoderLayer", "PyTorch's nn.TransformerEncoderLayer holding the layer's weights",
       says="may not use PyTorch's aten.")
class TorchEncoderLayer(NamedSublayer):
    def forward(self, x, mask=None):
        d = x.size(-1)
        theirs = _torch_layer(self, nn.TransformerEncoderLayer(
            d, self.self_attn.num_heads, self.feed_forward.linear1.out_features, dropout=0.0,
            batch_first=True, norm_first=self.residuals[0].norm_first),
            [("self_attn", "self_attn")], 2)
        padding = None if mask is None else ~mask.reshape(x.size(0), -1)
        return theirs(x, src_key_padding_mask=padding)


@wrong("5.5", "DecoderLayer", "PyTorch's nn.TransformerDecoderLayer holding the layer's weights",
       says="may not use PyTorch's aten.")
class TorchDecoderLayer(LoopOverSublayers):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        d = x.size(-1)
        theirs = _torch_layer(self, nn.TransformerDecoderLayer(
            d, self.self_attn.num_heads, self.feed_forward.linear1.out_features, dropout=0.0,
            batch_first=True, norm_first=self.residuals[0].norm_first),
            [("self_attn", "self_attn"), ("cross_attn", "multihead_attn")], 3)
        return theirs(x, memory)


# ------------------------------------------------------------------ 5.6 and 5.7 stacks


class _Stack(nn.Module):
    """An encoder's layers (each built anew from the active parts) and its last norm; the
    variant's forward uses them, or builds them otherwise."""

    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        parts = active_parts()
        self.layers = nn.ModuleList([parts.EncoderLayer(d_model, num_heads, d_ff, dropout,
                                                        norm_first) for _ in range(num_layers)])
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()


@wrong("5.6", "Encoder", "one layer listed num_layers times (one set of weights)",
       mistake="5.6/layers-shared")
class SharedLayerEncoder(_Stack):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        nn.Module.__init__(self)
        parts = active_parts()
        layer = parts.EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
        self.layers = nn.ModuleList([layer] * num_layers)
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


@wrong("5.6", "Encoder", "pre-LN without the last norm", mistake="5.6/no-final-norm")
class EncoderWithoutLastNorm(_Stack):
    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return x


@wrong("5.6", "Encoder", "a last norm in post-LN too")
class EncoderAlwaysNormed(_Stack):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.norm = active_parts().LayerNorm(d_model)

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


@wrong("5.6", "Encoder", "the mask not passed on to the layers", mistake="5.6/mask-not-passed")
class EncoderUnmasked(_Stack):
    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


@right("5.6", "Encoder", "the layers folded with functools.reduce")
class ReducedEncoder(_Stack):
    def forward(self, x, mask=None):
        return self.norm(functools.reduce(lambda y, layer: layer(y, mask), self.layers, x))


def _encoder_layers(d_model, num_heads, d_ff, num_layers, **kwargs):
    """``num_layers`` encoder layers of the active parts, each built with ``kwargs``."""
    parts = active_parts()
    return nn.ModuleList([parts.EncoderLayer(d_model, num_heads, d_ff, **kwargs)
                          for _ in range(num_layers)])


@wrong("5.6", "Encoder", "the layers built without the stack's dropout",
       mistake="5.6/dropout-not-passed-on")
class EncoderLayersWithoutDropout(_Stack):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.layers = _encoder_layers(d_model, num_heads, d_ff, num_layers,
                                      norm_first=norm_first)

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


@wrong("5.6", "Encoder", "the layers built without norm_first (post-LN), the last norm kept",
       mistake="5.6/norm-first-not-passed-on")
class EncoderLayersAlwaysPostLN(EncoderLayersWithoutDropout):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.layers = _encoder_layers(d_model, num_heads, d_ff, num_layers, dropout=dropout)


@wrong("5.6", "Encoder", "every layer applied to the stack's input, the last one's output kept",
       mistake="5.6/layers-not-chained")
class EncoderLayersNotChained(_Stack):
    def forward(self, x, mask=None):
        out = x
        for layer in self.layers:
            out = layer(x, mask)
        return self.norm(out)


@wrong("5.6", "Encoder", "the last norm nn.Identity() whatever norm_first is",
       mistake="5.6/norm-always-identity")
class EncoderNormAlwaysIdentity(EncoderLayersWithoutDropout):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.layers = _encoder_layers(d_model, num_heads, d_ff, num_layers, dropout=dropout,
                                      norm_first=norm_first)
        self.norm = nn.Identity()


@right("5.6", "Encoder", "the layers built by keywords; the last norm set in an if, applied "
       "only pre-LN")
class EncoderNormSetLater(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = _encoder_layers(d_model, num_heads, d_ff, num_layers, dropout=dropout,
                                      norm_first=norm_first)
        self.norm_first = norm_first
        self.norm = nn.Identity()
        if norm_first:
            self.norm = active_parts().LayerNorm(d_model)

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask=mask)
        return self.norm(x) if self.norm_first else x


class _DecoderStack(nn.Module):
    """A decoder's layers and its last norm, as :class:`_Stack`."""

    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        parts = active_parts()
        self.layers = nn.ModuleList([parts.DecoderLayer(d_model, num_heads, d_ff, dropout,
                                                        norm_first) for _ in range(num_layers)])
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()


@wrong("5.7", "Decoder", "one layer listed num_layers times (one set of weights)",
       mistake="5.7/layers-shared")
class SharedLayerDecoder(_DecoderStack):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        nn.Module.__init__(self)
        parts = active_parts()
        layer = parts.DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
        self.layers = nn.ModuleList([layer] * num_layers)
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "pre-LN without the last norm", mistake="5.7/no-final-norm")
class DecoderWithoutLastNorm(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return x


@wrong("5.7", "Decoder", "the masks not passed on to the layers",
       mistake="5.7/masks-not-passed")
class DecoderUnmasked(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory)
        return self.norm(x)


@wrong("5.7", "Decoder", "each layer attends to the previous layer's output, not the memory")
class DecoderWithoutMemory(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for i, layer in enumerate(self.layers):
            x = layer(x, memory if i == 0 else x, src_mask if i == 0 else tgt_mask, tgt_mask)
        return self.norm(x)


@right("5.7", "Decoder", "keyword arguments, the layers indexed")
class IndexedDecoder(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for i in range(len(self.layers)):
            x = self.layers[i](x, memory=memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.norm(x)


def _decoder_layers(d_model, num_heads, d_ff, num_layers, **kwargs):
    """``num_layers`` decoder layers of the active parts, each built with ``kwargs``."""
    parts = active_parts()
    return nn.ModuleList([parts.DecoderLayer(d_model, num_heads, d_ff, **kwargs)
                          for _ in range(num_layers)])


class _ChainedDecoder(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "the layers built without the stack's dropout",
       mistake="5.7/dropout-not-passed-on")
class DecoderLayersWithoutDropout(_ChainedDecoder):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.layers = _decoder_layers(d_model, num_heads, d_ff, num_layers,
                                      norm_first=norm_first)


@wrong("5.7", "Decoder", "the layers built without norm_first (post-LN), the last norm kept",
       mistake="5.7/norm-first-not-passed-on")
class DecoderLayersAlwaysPostLN(_ChainedDecoder):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.layers = _decoder_layers(d_model, num_heads, d_ff, num_layers, dropout=dropout)


@wrong("5.7", "Decoder", "the last norm nn.Identity() whatever norm_first is",
       mistake="5.7/norm-always-identity")
class DecoderNormAlwaysIdentity(_ChainedDecoder):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.norm = nn.Identity()


@wrong("5.7", "Decoder", "every layer applied to the stack's input, the last one's output kept",
       mistake="5.7/layers-not-chained")
class DecoderLayersNotChained(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        out = x
        for layer in self.layers:
            out = layer(x, memory, src_mask, tgt_mask)
        return self.norm(out)


@wrong("5.7", "Decoder", "the two masks handed to the layers swapped",
       mistake="5.7/masks-swapped")
class DecoderMasksSwapped(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, src_mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "the target's mask left out (self-attention unmasked)",
       mistake="5.7/target-mask-not-passed")
class DecoderWithoutTargetMask(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "the source's mask left out (cross-attention reads the padding)",
       mistake="5.7/source-mask-not-passed")
class DecoderWithoutSourceMask(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "the target's mask handed over as the source's")
class DecoderTargetMaskAsSource(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, tgt_mask)
        return self.norm(x)


@right("5.7", "Decoder", "the layers built by keywords; the last norm set in an if, applied "
       "only pre-LN")
class DecoderNormSetLater(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = _decoder_layers(d_model, num_heads, d_ff, num_layers, dropout=dropout,
                                      norm_first=norm_first)
        self.norm_first = norm_first
        self.norm = nn.Identity()
        if norm_first:
            self.norm = active_parts().LayerNorm(d_model)

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.norm(x) if self.norm_first else x


# ------------------------------------------------------------------ 5.8 the encoder-decoder


class _Model(nn.Module):
    """The encoder-decoder's modules, initialised and tied as the contract says; the
    variant's methods use them, or build them otherwise."""

    TIE = True  # False: the variant does not tie (it ties otherwise, or not at all)
    XAVIER = True
    EMBEDDING_DROPOUT = STACK_DROPOUT = True  # False: that part built with dropout 0

    def __init__(self, src_vocab_size, tgt_vocab_size, d_model, num_heads, d_ff, num_layers,
                 dropout=0.0, norm_first=False, tie_embeddings=True, max_len=5000):
        super().__init__()
        parts = active_parts()
        self.p, self.tied = dropout, tie_embeddings  # for a variant's own use (called as
        # the package calls it: every argument by position)
        if tie_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"one vocabulary: {src_vocab_size} != {tgt_vocab_size}")
        embedding_p = dropout if self.EMBEDDING_DROPOUT else 0.0
        stack_p = dropout if self.STACK_DROPOUT else 0.0
        self.src_embed = parts.embeddings(src_vocab_size, d_model, max_len, embedding_p)
        self.tgt_embed = parts.embeddings(tgt_vocab_size, d_model, max_len, embedding_p)
        self.encoder = parts.Encoder(d_model, num_heads, d_ff, num_layers, stack_p, norm_first)
        self.decoder = parts.Decoder(d_model, num_heads, d_ff, num_layers, stack_p, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if self.XAVIER:
            for parameter in self.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        if tie_embeddings and self.TIE:
            self.tgt_embed.tokens.embedding.weight = self.src_embed.tokens.embedding.weight
            self.generator.weight = self.src_embed.tokens.embedding.weight

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


@wrong("5.8", "EncoderDecoder", "log-probabilities from forward (a log_softmax generator)",
       mistake="5.8/log-probabilities")
class LogProbabilities(_Model):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        hidden = self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)
        return torch.log_softmax(self.generator(hidden), dim=-1)


@wrong("5.8", "EncoderDecoder", "the decoder run without the source's mask",
       mistake="5.8/cross-attention-unmasked")
class CrossAttentionUnmasked(_Model):
    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, None, tgt_mask)


@wrong("5.8", "EncoderDecoder", "the target embedded by the source's embedding",
       mistake="5.8/target-read-by-source-embedding")
class TargetBySourceEmbedding(_Model):
    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.src_embed(tgt), memory, src_mask, tgt_mask)


@wrong("5.8", "EncoderDecoder", "the generator given a copy of the embedding, not the matrix",
       mistake="5.8/not-tied")
class TiedByCopy(_Model):
    TIE = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tied:
            self.tgt_embed.tokens.embedding.weight = self.src_embed.tokens.embedding.weight
            self.generator.weight = nn.Parameter(self.src_embed.tokens.embedding.weight.clone())


@wrong("5.8", "EncoderDecoder", "tie_embeddings ignored: three matrices of their own",
       mistake="5.8/not-tied")
class NeverTied(_Model):
    TIE = False


@wrong("5.8", "EncoderDecoder", "the weights left at PyTorch's default initialisation",
       mistake="5.8/not-xavier")
class DefaultInitialisation(_Model):
    XAVIER = False


@wrong("5.8", "EncoderDecoder", "the encoder run without the source's mask")
class ModelEncoderUnmasked(_Model):
    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), None)


@wrong("5.8", "EncoderDecoder", "the stacks built without the model's dropout",
       mistake="5.8/dropout-not-passed-on")
class StacksWithoutDropout(_Model):
    STACK_DROPOUT = False


@wrong("5.8", "EncoderDecoder", "the embeddings built without the model's dropout",
       mistake="5.8/dropout-not-passed-on")
class EmbeddingsWithoutDropout(_Model):
    EMBEDDING_DROPOUT = False


@wrong("5.8", "EncoderDecoder", "decode returns the generator's logits, and forward applies "
       "the generator again", mistake="5.8/generator-in-decode")
class GeneratorInDecode(_Model):
    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.generator(self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask))


@right("5.8", "EncoderDecoder", "the embeddings' dropout applied in encode and decode with "
       "F.dropout(..., training=self.training)")
class FunctionalEmbeddingDropout(_Model):
    EMBEDDING_DROPOUT = False

    def encode(self, src, src_mask):
        x = torch.nn.functional.dropout(self.src_embed(src), self.p, training=self.training)
        return self.encoder(x, src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        x = torch.nn.functional.dropout(self.tgt_embed(tgt), self.p, training=self.training)
        return self.decoder(x, memory, src_mask, tgt_mask)


@right("5.8", "EncoderDecoder", "initialised by apply(), tied in one statement")
class AppliedInitialisation(_Model):
    TIE = False
    XAVIER = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

        def xavier(module):
            for parameter in module.parameters(recurse=False):
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)

        self.apply(xavier)
        if self.tied:
            shared = self.src_embed.tokens.embedding.weight
            self.generator.weight = self.tgt_embed.tokens.embedding.weight = shared


@right("5.8", "EncoderDecoder", "forward by keywords, memory named")
class KeywordModel(_Model):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encode(src=src, src_mask=src_mask)
        return self.generator(self.decode(memory=memory, src_mask=src_mask, tgt=tgt,
                                          tgt_mask=tgt_mask))


# ------------------------------------------------------------------ 5.6 and 5.7 by clones


def clones(module, n):
    """``n`` deep copies of ``module`` in an ``nn.ModuleList``, each with weights of its own:
    The Annotated Transformer's ``clones``."""
    import copy

    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


@right("5.6", "Encoder", "one layer built and deep-copied num_layers times "
       "(The Annotated Transformer's clones)")
class ClonedEncoder(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        parts = active_parts()
        self.layers = clones(parts.EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first),
                             num_layers)
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


@right("5.7", "Decoder", "one layer built and deep-copied num_layers times "
       "(The Annotated Transformer's clones)")
class ClonedDecoder(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, num_layers, dropout=0.0, norm_first=False):
        super().__init__()
        parts = active_parts()
        self.layers = clones(parts.DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first),
                             num_layers)
        self.norm = parts.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


# ------------------------------------------------------------------ dtype, device, gradients


@wrong("5.2", "PositionwiseFeedForward", "the ReLU as the maximum with torch.zeros(h.shape): "
       "made on the CPU", mistake="5.2/device-not-kept")
class ReluAgainstZeros(_FFN):
    def forward(self, x):
        hidden = self.linear1(x)
        return self.linear2(self.dropout(torch.maximum(hidden, torch.zeros(hidden.shape))))


@wrong("5.3", "ResidualConnection", "x detached where it is added back: the skip path carries "
       "no gradient", mistake="5.3/skip-detached")
class SkipDetached(_Residual):
    def forward(self, x, sublayer):
        if self.norm_first:
            return x.detach() + self.dropout(sublayer(self.norm(x)))
        return self.norm(x.detach() + self.dropout(sublayer(x)))


@wrong("5.4", "EncoderLayer", "a mask of ones made on the CPU when none is given",
       mistake="5.4/device-not-kept")
class DefaultMaskOnTheCpu(_Encoder):
    def forward(self, x, mask=None):
        if mask is None:
            mask = torch.ones(x.size(0), 1, 1, x.size(1), dtype=torch.bool)
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.residuals[1](x, self.feed_forward)


@wrong("5.5", "DecoderLayer", "the memory detached: the encoder's output taken as a constant",
       mistake="5.5/memory-detached")
class MemoryDetached(_Decoder):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        memory = memory.detach()
        x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
        return self.residuals[2](x, self.feed_forward)


@wrong("5.6", "Encoder", "a mask of ones made on the CPU when none is given",
       mistake="5.6/device-not-kept")
class EncoderDefaultMaskOnTheCpu(_Stack):
    def forward(self, x, mask=None):
        if mask is None:
            mask = torch.ones(x.size(0), 1, 1, x.size(1), dtype=torch.bool)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


@wrong("5.7", "Decoder", "the memory detached once for every layer",
       mistake="5.7/memory-detached")
class DecoderMemoryDetached(_DecoderStack):
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        memory = memory.detach()
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


@wrong("5.8", "EncoderDecoder", "the logits cast to float32 for the loss: a float64 model "
       "returns float32", mistake="5.8/dtype-changed")
class LogitsInFloat32(_Model):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return super().forward(src, tgt, src_mask, tgt_mask).float()


@wrong("5.8", "EncoderDecoder", "the memory detached between encode and decode",
       mistake="5.8/memory-detached")
class ModelMemoryDetached(_Model):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encode(src, src_mask).detach()
        return self.generator(self.decode(memory, src_mask, tgt, tgt_mask))


@wrong("5.8", "EncoderDecoder", "masks of ones made on the CPU when none are given",
       mistake="5.8/device-not-kept")
class DefaultMasksOnTheCpu(_Model):
    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if src_mask is None:
            src_mask = torch.ones(src.size(0), 1, 1, src.size(1), dtype=torch.bool)
        if tgt_mask is None:
            tgt_mask = torch.ones(1, 1, tgt.size(1), tgt.size(1), dtype=torch.bool)
        return super().forward(src, tgt, src_mask, tgt_mask)
