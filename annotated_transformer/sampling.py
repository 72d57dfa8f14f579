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


@torch.no_grad()
def complete(model: nn.Module, prompt: Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             cache: bool = True, top_p: float | None = None) -> Tensor:
    """Continue each prompt of ``prompt [B, Lp]`` (BOS first, padded on the right with PAD)
    until EOS or ``max_new_tokens``; returns the continuations ``[B, <= max_new_tokens]``,
    EOS included, PAD after it. At temperature 0 each token is the argmax (greedy
    decoding needs no chapter 8); otherwise it is drawn by ``model.parts.sample_next(logits,
    temperature, top_k, top_p, generator)``.

    Rows of different lengths decode together: while a row is still inside its prompt,
    its next token is the prompt's, not the model's. With ``cache``, each step computes
    only the new position (:class:`~annotated_transformer.incremental.DecoderCache`);
    without, the whole prefix is re-run at every step with the causal mask.
    """
    from annotated_transformer.incremental import DecoderCache

    incremental = DecoderCache(model) if cache else None
    causal_mask = model.parts.causal_mask
    sample_next = model.parts.sample_next if temperature else None  # greedy: not needed
    lengths = (prompt != PAD).sum(dim=1)  # [B]
    batch, width = prompt.shape
    ys = prompt[:, :1]
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
    for t in range(1, width + max_new_tokens):
        mask = causal_mask(ys.size(1), device=ys.device)
        logits = (incremental.next_logits(ys, mask) if incremental  # [B, V]
                  else model(ys, mask)[:, -1])
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
