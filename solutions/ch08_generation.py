"""Chapter 8: the decoder-only Transformer and generation.

A decoder-only Transformer (a "GPT") is the decoder without cross-attention: Chapter 5's
layers over one sequence with Chapter 4's causal mask. It learns to predict every token
from the ones before it, and it writes by predicting a token, appending it and predicting
again. This chapter has five exercises and a capstone. Three are what writing needs:
turning the last position's logits into a distribution to draw from
(:func:`next_token_distribution`, 8.1), drawing from it reproducibly (:func:`sample_next`,
8.2), and one step of self-attention that reuses the keys and values of the positions
already written instead of recomputing them (:func:`attention_step`, 8.3). Two are what
learning needs: the loss of every position's prediction of the next token
(:func:`language_model_loss`, 8.4), and the model itself (:class:`DecoderOnlyTransformer`,
8.5), Chapter 5's encoder stack between an embedding and a generator that share one
matrix. The capstone (8.6) trains that model, built from your parts, on arithmetic
progressions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from annotated_transformer.parts import active_parts

__all__ = ["next_token_distribution", "sample_next", "attention_step", "language_model_loss",
           "DecoderOnlyTransformer"]


def next_token_distribution(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                            top_p: float | None = None) -> Tensor:
    """Exercise 8.1: the distribution to draw the next token from, ``logits [B, V] -> [B, V]``.

    Three steps, in this order, on each row:

    1. **temperature** ``T``: ``p = softmax(logits / T)``. ``T < 1`` sharpens the
       distribution, ``T > 1`` flattens it. ``T = 0`` is greedy decoding: probability 1 on
       the argmax (the first of tied maxima, as ``torch.argmax``), 0 elsewhere, and top-k
       and top-p change nothing.
    2. **top-k**: keep the tokens whose logit is at least the ``k``-th largest of the row
       (tokens tied with the ``k``-th are all kept, so the result does not depend on the
       order of the vocabulary); ``k`` larger than ``V`` keeps every token. The others get
       probability 0 and the kept ones are renormalised to sum to 1.
    3. **top-p** (nucleus sampling, Holtzman et al., 2020): of what top-k left, keep the
       smallest set of likeliest tokens whose probabilities add up to at least ``p``:
       token ``i`` stays when the tokens *more probable than it* add up to less than ``p``
       (so the token that crosses ``p`` is kept, and so are the tokens tied with it);
       renormalise again. ``top_p=1`` keeps every token; a tiny ``p`` keeps the likeliest
       (and its ties).

    ``None`` skips a step. Returns probabilities (each row sums to 1) in ``logits``'s
    floating dtype, on its device. Raises ``ValueError`` naming the argument for
    ``temperature < 0``, ``top_k < 1`` or ``top_p`` outside ``(0, 1]``.

    Hint: take the softmax of Chapter 2 (``active_parts().softmax``) or PyTorch's. A token
    that is removed can get the logit ``-inf`` before a softmax, or probability 0 before a
    renormalisation. ``torch.sort(..., descending=True)`` and ``cumsum`` give, for each
    token in sorted order, the mass of the tokens before it.
    """
    # BEGIN SOLUTION 8.1
    if temperature < 0:
        raise ValueError(f"temperature must be at least 0, got temperature={temperature!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got top_k={top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got top_p={top_p!r}")
    if temperature == 0:
        greedy = torch.zeros_like(logits)
        return greedy.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        # the mass of the tokens strictly more probable than each token
        sorted_probs, _ = probs.sort(dim=-1, descending=True)
        above = sorted_probs.cumsum(dim=-1) - sorted_probs  # [B, V], in sorted order
        # a token's mass above is the smallest "above" among the sorted positions that
        # hold its probability (its ties come after the more probable tokens only)
        first = torch.searchsorted(-sorted_probs, -probs, side="left")  # [B, V]
        keep = above.gather(-1, first) < top_p
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
    # END SOLUTION


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None
                ) -> Tensor:
    """Exercise 8.2: one token per row, ``logits [B, V] -> [B]`` (``torch.long``).

    Draws each row's token from :func:`next_token_distribution` (8.1) with the same
    ``temperature``, ``top_k`` and ``top_p``, using ``generator`` for every random
    number, so that the same seed gives the same tokens: ``torch.multinomial(probs, 1,
    generator=generator)`` does. With ``temperature=0`` it returns the argmax and draws
    nothing (the generator's state is left as it was). A token of probability 0 is never
    drawn. Errors are those of 8.1.

    Hint: call ``next_token_distribution`` of this file (it is 8.1).
    """
    # BEGIN SOLUTION 8.2
    if temperature == 0:  # one-hot on the argmax, the arguments checked: nothing to draw
        return next_token_distribution(logits, 0.0, top_k, top_p).argmax(dim=-1)
    probs = next_token_distribution(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    # END SOLUTION


def attention_step(attn: nn.Module, x: Tensor, cache: tuple[Tensor, Tensor] | None = None
                   ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Exercise 8.3: causal self-attention for one new position, with a key-value cache.

    ``attn`` is a Chapter 3 ``MultiHeadAttention`` (its ``q_proj``, ``k_proj``, ``v_proj``,
    ``out_proj``, ``num_heads``, ``attention`` and ``dropout``); ``x [B, 1, D]`` is the
    input of the new position ``t``; ``cache`` holds the keys and values of positions
    ``0..t-1``, each ``[B, H, t, d_k]`` (already projected and split into heads, 3.1), or
    ``None`` before the first position.

    Project the new position's query, key and value, split them into heads, append the
    key and the value to the cache along the positions' axis (dim 2, after the old ones),
    attend with ``attn.attention`` (2.2, with ``dropout=attn.dropout``) of the one query over
    all ``t + 1`` keys (no mask: they are all in its past or itself), merge the heads (3.2)
    and apply ``out_proj``.

    Returns ``(output [B, 1, D], (keys, values))`` with the new cache ``[B, H, t + 1, d_k]``:
    ``output`` equals the last row of ``attn(X, X, X, causal_mask)`` for the whole prefix
    ``X [B, t + 1, D]``, computed with one row instead of ``t + 1``. Raises ``ValueError``
    when ``x`` is not ``[B, 1, D]``.

    Hint: ``active_parts().split_heads`` and ``merge_heads`` are 3.1 and 3.2.
    """
    # BEGIN SOLUTION 8.3
    if x.dim() != 3 or x.size(1) != 1:
        raise ValueError(f"x must have shape [B, 1, D] (one new position), got shape "
                         f"{tuple(x.shape)}")
    parts = active_parts()
    q = parts.split_heads(attn.q_proj(x), attn.num_heads)  # [B, H, 1, d_k]
    k = parts.split_heads(attn.k_proj(x), attn.num_heads)
    v = parts.split_heads(attn.v_proj(x), attn.num_heads)
    if cache is not None:
        k = torch.cat([cache[0], k], dim=2)  # [B, H, t + 1, d_k]
        v = torch.cat([cache[1], v], dim=2)
    heads, _ = attn.attention(q, k, v, mask=None, dropout=attn.dropout)  # [B, H, 1, d_k]
    return attn.out_proj(parts.merge_heads(heads)), (k, v)
    # END SOLUTION


def language_model_loss(logits: Tensor, tokens: Tensor, pad_id: int) -> Tensor:
    """Exercise 8.4: the causal language model's loss, a scalar.

    ``logits [B, L, V]`` are the model's outputs for ``tokens [B, L]`` (run with the causal
    mask): the logits at position ``i`` predict token ``i + 1``. The loss is the mean, over
    every predicted token that is not ``pad_id``, of its cross-entropy:

        loss = - (1 / N) * sum over b, i < L - 1 with tokens[b, i + 1] != pad_id of
               log softmax(logits[b, i])[tokens[b, i + 1]]

    where ``N`` counts those tokens (every token of the batch weighs the same, whatever
    its row's length). The last position predicts nothing and the first token is never
    predicted. Raises ``ValueError`` when the shapes do not match (``[B, L, V]`` and
    ``[B, L]``) or ``L < 2``.

    Hint: shift, flatten to ``[N, V]`` and ``[N]``, and reuse Chapter 6's loss
    (``active_parts().LabelSmoothingLoss(0.0, ignore_index=pad_id)``).
    """
    # BEGIN SOLUTION 8.4
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [B, L, V] and tokens [B, L] with the same B and L; "
                         f"got {tuple(logits.shape)} and {tuple(tokens.shape)}")
    if tokens.size(1) < 2:
        raise ValueError(f"a sequence of {tokens.size(1)} token(s) predicts nothing: L must "
                         f"be at least 2")
    predicted = logits[:, :-1].reshape(-1, logits.size(-1))  # [B * (L-1), V]
    targets = tokens[:, 1:].reshape(-1)  # [B * (L-1)]
    return active_parts().LabelSmoothingLoss(0.0, ignore_index=pad_id)(predicted, targets)
    # END SOLUTION


class DecoderOnlyTransformer(nn.Module):
    """Exercise 8.5: the decoder-only Transformer, a language model over one vocabulary.

    Its modules, by these names (a checkpoint saves them so):

    - ``embed``: ``embeddings(vocab_size, d_model, max_len, dropout)``, Chapter 5's given
      helper (``active_parts().embeddings``);
    - ``decoder``: Chapter 5's :class:`Encoder` (5.6) of ``num_layers`` layers, with
      ``dropout`` and ``norm_first``: a decoder layer without cross-attention is an encoder
      layer, and the causal mask it is given makes it a decoder;
    - ``generator``: ``nn.Linear(d_model, vocab_size)``.

    Every parameter with more than one dimension is initialised with
    ``nn.init.xavier_uniform_``; then, with ``tie_embeddings``, the generator's weight *is*
    the embedding's (``embed.tokens.embedding.weight``), one ``nn.Parameter``.

    ``forward(tokens [B, L], mask) -> logits [B, L, V]``, ``mask`` Chapter 4's
    ``target_mask`` or ``causal_mask`` (``True`` = attention allowed), passed to every
    layer: without it each position would read the tokens it must predict. Logits, not
    probabilities (:func:`language_model_loss` takes logits). May not use ``nn.Transformer``
    or its parts.
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, d_ff: int,
                 num_layers: int, dropout: float = 0.0, norm_first: bool = False,
                 tie_embeddings: bool = True, max_len: int = 5000) -> None:
        super().__init__()
        parts = active_parts()  # Chapter 5's embeddings and Encoder, from the model's parts
        # BEGIN SOLUTION 8.5
        self.embed = parts.embeddings(vocab_size, d_model, max_len, dropout)
        self.decoder = parts.Encoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.generator = nn.Linear(d_model, vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        if tie_embeddings:
            self.generator.weight = self.embed.tokens.embedding.weight
        # END SOLUTION

    def forward(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """``tokens [B, L]``, ``mask`` -> logits ``[B, L, V]``."""
        # BEGIN SOLUTION 8.5
        return self.generator(self.decoder(self.embed(tokens), mask))
        # END SOLUTION
