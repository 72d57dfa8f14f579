"""What an exercise file may name (annotated_transformer.course.grading.source_rules): each
rule refuses, at its line and with advice, the attack it is there for; every honest file of
the course (the solutions, the stubs and every correct variant, as the learner's file it
stands for) passes; what the rules leave to the runtime passes them, and the test that shows
the runtime refusing it is named beside it."""

from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
import types
import warnings
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from annotated_transformer.course.grading import source_rules
from annotated_transformer.course.grading.source_rules import (
    Violation,
    check_file,
    check_folder,
    check_source,
)
from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    ROOT,
    SOLUTIONS_DIR,
    chapter_test_files,
)

import variants

# Our own forbidden names (the graded test files own the real ones; they are used below too).
FORBIDDEN = {"2.1": ("softmax", "Softmax"), "4.2": ("generate_square_subsequent_mask",)}
PARTS = "from annotated_transformer.parts import active_parts\n"


def check(code: str, forbidden=FORBIDDEN) -> list[Violation]:
    return check_source(code, "exercises/ch02_attention.py", forbidden)


@functools.cache
def real_forbidden() -> dict[int, dict[str, tuple[str, ...]]]:
    """``{chapter: FORBIDDEN}`` of the graded test files, read without importing them."""
    from annotated_transformer.course.grading.dependencies import constants

    found = {}
    for chapter, path in chapter_test_files().items():
        forbidden = constants(ast.parse(path.read_text())).get("FORBIDDEN")
        if forbidden is not None:
            found[chapter] = forbidden
    return found


# ------------------------------------------------------------------ each rule, its attack

# (rule: the attack it stops, code, line, exercise, a fragment of the message)
REFUSED = [
    # The import allow-list: the collector's list of objects holds the worker's own objects
    # (the worker's audit hook refuses it too; book/instructor.md, "what it cannot stop");
    # sys, importlib, ctypes are as near.
    ("imports: gc finds the guard's exemption", "import gc\nfound = gc.get_objects()\n", 1,
     None, "`import gc` is not allowed"),
    ("imports: an internal submodule of torch", "from torch._C import _set_dispatch_mode\n", 1,
     None, "`_C`"),
    ("imports: the course's other names", "from annotated_transformer.parts import Parts\n", 1,
     None, "import only torch"),
    ("imports: a helper file the rules never read", "from . import helper\n", 1, None,
     "import only torch"),
    ("imports: names not named", "from torch import *\n", 1, None, "by name"),
    ("imports: a standard module libraries hand out", "import torch\nmods = torch.sys.modules\n",
     2, None, "`sys` is a module of Python's standard library"),
    # Names that turn strings into code or names, past every other rule.
    ("builtins: code from a string", "def f(x):\n    return eval('x.softmax(-1)')\n", 2, None,
     "runs or builds code from a string"),
    ("builtins: a name from a string", "import torch\nsm = getattr(torch, 'soft' + 'max')\n", 2,
     None, "looks names up by strings"),
    ("builtins: a class built from a dict of strings",
     "M = type('M', (), {'__torch_function__': print})\n", 1, None, "`type` is not allowed"),
    ("builtins: a shadowing parameter elsewhere", "def f(getattr):\n    return getattr\n\n"
     "getattr(f, 'x')\n", 2, None, "or rename your own `getattr`"),
    ("dunder names: the builtins module", "b = __builtins__\n", 1, None,
     "names with double underscores"),
    ("dunder attributes: a stand-in's closure", "def f(softmax):\n    return softmax.__closure__\n",
     2, None, "attributes with double underscores"),
    ("dunder attributes: object's own setattr",
     "class A:\n    def f(self):\n        object.__setattr__(self, 'x', 1)\n", 3, None,
     "double underscores"),
    ("frames: the grader's frame above a generator",
     "def g():\n    yield 1\n\nf = g().gi_frame.f_back.f_globals\n", 4, None, "frames"),
    ("special methods: a hook on every PyTorch call", "class A:\n    @classmethod\n"
     "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n        pass\n", 3,
     None, "behind your back"),
    ("special methods: raw memory for numpy", "class A:\n    @property\n"
     "    def __array_interface__(self):\n        return {}\n", 3, None, "behind your back"),
    ("special methods: a module's attribute hook", "def __getattr__(name):\n    return name\n",
     1, None, "behind your back"),
    ("metaclass: code run when a class is built",
     "from torch import nn\n\nclass M(nn.Module, metaclass=Meta):\n    pass\n", 3, None,
     "metaclass"),
    ("names by strings: string annotations evaluated",
     "import typing\n\ndef f(x: 'int'):\n    pass\n\nhints = typing.get_type_hints(f)\n", 6, None,
     "looks names up or sets attributes by strings"),
    ("names by strings: a module namespace merged",
     "import functools\nimport torch\n\ndef f():\n    pass\n\n"
     "functools.update_wrapper(f, torch.cuda.is_available, updated=('__glo' + 'bals__',))\n", 7,
     None, "by strings"),
    ("names by strings: copy's reducers set any attribute",
     "import torch\ntorch.nn.modules.transformer.copy.dispatch_table[object] = print\n", 2, None,
     "by strings"),
    ("names by strings: a dataclass with a dunder field",
     "import dataclasses\nA = dataclasses.make_dataclass('A', [('__array_interface__', dict)])\n",
     2, None, "by strings"),
    ("one argument: deepcopy's memo keeps every original",
     "import copy\n\ndef f(x, memo):\n    return copy.deepcopy(x, memo)\n", 4, None,
     "write `copy.deepcopy(x)`"),
    ("one argument: wraps copies a namespace by name",
     "from functools import wraps\n\ndef f(g, h):\n    return wraps(g, (), ('__globals__',))(h)\n",
     4, None, "write `@functools.wraps(function)`"),
    ("one argument: deepcopy handed on", "from copy import deepcopy\ncopier = deepcopy\n", 2,
     None, "write `copy.deepcopy(x)`"),
    ("one argument: deepcopy renamed", "from copy import deepcopy as dc\n", 1, None,
     "import it by its own name"),
    ("string annotations: code in a string",
     "x: \"__import__('os').system('ls')\" = 1\n", 1, None, "an annotation names types only"),
    ("string annotations: a module in a string", "import torch\n\nx: 'torch.sys' = 1\n", 3, None,
     "`sys` is a module"),
    ("private names: PyTorch's switches",
     "import torch\npop = torch._C._pop_torch_dispatch_stack\n", 2, None,
     "is an internal of PyTorch's"),
    ("private names: a library's, on self too", "import torch\n\nclass A:\n"
     "    def __init__(self):\n        self._C = None\n\n    def g(self):\n"
     "        return self._C\n\nA.g(torch)\n", 8, None, "is an internal of PyTorch's"),
    ("private names: on what is not self", "def g(parts):\n    return parts._source\n", 2,
     None, "names starting with `_` are internals"),
    ("dunder attributes: a name set", "def f():\n    pass\n\nf.__name__ = 'exempt'\n", 4, None,
     "double underscores"),
    # Files: what the code writes in the worker's /tmp and loads again would run unread.
    ("files: a file written", "import numpy as np\nnp.frombuffer(b'import gc', np.uint8)"
     ".tofile('/tmp/evil.py')\n", 2, None, "writes or loads files"),
    ("files: a file read through numpy's records",
     "import numpy.ma.mrecords\nf = numpy.ma.mrecords.openfile('/proc/self/mountinfo')\n", 2,
     None, "writes or loads files"),
    ("files: a pickle runs what it names",
     "import torch\nw = torch.load('/tmp/w.pt', weights_only=False)\n", 2, None,
     "writes or loads files"),
    ("files: a hubconf.py imported unread",
     "import torch\nm = torch.hub.load('/tmp/d', 'm', source='local')\n", 2, None,
     "writes or loads files"),
    ("native code: a library of one's own", "import torch\ntorch.ops.load_library('/tmp/x.so')\n",
     2, None, "`torch.ops` is not allowed"),
    ("native code: PyTorch's compiler", "import torch\nf = torch.compile(print)\n", 2, None,
     "PyTorch's compiler and dispatcher"),
    ("native code: numpy's unchecked strides",
     "from numpy.lib.stride_tricks import as_strided\n", 1, None, "`lib`: it reaches native"),
    ("native code: torch.utils, code from a string in its benchmark", "import torch\nnn = torch\n"
     "t = nn.utils.benchmark.Timer('import gc').timeit(1)\n", 3, None, "`nn.utils` is not allowed"),
    ("native code: torch.utils imported", "import torch.utils.benchmark\n", 1, None,
     "`utils`: it reaches native code"),
    ("match: a class pattern reads a dunder", "match f:\n    case object(__globals__=g):\n"
     "        pass\n", 2, None, "double underscores"),
    # An exercise's forbidden names: PyTorch's causal mask is triu and full, ops an honest
    # 4.2 uses too, so the dispatch guard cannot refuse it; reading the file does.
    ("forbidden: PyTorch's causal mask for 4.2",
     "from torch import nn\n\nmask = nn.Transformer.generate_square_subsequent_mask(3)\n", 3,
     "4.2", "exercise 4.2 asks you to write generate_square_subsequent_mask yourself"),
    ("forbidden: by a class pattern", "from torch import nn\n\nmatch nn.Transformer:\n"
     "    case object(generate_square_subsequent_mask=m):\n        pass\n", 4, "4.2",
     "exercise 4.2"),
    ("forbidden: through a fake active_parts", "from torch import nn\n\ndef active_parts():\n"
     "    return nn.Transformer\n\nm = active_parts().generate_square_subsequent_mask(3)\n", 6,
     "4.2", "exercise 4.2"),
    ("forbidden: a parts name rebound", PARTS + "from torch import nn\n\nparts = active_parts()\n"
     "parts = nn.Transformer\nm = parts.generate_square_subsequent_mask(3)\n", 6, "4.2",
     "exercise 4.2"),
    ("forbidden: an exception named like the parts", PARTS + "parts = active_parts()\ntry:\n"
     "    pass\nexcept Exception as parts:\n    parts.generate_square_subsequent_mask\n", 6, "4.2",
     "exercise 4.2"),
]


@pytest.mark.parametrize(("code", "line", "exercise", "fragment"),
                         [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_each_rule_refuses_its_attack_at_its_line(code, line, exercise, fragment):
    found = check(code)
    matching = [v for v in found if v.line == line and v.exercise == exercise
                and fragment in v.message]
    assert matching, f"expected line {line}, exercise {exercise}, '{fragment}'; got {found}"
    for violation in found:  # one line that says what is not allowed and what to do
        assert "\n" not in violation.message and len(violation.message) <= 200
        assert "not allowed" in violation.message, violation.message


def test_a_forbidden_name_counts_for_every_exercise_that_lists_it():
    found = check("import torch\ny = torch.softmax(torch.zeros(2))\n",
                  {"2.1": ("softmax",), "2.2": ("softmax",)})
    assert sorted(v.exercise for v in found) == ["2.1", "2.2"]
    assert all(v.line == 2 and "`active_parts().softmax`" in v.message for v in found)


# ------------------------------------------------------------------ what the runtime refuses

# Code the rules leave to a layer that watches it run, with the test that shows that layer
# refusing it (with the rules off, or with code that passes them).
LEFT_TO_THE_RUNTIME = [
    # The dispatch guard: tests/grading/test_allowed_ops.py,
    # test_a_plain_cross_entropy_is_allowed_where_the_smoothing_is_not.
    ("a forbidden keyword", "import torch.nn.functional as F\n"
     "loss = F.cross_entropy(x, y, label_smoothing=0.1)\n"),
    # The worker seeds each call: tests/grading/test_grading_security.py, "pin the seed".
    ("the global generator", "import torch\ntorch.manual_seed(0)\n"),
    # Confinement: the learner's own parts whatever is asked (tests/grading/test_sandbox.py,
    # test_the_reference_is_out_of_reach; tests/grading/test_boundary.py).
    ("the parts' other methods", PARTS + "ref = active_parts().reference()\n"),
    # A name is a string; reading one is harmless.
    ("a class's name", "def f(x):\n    return x.__class__.__name__, f.__qualname__\n"),
]


@pytest.mark.parametrize("code", [c for _, c in LEFT_TO_THE_RUNTIME],
                         ids=[name for name, _ in LEFT_TO_THE_RUNTIME])
def test_what_the_runtime_refuses_is_not_repeated(code):
    assert check(code, {}) == []


# ------------------------------------------------------------------ what an honest file may do

GOOD = [
    ("the allowed imports", "from __future__ import annotations\n\nimport math\nimport itertools\n"
     "import functools\nimport numbers\nimport typing\nimport collections.abc\n"
     "from collections.abc import Callable\nfrom dataclasses import dataclass, field\n"
     "from typing import Optional\n\nimport numpy as np\nimport torch\n"
     "import torch.nn.functional as F\nfrom torch import Tensor, nn\nfrom torch.nn import "
     "functional\nimport torch.nn.init as init\nfrom torch.distributions import Categorical\n\n"
     "from annotated_transformer.batch import Batch\n" + PARTS),
    ("The Annotated Transformer's clones", "import copy\nfrom copy import deepcopy\n\n"
     "from torch import nn\n\ndef clones(module, N):\n"
     "    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])\n\n"
     "def shallow_and_deep(module):\n    return copy.copy(module), deepcopy(module)\n"),
    ("own parts by the forbidden name", PARTS + "\ndef softmax(x, dim=-1):\n    return x\n\n"
     "y = softmax(1)\nz = active_parts().softmax(1)\nparts = active_parts()\n"
     "w = parts.generate_square_subsequent_mask(3)\n"),
    ("super, private names and special methods of one's own", "from torch import nn\n\n"
     "class A(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        nn.Module.__init__(self)\n        self._cache = {}\n\n    @classmethod\n"
     "    def make(cls):\n        return cls._build()\n\n    @staticmethod\n"
     "    def _build():\n        return 1\n\n    def __repr__(self):\n"
     "        return f'{self.__class__.__name__}()'\n\n    def __radd__(self, other):\n"
     "        return self\n\n    def __getitem__(self, i):\n        return self._cache[i]\n"),
    ("module dunders", "__all__ = ['f']\n\nif __name__ == '__main__':\n    print(1)\n"),
    ("type in annotations", "from torch import nn\n\ndef f(cls: type[nn.Module]) -> type:\n"
     "    return cls\n\nx: type = int\n"),
    ("tensor methods named like a standard module", "import numpy as np\nimport torch\n\n"
     "def f(x, m):\n    return (torch.select(x, 0, 1), x.chunk(2), np.array([1.0]).copy(),\n"
     "            torch.trace(m), x.type(torch.float64))\n"),
    ("nn.utils: tensor utilities", "import torch\nimport torch.nn as tnn\nfrom torch import nn\n"
     "from torch.nn.utils.rnn import pad_sequence\nfrom torch.nn import utils\n\n"
     "def clip(model, rows):\n    nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
     "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
     "    return tnn.utils.rnn.pad_sequence(rows), pad_sequence(rows), utils.rnn\n"),
    ("a dataclass", "from dataclasses import dataclass, field\n\n@dataclass(frozen=True)\n"
     "class Hyp:\n    score: float\n    tokens: list = field(default_factory=list)\n\n"
     "    def __post_init__(self):\n        pass\n"),
    ("a string annotation naming a type", "from torch import Tensor\n\n"
     "def f(x: 'Tensor', y: 'list[int] | None' = None) -> 'Tensor':\n    return x\n"),
    ("match statements", "def f(x):\n    match x:\n        case (a, b):\n            return a\n"
     "        case {'k': v, **rest}:\n            return v\n        case int(n) if n > 0:\n"
     "            return n\n"),
    ("functools.wraps as a decorator", "import functools\n\ndef deco(g):\n"
     "    @functools.wraps(g)\n    def inner(*a):\n        return g(*a)\n\n    return inner\n"),
    ("a docstring that names what is not allowed", "def f():\n"
     "    \"\"\"Do not call torch.softmax, open() or eval here; see torch.load.\"\"\"\n"),
]


@pytest.mark.parametrize("code", [case[1] for case in GOOD], ids=[case[0] for case in GOOD])
def test_honest_code_passes(code):
    assert check(code) == []


def test_every_solution_and_stub_passes_with_the_graded_forbidden_names():
    forbidden = real_forbidden()
    assert forbidden  # the graded tests declare some
    for folder in (SOLUTIONS_DIR, EXERCISES_DIR):
        assert sorted(folder.glob("ch*.py"))
        assert check_folder(folder, forbidden) == {}, folder


# ------------------------------------------------------------------ the correct variants


def _learner_form(node: ast.stmt) -> ast.stmt:
    """The definition as a learner would write it: no decorator, and a class built with
    ``type(name, bases, {})`` (a variants-module shortcut) written as a class statement."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args:
        built = node.value.args[0]
        if (isinstance(built, ast.Call) and isinstance(built.func, ast.Name)
                and built.func.id == "type"):
            return ast.ClassDef(name=node.targets[0].id, bases=list(built.args[1].elts),
                                keywords=[], body=[ast.Pass()], decorator_list=[],
                                type_params=[])
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        node.decorator_list = [d for d in node.decorator_list if not _is_variant_decorator(d)]
    return node


def _is_variant_decorator(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("right", "wrong"))


def _variant_call(node: ast.stmt) -> ast.Call | None:
    """The ``right(...)``/``wrong(...)`` call that registers this definition, if any."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return next((d for d in node.decorator_list if _is_variant_decorator(d)), None)
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and _is_variant_decorator(node.value.func)):
        return node.value.func
    return None


class _ThroughParts(ast.NodeTransformer):
    """``from solutions.chNN import x`` (the variants module's way to the reference) becomes
    ``x = active_parts().x``, the way a learner's file takes a part."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | list[ast.stmt]:
        if not (node.module or "").startswith("solutions"):
            return node
        return [ast.parse(f"{a.asname or a.name} = active_parts().{a.name}").body[0]
                for a in node.names]


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def right_variant_files() -> list[tuple[str, int, str]]:
    """``(variant, chapter, source)``: each correct variant as the learner's file it stands
    for, built as tests/variants/__init__.py's ``load`` builds it (the reference chapter with
    one name replaced), with the helpers it uses from its variants module."""
    made = []
    for path in sorted((ROOT / "tests" / "variants").glob("ch*.py")):
        chapter = int(path.stem.removeprefix("ch"))
        solution = next(SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py")).read_text()
        tree = _ThroughParts().visit(ast.parse(path.read_text()))
        imports = [n for n in tree.body if isinstance(n, ast.Import) or (
            isinstance(n, ast.ImportFrom) and n.module not in ("__future__", "variants"))]
        defined = {name: n for n in tree.body if (name := _defined_name(n))}
        for node in tree.body:
            call = _variant_call(node)
            if call is None or call.func.id != "right":
                continue
            name, replaces = _defined_name(node), call.args[1].value
            helpers = _helpers_of(node, defined)
            body = [*imports, *helpers, _learner_form(node)]
            source = (f"{solution}\n\nfrom annotated_transformer.parts import active_parts\n"
                      f"{ast.unparse(ast.Module(body=body, type_ignores=[]))}\n\n"
                      f"{replaces} = {name}\n")
            made.append((name, chapter, source))
    return made


def _helpers_of(node: ast.stmt, defined: dict[str, ast.stmt]) -> list[ast.stmt]:
    """The module-level definitions a variant uses, directly or through each other."""
    wanted: list[str] = []
    todo = [node]
    while todo:
        for inner in ast.walk(todo.pop()):
            if (isinstance(inner, ast.Name) and inner.id in defined
                    and inner.id not in wanted and defined[inner.id] is not node):
                wanted.append(inner.id)
                todo.append(defined[inner.id])
    order = list(defined)
    return [_learner_form(defined[n]) for n in sorted(wanted, key=order.index)]


RIGHT_VARIANTS = right_variant_files()


def test_every_right_variant_is_found():
    registered = {(v.chapter, v.name) for chapter in range(1, 9)
                  for v in variants.for_chapter(chapter) if v.correct}
    assert {(chapter, name) for name, chapter, _ in RIGHT_VARIANTS} == registered
    assert {chapter for chapter, _ in registered} == set(range(1, 9))


@pytest.mark.parametrize(("name", "chapter", "source"), RIGHT_VARIANTS,
                         ids=[name for name, _, _ in RIGHT_VARIANTS])
def test_every_right_variant_passes_as_a_learner_file(name, chapter, source):
    compile(source, name, "exec")  # the file we built is Python
    found = check_source(source, f"exercises/ch{chapter:02d}_{name}.py",
                         real_forbidden().get(chapter, {}))
    assert found == []  # the whole file passes, for every exercise of its chapter


# ------------------------------------------------------------------ encodings and syntax


def write(tmp_path: Path, data: bytes, name: str = "ch02_attention.py") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_file_is_read_as_python_reads_it(tmp_path):
    """The rules read the tree that ``compile`` makes of the file's bytes (a coding cookie,
    a BOM), which is what the worker runs: no encoding shows them another text."""
    body = "x = 'é'\n"
    for data in (body.encode(), b"\xef\xbb\xbf" + body.encode(),
                 b"#!/usr/bin/env python\n# coding=utf8\n" + body.encode(),
                 b"# -*- coding: latin-1 -*-\n" + body.encode("latin-1")):
        assert check_file(write(tmp_path, data)) == []
    # In UTF-7, "+AG0-" is "m": Python reads torch.softmax where a UTF-8 reader does not.
    data = b"# coding: utf-7\nimport torch\ny = torch.soft+AG0-ax(torch.ones(2))\n"
    [violation] = check_file(write(tmp_path, data), FORBIDDEN)
    assert (violation.line, violation.exercise) == (3, "2.1")


def test_an_encoding_python_cannot_read_is_one_violation(tmp_path):
    for data in (b"# coding: rot13\nx = 1\n", b"# coding: no-such-codec\nx = 1\n",
                 b"\xef\xbb\xbf# coding: latin-1\nx = 1\n", b"x = 1\nname = 'caf\xe9'\n"):
        [violation] = check_file(write(tmp_path, data))
        assert "is not valid Python" in violation.message and violation.exercise is None


def test_a_syntax_error_is_one_violation_with_its_line_and_text(tmp_path):
    path = write(tmp_path, b"import torch\n\ndef softmax(x, dim=-1:\n    return x\n")
    [violation] = check_file(path, FORBIDDEN)
    assert (violation.line, violation.exercise) == (3, None)
    assert "this line is not valid Python: invalid syntax" in violation.message
    assert "def softmax(x, dim=-1:" in violation.message


def test_null_bytes_and_deep_nesting_are_reported_not_raised(tmp_path):
    assert check_file(write(tmp_path, b"x = 1\x00\n"))[0].exercise is None
    deep = "x = " + "+".join(["y"] * 50_000) + "\n"  # more than Python itself compiles
    [violation] = check_source(deep, "ch02_attention.py")
    assert violation.exercise is None and "simplify" in violation.message
    nested = "x = " + "(" * 400 + "1" + ")" * 400 + "\n"
    [violation] = check_source(nested, "ch02_attention.py")
    assert violation.exercise is None


def test_a_file_full_of_violations_gives_a_short_list():
    found = check("import os\n" * 500)
    assert len(found) == source_rules.MAX_VIOLATIONS
    assert found[-1].message.startswith("451 more things not allowed from line 50 on")


def test_links_fifos_and_huge_files_are_not_read(tmp_path):
    target = write(tmp_path, b"x = 1\n", "real.py")
    link = tmp_path / "ch02_attention.py"
    link.symlink_to(target)
    assert "symbolic link" in check_file(link)[0].message
    fifo = tmp_path / "ch03_multi_head.py"
    os.mkfifo(fifo)
    assert "not a regular file" in check_file(fifo)[0].message  # opening it would block
    huge = write(tmp_path, b"#" * (source_rules.MAX_SOURCE_BYTES + 1) + b"\n", "ch04_x.py")
    assert "must be under" in check_file(huge)[0].message


# ------------------------------------------------------------------ a folder


def test_the_chapter_files_of_the_folder_are_read_and_keyed_by_chapter(tmp_path):
    """What the worker loads, and nothing else: a chapter file at the top of the folder
    (a link to one is refused). A helper, a subfolder, bytecode or a native module is
    never loaded (an exercise file imports only the allow-list's modules, and a chapter
    is compiled from its own bytes), so it is not read."""
    folder = tmp_path / "exercises"
    (folder / "sub").mkdir(parents=True)
    (folder / "__pycache__").mkdir()
    (folder / "ch01_positional_encoding.py").write_text("import math\n")
    (folder / "ch02_attention.py").write_text("import torch\ny = torch.softmax(torch.ones(2))\n")
    (folder / "ch03_multi_head.py").symlink_to(SOLUTIONS_DIR / "ch03_multi_head.py")
    for other in ("helper.py", "sub/deep.py", "ch04_masking.pyc", "__pycache__/x.pyc"):
        (folder / other).write_text("import os\n")
    found = check_folder(folder, {2: {"2.1": ("softmax", "Softmax")}})
    assert set(found) == {2, 3}
    [chapter_two] = found[2]
    assert (chapter_two.path, chapter_two.line, chapter_two.exercise) == (
        "exercises/ch02_attention.py", 2, "2.1")
    assert "symbolic link" in found[3][0].message


# ------------------------------------------------------------------ as PyTorch changes


def _module_valued(module: types.ModuleType) -> list[tuple[str, types.ModuleType]]:
    """A module's public attributes that are modules."""
    with warnings.catch_warnings():  # some names are deprecated aliases that warn when read
        warnings.simplefilter("ignore")
        values = [(name, getattr(module, name, None)) for name in dir(module)
                  if not name.startswith("_")]
        return [(n, v) for n, v in values if isinstance(v, types.ModuleType)]


def test_every_module_that_pytorch_or_numpy_hands_out_is_refused():
    """``torch.os``, ``typing.stdlib_re``, ``torch.cuda.tunable.mp``: a module that is not
    PyTorch's or numpy's own, reached as an attribute of any of their modules (or of an
    allowed module), is refused by its name, whatever path leads to it."""
    for module in source_rules.IMPORTABLE:
        importlib.import_module(module)
    roots = {m.split(".")[0] for m in source_rules.IMPORTABLE}
    harmless = {"math", "cmath", "copy", "abc", "numbers", "itertools", "functools"}
    escapes = set()
    for module_name, module in list(sys.modules.items()):
        if (module_name.split(".")[0] not in roots or not isinstance(module, types.ModuleType)
                or any(part.startswith("_") for part in module_name.split("."))):
            continue
        for name, value in _module_valued(module):
            if (value.__name__ in harmless or value.__name__.split(".")[0] in ("torch", "numpy")
                    or value.__name__ in source_rules.IMPORTABLE):
                continue
            if not check(f"import torch\nx = torch.anything.{name}\n"):
                escapes.add(f"{module_name}.{name} = {value.__name__}")
    assert sorted(escapes) == []


def test_violations_are_frozen_records():
    violation = Violation("exercises/ch02_attention.py", 3, "2.1", "m")
    with pytest.raises(FrozenInstanceError):
        violation.line = 4
    assert violation.told() == "ch02_attention.py, line 3: m"
    assert CHAPTER_FILE.match("ch02_attention.py")
