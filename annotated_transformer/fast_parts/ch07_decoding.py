"""Chapter 7, fast: the reference beam search (it runs the model, which is where the time goes)."""

from __future__ import annotations

from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 7)

beam_search = _reference.beam_search

__all__ = ["beam_search"]
