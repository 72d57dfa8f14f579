"""annotated_transformer: the Transformer of "Attention Is All You Need", built chapter by chapter.

Parts come from the reference (``solutions``), the learner's work (``exercises``)
or a mix: see :mod:`annotated_transformer.parts`.
"""

from annotated_transformer.parts import Parts, active_parts, use_parts

__all__ = ["Parts", "active_parts", "use_parts"]
__version__ = "0.1.0"
