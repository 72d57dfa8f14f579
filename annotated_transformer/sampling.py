"""A decoder-only model's completion of prompts: greedy, or sampled with a temperature,
top-k and top-p. Used by :meth:`~annotated_transformer.model.DecoderOnlyTransformer.generate`;
it needs only the model's forward pass and its parts' ``causal_mask`` (Chapter 4) and
``sample_next`` (Chapter 8), which draws each sampled token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from annotated_transformer.data.task import pad_rows
from annotated_transformer.data.vocab import EOS, PAD


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def context_window(model: nn.Module) -> int | None:
    """The most positions ``model`` reads at once: its config's ``max_len`` (``None``: no
    limit known)."""
    return getattr(getattr(model, "config", None), "max_len", None)


def crop(tokens: Tensor, window: int | None) -> Tensor:
    """What a model of ``window`` positions reads of ``tokens [B, t]``: all of them while
    ``t <= window``, else the first (``BOS``) and the latest ``window - 1`` ``[B, window]``.
    BOS stays first, as in training, where every sequence starts with it."""
    if window is None or tokens.size(1) <= window:
        return tokens
    if window < 2:
        raise ValueError(f"a context window of {window} position(s) has no room for BOS and "
                         f"a token")
    return torch.cat([tokens[:, :1], tokens[:, tokens.size(1) - (window - 1):]], dim=1)


@torch.no_grad()
def complete(model: nn.Module, prompt: Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             cache: bool = True, top_p: float | None = None) -> Tensor:
    """Continue each prompt of ``prompt [B, Lp]`` (BOS first, padded on the right with PAD)
    until EOS or ``max_new_tokens``; returns the continuations ``[B, <= max_new_tokens]``,
    EOS included, PAD after it. At temperature 0 each token is the argmax (greedy
    decoding needs no chapter 8); otherwise it is drawn by ``model.parts.sample_next(logits,
    temperature, top_k, top_p, generator)``.

    - **Prefill.** The first ``s`` columns, where ``s`` is the shortest prompt's length,
      go through the model in one forward pass (with ``cache``, it fills the keys and
      values of every layer); then one token a step.
    - **Prompts of different lengths** decode together, padded on the right: after the
      prefill, a row still inside its prompt takes its prompt's next token, not the
      model's. Every token sits at its own position ``t`` in every row, as when the row is
      decoded alone, so each row's continuation is the one it gets alone (no per-row
      position offsets needed, at the price of feeding a longer prompt's tail one token a
      step).
    - **Positions while cached.** With ``cache``, each step computes only the new position
      (:class:`~annotated_transformer.incremental.DecoderCache`), and its positional
      encoding is that of its absolute position ``t``, not of 0; without, the whole
      prefix is re-run at every step with the causal mask.
    - **The context window.** A model reads at most :func:`context_window` positions
      (``W``, its ``max_len``). Past them it reads :func:`crop`'s window, BOS and the
      latest ``W - 1`` tokens. Cropping moves every kept token to another absolute
      position, so the cache's keys and values (computed at the old ones) are stale: the
      cache sees a prefix it has not seen and prefills the window again, every step past
      ``W`` (``O(W)`` positions a step, as without the cache). The result is what
      cropping by hand and running the model on each window gives.
    """
    from annotated_transformer.incremental import DecoderCache

    incremental = DecoderCache(model) if cache else None
    causal_mask = model.parts.causal_mask
    sample_next = model.parts.sample_next if temperature else None  # greedy: not needed
    window = context_window(model)
    lengths = (prompt != PAD).sum(dim=1)  # [B]
    batch, width = prompt.shape
    prefill = max(1, int(lengths.min()))  # the columns every row's prompt has
    ys = prompt[:, :prefill]
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
    for t in range(prefill, width + max_new_tokens):
        seen = crop(ys, window)  # [B, min(t, W)]
        mask = causal_mask(seen.size(1), device=seen.device)
        logits = (incremental.next_logits(seen, mask) if incremental  # [B, V]
                  else model(seen, mask)[:, -1])
        token = (logits.argmax(dim=-1) if temperature == 0 else
                 sample_next(logits.float(), temperature, top_k, top_p, generator))
        in_prompt = t < lengths
        forced = prompt[:, t] if t < width else torch.full_like(token, PAD)
        token = torch.where(in_prompt, forced, token)
        token = torch.where(finished, torch.full_like(token, PAD), token)
        finished |= ~in_prompt & (token == EOS)
        # a row also stops after max_new_tokens of its own
        finished |= ~in_prompt & (t + 1 - lengths >= max_new_tokens)
        ys = torch.cat([ys, token.unsqueeze(1).to(ys.dtype)], dim=1)
        if finished.all():
            break
    rows = [ys[b, lengths[b]:lengths[b] + max_new_tokens].tolist() for b in range(batch)]
    rows = [r[: r.index(EOS) + 1] if EOS in r else [t for t in r if t != PAD] for r in rows]
    return pad_rows([r or [PAD] for r in rows]).to(prompt.device)
