"""What an exercise file may do, checked by reading it before any learner code is imported.

An exercise file computes with PyTorch and nothing else: it may import what ``rules``
allows (``torch``, ``numpy``, a few computing modules of Python's, and from the course only
``active_parts`` and ``Batch``); it may not reach files, processes, the interpreter's
internals or frames, build code from strings or name the op an exercise asks for. Each rule
is in ``rules``, with the reason the learner reads. Reading code, it stops the plain and the
cleverly spelled ways and names the line; the layers that watch the code run catch what it
cannot follow (PyTorch's dispatcher, ``allowed_ops``; the worker and its boundary).

The package, one job a module: ``rules`` (the rules as data), ``scopes`` (which scope a
name is evaluated in), the checker's parts (``base``: a violation, and what the checker
knows of a file; ``names``: imports, names and definitions; ``attributes``: attributes,
calls and keywords) and ``folders`` (the checker over source text, a file and a learner's
folder: :func:`check_source`, :func:`check_file`, :func:`check_folder`).
"""
from __future__ import annotations

from annotated_transformer.course.grading.source_rules.base import Violation
from annotated_transformer.course.grading.source_rules.folders import (
    check_file,
    check_folder,
    check_source,
)

__all__ = ["Violation", "check_file", "check_folder", "check_source"]
