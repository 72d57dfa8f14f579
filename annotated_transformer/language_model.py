"""Chapter 8's capstone: a decoder-only model, built from parts, learns a small language.

The language: arithmetic progressions of digits modulo 10, ``BOS a, a+d, a+2d, ... EOS``
(``LENGTH`` terms, every start ``a`` and step ``d``). A model that has learnt it continues
a prompt of two terms, ``BOS a a+d``, with the rest of its progression: it must read the
step from the two terms and carry it on. Training scores every token of every sequence
with the parts' ``language_model_loss`` (Chapter 8); the model is Chapter 5's layers
(:class:`~annotated_transformer.model.DecoderOnlyTransformer`), and writing goes through
:func:`~annotated_transformer.sampling.complete`, which draws with the parts'
``sample_next``. Nothing here imports a chapter: every part is reached by its name.
"""

from __future__ import annotations

import torch
from torch import Tensor

from annotated_transformer.data.vocab import BOS, EOS, PAD
from annotated_transformer.model import DecoderOnlyTransformer, TransformerConfig
from annotated_transformer.parts import Parts, active_parts

LENGTH = 8  # terms per progression
DIGIT = 3  # the id of the digit 0 (PAD, BOS and EOS come first)
VOCAB_SIZE = DIGIT + 10
# 20 (start, step) pairs never trained on with ``hold_out=True``: rows of progressions(),
# drawn once with a fixed seed, so that a score on them is of the language, not of memory.
HELD_OUT = tuple(sorted(torch.randperm(100, generator=torch.Generator().manual_seed(8))[:20]
                        .tolist()))
SEEN = tuple(row for row in range(100) if row not in HELD_OUT)


def progressions() -> Tensor:
    """Every progression, ``[100, LENGTH + 2]`` (``BOS``, the terms, ``EOS``): row
    ``10 * a + d`` starts at ``a`` with step ``d``."""
    start, step = torch.arange(10).repeat_interleave(10), torch.arange(10).repeat(10)
    terms = (start[:, None] + step[:, None] * torch.arange(LENGTH)) % 10 + DIGIT
    return torch.cat([torch.full((100, 1), BOS), terms, torch.full((100, 1), EOS)], dim=1)


def as_text(tokens: Tensor) -> str:
    """Digits as text: ``BOS 3 5 ... EOS`` -> ``"35..."`` (the special tokens left out)."""
    return "".join(str(t - DIGIT) for t in tokens.tolist() if t >= DIGIT)


def train_language_model(parts: Parts | None = None, steps: int = 300, batch_size: int = 32,
                         seed: int = 0, log=None, hold_out: bool = False
                         ) -> tuple[DecoderOnlyTransformer, list[float]]:
    """A small decoder-only model from ``parts`` (the active ones by default), trained
    ``steps`` steps with Adam on batches of progressions (with ``hold_out``, never those of
    :data:`HELD_OUT`); returns it in eval mode and the loss of every step. About ten
    seconds on one CPU core."""
    parts = parts or active_parts()
    torch.manual_seed(seed)
    config = TransformerConfig.small(VOCAB_SIZE, d_model=64, max_len=LENGTH + 2)
    model = DecoderOnlyTransformer(config, parts=parts)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    data, losses = progressions(), []
    if hold_out:
        data = data[list(SEEN)]
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        tokens = data[torch.randint(len(data), (batch_size,), generator=generator)]
        logits = model(tokens, parts.target_mask(tokens, PAD))
        loss = parts.language_model_loss(logits, tokens, PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if log is not None and (step + 1) % 100 == 0:
            log(f"step {step + 1}: loss {loss.item():.4f}")
    return model.eval(), losses


def continue_progressions(model: DecoderOnlyTransformer, temperature: float = 0.0,
                          generator: torch.Generator | None = None) -> list[str]:
    """Every progression's first two terms continued by ``model`` (up to ``LENGTH - 2``
    more terms and EOS): 100 strings of digits, right when each equals its progression."""
    prompts = progressions()[:, :3]
    out = model.generate(prompts, LENGTH - 1, temperature=temperature, generator=generator)
    return [as_text(p) + as_text(o) for p, o in zip(prompts, out, strict=True)]


def exact_match(model: DecoderOnlyTransformer, rows: tuple[int, ...] | None = None) -> float:
    """The share of progressions (those of ``rows``, else all 100) that ``model`` continues
    exactly (greedily)."""
    rows = tuple(range(100)) if rows is None else rows
    right = [as_text(row) for row in progressions()]
    written = continue_progressions(model)
    return sum(written[r] == right[r] for r in rows) / len(rows)
