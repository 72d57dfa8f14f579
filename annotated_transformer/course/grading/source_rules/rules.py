"""The rules, as data, each with its reason: what an exercise file may import and name."""
from __future__ import annotations

import builtins
import dataclasses
import functools
import itertools
import sys
from dataclasses import fields

from annotated_transformer.parts import Parts

# Modules an exercise may import whole (``import torch.nn.functional as F``) or take any
# public name from (``from torch import Tensor, nn``); each name taken is checked like an
# attribute of the module. These compute and nothing else; numpy is here because a correct
# answer (tests/variants/ch01.py, numpy_float64) and many honest learners use it.
#
# copy is here for ``copy.deepcopy(layer)``, the ``clones`` of The Annotated Transformer
# (tests/variants/ch05.py, ClonedEncoder). PyTorch hands the module out too
# (``torch.nn.modules.transformer.copy``), so what it offers is ruled by name, whatever
# path leads to it:
# - ``deepcopy(x)`` rebuilds what ``x`` holds through the ``__deepcopy__``,
#   ``__reduce_ex__`` and ``__setstate__`` of its classes: PyTorch's, numpy's or Python's
#   (a file may not define them: ALLOWED_DUNDER_METHODS). It reaches no object the file does
#   not hold already; a function or class is copied as itself (a stand-in's closure is not
#   entered), a copied stand-in shares its class and so is revoked with the original, and a
#   tensor is copied through PyTorch's calls, under the guard like any other.
# - ``deepcopy(x, memo)`` hands back, in ``memo``, every original it copied, each object's
#   ``__dict__`` among them (``vars`` by another name): one argument only (ONE_ARGUMENT_ONLY).
# - ``copy.dispatch_table`` (copyreg's) registers a reducer for a type, and ``copy`` then sets
#   the state it returns with ``setattr``, any name (a class's ``__torch_function__``):
#   refused by name (BANNED_ATTRIBUTES), as ``_reconstruct``, which does the same, is a
#   private name (library_private_names, through any ``self``).
# - ``copy.copy`` is a shallow copy and keeps no memo; ``copy.replace`` (Python 3.13) calls
#   ``__replace__``, which only library types define, each with a public ``replace`` already;
#   ``copy.types`` and ``copy.weakref`` are standard modules, refused as attributes.
IMPORTABLE = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "numpy", "math", "typing", "collections.abc",
    "dataclasses", "functools", "itertools", "numbers", "copy",
})
# Modules only some names may come from. The course package is how a chapter uses an
# earlier chapter's part; any other name of it (Parts, load_chapter, ...) loads a chapter
# from a source of the learner's choosing, the reference included.
FROM_ONLY = {
    "__future__": frozenset({"annotations"}),
    "annotated_transformer.parts": frozenset({"active_parts"}),
    "annotated_transformer.batch": frozenset({"Batch"}),
}
ALLOWED_IMPORTS = ("torch, numpy, math, typing, collections.abc, dataclasses, functools, "
                   "itertools, numbers, copy, active_parts, Batch")
MAX_MESSAGE = 200  # characters: one line a learner reads in a report

# Built-in names an exercise may not use, with why (each one a way around every other rule).
BANNED_BUILTINS = {
    "eval": "runs code from a string; write the code itself",
    "exec": "runs code from a string; write the code itself",
    "compile": "builds code from a string; write the code itself",
    "open": "reads and writes files; an exercise computes with tensors only",
    "getattr": "looks an attribute up by a computed name; write the attribute (x.name)",
    "setattr": "sets an attribute by a computed name; write `self.name = value`",
    "delattr": "deletes an attribute by a computed name; write `del self.name`",
    "globals": "reaches the module's namespace; use the names themselves",
    "locals": "reaches a frame's namespace; use the names themselves",
    "vars": "reaches an object's namespace; use its attributes (x.name)",
    "dir": "lists an object's hidden names; use its attributes (x.name)",
    "memoryview": "reaches raw memory; use tensors",
    "type": "builds classes and reaches internals; use isinstance(x, SomeClass)",
}

# Attribute names (also ``from m import name``) that reach past computing with tensors.
# One line per reason; the reason is what the learner reads.
_BANNED_GROUPS = {
    "reads or writes files": (
        "load save from_file fromfile tofile savez savez_compressed savetxt loadtxt genfromtxt "
        "fromregex memmap open_memmap DataSource dump dumps serialization hub package onnx "
        "profiler gds dill"),
    "starts processes or threads, or loads native code": (
        "multiprocessing distributed parallel DataParallel cpp_extension utils library classes "
        "ctypeslib ctypes f2py distutils testing jiterator share_memory share_memory_ lib "
        "mp python_multiprocessing reducer reduction tunable typing_extensions"),
    "reaches PyTorch's compiler or operator dispatch": (
        "ops jit compile compiler fx export overrides register_dispatch_key backends ao "
        "quantization handle_torch_function has_torch_function has_torch_function_unary "
        "has_torch_function_variadic as_subclass"),
    "changes or reads the global random number generator": (
        "manual_seed manual_seed_all seed seed_all set_rng_state set_rng_state_all "
        "get_rng_state get_rng_state_all initial_seed fork_rng default_generator get_state "
        "set_state"),
    "builds code or looks names up from strings": (
        "get_type_hints ForwardRef make_dataclass attrgetter methodcaller stdlib_re "
        "sympy sympify mpmath jinja2 networkx"),
    "reaches the interpreter's frames": (
        "gi_frame gi_code gi_yieldfrom gi_running gi_suspended cr_frame cr_code cr_await "
        "cr_origin ag_frame ag_code ag_await f_back f_globals f_locals f_builtins f_code "
        "f_trace f_lasti tb_frame tb_next tb_lasti co_code co_consts co_names"),
    "loads chapters from a source other than the grader's": "reference learner with_chapter",
    # update_wrapper(f, g, updated=("__globals__",)) merges g's module namespace into f's.
    "copies attributes by name from one object to another (a module's namespace among them)": (
        "update_wrapper WRAPPER_ASSIGNMENTS WRAPPER_UPDATES"),
    "sets attributes by computed names when objects are copied or pickled": "dispatch_table",
}
# Functions an exercise may call with one plain argument only, in a call where it names them,
# and import by their own names: how to write the call, and why their other arguments are refused.
ONE_ARGUMENT_ONLY = {
    "wraps": ("`@functools.wraps(function)`",
              "its other arguments copy attributes by name, a module's namespace among them"),
    "deepcopy": ("`copy.deepcopy(module)`",
                 "its memo argument hands back the originals it copied, their namespaces among "
                 "them"),
}
BANNED_ATTRIBUTES = {name: reason for reason, names in _BANNED_GROUPS.items()
                     for name in names.split()}
# Banned names that are honest tensor utilities under one parent: ``nn.utils`` (padding,
# gradient clipping, parametrizations) is not ``torch.utils`` (data loaders, native code).
UTILITIES_UNDER = {"utils": frozenset({"torch.nn"})}
# PyTorch, numpy, typing and dataclasses hand out standard modules as attributes
# (``torch.os``, ``torch.sys``, ``dataclasses.builtins``): any standard module's name is
# refused as an attribute, except these, which are also tensor or array operations or harmless.
STDLIB_EXEMPT = frozenset({"abc", "array", "chunk", "cmath", "copy", "math", "numbers",
                           "select", "token", "trace"})
STDLIB_MODULES = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))

# What ``active_parts()`` is besides the parts: ways to other sources (the reference).
PARTS_OWN = (frozenset(n for n in dir(Parts) if not n.startswith("_"))
             | {f.name for f in fields(Parts)})

# The special methods a learner's class may define: construction, printing, containers,
# calling, context managers, comparisons and arithmetic. Any other one is a hook that Python,
# PyTorch or numpy run behind the learner's back (``__array_interface__`` hands numpy a raw
# memory address, ``__torch_function__`` intercepts every call), so the list is of what is
# allowed, not of what is not.
_ARITHMETIC = ("add sub mul matmul truediv floordiv mod pow lshift rshift and xor or").split()
ALLOWED_DUNDER_METHODS = frozenset(
    "__init__ __post_init__ __repr__ __str__ __len__ __iter__ __next__ __reversed__ "
    "__contains__ __getitem__ __setitem__ __delitem__ __call__ __enter__ __exit__ __eq__ "
    "__ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __neg__ __pos__ __abs__ "
    "__invert__".split()
    + [f"__{prefix}{op}__" for op in _ARITHMETIC for prefix in ("", "r", "i")])
# Why some of the others are refused, for the message (any other one: "a hook").
BANNED_DUNDER_METHODS = {
    "__torch_function__": "intercepts every PyTorch call",
    "__torch_dispatch__": "intercepts every PyTorch call",
    "__array__": "runs inside numpy and PyTorch conversions",
    "__array_function__": "intercepts numpy calls", "__array_ufunc__": "intercepts numpy calls",
    "__getattr__": "answers attribute lookups by computed names",
    "__getattribute__": "answers attribute lookups by computed names",
    "__setattr__": "changes attributes by computed names",
    "__delattr__": "deletes attributes by computed names", "__dir__": "hides names",
    "__new__": "builds objects behind the constructor",
    "__init_subclass__": "runs when classes are built",
    "__set_name__": "runs when classes are built",
    "__class_getitem__": "runs when classes are subscripted",
    "__mro_entries__": "changes how classes are built",
    "__prepare__": "changes how classes are built",
}
SELF_NAMES = frozenset({"self", "cls"})


@functools.cache
def library_private_names() -> frozenset[str]:
    """The ``_names`` of PyTorch's, numpy's and the importable modules' internals (``_C``,
    ``_ops``, ``_pop_torch_dispatch_stack``) and of tensors and modules: never a learner's
    own attribute, whatever object it is read from."""
    import copy
    import math
    import typing

    import numpy
    import torch
    import torch.nn.functional

    owners = (torch, torch._C, torch.nn, torch.nn.functional, numpy, math, typing, functools,
              itertools, dataclasses, copy, torch.Tensor, torch.nn.Module)
    return frozenset(n for owner in owners for n in dir(owner)
                     if n.startswith("_") and not is_dunder(n))
# The names Python provides in every module; any other name a file uses, it must bind itself
# (a name from nowhere was put in the module's namespace by code the rules cannot see).
BUILTIN_NAMES = frozenset(dir(builtins))
# Thirty times the largest solution file: more is not an exercise, and reading it (about
# 10 microseconds a byte) must not make the grader wait.
MAX_SOURCE_BYTES = 250_000
MAX_VIOLATIONS = 50  # per file: the first ones say what to fix; a report stays short


def is_dunder(name: str) -> bool:
    """``__name__``-style: two underscores on both sides."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def attribute_problem(name: str, parent: str | None = None) -> str | None:
    """Why an attribute (or imported) name is refused, or None, whatever object it is read
    from (a learner's ``self`` too: any object may be passed as ``self``). ``parent``: the
    module it is taken from, when known for sure (``torch.nn`` for ``torch.nn.utils``)."""
    if parent is not None and parent in UTILITIES_UNDER.get(name, ()):
        return None
    reason = BANNED_ATTRIBUTES.get(name)
    if reason:
        return f"it {reason}; compute with tensors only"
    if name in STDLIB_MODULES and name not in STDLIB_EXEMPT:
        return (f"`{name}` is a module of Python's standard library, which PyTorch's modules "
                f"hand out as attributes; if it is your own attribute, rename it")
    return None


def module_problem(module: str) -> str | None:
    """Why a module may not be imported, or None. A submodule of torch or numpy
    (``torch.nn.init``) may be, when each part of its name passes the attribute rules,
    since ``import torch.nn.init`` reaches what ``torch.nn.init`` does."""
    if module in IMPORTABLE:
        return None
    root, *parts = module.split(".")
    if root not in ("torch", "numpy") or not parts:
        return f"import only {ALLOWED_IMPORTS}"
    for at, part in enumerate(parts):
        before = ".".join([root, *parts[:at]])
        if part.startswith("_"):
            return f"`{part}` is internal (its name starts with `_`); import only {ALLOWED_IMPORTS}"
        problem = attribute_problem(part, parent=before)
        if problem:
            return f"`{part}`: {problem}"
    return None
