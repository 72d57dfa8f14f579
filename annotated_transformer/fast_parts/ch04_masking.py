"""Chapter 4, fast: the reference (a mask is one comparison and one triangle)."""

from __future__ import annotations

from annotated_transformer.parts import load_chapter

_reference = load_chapter("solutions", 4)

padding_mask = _reference.padding_mask
causal_mask = _reference.causal_mask
target_mask = _reference.target_mask

__all__ = ["padding_mask", "causal_mask", "target_mask"]
