"""What an exercise file may do, checked by reading it before any learner code is imported.

An exercise file computes with PyTorch and nothing else (:data:`SUMMARY` says it to the
learner). It may import ``torch`` (``torch.nn``, ``torch.nn.functional``, ``Tensor`` and any
public submodule whose name passes the attribute rules), ``numpy``, ``math``, ``typing``,
``collections.abc``, ``dataclasses``, ``functools``, ``itertools``, ``numbers`` and
``__future__``, and from the course only ``active_parts`` (``annotated_transformer.parts``)
and ``Batch`` (``annotated_transformer.batch``). It may not reach files, processes, threads,
the interpreter's internals or frames, build code or import modules at run time, touch the
global random number generator, change process-wide settings or patch what it imported; the
op an exercise asks for may not be named anywhere in the file. Every ``.py`` file of the
learner's folder is read, because any of them can be imported by the others, and anything
Python could import in place of a checked source (bytecode, extension modules, links) is
refused.

The rules, each with its reason beside it below: the import allow-list; banned built-ins
(:data:`BANNED_BUILTINS`); double-underscore names and attributes, and private attributes
of anything but ``self``/``cls``; banned attribute names (:data:`BANNED_ATTRIBUTES`, and the
standard library's module names that PyTorch re-exports, ``torch.os``); special methods by an
allow-list (:data:`ALLOWED_DUNDER_METHODS`); no metaclass and no Tensor subclass; ``super``
only as ``super().method``; ``str.format`` only on a literal without attribute fields; no
assignment or ``del`` on an imported module or class or a name that hands one on, nor
on an object reached through an attribute of a library object (``w.keywords[...]``, also
changed in place by ``update``, ``append``...); no
``functools.update_wrapper`` and ``functools.wraps`` with its one argument only (their
other arguments copy attributes named by strings, a module's namespace among them); every
name the file uses is a built-in or bound in the file (a name from nowhere was put in the
namespace by code the rules cannot see); and the exercise's forbidden names (attributes,
imported names and keywords) anywhere in the file.

This is the third layer of the grader's defences (issue 17). It reads code and runs nothing,
so it stops the plain and the cleverly spelled ways; it cannot follow values through
function arguments (``def patch(c): c.softmax = f`` called with ``torch.Tensor``) or know
every PyTorch function that computes a forbidden op under another name
(``torch.distributions.Categorical(logits=x).probs``), which the layers that watch the code
run (PyTorch's dispatch, a separate worker process) catch.

``check_file`` and ``check_folder`` return :class:`Violation` records; ``read_source`` decodes
a file as Python would and refuses any encoding other than UTF-8.

The package, one job a module: ``rules`` (the rules as data, each with its reason),
``reading`` (decoding a file as Python would), ``scopes``, ``expressions``, the checker
(``base``, ``names``, ``attributes``, ``definitions``, ``checker``), ``violations`` (the
record of a broken rule and its message) and ``folders`` (source text, files and folders).
"""
from __future__ import annotations

from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES

from annotated_transformer.course.grading.source_rules.folders import (
    check_file,
    check_folder,
    check_source,
)
from annotated_transformer.course.grading.source_rules.reading import read_source
from annotated_transformer.course.grading.source_rules.rules import (
    ALLOWED_DUNDER_METHODS,
    ALLOWED_IMPORTS,
    BANNED_ATTRIBUTES,
    BANNED_BASES,
    BANNED_BUILTINS,
    BANNED_DUNDER_METHODS,
    BANNED_PREFIXES,
    FROM_ONLY,
    IMPORTABLE,
    MAX_MESSAGE,
    MAX_SOURCE_BYTES,
    MAX_VIOLATIONS,
    PARTS_OWN,
    SELF_NAMES,
    STDLIB_EXEMPT,
    STDLIB_MODULES,
    SUMMARY,
)
from annotated_transformer.course.grading.source_rules.violations import SourceRejected, Violation

__all__ = [
    "ALLOWED_DUNDER_METHODS", "ALLOWED_IMPORTS", "BANNED_ATTRIBUTES", "BANNED_BASES",
    "BANNED_BUILTINS", "BANNED_DUNDER_METHODS", "BANNED_PREFIXES", "BYTECODE_SUFFIXES",
    "EXTENSION_SUFFIXES", "FROM_ONLY", "IMPORTABLE", "MAX_MESSAGE", "MAX_SOURCE_BYTES",
    "MAX_VIOLATIONS", "PARTS_OWN", "SELF_NAMES", "STDLIB_EXEMPT", "STDLIB_MODULES", "SUMMARY",
    "SourceRejected", "Violation", "check_file", "check_folder", "check_source", "read_source",
]
