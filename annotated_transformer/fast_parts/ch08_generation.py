"""Chapter 8, fast: the reference's sampling, cache step and loss (the model's forward pass
is where generating and training spend their time)."""

from __future__ import annotations

from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 8)

next_token_distribution = _reference.next_token_distribution
sample_next = _reference.sample_next
attention_step = _reference.attention_step
language_model_loss = _reference.language_model_loss

__all__ = ["next_token_distribution", "sample_next", "attention_step", "language_model_loss",
           "DecoderOnlyTransformer"]


class DecoderOnlyTransformer(_reference.DecoderOnlyTransformer):
    """Exercise 8.5: the reference's model, of the fast stack under ``Parts("fast")``."""

