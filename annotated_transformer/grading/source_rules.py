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
assignment or ``del`` on an imported module or class or a name that hands one on; and the
exercise's forbidden names (attributes, imported names and keywords) anywhere in the file.

This is the third layer of the grader's defences (issue 17). It reads code and runs nothing,
so it stops the plain and the cleverly spelled ways; it cannot follow values through
function arguments (``def patch(c): c.softmax = f`` called with ``torch.Tensor``) or know
every PyTorch function that computes a forbidden op under another name
(``torch.distributions.Categorical(logits=x).probs``), which the layers that watch the code
run (PyTorch's dispatch, a separate worker process) catch.

``check_file`` and ``check_folder`` return :class:`Violation` records; ``read_source`` decodes
a file as Python would and refuses any encoding other than UTF-8.
"""
from __future__ import annotations

import ast
import codecs
import io
import os
import re
import stat
import string
import sys
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES
from pathlib import Path

from annotated_transformer.grading.layout import CHAPTER_FILE
from annotated_transformer.parts import Parts


@dataclass(frozen=True)
class Violation:
    """One thing a learner's file may not do, at one line."""

    path: str  # the file's path as given (check_file) or from the folder's name (check_folder)
    line: int
    exercise: str | None  # "2.1" for a forbidden name of that exercise, else None
    message: str  # one line: what is not allowed and what to do instead


class SourceRejected(ValueError):
    """The file cannot be read as Python source the way the grader reads it."""


# ------------------------------------------------------------------ the rules, as data

# Modules an exercise may import whole (``import torch.nn.functional as F``) or take any
# public name from (``from torch import Tensor, nn``); each name taken is checked like an
# attribute of the module. These compute and nothing else; numpy is here because a correct
# answer (tests/variants/ch01.py, numpy_float64) and many honest learners use it.
IMPORTABLE = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "numpy", "math", "typing", "collections.abc",
    "dataclasses", "functools", "itertools", "numbers",
})
# Modules only some names may come from. The course package is how a chapter uses an
# earlier chapter's part; any other name of it (Parts, load_chapter, ...) loads a chapter
# from a source of the learner's choosing, the reference included.
FROM_ONLY = {
    "__future__": frozenset({"annotations"}),
    "annotated_transformer.parts": frozenset({"active_parts"}),
    "annotated_transformer.batch": frozenset({"Batch"}),
}
# What the learner reads (the instructor page and the grader's report can print it).
SUMMARY = (
    "An exercise file computes with PyTorch and nothing else. It may import torch (with "
    "torch.nn, torch.nn.functional and their public submodules), numpy, math, typing, "
    "collections.abc, dataclasses, functools, itertools, numbers, and from the course only "
    "active_parts and Batch. It may not read or write files, start processes or threads, "
    "reach the interpreter's internals or frames (names with double underscores, names of "
    "others starting with _), run code from strings, import modules at run time, touch the "
    "global random number generator or change what it imported. Every .py file in the "
    "folder is checked, and the op an exercise asks you to write may not be used anywhere "
    "in the file.")
ALLOWED_IMPORTS = ("torch, numpy, math, typing, collections.abc, dataclasses, functools, "
                   "itertools, numbers, active_parts, Batch")
MAX_MESSAGE = 200  # characters: one line a learner reads in a report

# Built-in names an exercise may not use, with why (each one a way around every other rule).
BANNED_BUILTINS = {
    "eval": "runs code from a string; write the code itself",
    "exec": "runs code from a string; write the code itself",
    "compile": "builds code from a string; write the code itself",
    "open": "reads and writes files; an exercise computes with tensors only",
    "input": "reads the terminal; take values as arguments",
    "breakpoint": "starts a debugger; remove it before grading",
    "help": "starts the interactive help; remove it before grading",
    "getattr": "looks an attribute up by a computed name; write the attribute (x.name)",
    "setattr": "sets an attribute by a computed name; write `self.name = value`",
    "delattr": "deletes an attribute by a computed name; write `del self.name`",
    "globals": "reaches the module's namespace; use the names themselves",
    "locals": "reaches a frame's namespace; use the names themselves",
    "vars": "reaches an object's namespace; use its attributes (x.name)",
    "dir": "lists an object's hidden names; use its attributes (x.name)",
    "memoryview": "reaches raw memory; use tensors",
    "type": "builds classes and reaches internals; use isinstance(x, SomeClass)",
    "exit": "stops the grader; raise ValueError instead",
    "quit": "stops the grader; raise ValueError instead",
    "copyright": "is the interactive help; remove it", "credits": "is the interactive help; "
    "remove it", "license": "is the interactive help; remove it",
    # These pass through the test framework's handlers and stop the whole run.
    "SystemExit": "stops the grader; raise ValueError instead",
    "KeyboardInterrupt": "stops the grader; raise ValueError instead",
    "GeneratorExit": "stops the grader; raise ValueError instead",
    "BaseException": "stops the grader; use Exception",
}

# Attribute names (also ``from m import name``) that reach past computing with tensors.
# One line per reason; the reason is what the learner reads.
_BANNED_GROUPS = {
    "reads or writes files": (
        "load save from_file fromfile tofile savez savez_compressed savetxt loadtxt genfromtxt "
        "fromregex memmap open_memmap DataSource dump dumps serialization hub package onnx "
        "profiler gds"),
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
    "changes a setting of the whole process": (
        "set_default_dtype set_default_device set_default_tensor_type "
        "use_deterministic_algorithms set_deterministic_debug_mode set_num_threads "
        "set_num_interop_threads set_flush_denormal set_float32_matmul_precision "
        "set_warn_always seterr seterrcall setbufsize monitor"),
    "installs a hook on every module or tensor": "graph register_multi_grad_hook",
    "changes what isinstance answers for classes that are not yours": "register",
    "builds code or looks names up from strings": (
        "get_type_hints ForwardRef make_dataclass attrgetter methodcaller stdlib_re"),
    "reaches the interpreter's frames": (
        "gi_frame gi_code gi_yieldfrom gi_running gi_suspended cr_frame cr_code cr_await "
        "cr_origin ag_frame ag_code ag_await f_back f_globals f_locals f_builtins f_code "
        "f_trace f_lasti tb_frame tb_next tb_lasti co_code co_consts co_names"),
    "loads chapters from a source other than the grader's": "reference learner with_chapter",
}
BANNED_ATTRIBUTES = {name: reason for reason, names in _BANNED_GROUPS.items()
                     for name in names.split()}
# Global module hooks (register_module_forward_hook, ...) act on every module, the grader's too.
BANNED_PREFIXES = {"register_module_": "installs a hook on every module or tensor"}
# PyTorch, numpy, typing and dataclasses hand out standard modules as attributes
# (``torch.os``, ``torch.sys``, ``dataclasses.builtins``): any standard module's name is
# refused as an attribute, except these, which are also tensor or array operations or harmless.
STDLIB_EXEMPT = frozenset({"abc", "array", "chunk", "cmath", "copy", "math", "numbers",
                           "select", "trace"})
STDLIB_MODULES = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))

# What ``active_parts()`` is besides the parts: ways to other sources (the reference).
PARTS_OWN = (frozenset(n for n in dir(Parts) if not n.startswith("_"))
             | {f.name for f in fields(Parts)})

# The special methods a learner's class may define: construction, printing, containers,
# calling, context managers, comparisons and arithmetic. Any other one is a hook that Python,
# PyTorch or numpy run behind the learner's back (``__array_interface__`` hands numpy a raw
# memory address, ``__torch_function__`` intercepts every call, ``__del__`` runs after the
# verdict), so the list is of what is allowed, not of what is not.
_ARITHMETIC = ("add sub mul matmul truediv floordiv mod pow lshift rshift and xor or").split()
ALLOWED_DUNDER_METHODS = frozenset(
    "__init__ __post_init__ __repr__ __str__ __len__ __iter__ __next__ __reversed__ "
    "__contains__ __getitem__ __setitem__ __delitem__ __call__ __enter__ __exit__ __eq__ "
    "__ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __neg__ __pos__ __abs__ "
    "__invert__".split()
    + [f"__{prefix}{op}__" for op in _ARITHMETIC for prefix in ("", "r", "i")])
# Why some of the others are refused, for the message (any other one: "a hook").
BANNED_DUNDER_METHODS = {
    "__del__": "runs when the grader frees the object, after the verdict",
    "__torch_function__": "intercepts every PyTorch call",
    "__torch_dispatch__": "intercepts every PyTorch call",
    "__array__": "runs inside numpy and PyTorch conversions",
    "__array_function__": "intercepts numpy calls", "__array_ufunc__": "intercepts numpy calls",
    "__reduce__": "runs when a result is copied between processes",
    "__reduce_ex__": "runs when a result is copied between processes",
    "__getstate__": "runs when a result is copied between processes",
    "__setstate__": "runs when a result is copied between processes",
    "__getnewargs__": "runs when a result is copied between processes",
    "__getnewargs_ex__": "runs when a result is copied between processes",
    "__copy__": "runs when the grader copies a result",
    "__deepcopy__": "runs when the grader copies a result",
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
    "__instancecheck__": "changes what isinstance answers",
    "__subclasscheck__": "changes what issubclass answers",
    "__subclasshook__": "changes what issubclass answers",
    "__class__": "changes what isinstance answers",
}
# Classes a learner's class may not derive from (by the end of the name: MaskedTensor too): a
# Tensor subclass overrides comparisons and intercepts every PyTorch call made with it.
BANNED_BASES = ("Tensor", "Parameter", "Buffer")

SELF_NAMES = frozenset({"self", "cls"})
# Thirty times the largest solution file: more is not an exercise, and reading it (about
# 10 microseconds a byte) must not make the grader wait.
MAX_SOURCE_BYTES = 250_000
MAX_VIOLATIONS = 50  # per file: the first ones say what to fix; a report stays short
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (ast.Module, ast.ClassDef, *_FUNCTIONS, *_COMPREHENSIONS)
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _is_dunder(name: str) -> bool:
    """``__name__``-style: two underscores on both sides."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _clip(text: str, width: int = 40) -> str:
    """The text, cut to ``width`` characters with a visible marker."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _snippet(node: ast.AST, width: int = 40) -> str:
    """The node's code, shortened for a one-line message."""
    try:
        text = " ".join(ast.unparse(node).split())
    except (RecursionError, ValueError):
        text = type(node).__name__
    return _clip(text, width)


def _attribute_problem(name: str, own: bool = False) -> str | None:
    """Why an attribute (or imported) name is refused, or None. ``own``: an attribute of the
    learner's ``self``, which may share a name with a standard module."""
    reason = BANNED_ATTRIBUTES.get(name) or next(
        (r for prefix, r in BANNED_PREFIXES.items() if name.startswith(prefix)), None)
    if reason:
        return f"it {reason}; compute with tensors only"
    if name in STDLIB_MODULES and name not in STDLIB_EXEMPT and not own:
        return (f"`{name}` is a module of Python's standard library; if it is your own "
                f"attribute, rename it")
    return None


def _module_problem(module: str) -> str | None:
    """Why a module may not be imported, or None. A submodule of torch or numpy
    (``torch.nn.init``) may be, when each part of its name passes the attribute rules,
    since ``import torch.nn.init`` reaches what ``torch.nn.init`` does."""
    if module in IMPORTABLE:
        return None
    root, *parts = module.split(".")
    if root not in ("torch", "numpy") or not parts:
        return f"import only {ALLOWED_IMPORTS}"
    for part in parts:
        if part.startswith("_"):
            return f"`{part}` is internal (its name starts with `_`); import only {ALLOWED_IMPORTS}"
        problem = _attribute_problem(part)
        if problem:
            return f"`{part}`: {problem}"
    return None


# ------------------------------------------------------------------ reading a file


def _declared_encoding(data: bytes) -> tuple[str, int] | None:
    """The PEP 263 cookie as written and its line, where Python would read one."""
    lines = data.splitlines()[:2]
    for number, line in enumerate(lines, start=1):
        match = _COOKIE.match(line)
        if match:
            return match[1].decode("ascii", "replace"), number
        if not re.match(rb"^[ \t\f]*(?:[#\r\n]|$)", line):
            return None  # code on line 1: Python reads no cookie on line 2
    return None


def _check_readable(path: Path) -> None:
    """Only a regular file of a sane size is read: a link may point at /proc or the
    reference, a FIFO would block the grader forever, a huge file would exhaust it."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise SourceRejected(f"{path.name} is a symbolic link; put the file itself in the folder")
    if not stat.S_ISREG(info.st_mode):
        raise SourceRejected(f"{path.name} is not a regular file")
    if info.st_size > MAX_SOURCE_BYTES:
        raise SourceRejected(f"{path.name} has {info.st_size:,} bytes; an exercise file "
                             f"must be under {MAX_SOURCE_BYTES:,}")


def read_source(path: Path) -> str:
    """Decode as Python would (PEP 263 cookie, BOM). A declared encoding other than UTF-8
    (``utf-8``, ``utf8``, ``utf-8-sig`` and their aliases are fine) and bytes that are not
    UTF-8 raise :class:`SourceRejected` with a message naming the file and the line: a
    cookie such as ``utf-7`` would otherwise show the grader one text and Python another."""
    path = Path(path)
    _check_readable(path)
    data = path.read_bytes()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:  # an unknown encoding, or a BOM with another cookie
        declared = _declared_encoding(data)
        where = f" on line {declared[1]}" if declared else ""
        raise SourceRejected(f"{path.name}: {error}{where}; save the file as UTF-8 and remove "
                             f"the coding line") from None
    if codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        name, line = _declared_encoding(data) or (encoding, 1)
        raise SourceRejected(f"{path.name} declares the encoding {name} on line {line}; "
                             f"save the file as UTF-8 and remove the coding line")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SourceRejected(f"{path.name} has a byte that is not UTF-8 "
                             f"(0x{data[error.start]:02x}) on line {line}; save the file as "
                             f"UTF-8") from None


# ------------------------------------------------------------------ scopes


class _Scopes:
    """Which scope each node is evaluated in and which names each scope binds, so that a
    built-in's name can be told from a parameter or local variable that shadows it."""

    def __init__(self, tree: ast.Module) -> None:
        self.scope_of: dict[int, ast.AST] = {}
        self.parent_scope: dict[int, ast.AST | None] = {id(tree): None}
        self.bound: dict[int, set[str]] = {}
        self.declared_global: dict[int, set[str]] = {}
        self._walk(tree)

    def _walk(self, tree: ast.Module) -> None:
        """Give every node its scope, top-down (iteratively: a deeply nested file cannot
        exhaust the grader's stack)."""
        stack: list[tuple[ast.AST, ast.AST]] = [(child, tree) for child in tree.body]
        while stack:
            node, scope = stack.pop()
            self.scope_of[id(node)] = scope
            self._bind(node, scope)
            stack.extend(self._children(node, scope))

    def _children(self, node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """Each child with the scope it is evaluated in (defaults, decorators, bases and a
        comprehension's first iterable belong to the enclosing scope)."""
        if isinstance(node, _SCOPES):
            self.parent_scope[id(node)] = scope
        if isinstance(node, _FUNCTIONS):
            outer = [*getattr(node, "decorator_list", []), *getattr(node, "type_params", []),
                     node.args]
            if getattr(node, "returns", None) is not None:
                outer.append(node.returns)
            yield from ((child, scope) for child in outer)
            body = node.body if isinstance(node.body, list) else [node.body]
            yield from ((child, node) for child in body)
            self._bind_arguments(node)
        elif isinstance(node, ast.ClassDef):
            outer = [*node.decorator_list, *getattr(node, "type_params", []), *node.bases,
                     *node.keywords]
            yield from ((child, scope) for child in outer)
            yield from ((child, node) for child in node.body)
        elif isinstance(node, _COMPREHENSIONS):
            first, *_ = node.generators
            yield first.iter, scope
            for child in ast.iter_child_nodes(node):
                if child is not first:
                    yield child, node
            yield from ((child, node) for child in (first.target, *first.ifs))
        else:
            yield from ((child, scope) for child in ast.iter_child_nodes(node))

    def _bind_arguments(self, function: ast.AST) -> None:
        """A function's parameters are its locals."""
        args = function.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        self.bound.setdefault(id(function), set()).update(a.arg for a in every if a)

    def _bind(self, node: ast.AST, scope: ast.AST) -> None:
        """Record the names a node binds in the scope it is evaluated in."""
        names: list[str] = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names = [node.name]
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names = [node.rest]
        elif isinstance(node, ast.Nonlocal):
            names = list(node.names)
        elif isinstance(node, ast.Global):
            self.declared_global.setdefault(id(scope), set()).update(node.names)
        self.bound.setdefault(id(scope), set()).update(names)

    def is_builtin(self, node: ast.Name) -> bool:
        """Whether the name may reach the built-in of that name: it is not a parameter or
        local of an enclosing function (module and class bindings depend on the order the
        code runs in, so they do not count)."""
        scope = self.scope_of.get(id(node))
        while scope is not None and not isinstance(scope, ast.Module):
            if node.id in self.declared_global.get(id(scope), ()):
                return True
            local = isinstance(scope, (*_FUNCTIONS, *_COMPREHENSIONS))
            if local and node.id in self.bound.get(id(scope), ()):
                return False
            scope = self.parent_scope.get(id(scope))  # a class body's names do not count
        return True

    def module_level(self, node: ast.AST) -> bool:
        """Whether the node is evaluated in the module's own scope."""
        return isinstance(self.scope_of.get(id(node)), ast.Module)


# ------------------------------------------------------------------ the checker


def _root_name(node: ast.AST) -> ast.Name | None:
    """The name an attribute chain starts from: ``torch`` in ``torch.nn.Softmax().x[0]``."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return node if isinstance(node, ast.Name) else None


def _value_expressions(node: ast.AST) -> Iterator[ast.AST]:
    """The expressions whose object an expression may hand on (the elements of a tuple, the
    branches of ``a if c else b``...)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _value_expressions(element)
    elif isinstance(node, ast.IfExp):
        yield from _value_expressions(node.body)
        yield from _value_expressions(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _value_expressions(value)
    elif isinstance(node, (ast.Starred, ast.NamedExpr)):
        yield from _value_expressions(node.value)
    else:
        yield node


def _value_roots(node: ast.AST) -> Iterator[ast.Name]:
    """Names whose object an expression hands on unchanged (``T = torch.Tensor``,
    ``T, U = nn.Module, F``); a call makes a new object and is not followed."""
    for value in _value_expressions(node):
        while isinstance(value, (ast.Attribute, ast.Subscript)):
            value = value.value
        if isinstance(value, ast.Name):
            yield value


def _target_names(node: ast.AST) -> Iterator[str]:
    """The plain names an assignment target binds (``a, *b = ...``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _target_names(element)
    elif isinstance(node, ast.Starred):
        yield from _target_names(node.value)


def _other_binding(node: ast.AST) -> list[str]:
    """Names bound where no value is written: ``x += 1``, ``except E as x``, ``case x:``,
    ``case {**x}``, ``type X = ...``."""
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    type_alias = getattr(ast, "TypeAlias", None)  # Python 3.12
    if type_alias is not None and isinstance(node, type_alias):
        return [node.name.id]
    return []


def _one_line(message: str) -> str:
    """A message as one line of at most MAX_MESSAGE characters."""
    message = " ".join(message.split())
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def _argument_defaults(arguments: ast.arguments) -> Iterator[tuple[str, ast.expr]]:
    """``(parameter, default)`` pairs: a default hands its object on to the parameter."""
    positional = [*arguments.posonlyargs, *arguments.args]
    with_default = positional[len(positional) - len(arguments.defaults):]
    yield from ((a.arg, d) for a, d in zip(with_default, arguments.defaults, strict=True))
    yield from ((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                           strict=True) if d is not None)


def _format_fields(text: str) -> Iterator[str]:
    """Every replacement field's name in a format string, nested ones included."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return
    for _, field, spec, _ in parsed:
        if field is not None:
            yield field
        if spec:
            yield from _format_fields(spec)


class _Checker:
    """Reads one parsed file and collects its violations."""

    def __init__(self, tree: ast.Module, path: str,
                 forbidden: Mapping[str, Sequence[str]]) -> None:
        self.path = path
        self.scopes = _Scopes(tree)
        self.nodes = list(ast.walk(tree))
        self.parent = {id(child): node for node in self.nodes
                       for child in ast.iter_child_nodes(node)}
        self.attributes = {ex: {n for n in names if not n.endswith("=")}
                           for ex, names in forbidden.items()}
        self.keywords = {ex: {n[:-1] for n in names if n.endswith("=")}
                         for ex, names in forbidden.items()}
        self.imported = {name for node in self.nodes
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for name in self._import_binds(node)}
        self.bindings = list(self._bindings())
        self.all_bound = {name for name, _ in self.bindings}
        self.base_verdicts: dict[str, bool] = {}
        self.values_of: dict[str, list[ast.AST]] = {}
        for name, value in self.bindings:
            if value is not None:
                self.values_of.setdefault(name, []).append(value)
        self.course_parts = self._active_parts_is_the_course()
        self.annotations = self._annotation_nodes()
        self.classes = {n.name for n in self.nodes if isinstance(n, ast.ClassDef)}
        self.parts_names = self._parts_aliases()
        self.protected = self._protected_names()
        self.found: list[Violation] = []

    # -------------------------------------------------------------- bookkeeping

    @staticmethod
    def _import_binds(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        """The names an import statement binds (``import torch.nn`` binds ``torch``)."""
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0]

    def _annotation_nodes(self) -> set[int]:
        """Every node inside an annotation (of a parameter, a return or a variable)."""
        roots = [n.annotation for n in self.nodes if isinstance(n, (ast.arg, ast.AnnAssign))
                 and n.annotation is not None]
        roots += [n.returns for n in self.nodes
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
        return {id(inner) for root in roots for inner in ast.walk(root)}

    def _bindings(self) -> Iterator[tuple[str, ast.AST | None]]:
        """``(name, value)`` for each binding of a name; value None when it is not a plain
        assignment (a parameter, a loop target, an import, a def)."""
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    value = node.value if isinstance(target, ast.Name) else None
                    for name in _target_names(target):
                        yield name, value
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(
                    node.target, ast.Name):
                yield node.target.id, node.value
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                for name in _target_names(node.target):
                    yield name, node.iter  # the loop hands on the elements of iter
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                for name in _target_names(node.optional_vars):
                    yield name, None
            elif isinstance(node, ast.arg):
                yield node.arg, None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield node.name, None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in self._import_binds(node):
                    yield name, node
            else:
                yield from ((name, None) for name in _other_binding(node))

    def _parts_aliases(self) -> set[str]:
        """Names bound only to ``active_parts()`` (``parts = active_parts()``), when
        ``active_parts`` is only ever the course's."""
        if not self.course_parts:
            return set()
        values: dict[str, list[ast.AST | None]] = {}
        for name, value in self.bindings:
            values.setdefault(name, []).append(value)
        return {name for name, vs in values.items()
                if all(v is not None and self._is_active_parts_call(v) for v in vs)}

    def _active_parts_is_the_course(self) -> bool:
        """Whether ``active_parts`` is only ever the course's own import."""
        for name, value in self.bindings:
            if name == "active_parts" and not (
                    isinstance(value, ast.ImportFrom)
                    and value.module == "annotated_transformer.parts"):
                return False
        return True

    @staticmethod
    def _is_active_parts_call(node: ast.AST) -> bool:
        """``active_parts()`` exactly."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "active_parts" and not node.args and not node.keywords)

    def _through_parts(self, base: ast.AST) -> bool:
        """``active_parts().x`` and ``parts.x`` are the course's parts, not PyTorch's op."""
        if self._is_active_parts_call(base):
            return self.course_parts
        return isinstance(base, ast.Name) and base.id in self.parts_names

    def _protected_names(self) -> set[str]:
        """Names whose attributes may not be assigned: imports, built-ins and the names that
        hand one on unchanged (``T = torch.Tensor``, ``for T in (nn.Module,)``, ``def f(T=F)``),
        found in one pass over who hands on whom (linear, whatever a file holds)."""
        protected = set(self.imported)
        pairs = [(name, value) for name, value in self.bindings
                 if value is not None and not isinstance(value, (ast.ImportFrom, ast.Import))]
        pairs += [pair for n in self.nodes if isinstance(n, ast.arguments)
                  for pair in _argument_defaults(n)]
        handed_to: dict[str, set[str]] = {}
        for name, value in pairs:
            for root in _value_roots(value):
                if self._unbound_builtin(root):
                    protected.add(name)
                handed_to.setdefault(root.id, set()).add(name)
        todo = list(protected)
        while todo:
            for name in handed_to.pop(todo.pop(), ()):
                if name not in protected:
                    protected.add(name)
                    todo.append(name)
        return protected

    def _unbound_builtin(self, name: ast.Name) -> bool:
        """A built-in (``int``, ``print``) that the file never binds to anything of its own."""
        return (name.id not in SELF_NAMES and name.id not in self.all_bound
                and self.scopes.is_builtin(name))

    def add(self, node: ast.AST, message: str, exercise: str | None = None) -> None:
        """Record a violation at the node's line, its message cut to one short line."""
        self.found.append(Violation(self.path, getattr(node, "lineno", 1), exercise,
                                    _one_line(message)))

    # -------------------------------------------------------------- running the rules

    def run(self) -> list[Violation]:
        """Every rule over every node; the violations in line order, at most MAX_VIOLATIONS."""
        for node in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
            elif isinstance(node, ast.Name):
                self.check_name(node)
            elif isinstance(node, ast.Attribute):
                self.check_attribute(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.check_definition(node)
            elif isinstance(node, ast.ClassDef):
                self.check_class(node)
            elif isinstance(node, ast.keyword):
                self.check_keyword(node)
            elif isinstance(node, ast.MatchClass):
                self.check_match_class(node)
            elif id(node) in self.annotations and isinstance(node, ast.Constant):
                self.check_string_annotation(node)
            if isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
                self.check_store(node)
        found = sorted(set(self.found), key=lambda v: (v.line, v.exercise or "", v.message))
        if len(found) <= MAX_VIOLATIONS:
            return found
        kept, rest = found[: MAX_VIOLATIONS - 1], found[MAX_VIOLATIONS - 1:]
        more = Violation(self.path, rest[0].line, None,
                         f"{len(rest)} more things not allowed from line {rest[0].line} on "
                         f"are not listed; fix the ones above first")
        return [*kept, more]

    # -------------------------------------------------------------- imports

    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        """Only the allow-list's modules, because any other one is a way to files,
        processes or the interpreter (``os``, ``importlib``, ``sys.modules``...)."""
        if isinstance(node, ast.ImportFrom) and node.level:
            self.add(node, f"relative imports are not allowed in an exercise file: keep "
                           f"helpers in the chapter file; import only {ALLOWED_IMPORTS}")
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                problem = _module_problem(alias.name)
                if problem:
                    self.add(node, f"`import {_clip(alias.name)}` is not allowed in an "
                                   f"exercise file: {problem}")
            return
        module = node.module or ""
        problem = None if module in FROM_ONLY else _module_problem(module)
        if problem:
            self.add(node, f"`from {_clip(module)} import ...` is not allowed here: {problem}")
            return
        for alias in node.names:
            self.check_imported_name(node, module, alias.name)

    def check_imported_name(self, node: ast.ImportFrom, module: str, name: str) -> None:
        """A name taken from a module is checked as that module's attribute would be."""
        if name == "*":
            self.add(node, f"`from {module} import *` is not allowed in an exercise file: "
                           f"name what you import")
        elif module in FROM_ONLY and name not in FROM_ONLY[module]:
            allowed = ", ".join(sorted(FROM_ONLY[module]))
            self.add(node, f"`from {module} import {name}` is not allowed in an exercise "
                           f"file: from {module} import only {allowed}")
        else:
            self.check_attribute_name(node, name, f"from {module} import {name}", None)
            self.check_forbidden_name(node, name, f"from {module} import {name}")

    # -------------------------------------------------------------- names

    def check_name(self, node: ast.Name) -> None:
        """Built-ins that escape the rules, dunder names, and ``super``/``object`` misuse."""
        name = node.id
        if _is_dunder(name):
            self.check_dunder_name(node)
        elif name in BANNED_BUILTINS and isinstance(node.ctx, ast.Load):
            call = self.parent.get(id(node))
            called = isinstance(call, ast.Call) and call.func is node
            if name == "type" and id(node) in self.annotations and not called:
                return  # ``type[nn.Module]`` in an annotation is a type, not a call
            if self.scopes.is_builtin(node):
                own = f" (or rename your own `{name}`)" if name in self.all_bound else ""
                self.add(node, f"`{name}` is not allowed in an exercise file: it "
                               f"{BANNED_BUILTINS[name]}{own}")
        elif name == "super" and isinstance(node.ctx, ast.Load) and self.scopes.is_builtin(node):
            self.check_super(node)
        elif name == "object" and self.scopes.is_builtin(node):
            parent = self.parent.get(id(node))
            if isinstance(parent, ast.Attribute) and parent.value is node:
                self.add(node, f"`{_snippet(parent)}` is not allowed in an exercise file: "
                               f"`object`'s methods bypass a class's own; call the method "
                               f"on your object")

    def check_dunder_name(self, node: ast.Name) -> None:
        """``__all__`` at module level and the ``__name__ == "__main__"`` guard only:
        ``__builtins__``, ``__file__``, ``__loader__``... reach the interpreter."""
        if node.id == "__all__" and self.scopes.module_level(node):
            return
        if node.id == "__name__" and self._in_main_guard(node):
            return
        self.add(node, f"`{node.id}` is not allowed in an exercise file: names with double "
                       f"underscores reach the interpreter's internals (only `__all__` and "
                       f"`if __name__ == \"__main__\":`)")

    def _in_main_guard(self, node: ast.Name) -> bool:
        """``__name__`` in ``if __name__ == "__main__":`` at module level."""
        compare = self.parent.get(id(node))
        statement = self.parent.get(id(compare))
        if not (isinstance(compare, ast.Compare) and isinstance(statement, ast.If)
                and statement.test is compare and self.scopes.module_level(statement)):
            return False
        sides = [compare.left, *compare.comparators]
        return (len(sides) == 2 and isinstance(compare.ops[0], ast.Eq)
                and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))

    def check_super(self, node: ast.Name) -> None:
        """``super()`` (or ``super(MyClass, self)``) followed by an attribute: any other use
        hands out an object through which a class's own methods are bypassed."""
        call = self.parent.get(id(node))
        used = self.parent.get(id(call))
        ok_call = isinstance(call, ast.Call) and call.func is node and not call.keywords and (
            not call.args or self._classic_super(call.args))
        if not (ok_call and isinstance(used, ast.Attribute) and used.value is call):
            self.add(node, "this use of `super` is not allowed in an exercise file: write "
                           "`super().method(...)`, e.g. `super().__init__()`")

    def _classic_super(self, args: list[ast.expr]) -> bool:
        """``super(MyClass, self)``, the older spelling of ``super()``."""
        return (len(args) == 2 and isinstance(args[0], ast.Name) and args[0].id in self.classes
                and isinstance(args[1], ast.Name) and args[1].id in SELF_NAMES)

    # -------------------------------------------------------------- attributes

    def check_attribute(self, node: ast.Attribute) -> None:
        """Dunder and private attributes, the banned names, Parts' own methods, and the
        exercise's forbidden names."""
        base, name = node.value, node.attr
        code = _snippet(node)
        if _is_dunder(name):
            self.check_dunder_attribute(node)
        elif name.startswith("_") and not self._self_based(base):
            self.add(node, f"`{code}` is not allowed in an exercise file: names starting with "
                           f"`_` are PyTorch's internals; use its public functions (only "
                           f"`self._name` is fine)")
        else:
            self.check_attribute_name(node, name, code, base)
        if name in ("format", "format_map"):
            self.check_format(node)
        if self._through_parts(base):
            if name in PARTS_OWN:
                self.add(node, f"`{code}` is not allowed in an exercise file: take a part by "
                               f"its name, e.g. `active_parts().softmax`")
            return
        self.check_forbidden_name(node, name, code)

    def check_dunder_attribute(self, node: ast.Attribute) -> None:
        """Only ``.__init__(...)`` called and a class's name (``self.__class__.__name__``,
        ``cls.__name__``, strings for messages): ``__class__`` otherwise, ``__dict__``,
        ``__globals__``, ``__subclasses__``... are the ways into the interpreter's internals."""
        parent = self.parent.get(id(node))
        if node.attr == "__init__" and isinstance(parent, ast.Call) and parent.func is node:
            return
        if self._class_name(node) or (isinstance(parent, ast.Attribute)
                                      and self._class_name(parent)):
            return
        self.add(node, f"`{_snippet(node)}` is not allowed in an exercise file: attributes "
                       f"with double underscores reach the interpreter's internals (only "
                       f"`super().__init__(...)`)")

    def _class_name(self, node: ast.Attribute) -> bool:
        """``self.__class__.__name__`` or ``cls.__name__`` (``__qualname__`` too)."""
        if node.attr not in ("__name__", "__qualname__"):
            return False
        base = node.value
        if isinstance(base, ast.Attribute) and base.attr == "__class__":
            return isinstance(base.value, ast.Name) and base.value.id == "self"
        return isinstance(base, ast.Name) and base.id == "cls"

    def _self_based(self, base: ast.AST) -> bool:
        """Whether an attribute's base is the learner's own ``self`` or ``cls``."""
        return isinstance(base, ast.Name) and base.id in SELF_NAMES

    def check_attribute_name(self, node: ast.AST, name: str, code: str,
                             base: ast.AST | None) -> None:
        """Banned attribute names, and standard modules that PyTorch and friends re-export
        (``torch.os``), unless an attribute of the learner's own ``self``."""
        problem = _attribute_problem(name, own=self._self_based(base))
        if problem:
            self.add(node, f"`{code}` is not allowed in an exercise file: {problem}")

    def check_forbidden_name(self, node: ast.AST, name: str, code: str) -> None:
        """The op an exercise asks the learner to write, by any attribute or import."""
        for exercise, names in self.attributes.items():
            if name in names:
                self.add(node, f"`{code}` is not allowed: exercise {exercise} asks you to "
                               f"write {name} yourself; call your own function or "
                               f"`active_parts().{name}`", exercise)

    def check_match_class(self, node: ast.MatchClass) -> None:
        """``case object(softmax=f):`` looks ``softmax`` up on the subject: each keyword of a
        class pattern is checked as the attribute it reads."""
        for name in node.kwd_attrs:
            code = f"case {_snippet(node.cls)}({name}=...)"
            if name.startswith("_"):
                self.add(node, f"`{code}` is not allowed in an exercise file: it reads a "
                               f"private or double-underscore attribute")
            else:
                self.check_attribute_name(node, name, code, None)
                self.check_forbidden_name(node, name, code)

    def check_string_annotation(self, node: ast.Constant) -> None:
        """A string annotation is code that ``typing.get_type_hints`` would evaluate later:
        it may name types only (no calls, no double-underscore names)."""
        if not isinstance(node.value, str):
            return
        try:
            inner = ast.parse(node.value.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # not an expression: evaluating it would fail, it cannot run anything
        for part in ast.walk(inner):
            name = getattr(part, "id", None) or getattr(part, "attr", None) or ""
            if isinstance(part, (ast.Call, ast.Lambda)) or _is_dunder(name):
                self.add(node, f"the annotation {_clip(repr(node.value))} is not allowed in an "
                               f"exercise file: an annotation names types only")
                return

    # -------------------------------------------------------------- definitions

    def check_definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Dunder methods only inside a class, and none that runs behind the learner's back."""
        if not _is_dunder(node.name):
            return
        in_class = isinstance(self.scopes.scope_of.get(id(node)), ast.ClassDef)
        if not in_class:
            self.add(node, f"`def {node.name}` is not allowed outside a class in an exercise "
                           f"file: give the function a plain name")
        elif node.name not in ALLOWED_DUNDER_METHODS:
            reason = BANNED_DUNDER_METHODS.get(
                node.name, "is a hook that Python, PyTorch or numpy call behind your back")
            self.add(node, f"`def {node.name}` is not allowed in an exercise file: it "
                           f"{reason}; write a plain method")

    def check_class(self, node: ast.ClassDef) -> None:
        """No metaclass and no Tensor subclass: both run code the learner does not call."""
        for keyword in node.keywords:
            given = keyword.arg or "**"
            self.add(node, f"`class {node.name}(..., {given}=...)` is not allowed in an "
                           f"exercise file: a metaclass changes how classes are built; derive "
                           f"from nn.Module or nothing")
        for base in node.bases:
            if self._banned_base(base):
                self.add(node, f"`class {node.name}({_snippet(base)})` is not allowed in an "
                               f"exercise file: a Tensor subclass intercepts PyTorch's calls; "
                               f"derive from nn.Module or nothing")

    def _banned_base(self, base: ast.AST) -> bool:
        """Whether a base names Tensor or Parameter, also through ``from torch import Tensor
        as Base`` or ``Base = torch.Tensor`` (each name looked into once per file)."""
        if isinstance(base, ast.Attribute):
            return base.attr.endswith(BANNED_BASES)
        if not isinstance(base, ast.Name):
            return False
        if base.id not in self.base_verdicts:
            self.base_verdicts[base.id] = False  # a cycle of aliases reaches nothing new
            self.base_verdicts[base.id] = base.id.endswith(BANNED_BASES) or any(
                self._hands_on_banned_base(base.id, value)
                for value in self.values_of.get(base.id, ()))
        return self.base_verdicts[base.id]

    def _hands_on_banned_base(self, name: str, value: ast.AST) -> bool:
        """Whether one binding of ``name`` gives it a Tensor-like class."""
        if isinstance(value, ast.ImportFrom):
            return any(a.name.endswith(BANNED_BASES) for a in value.names
                       if (a.asname or a.name) == name)
        return not isinstance(value, ast.Import) and any(
            self._banned_base(inner) for inner in _value_expressions(value))

    # -------------------------------------------------------------- calls and keywords

    def check_keyword(self, node: ast.keyword) -> None:
        """A forbidden keyword argument (``label_smoothing=``), also hidden in ``**{...}``."""
        for exercise, names in self.keywords.items():
            used = {node.arg} if node.arg else self._unpacked_keys(node.value)
            for name in sorted(used & names):
                self.add(node.value, f"`{name}=` is not allowed in this file: exercise "
                                     f"{exercise} asks you to compute what it does yourself",
                         exercise)

    @staticmethod
    def _unpacked_keys(value: ast.AST) -> set[str]:
        """The keyword names a ``**{...}`` or ``**dict(...)`` argument passes."""
        if isinstance(value, ast.Dict):
            return {k.value for k in value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return {k.arg for k in value.keywords if k.arg}
        return set()

    def check_format(self, node: ast.Attribute) -> None:
        """``str.format`` looks attributes up from the format string (``"{0.__class__}"``):
        only called on a string literal without attribute fields (f-strings are fine)."""
        call = self.parent.get(id(node))
        text = node.value.value if isinstance(node.value, ast.Constant) else None
        if not (isinstance(call, ast.Call) and call.func is node and isinstance(text, str)):
            self.add(node, f"`{_snippet(node)}` is not allowed in an exercise file: call "
                           f"`.format` on a string literal, or use an f-string")
        elif any("." in field for field in _format_fields(text)):
            self.add(node, "attribute lookups inside a format string are not allowed in an "
                           "exercise file: use an f-string")

    # -------------------------------------------------------------- assignments

    def check_store(self, node: ast.AST) -> None:
        """No assignment or ``del`` on an imported module or class (``torch.softmax = f``,
        ``nn.Module.__call__ = g``): that changes PyTorch for the grader too."""
        if not isinstance(node, (ast.Attribute, ast.Subscript)):
            return
        root = _root_name(node)
        if root is None or root.id in SELF_NAMES:
            return
        if root.id in self.protected or self._unbound_builtin(root):
            self.add(node, f"`{_snippet(node)}` is not allowed in an exercise file: it changes "
                           f"`{root.id}`, which is not yours; assign to your own objects "
                           f"(self.x = ...)")


# ------------------------------------------------------------------ files and folders


def _syntax_violation(path: str, name: str, error: SyntaxError) -> Violation:
    """One violation naming the file, the line and the text that does not parse."""
    text = " ".join((error.text or "").split())
    text = text if len(text) <= 60 else text[:57] + "..."
    line = error.lineno or 1
    shown = f" (`{text}`)" if text else ""
    return Violation(path, line, None, _one_line(f"{name} line {line} is not valid Python: "
                                                 f"{error.msg}{shown}; fix it so the file runs"))


def check_source(source: str, path: str,
                 forbidden: Mapping[str, Sequence[str]] = {}) -> list[Violation]:  # noqa: B006
    """Every rule over source text (``path`` only labels the violations)."""
    name = Path(path).name
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as error:
        return [_syntax_violation(path, name, error)]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, deep nesting
        return [Violation(path, 1, None, _one_line(f"{name} cannot be read as Python "
                                                   f"({error}); simplify the file"))]
    try:
        return _Checker(tree, path, forbidden).run()
    except RecursionError:
        return [Violation(path, 1, None, f"{name} nests expressions too deeply to check; "
                                         f"split long expressions")]


def check_file(path: Path, forbidden: Mapping[str, Sequence[str]] = {}  # noqa: B006
               ) -> list[Violation]:
    """Every rule over one file. ``forbidden`` is ``{exercise id: names}``, e.g.
    ``{"2.1": ("softmax",), "6.2": ("label_smoothing=",)}``: attribute names (any attribute
    access or ``from m import name``) or keyword arguments (a trailing ``=``), forbidden
    anywhere in the file, each reported with its exercise. A plain name (the learner's own
    ``softmax``) and a part taken through the course (``active_parts().softmax``) are
    allowed. A file that does not parse, or cannot be read as UTF-8 Python, is one
    violation with exercise None."""
    try:
        source = read_source(Path(path))
    except SourceRejected as error:
        return [Violation(str(path), _line_of(str(error)), None, _one_line(str(error)))]
    except OSError as error:
        return [Violation(str(path), 1, None, _one_line(f"{Path(path).name} cannot be read: "
                                                        f"{error.strerror or error}"))]
    return check_source(source, str(path), forbidden)


def _line_of(message: str) -> int:
    """The line a :class:`SourceRejected` message names (1 when none)."""
    match = re.search(r"on line (\d+)", message)
    return int(match[1]) if match else 1


def _importable_non_source(path: Path) -> str | None:
    """Why a file that Python could import instead of a checked ``.py`` is refused."""
    name = path.name
    if any(name.endswith(s) for s in EXTENSION_SUFFIXES):
        return "is a compiled extension module"
    if any(name.endswith(s) for s in BYTECODE_SUFFIXES):
        if path.parent.name != "__pycache__":
            return "is compiled bytecode without its source"
        if _unchecked_pyc(path):
            return "is bytecode that Python would run without comparing it with its source"
    return None


def _unchecked_pyc(path: Path) -> bool:
    """A hash-based .pyc with check_source off (PEP 552) wins over the .py beside it."""
    try:
        with path.open("rb") as handle:
            header = handle.read(8)
    except OSError:
        return False
    flags = int.from_bytes(header[4:8], "little") if len(header) == 8 else 0
    return flags & 0b01 == 1 and flags & 0b10 == 0


def _files(folder: Path) -> Iterator[Path]:
    """Every file under folder, links included but not followed. A folder whose name is not
    a Python name (``.ipynb_checkpoints``, ``.git``) is skipped: no import can reach it."""
    for directory, subdirectories, names in os.walk(folder, followlinks=False):
        here = Path(directory)
        subdirectories[:] = sorted(d for d in subdirectories if d.isidentifier())
        for name in sorted(names) + [d for d in subdirectories if (here / d).is_symlink()]:
            yield here / name


def _chapter_of(path: Path, folder: Path) -> int | None:
    """The chapter a file belongs to: a ``chNN_*.py`` file at the top of the folder, or any
    file of a ``chNN_*`` package there (``import exercises.ch02_attention`` would load it)."""
    top = path.relative_to(folder).parts[0]
    match = CHAPTER_FILE.match(top) or (CHAPTER_FILE.match(top + ".py")
                                        if top != path.name else None)
    return int(match["chapter"]) if match else None


def _label(path: Path, folder: Path) -> str:
    """The path as the learner knows it: ``exercises/helper.py``."""
    return (Path(folder.name) / path.relative_to(folder)).as_posix()


def check_folder(folder: Path, forbidden_by_chapter: Mapping[
        int, Mapping[str, Sequence[str]]] = {}) -> dict[int | None, list[Violation]]:  # noqa: B006
    """Every ``.py`` file under ``folder`` (and anything else Python could import from it).
    Key: the chapter number for a ``chNN_*.py`` file at the top of the folder (or a file of a
    ``chNN_*`` package there), None for any other file: its violations concern every chapter,
    and every chapter's forbidden names apply to it. Paths read ``exercises/helper.py``."""
    folder = Path(folder)
    every_exercise = {ex: names for chapter in forbidden_by_chapter.values()
                      for ex, names in chapter.items()}
    found: dict[int | None, list[Violation]] = {}
    for path in _files(folder):
        label = _label(path, folder)
        key = _chapter_of(path, folder)
        if path.suffix == ".py" or path.is_symlink():
            forbidden = forbidden_by_chapter.get(key, {}) if key is not None else every_exercise
            violations = _check_labelled(path, label, forbidden)
        else:
            reason = _importable_non_source(path)
            message = f"{label} {reason}; keep only .py source files in the folder"
            violations = [Violation(label, 1, None, _one_line(message))] if reason else []
        if violations:
            found.setdefault(key, []).extend(violations)
    return found


def _check_labelled(path: Path, label: str,
                    forbidden: Mapping[str, Sequence[str]]) -> list[Violation]:
    """``check_file`` with the violations' paths relabelled for the report."""
    violations = check_file(path, forbidden)
    return [Violation(label, v.line, v.exercise, v.message) for v in violations]
