"""Stand-ins, the worker's half: the grader's own versions of earlier exercises, built and revoked.

Which exercises a test runs on stand-ins, and why, is the trusted side's
(``dependencies.Declared.stand_ins``); a request names them (its
``standins``, of :data:`~annotated_transformer.course.grading.protocol.STAND_INS`), and here
they are made: PyTorch's own op where PyTorch has one (``torch.softmax``, ``F.layer_norm``,
``F.multi_head_attention_forward``, ``F.cross_entropy``), else the formula the exercise's
docstring states.

A stand-in belongs to one request of the worker (:mod:`.process`): :func:`build` makes the
stand-ins afresh for the request that is handed them, and the function it returns with them
revokes them when that request ends. A revoked stand-in (a class, a function, a module built
from one, a graph its computation left) refuses to work when it is called, and the call is
noted: the request that made it is ``forbidden``, naming the exercise whose tests were handed
it. So a stand-in kept at module level serves no later test: not the capstones (6.6, 8.6:
the learner's own parts together, no stand-in), not an exercise that has none.

Where a stand-in uses an op the exercise under test may not (a softmax in 5.4's attention),
it computes through :func:`.trusted.computations`, whose ops the guard exempts. Each stand-in notes
that it ran: an exercise whose own stand-in ran while its tests ran is refused
(``forbidden``), so a stand-in is never an answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from annotated_transformer.course.grading.protocol import STAND_INS

if TYPE_CHECKING:
    from torch import Tensor


class StandInRevoked(RuntimeError):
    """A stand-in called after the request it was made for ended."""


def build(computed: Mapping[str, Callable[..., Any]], ran: Callable[[str], None],
          kept: Callable[[tuple[str, str]], None], owner: str
          ) -> tuple[dict[str, Any], Callable[[], None]]:
    """``({exercise: stand-in}, revoke)``: the stand-ins for one request, that of a test of
    exercise ``owner``, computing with ``computed`` (:func:`.trusted.computations`). Each notes
    ``ran(exercise)`` when it runs; once ``revoke()`` was called, each one, and every object
    made from one, raises :class:`StandInRevoked` instead and notes ``kept((exercise,
    owner))``."""
    import torch
    from torch import nn

    live = [True]  # held here and by the stand-ins only

    def entered(exercise: str, note: bool = True) -> None:
        """Every stand-in's first step: refused once its request has ended."""
        if not live[0]:
            kept((exercise, owner))
            raise StandInRevoked(
                f"the grader's stand-in for exercise {exercise} was handed to a test of "
                f"exercise {owner}, which has ended: a stand-in serves only the test it is "
                f"handed to (ask active_parts() for a part where you use it; keep none)")
        if note:
            ran(exercise)

    def revoke() -> None:
        live[0] = False

    def alive(exercise: str) -> Callable[[], None]:
        return lambda: entered(exercise, note=False)

    softmax_alive, attention_alive, norm_alive, loss_alive = (
        alive(e) for e in ("2.1", "3.3", "5.1", "6.2"))

    def noted(exercise: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            entered(exercise)
            return function(*args, **kwargs)
        call.__name__ = call.__qualname__ = STAND_INS[exercise]
        call.__doc__ = f"The grader's stand-in for exercise {exercise}."
        return call

    def softmax(x: Tensor, dim: int = -1) -> Tensor:
        return computed["2.1"](softmax_alive, x, dim)

    def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                     mask: Tensor | None = None,
                                     dropout: Callable[[Tensor], Tensor] | None = None
                                     ) -> tuple[Tensor, Tensor]:
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
        weights = computed["2.1"](softmax_alive, scores, -1)
        if dropout is not None:  # the caller's dropout: checked as the learner's
            weights = dropout(weights)
        return weights @ value, weights

    def split_heads(x: Tensor, num_heads: int) -> Tensor:  # [B, L, D] -> [B, H, L, D/H]
        batch, length, d_model = x.shape
        if num_heads <= 0 or d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        return x.reshape(batch, length, num_heads, d_model // num_heads).transpose(1, 2)

    def merge_heads(x: Tensor) -> Tensor:  # [B, H, L, d_k] -> [B, L, H*d_k]
        batch, heads, length, d_k = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * d_k)

    def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
        return (tokens != pad_id)[:, None, None, :]

    def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
        return torch.ones(size, size, dtype=torch.bool, device=device).tril()

    def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
        return padding_mask(tokens, pad_id) & causal_mask(tokens.size(-1), tokens.device)

    class LayerNorm(nn.Module):
        """The grader's stand-in for exercise 5.1: ``F.layer_norm``."""

        def __init__(self, d_model: int, eps: float = 1e-5) -> None:
            entered("5.1")
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d_model))
            self.bias = nn.Parameter(torch.zeros(d_model))

        def forward(self, x: Tensor) -> Tensor:
            entered("5.1")
            return computed["5.1"](norm_alive, x, self.weight, self.bias, self.eps)

    class PositionwiseFeedForward(nn.Module):
        """The grader's stand-in for exercise 5.2."""

        def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
            entered("5.2")
            super().__init__()
            self.linear1 = nn.Linear(d_model, d_ff)
            self.linear2 = nn.Linear(d_ff, d_model)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: Tensor) -> Tensor:
            entered("5.2")
            return self.linear2(self.dropout(torch.relu(self.linear1(x))))

    class ResidualConnection(nn.Module):
        """The grader's stand-in for exercise 5.3 (its norm is the stand-in LayerNorm)."""

        def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False
                     ) -> None:
            entered("5.3")
            super().__init__()
            self.norm = LayerNorm(d_model)
            self.dropout = nn.Dropout(dropout)
            self.norm_first = norm_first

        def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
            entered("5.3")
            if self.norm_first:
                return x + self.dropout(sublayer(self.norm(x)))
            return self.norm(x + self.dropout(sublayer(x)))

    class MultiHeadAttention(nn.Module):
        """The grader's stand-in for exercise 3.3: PyTorch's multi-head attention."""

        def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                     bias: bool = True) -> None:
            entered("3.3")
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
            entered("3.3")
            out, weights = computed["3.3"](
                attention_alive, query, key, value, mask, self.q_proj.weight, self.q_proj.bias,
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
            entered("5.4")
            super().__init__()
            self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
            self.residuals = nn.ModuleList(
                [ResidualConnection(d_model, dropout, norm_first) for _ in range(2)])

        def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
            entered("5.4")
            x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, mask))
            return self.residuals[1](x, self.feed_forward)

    class DecoderLayer(nn.Module):
        """The grader's stand-in for exercise 5.5, of the stand-ins above."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                     norm_first: bool = False) -> None:
            entered("5.5")
            super().__init__()
            self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
            self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
            self.residuals = nn.ModuleList(
                [ResidualConnection(d_model, dropout, norm_first) for _ in range(3)])

        def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                    tgt_mask: Tensor | None = None) -> Tensor:
            entered("5.5")
            x = self.residuals[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
            x = self.residuals[1](x, lambda y: self.cross_attn(y, memory, memory, src_mask))
            return self.residuals[2](x, self.feed_forward)

    class Encoder(nn.Module):
        """The grader's stand-in for exercise 5.6: its layers, then a last norm pre-LN."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                     dropout: float = 0.0, norm_first: bool = False) -> None:
            entered("5.6")
            super().__init__()
            self.layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout,
                                                      norm_first) for _ in range(num_layers)])
            self.norm = LayerNorm(d_model) if norm_first else nn.Identity()

        def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
            entered("5.6")
            for layer in self.layers:
                x = layer(x, mask)
            return self.norm(x)

    class Decoder(nn.Module):
        """The grader's stand-in for exercise 5.7: its layers, then a last norm pre-LN."""

        def __init__(self, d_model: int, num_heads: int, d_ff: int, num_layers: int,
                     dropout: float = 0.0, norm_first: bool = False) -> None:
            entered("5.7")
            super().__init__()
            self.layers = nn.ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout,
                                                      norm_first) for _ in range(num_layers)])
            self.norm = LayerNorm(d_model) if norm_first else nn.Identity()

        def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                    tgt_mask: Tensor | None = None) -> Tensor:
            entered("5.7")
            for layer in self.layers:
                x = layer(x, memory, src_mask, tgt_mask)
            return self.norm(x)

    class PositionalEncoding(nn.Module):
        """The grader's stand-in for exercise 1.2: the sinusoidal table, added, then
        dropout."""

        def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
            entered("1.2")
            super().__init__()
            position = torch.arange(max_len, dtype=torch.float64)[:, None]
            rate = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
            table = torch.zeros(max_len, d_model, dtype=torch.float64)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
            self.register_buffer("pe", table.float())
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: Tensor) -> Tensor:
            entered("1.2")
            if x.size(1) > self.pe.size(0):
                raise ValueError(f"sequence length L={x.size(1)} is longer than "
                                 f"max_len={self.pe.size(0)}")
            return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))

    class TokenEmbedding(nn.Module):
        """The grader's stand-in for exercise 1.3: ``embedding(tokens) * sqrt(d_model)``."""

        def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None
                     ) -> None:
            entered("1.3")
            super().__init__()
            self.d_model = d_model
            self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)

        def forward(self, tokens: Tensor) -> Tensor:
            entered("1.3")
            return self.embedding(tokens) * math.sqrt(self.d_model)

    class LabelSmoothingLoss(nn.Module):
        """The grader's stand-in for exercise 6.2: ``F.cross_entropy``."""

        def __init__(self, smoothing: float = 0.1, ignore_index: int | None = None) -> None:
            entered("6.2")
            super().__init__()
            self.smoothing, self.ignore_index = smoothing, ignore_index

        def forward(self, logits: Tensor, target: Tensor) -> Tensor:
            entered("6.2")
            ignore = -100 if self.ignore_index is None else self.ignore_index
            if bool((target == ignore).all()):
                return (logits * 0).sum()
            return computed["6.2"](loss_alive, logits, target, ignore, self.smoothing)

    found: dict[str, Any] = {}
    functions = {"2.1": softmax, "2.2": scaled_dot_product_attention, "3.1": split_heads,
                 "3.2": merge_heads, "4.1": padding_mask, "4.2": causal_mask,
                 "4.3": target_mask}
    found.update({e: noted(e, f) for e, f in functions.items()})  # type: ignore[arg-type]
    found.update({"1.2": PositionalEncoding, "1.3": TokenEmbedding, "3.3": MultiHeadAttention,
                  "5.1": LayerNorm, "5.2": PositionwiseFeedForward, "5.3": ResidualConnection,
                  "5.4": EncoderLayer, "5.5": DecoderLayer, "5.6": Encoder, "5.7": Decoder,
                  "6.2": LabelSmoothingLoss})
    return found, revoke
