"""Stand-ins: the grader's own version of an exercise, so that a later one is graded alone.

Exercise 5.5 (``DecoderLayer``) builds on 3.3, 5.1, 5.2 and 5.3. Graded on the learner's own
earlier parts, a correct 5.5 would fail when their LayerNorm is wrong, and be named for a
mistake it did not make. So while the tests of an exercise run, the earlier exercises it
builds on are these stand-ins (:data:`EXERCISES`): PyTorch's own op where PyTorch has one
(``torch.softmax``, ``F.layer_norm``, ``F.multi_head_attention_forward``,
``F.cross_entropy``), else the formula the exercise's docstring states. Its points and its
named mistake then depend on its own code alone. Whether the learner's parts work together
is the capstones' question (6.6, 8.6 run on the learner's parts only) and each report's
line "uses your 5.1, whose values are wrong" (:mod:`.engine`).

In the worker (:mod:`.worker`), built before any learner code runs. Where a stand-in uses an
op the exercise under test may not (a softmax in 5.4's attention), it computes under the
guard's exemption (:func:`annotated_transformer.course.grading.allowed_ops.guard_factory`),
its backward too, and never calls learner code while exempt (the dropout a caller passes to
attention runs outside). Each stand-in notes that it ran: an exercise whose own stand-in ran
while its tests ran is refused (``forbidden``), so a stand-in is never an answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# The exercises that have a stand-in, and the name each is looked up by (its chapter's).
EXERCISES = {
    "1.2": "PositionalEncoding", "1.3": "TokenEmbedding", "2.1": "softmax",
    "2.2": "scaled_dot_product_attention", "3.3": "MultiHeadAttention", "4.1": "padding_mask",
    "4.2": "causal_mask", "4.3": "target_mask", "5.1": "LayerNorm",
    "5.2": "PositionwiseFeedForward", "5.3": "ResidualConnection", "5.4": "EncoderLayer",
    "5.5": "DecoderLayer", "5.6": "Encoder", "5.7": "Decoder", "6.2": "LabelSmoothingLoss",
}


def build(exempt: Callable[[], AbstractContextManager], ran: Callable[[str], None]
          ) -> dict[str, Any]:
    """``{exercise: stand-in}``; ``exempt()`` switches the guard's checks off for a block,
    ``ran(exercise)`` notes that a stand-in ran. (PyTorch is imported here, in the worker:
    the grader's own process reads :data:`EXERCISES` without loading it.)"""
    import torch
    import torch.nn.functional as F
    from torch import Tensor, nn

    def trusted(function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (of tensors and other arguments, PyTorch's ops only) computed under
        the exemption, forward and backward, as one autograd node."""

        class Call(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                with exempt(), torch.enable_grad():
                    inputs = [a.detach().requires_grad_(need) if isinstance(a, Tensor)
                              and need else a.detach() if isinstance(a, Tensor) else a
                              for a, need in zip(args, ctx.needs_input_grad, strict=True)]
                    out = function(*inputs)
                outputs = out if isinstance(out, tuple) else (out,)
                ctx.inputs, ctx.outputs = inputs, outputs
                return tuple(o.detach() for o in outputs) if isinstance(out, tuple) else (
                    out.detach())

            @staticmethod
            def backward(ctx, *grads):
                wanted = [i for i, a in enumerate(ctx.inputs)
                          if isinstance(a, Tensor) and a.requires_grad]
                pairs = [(o, g) for o, g in zip(ctx.outputs, grads, strict=True)
                         if g is not None and o.requires_grad]
                found: list[Tensor | None] = [None] * len(ctx.inputs)
                if wanted and pairs:
                    with exempt():
                        computed = torch.autograd.grad(
                            [o for o, _ in pairs], [ctx.inputs[i] for i in wanted],
                            [g for _, g in pairs], allow_unused=True)
                    for i, grad in zip(wanted, computed, strict=True):
                        found[i] = grad
                return tuple(found)

        def call(*args: Any) -> Any:
            # Only what runs no code of its own enters the exemption: tensors of exactly
            # Tensor or Parameter (a subclass's methods would run exempt), plain numbers.
            for arg in args:
                if not (type(arg) in (Tensor, nn.Parameter) or arg is None
                        or type(arg) in (bool, int, float)):
                    raise TypeError(f"the grader's stand-in takes tensors and numbers, got a "
                                    f"{type(arg).__name__}")
            return Call.apply(*args)

        return call

    def noted(exercise: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            ran(exercise)
            return function(*args, **kwargs)
        call.__name__ = call.__qualname__ = EXERCISES[exercise]
        call.__doc__ = f"The grader's stand-in for exercise {exercise}."
        return call

    def softmax_of(x: Tensor, dim: int) -> Tensor:
        out = torch.softmax(x, dim)  # a slice of -inf only: NaN, which the course makes 0
        return torch.where(torch.isnan(out), torch.zeros_like(out), out)

    trusted_softmax = trusted(softmax_of)

    def softmax(x: Tensor, dim: int = -1) -> Tensor:
        return trusted_softmax(x, dim)

    def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                     mask: Tensor | None = None,
                                     dropout: Callable[[Tensor], Tensor] | None = None
                                     ) -> tuple[Tensor, Tensor]:
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
        weights = trusted_softmax(scores, -1)
        if dropout is not None:  # the caller's dropout: outside the exemption
            weights = dropout(weights)
        return weights @ value, weights

    def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
        return (tokens != pad_id)[:, None, None, :]

    def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
        return torch.ones(size, size, dtype=torch.bool, device=device).tril()

    def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
        return padding_mask(tokens, pad_id) & causal_mask(tokens.size(-1), tokens.device)

    trusted_layer_norm = trusted(lambda x, weight, bias, eps: F.layer_norm(
        x, (x.size(-1),), weight, bias, eps))

    class LayerNorm(nn.Module):
        """The grader's stand-in for exercise 5.1: ``F.layer_norm``."""

        def __init__(self, d_model: int, eps: float = 1e-5) -> None:
            ran("5.1")
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d_model))
            self.bias = nn.Parameter(torch.zeros(d_model))

        def forward(self, x: Tensor) -> Tensor:
            ran("5.1")
            return trusted_layer_norm(x, self.weight, self.bias, self.eps)

    class PositionwiseFeedForward(nn.Module):
        """The grader's stand-in for exercise 5.2."""

        def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
            ran("5.2")
            super().__init__()
            self.linear1 = nn.Linear(d_model, d_ff)
            self.linear2 = nn.Linear(d_ff, d_model)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: Tensor) -> Tensor:
            ran("5.2")
            return self.linear2(self.dropout(torch.relu(self.linear1(x))))

    class ResidualConnection(nn.Module):
        """The grader's stand-in for exercise 5.3 (its norm is the stand-in LayerNorm)."""

        def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False
                     ) -> None:
            ran("5.3")
            super().__init__()
            self.norm = LayerNorm(d_model)
            self.dropout = nn.Dropout(dropout)
            self.norm_first = norm_first

        def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
            ran("5.3")
            if self.norm_first:
                return x + self.dropout(sublayer(self.norm(x)))
            return self.norm(x + self.dropout(sublayer(x)))

    def attend(query, key, value, mask, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, heads,
               dropout, training):
        """Multi-head attention from PyTorch's ops, with the course's mask (``True`` =
        allowed; a query with no key attends to nothing) and its weights per head."""
        def heads_of(x, weight, bias):  # [B, L, D] -> [B, H, L, d_k]
            return F.linear(x, weight, bias).unflatten(-1, (heads, -1)).transpose(1, 2)

        q, k, v = heads_of(query, q_w, q_b), heads_of(key, k_w, k_b), heads_of(value, v_w, v_b)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
        weights = F.dropout(softmax_of(scores, -1), dropout, training)
        return F.linear((weights @ v).transpose(1, 2).flatten(-2), o_w, o_b), weights

    trusted_attention = trusted(attend)

    class MultiHeadAttention(nn.Module):
        """The grader's stand-in for exercise 3.3: PyTorch's multi-head attention."""

        def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                     bias: bool = True) -> None:
            ran("3.3")
            super().__init__()
            if num_heads <= 0 or d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
            self.attention = found["2.2"]  # Chapter 2's attention, as the contract has it
            self.d_model, self.num_heads = d_model, num_heads
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.k_proj = nn.Linear(d_model, d_model, bias=bias)
            self.v_proj = nn.Linear(d_model, d_model, bias=bias)
            self.out_proj = nn.Linear(d_model, d_model, bias=bias)
            self.dropout = nn.Dropout(dropout)
            self.attention_weights: Tensor | None = None

        def forward(self, query: Tensor, key: Tensor, value: Tensor,
                    mask: Tensor | None = None) -> Tensor:
            ran("3.3")
            out, weights = trusted_attention(
                query, key, value, mask, self.q_proj.weight, self.q_proj.bias,
                self.k_proj.weight, self.k_proj.bias, self.v_proj.weight, self.v_proj.bias,
                self.out_proj.weight, self.out_proj.bias, self.num_heads, self.dropout.p,
                self.training)
            self.attention_weights = weights.detach()
            return out

    class EncoderLayer(nn.Module):
        """The grader's stand-in for exercise 5.4, of the stand-ins above (the contract's
        state-dict names)."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                     norm_first: bool = False) -> None:
            ran("5.4")
            super().__init__()
            self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
            self.residuals = nn.ModuleList(
                [ResidualConnection(d_model, dropout, norm_first) for _ in range(2)])

        def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
            ran("5.4")
            x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, mask))
            return self.residuals[1](x, self.feed_forward)

    class DecoderLayer(nn.Module):
        """The grader's stand-in for exercise 5.5, of the stand-ins above."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                     norm_first: bool = False) -> None:
            ran("5.5")
            super().__init__()
            self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
            self.residuals = nn.ModuleList(
                [ResidualConnection(d_model, dropout, norm_first) for _ in range(3)])

        def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                    tgt_mask: Tensor | None = None) -> Tensor:
            ran("5.5")
            x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
            x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
            return self.residuals[2](x, self.feed_forward)

    class Encoder(nn.Module):
        """The grader's stand-in for exercise 5.6: its layers, then a last norm pre-LN."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                     dropout: float = 0.0, norm_first: bool = False) -> None:
            ran("5.6")
            super().__init__()
            self.layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout,
                                                      norm_first) for _ in range(num_layers)])
            self.norm = LayerNorm(d_model) if norm_first else nn.Identity()

        def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
            ran("5.6")
            for layer in self.layers:
                x = layer(x, mask)
            return self.norm(x)

    class Decoder(nn.Module):
        """The grader's stand-in for exercise 5.7: its layers, then a last norm pre-LN."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                     dropout: float = 0.0, norm_first: bool = False) -> None:
            ran("5.7")
            super().__init__()
            self.layers = nn.ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout,
                                                      norm_first) for _ in range(num_layers)])
            self.norm = LayerNorm(d_model) if norm_first else nn.Identity()

        def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                    tgt_mask: Tensor | None = None) -> Tensor:
            ran("5.7")
            for layer in self.layers:
                x = layer(x, memory, src_mask, tgt_mask)
            return self.norm(x)

    class PositionalEncoding(nn.Module):
        """The grader's stand-in for exercise 1.2: the sinusoidal table, added, then
        dropout."""

        def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
            ran("1.2")
            super().__init__()
            position = torch.arange(max_len, dtype=torch.float64)[:, None]
            rate = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
            table = torch.zeros(max_len, d_model, dtype=torch.float64)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
            self.register_buffer("pe", table.float())
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: Tensor) -> Tensor:
            ran("1.2")
            if x.size(1) > self.pe.size(0):
                raise ValueError(f"sequence length L={x.size(1)} is longer than "
                                 f"max_len={self.pe.size(0)}")
            return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))

    class TokenEmbedding(nn.Module):
        """The grader's stand-in for exercise 1.3: ``embedding(tokens) * sqrt(d_model)``."""

        def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None
                     ) -> None:
            ran("1.3")
            super().__init__()
            self.d_model = d_model
            self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)

        def forward(self, tokens: Tensor) -> Tensor:
            ran("1.3")
            return self.embedding(tokens) * math.sqrt(self.d_model)

    trusted_cross_entropy = trusted(lambda logits, target, ignore, smoothing: F.cross_entropy(
        logits, target, ignore_index=ignore, label_smoothing=smoothing))

    class LabelSmoothingLoss(nn.Module):
        """The grader's stand-in for exercise 6.2: ``F.cross_entropy``."""

        def __init__(self, smoothing: float = 0.1, ignore_index: int | None = None) -> None:
            ran("6.2")
            super().__init__()
            self.smoothing, self.ignore_index = smoothing, ignore_index

        def forward(self, logits: Tensor, target: Tensor) -> Tensor:
            ran("6.2")
            ignore = -100 if self.ignore_index is None else self.ignore_index
            if bool((target == ignore).all()):
                return (logits * 0).sum()
            return trusted_cross_entropy(logits, target, ignore, self.smoothing)

    found: dict[str, Any] = {}
    functions = {"2.1": softmax, "2.2": scaled_dot_product_attention, "4.1": padding_mask,
                 "4.2": causal_mask, "4.3": target_mask}
    found.update({e: noted(e, f) for e, f in functions.items()})  # type: ignore[arg-type]
    found.update({"1.2": PositionalEncoding, "1.3": TokenEmbedding, "3.3": MultiHeadAttention,
                  "5.1": LayerNorm, "5.2": PositionwiseFeedForward, "5.3": ResidualConnection,
                  "5.4": EncoderLayer, "5.5": DecoderLayer, "5.6": Encoder, "5.7": Decoder,
                  "6.2": LabelSmoothingLoss})
    return found


def stand_ins_for(exercise: str | None, declared: Any) -> tuple[str, ...]:
    """The earlier exercises that ``exercise``'s tests run on stand-ins: every one it builds
    on (``declared``: :class:`~.dependencies.Declared`) that has one; none for a capstone,
    whose question is whether the learner's own parts work together."""
    if exercise is None or exercise in declared.integration:
        return ()
    return tuple(e for e in declared.closure(exercise) if e in EXERCISES)
