"""What an exercise file may name, read before any of it is imported: only what no layer that
watches code run can hold. **Imports** (``IMPORTABLE``, ``active_parts``, ``Batch``): any other
module reaches the worker's own objects (``gc``, ``sys``, ``ctypes``). **Names that turn strings
into code or names** (``eval``, ``getattr``, dunders, frames, a string annotation, a metaclass,
special methods run behind the learner's back). Libraries' **private names**, **files**, **native
code** and the compiler. **An exercise's forbidden names** (``FORBIDDEN``): what the guard
cannot tell from an honest answer (4.2's mask). The rest is the runtime's (book/instructor.md).
"""
from __future__ import annotations

import ast
import functools
import importlib
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from annotated_transformer.layout import CHAPTER_FILE

IMPORTABLE = frozenset(_IMPORTS := (
    "torch", "torch.nn", "torch.nn.functional", "numpy", "math", "typing", "collections.abc",
    "dataclasses", "functools", "itertools", "numbers", "copy",  # copy: clones of a layer
))
FROM_ONLY = {"__future__": {"annotations"}, "annotated_transformer.parts": {"active_parts"},
             "annotated_transformer.batch": {"Batch"}}
ALLOWED_IMPORTS = ", ".join([*(m for m in _IMPORTS if not m.startswith("torch.")),
                             "active_parts", "Batch"])
DYNAMIC_BUILTINS = {
    "runs or builds code from a string; write the code itself": "eval exec compile breakpoint",
    "looks names up by strings; write the attribute (x.name) or `self.name = value`":
        "getattr setattr delattr vars dir globals locals type",
    "reaches files or raw memory; an exercise computes with tensors only": "open memoryview",
}
BANNED_ATTRIBUTES = {
    "writes or loads files (one your code wrote would run unchecked)": "load loads save "
        "from_file fromfile tofile savez savez_compressed savetxt loadtxt genfromtxt fromregex "
        "memmap open_memmap DataSource dump dumps serialization hub model_zoo load_url package "
        "load_library onnx profiler gds dill openfile fromtextfile",
    "reaches native code, raw memory, processes, or PyTorch's compiler and dispatcher": (
        "distributed parallel DataParallel cpp_extension utils library classes ctypeslib f2py "
        "testing jiterator share_memory share_memory_ lib stride_tricks ops jit compile "
        "compiler fx export overrides register_dispatch_key backends ao quantization "
        "handle_torch_function has_torch_function has_torch_function_unary "
        "has_torch_function_variadic as_subclass"),
    "reaches the interpreter's frames": "gi_frame gi_code gi_yieldfrom cr_frame cr_code "
        "cr_await ag_frame ag_code ag_await f_back f_globals f_locals f_builtins f_code "
        "f_trace tb_frame tb_next co_code co_consts co_names",
    "looks names up or sets attributes by strings": "get_type_hints ForwardRef make_dataclass "
        "attrgetter methodcaller update_wrapper WRAPPER_ASSIGNMENTS WRAPPER_UPDATES "
        "dispatch_table",
    "is a module PyTorch hands out beside its own": "stdlib_re mp python_multiprocessing "
        "reduction reducer typing_extensions sympy mpmath jinja2 networkx",
}
BANNED = {n: why for why, names in BANNED_ATTRIBUTES.items() for n in names.split()}
BUILTIN_BANS = {n: why for why, names in DYNAMIC_BUILTINS.items() for n in names.split()}
# Standard modules that are also tensor methods (x.select, x.chunk, torch.trace) or harmless.
STDLIB_MODULES = frozenset(sys.stdlib_module_names) - {
    "abc", "array", "chunk", "cmath", "copy", "math", "numbers", "select", "token", "trace"}
# One plain argument: wraps' others copy attributes by name, deepcopy's memo keeps originals.
ONE_ARGUMENT_ONLY = {"wraps": "`@functools.wraps(function)`", "deepcopy": "`copy.deepcopy(x)`"}
_ARITHMETIC = "add sub mul matmul truediv floordiv mod pow lshift rshift and xor or".split()
ALLOWED_DUNDER_METHODS = frozenset(
    "__init__ __post_init__ __repr__ __str__ __len__ __iter__ __next__ __reversed__ "
    "__contains__ __getitem__ __setitem__ __delitem__ __call__ __enter__ __exit__ __eq__ "
    "__ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __neg__ __pos__ __abs__ "
    "__invert__".split() + [f"__{p}{op}__" for op in _ARITHMETIC for p in ("", "r", "i")])
MAX_MESSAGE = 200  # characters: one line a learner reads in a report
MAX_SOURCE_BYTES = 250_000  # thirty times the largest solution
MAX_VIOLATIONS = 50  # per file: the first ones say what to fix


@functools.cache
def library_private_names() -> frozenset[str]:
    """The ``_names`` of the importable modules, tensors and modules (``_C``, ``_version``)."""
    import torch

    owners = [importlib.import_module(m) for m in IMPORTABLE] + [torch._C, torch.Tensor,
                                                                 torch.nn.Module]
    return frozenset(n for o in owners for n in dir(o) if n.startswith("_") and not is_dunder(n))


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def attribute_problem(name: str, parent: str | None = None) -> str | None:
    """Why an attribute or imported name is refused (``parent``: its module, if sure), or None."""
    if name in BANNED and (name, parent) != ("utils", "torch.nn"):
        return f"it {BANNED[name]}"
    if name in library_private_names():
        return f"`{name}` is an internal of PyTorch's, numpy's or Python's (it starts with `_`)"
    if name in STDLIB_MODULES:
        return (f"`{name}` is a module of Python's standard library that libraries hand out as "
                f"an attribute; if it is your own attribute, rename it")
    return None


@dataclass(frozen=True)
class Violation:
    """One thing a learner's file may not do, at one line (``exercise``: a forbidden name's;
    ``unreadable``: the file is not Python at all)."""

    path: str
    line: int
    exercise: str | None
    message: str
    unreadable: bool = False

    def told(self) -> str:  # what the learner reads
        return f"{Path(self.path).name}, line {self.line}: {self.message}"


def one_line(message: str, width: int = MAX_MESSAGE) -> str:
    message = " ".join(message.split())
    return message if len(message) <= width else message[: width - 3] + "..."


def snippet(node: ast.AST) -> str:
    return one_line(ast.unparse(node), 40)  # a RecursionError: check_source's "simplify"


class Checker:
    """Reads one parsed file and collects its violations."""

    def __init__(self, tree: ast.Module, path: str, forbidden: Mapping[str, Sequence[str]]):
        self.path, self.found = path, list[Violation]()
        self.nodes = list(ast.walk(tree))
        self.parent = {id(c): n for n in self.nodes for c in ast.iter_child_nodes(n)}
        self.forbidden = forbidden
        self.bound = self._bindings()
        self.course_parts = self._names_module(ast.Name("active_parts"),
                                               "annotated_transformer.parts.active_parts")
        self.parts_names = {name for name, values in self.bound.items() if self.course_parts
                            and all(self._is_parts_call(v) for v in values)}
        roots = [n.annotation for n in self.nodes if isinstance(n, (ast.arg, ast.AnnAssign))] + [
            n.returns for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.annotations = {id(inner) for root in roots if root for inner in ast.walk(root)}

    def refuse(self, node: ast.AST, code: str, why: str, exercise: str | None = None) -> None:
        self.found.append(Violation(self.path, getattr(node, "lineno", 1), exercise, one_line(
            f"`{code}` is not allowed in an exercise file: {why}")))

    @staticmethod
    def _is_parts_call(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node) == "active_parts()"

    def _bindings(self) -> dict[str, list]:
        """Each name's bindings: an assigned value, what an import binds, or None."""
        bound: dict[str, list] = {}
        binders = (ast.arg, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler,
                   ast.MatchAs, ast.MatchStar, ast.MatchMapping)
        for n in self.nodes:
            parent = self.parent.get(id(n))
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                bound.setdefault(n.id, []).append(parent.value if isinstance(
                    parent, ast.Assign) and n in parent.targets else None)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                for a in n.names:
                    to = (f"{n.module}.{a.name}" if isinstance(n, ast.ImportFrom) else a.name
                          if a.asname else a.name.split(".")[0])
                    bound.setdefault((a.asname or a.name).split(".")[0], []).append(to)
            elif isinstance(n, binders) and (name := getattr(n, "arg", None) or getattr(
                    n, "name", None) or getattr(n, "rest", None)):
                bound.setdefault(name, []).append(None)
        return bound

    def _names_module(self, node: ast.AST, module: str) -> bool:
        """Whether ``node`` is that module for sure: a name bound only by importing it, or
        an attribute chain of one."""
        if isinstance(node, ast.Attribute):
            above, _, last = module.rpartition(".")
            return node.attr == last and bool(above) and self._names_module(node.value, above)
        values = self.bound.get(getattr(node, "id", ""), [])
        return bool(values) and all(v == module for v in values)

    def run(self) -> list[Violation]:
        for node in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
            elif isinstance(node, ast.Name):
                self.check_name(node)
            elif isinstance(node, ast.Attribute):
                self.check_attribute(node, node.attr, node.value, snippet(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.check_definition(node)
            elif isinstance(node, ast.ClassDef) and node.keywords:
                self.refuse(node, f"class {node.name}(..., metaclass=...)", "a metaclass "
                            "changes how classes are built; derive from nn.Module or nothing")
            elif isinstance(node, ast.MatchClass):
                for name in node.kwd_attrs:
                    self.check_attribute(node, name, None, f"case {snippet(node.cls)}({name}=...)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(
                    node) in self.annotations:
                self.check_string_annotation(node)
        found = sorted(set(self.found), key=lambda v: (v.line, v.exercise or "", v.message))
        if len(found) > MAX_VIOLATIONS:
            kept, rest = found[: MAX_VIOLATIONS - 1], found[MAX_VIOLATIONS - 1:]
            found = [*kept, Violation(self.path, rest[0].line, None, f"{len(rest)} more things "
                     f"not allowed from line {rest[0].line} on are not listed; fix these first")]
        return found

    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.level:
            return self.refuse(node, "from . import ...", f"import only {ALLOWED_IMPORTS}")
        imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""])  # a relative import was refused above
        for module in imported:
            root, *parts = module.split(".")
            if module in IMPORTABLE or (isinstance(node, ast.ImportFrom) and module in FROM_ONLY):
                continue
            if root not in ("torch", "numpy") or not parts:
                return self.refuse(node, f"import {module}", f"import only {ALLOWED_IMPORTS}")
            for at, part in enumerate(parts):
                why = attribute_problem(part, ".".join([root, *parts[:at]]))
                if why or part.startswith("_"):
                    why = why or "its name starts with `_` (an internal)"
                    return self.refuse(node, f"import {module}", f"`{part}`: {why}")
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                code = f"from {node.module} import {alias.name}"
                allowed = FROM_ONLY.get(node.module or "")
                if alias.name == "*" or (allowed is not None and alias.name not in allowed):
                    self.refuse(node, code, f"import only {ALLOWED_IMPORTS}, by name")
                elif alias.name in ONE_ARGUMENT_ONLY and alias.asname not in (None, alias.name):
                    self.refuse(node, code + f" as {alias.asname}", "import it by its own name")
                else:
                    self.check_attribute(node, alias.name, None, code, node.module)

    def check_name(self, node: ast.Name) -> None:
        name, parent = node.id, self.parent.get(id(node))
        if is_dunder(name) and not (name == "__all__" or name == "__name__"
                                    and isinstance(node.ctx, ast.Load)):
            self.refuse(node, name, "names with double underscores reach the interpreter's "
                        "internals (only `__all__` and `if __name__ == \"__main__\":`)")
        elif name in BUILTIN_BANS and isinstance(node.ctx, ast.Load) and not (
                name == "type" and (isinstance(parent, ast.Subscript) and parent.value is node
                                    or node in (getattr(parent, "annotation", None),
                                                getattr(parent, "returns", None)))):
            self.refuse(node, name, f"it {BUILTIN_BANS[name]} (or rename your own `{name}`)")
        elif name in ONE_ARGUMENT_ONLY and isinstance(node.ctx, ast.Load):
            self.check_one_argument(node, name)

    def check_attribute(self, node: ast.AST, name: str, base: ast.AST | None, code: str,
                        parent: str | None = None) -> None:
        if is_dunder(name):
            if not self._dunder_allowed(node, name):
                self.refuse(node, code, "attributes with double underscores reach the "
                            "interpreter's internals (only `super().__init__(...)` and "
                            "`self.__class__.__name__`)")
            return
        if base is not None and self._names_module(base, "torch.nn"):
            parent = "torch.nn"
        problem = attribute_problem(name, parent)  # ``self._x``, ``cls._x``: the learner's own
        if problem is None and name.startswith("_") and not (
                isinstance(base, ast.Name) and base.id in ("self", "cls")):
            problem = "names starting with `_` are internals; use public functions (or `self._x`)"
        if problem:
            self.refuse(node, code, problem)
        if name in ONE_ARGUMENT_ONLY and isinstance(node, ast.Attribute):
            self.check_one_argument(node, name)
        through_parts = (self.course_parts and self._is_parts_call(base)) or (  # own parts
            isinstance(base, ast.Name) and base.id in self.parts_names)
        for exercise, names in self.forbidden.items():
            if name in names and not through_parts:
                self.refuse(node, code, f"exercise {exercise} asks you to write {name} yourself; "
                            f"call your own or `active_parts().{name}`", exercise)

    def _dunder_allowed(self, node: ast.AST, name: str) -> bool:  # x.__class__.__name__
        parent, names = self.parent.get(id(node)), ("__name__", "__qualname__")
        return not isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)) and (
            name in names or name == "__class__" and getattr(parent, "attr", None) in names
            or name == "__init__" and isinstance(parent, ast.Call) and parent.func is node)

    def check_one_argument(self, node: ast.AST, name: str) -> None:
        call = self.parent.get(id(node))
        if not (isinstance(call, ast.Call) and call.func is node and len(call.args) == 1
                and not isinstance(call.args[0], ast.Starred) and not call.keywords):
            self.refuse(node, snippet(node), f"write {ONE_ARGUMENT_ONLY[name]} (its other "
                        f"arguments reach objects' namespaces by name)")

    def check_definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        in_class = isinstance(self.parent.get(id(node)), ast.ClassDef)
        if is_dunder(node.name) and not (in_class and node.name in ALLOWED_DUNDER_METHODS):
            self.refuse(node, f"def {node.name}", "Python, PyTorch or numpy call it behind your "
                        "back (only construction, printing, containers, comparisons and "
                        "arithmetic in a class); write a plain method")

    def check_string_annotation(self, node: ast.Constant) -> None:
        """A string annotation is code that ``get_type_hints`` (in ``singledispatch``, too)
        evaluates: it may name types only, under the rules of the file's own code."""
        try:
            inner = ast.parse(node.value.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # not an expression: evaluating it fails before it runs anything
        if any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)) for n in ast.walk(inner)):
            return self.refuse(node, one_line(repr(node.value), 40), "an annotation names "
                               "types only")
        self.found += [replace(found, line=node.lineno) for found in Checker(
            ast.Module([ast.Expr(inner.body)], []), self.path, {}).run()]


def check_source(source: str | bytes, path: str,
                 forbidden: Mapping[str, Sequence[str]] = {}) -> list[Violation]:  # noqa: B006
    """Every rule over source text or bytes (``path`` only labels the violations)."""
    name = Path(path).name
    try:
        tree = ast.parse(source, filename=name)
        return Checker(tree, path, forbidden).run()
    except SyntaxError as error:
        text = one_line(error.text or "", 60)
        return [Violation(path, error.lineno or 1, None, one_line(
            f"this line is not valid Python: {error.msg}{f' (`{text}`)' if text else ''}; "
            f"fix it so the file runs"), unreadable=True)]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, deep nesting
        return [Violation(path, 1, None, one_line(
            f"{name} cannot be read as Python ({error}); simplify the file"), unreadable=True)]


def check_file(path: Path, forbidden: Mapping[str, Sequence[str]] = {}  # noqa: B006
               ) -> list[Violation]:
    """Every rule over one file; ``forbidden``: ``{"2.1": ("softmax",)}``. A link (to the
    reference?), a FIFO (it would block) or a huge file is one violation, never read."""
    path = Path(path)
    try:
        mode, size = (info := path.lstat()).st_mode, info.st_size
        why = (f"{path.name} is a symbolic link; put the file itself in the folder"
               if stat.S_ISLNK(mode) else f"{path.name} is not a regular file"
               if not stat.S_ISREG(mode) else f"{path.name} has {size:,} bytes; an exercise file "
               f"must be under {MAX_SOURCE_BYTES:,}" if size > MAX_SOURCE_BYTES else None)
        return ([Violation(str(path), 1, None, why)] if why else
                check_source(path.read_bytes(), str(path), forbidden))
    except OSError as error:
        return [Violation(str(path), 1, None, one_line(
            f"{path.name} cannot be read: {error.strerror or error}"), unreadable=True)]


def check_folder(folder: Path, forbidden_by_chapter: Mapping[
        int, Mapping[str, Sequence[str]]] = {}) -> dict[int, list[Violation]]:  # noqa: B006
    """Every chapter file at the top of ``folder`` (``chNN_*.py``, what the worker loads), with
    its chapter's forbidden names, keyed by chapter; paths read ``exercises/ch02_attention.py``."""
    folder, found = Path(folder), {}
    for path in sorted(folder.glob("ch*.py")):
        if (match := CHAPTER_FILE.match(path.name)) and (violations := [
                replace(v, path=f"{folder.name}/{path.name}") for v in check_file(
                    path, forbidden_by_chapter.get(int(match["chapter"]), {}))]):
            found[int(match["chapter"])] = violations
    return found
