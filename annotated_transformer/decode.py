"""Decoding: from a trained model to text.

- Encoder-decoder models decode with Chapter 6's ``greedy_decode`` or Chapter 7's
  ``beam_search``, taken from the model's parts (the reference or the learner's).
- Decoder-only models *complete* a prompt: greedily, or by sampling with a temperature
  and top-k.

Every function works on the model's device and never assumes one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from annotated_transformer.data.task import Task, pad_rows
from annotated_transformer.data.vocab import BOS, EOS, PAD


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def pick_token(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None) -> Tensor:
    """The next token per row from ``logits [B, V]``: the argmax when ``temperature`` is 0,
    otherwise a sample from ``softmax(logits / temperature)`` over the ``top_k`` likeliest."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


@torch.no_grad()
def complete(model: nn.Module, prompt: Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Continue each prompt of ``prompt [B, Lp]`` (BOS first, padded on the right with PAD)
    until EOS or ``max_new_tokens``; returns the continuations ``[B, <= max_new_tokens]``,
    EOS included, PAD after it.

    Rows of different lengths decode together: while a row is still inside its prompt,
    its next token is the prompt's, not the model's. The whole prefix is re-run at every
    step with the causal mask (no cache; the sequences here are short).
    """
    causal_mask = model.parts.causal_mask
    lengths = (prompt != PAD).sum(dim=1)  # [B]
    batch, width = prompt.shape
    ys = prompt[:, :1]
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
    for t in range(1, width + max_new_tokens):
        logits = model(ys, causal_mask(ys.size(1), device=ys.device))[:, -1]  # [B, V]
        token = pick_token(logits, temperature, top_k, generator)
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


@torch.no_grad()
def decode_batch(model: nn.Module, task: Task, src: Tensor, beam_size: int | None = None,
                 max_len: int | None = None) -> Tensor:
    """The model's outputs for a batch of sources ``src [B, Ls]`` (on the model's device):
    encoder-decoder ``[B, <= max_len]`` starting with BOS (greedy, or beam search when
    ``beam_size`` is given), decoder-only the continuations (greedy)."""
    model.eval()
    parts = model.parts
    if task.decoder_only:
        if beam_size is not None:
            raise ValueError("beam search is for encoder-decoder models; this checkpoint is "
                             "decoder-only (use --temperature/--top-k to sample)")
        return complete(model, src, max_len or task.max_target_len)
    max_len = max_len or task.max_target_len
    src_mask = parts.padding_mask(src, PAD)
    if beam_size is None:
        return parts.greedy_decode(model, src, src_mask, max_len, BOS, EOS, PAD)
    return parts.beam_search(model, src, src_mask, max_len, BOS, EOS, PAD,
                             beam_size=beam_size)


def translate(model: nn.Module, task: Task, texts: list[str], beam_size: int | None = None,
              temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
              batch_size: int = 256) -> list[str]:
    """Decode ``texts`` (unknown characters raise ``VocabularyError``) to output texts."""
    device = model_device(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    outputs: list[str] = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start:start + batch_size]
        src = pad_rows([task.source_ids(t) for t in chunk]).to(device)
        if task.decoder_only and temperature > 0:
            model.eval()
            ids = complete(model, src, task.max_target_len, temperature, top_k, generator)
        else:
            ids = decode_batch(model, task, src, beam_size)
        outputs.extend(task.vocab.decode(row) for row in ids.tolist())
    return outputs
