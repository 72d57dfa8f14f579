"""The reference implementation of every graded exercise, one module a chapter.

This package is the single source: ``exercises/`` is generated from it by
``python -m annotated_transformer stubs``.
"""
