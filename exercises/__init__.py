"""Your implementations of the graded exercises, one module a chapter.

Each file starts as a stub generated from ``solutions/``: replace every
``raise NotImplementedError(...)`` with your code, then grade your work with
``python -m annotated_transformer grade``.
"""
