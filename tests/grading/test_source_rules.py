"""What an exercise file may do (annotated_transformer.course.grading.source_rules): the tricks a
dishonest learner would try are each refused at the right line, with the right exercise and a
message a learner understands; every honest file of the course (the solutions, the stubs and
every correct variant, as the learner's file it stands for) passes."""

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

from annotated_transformer.course.grading.source_rules import (
    Violation,
    check_file,
    check_folder,
    check_source,
    rules,
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
FORBIDDEN = {"2.1": ("softmax", "Softmax", "softmin"), "2.2": ("scaled_dot_product_attention",),
             "6.2": ("label_smoothing=",)}


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


# ------------------------------------------------------------------ what is refused

# (id, code, line, exercise, a fragment of the message)
BAD = [
    ("getattr by a computed name",
     "import torch\n\ndef softmax(x, dim=-1):\n    return getattr(torch, 'soft' + 'max')(x)\n",
     4, None, "`getattr` is not allowed"),
    ("eval", "def softmax(x, dim=-1):\n    return eval('x.softmax(dim)')\n", 2, None,
     "runs code from a string"),
    ("exec", "exec('import os')\n", 1, None, "`exec` is not allowed"),
    ("compile builtin", "code = compile('1', 'f', 'eval')\n", 1, None, "`compile` is not allowed"),
    ("__import__", "os = __import__('os')\n", 1, None, "`__import__` is not allowed"),
    ("import os", "import math\nimport os\n", 2, None, "`import os` is not allowed"),
    ("import subprocess", "import subprocess\n", 1, None, "`import subprocess` is not allowed"),
    ("import importlib", "import importlib\n", 1, None, "`import importlib` is not allowed"),
    ("import sys", "import sys\nsys.modules['torch']\n", 1, None, "`import sys`"),
    ("import inside a function", "def f():\n    import ctypes\n", 2, None, "`import ctypes`"),
    # The guard lives in the worker's process: the collector's list of objects holds its
    # own functions (book/instructor.md, "what it cannot stop").
    ("the guard found by the garbage collector", "import gc\nfound = gc.get_objects()\n", 1,
     None, "`import gc` is not allowed"),
    ("a stand-in's closure", "def f(softmax):\n    return softmax.__closure__\n", 2, None,
     "double underscores"),
    ("from torch import ops", "from torch import ops\n", 1, None, "operator dispatch"),
    ("torch.ops.aten",
     "import torch\n\ndef softmax(x, dim=-1):\n    return torch.ops.aten._softmax(x, dim, False)\n",
     4, None, "`torch.ops` is not allowed"),
    ("a private name of torch", "import torch\nC = torch._C\n", 2, None, "`torch._C`"),
    ("private attribute of a tensor", "def f(x):\n    return x._version\n", 2, None,
     "names starting with `_`"),
    # A name is never a key: `self` may be any object (torch itself, passed by the caller).
    ("self as a plain function's parameter", "import torch\n\ndef f(self):\n"
     "    return self._secret\n\nf(torch)\n", 4, None, "only `self._name` in a method"),
    ("self bound to torch", "import torch\n\nclass A:\n    def g(self):\n"
     "        self = torch\n        self._mine = 1\n        return self._mine\n", 7, None,
     "only `self._name` in a method"),
    ("a method given torch as self", "import torch\n\nclass A:\n"
     "    def __init__(self):\n        self._C = None\n\n    def g(self):\n"
     "        return self._C\n\nA.g(torch)\n", 8, None, "`_C` is one of them"),
    ("the dispatch stack through self", "class A:\n    def g(self):\n"
     "        return self._pop_torch_dispatch_stack()\n", 3, None, "is one of them"),
    ("a private name the class never sets", "class A:\n    def g(self):\n"
     "        return self._secret\n", 3, None, "for an attribute your class sets"),
    ("a standard module on self", "class A:\n    def g(self):\n"
     "        return self.builtins.exec\n", 3, None, "standard library"),
    ("dunder attributes", "def f(x):\n    return x.__class__.__bases__\n", 2, None,
     "double underscores"),
    ("function globals", "f = lambda: 0\ng = f.__globals__\n", 2, None, "double underscores"),
    ("__builtins__", "b = __builtins__\n", 1, None, "`__builtins__` is not allowed"),
    ("__file__", "where = __file__\n", 1, None, "`__file__` is not allowed"),
    ("nn.Softmax in 2.1", "import torch\n\ndef softmax(x, dim=-1):\n"
     "    return torch.nn.Softmax(dim=dim)(x)\n", 4, "2.1", "exercise 2.1"),
    ("module-level alias outside the function",
     "import torch\nsm = torch.softmax\n\ndef softmax(x, dim=-1):\n    return sm(x, dim)\n",
     2, "2.1", "asks you to write softmax yourself"),
    ("a related op", "import torch.nn.functional as F\n\ndef softmax(x, dim=-1):\n"
     "    return F.softmin(-x, dim)\n", 4, "2.1", "`F.softmin`"),
    ("tensor method", "def softmax(x, dim=-1):\n    return x.softmax(dim)\n", 2, "2.1",
     "`x.softmax`"),
    ("from torch import the op", "from torch.nn.functional import softmax as s\n", 1, "2.1",
     "from torch.nn.functional import softmax"),
    ("forbidden in a helper", "import torch.nn.functional as F\n\ndef _helper(q, k, v):\n"
     "    return F.scaled_dot_product_attention(q, k, v)\n", 4, "2.2", "exercise 2.2"),
    ("forbidden keyword", "import torch.nn.functional as F\nloss = F.cross_entropy(\n"
     "    x, y, label_smoothing=0.1)\n", 3, "6.2", "`label_smoothing=`"),
    ("forbidden keyword by **dict", "import torch.nn.functional as F\n"
     "loss = F.cross_entropy(x, y, **{'label_smoothing': 0.1})\n", 2, "6.2", "exercise 6.2"),
    ("open a file", "def f():\n    open('grade.json', 'w').write('{}')\n", 2, None,
     "reads and writes files"),
    ("standard module re-exported by torch", "import torch\ntorch.os.system('ls')\n", 2, None,
     "`os` is a module of Python's standard library"),
    ("sys through typing", "import typing\nmods = typing.sys.modules\n", 2, None,
     "`typing.sys`"),
    ("builtins through dataclasses", "import dataclasses\ndataclasses.builtins.print(1)\n", 2,
     None, "`builtins` is a module"),
    ("re-exported module by from-import", "from torch import os\n", 1, None,
     "`os` is a module"),
    ("generator frame", "def g():\n    yield 1\n\nf = g().gi_frame.f_back.f_locals\n", 4, None,
     "frames"),
    ("global RNG", "import torch\ntorch.manual_seed(0)\n", 2, None, "random number generator"),
    ("global RNG of every GPU", "import torch\ntorch.cuda.manual_seed_all(0)\n", 2, None,
     "random number generator"),
    ("torch.load", "import torch\nw = torch.load('weights.pt')\n", 2, None, "files"),
    ("torch.hub", "import torch\nm = torch.hub.load('x', 'y')\n", 2, None, "files"),
    ("torch.compile", "import torch\nf = torch.compile(print)\n", 2, None, "compiler"),
    ("torch.jit", "import torch\n\n@torch.jit.script\ndef f(x):\n    return x\n", 3, None,
     "`torch.jit`"),
    ("torch.utils", "import torch\nloader = torch.utils.data.DataLoader([])\n", 2, None,
     "processes or threads"),
    ("numpy file I/O", "import numpy as np\narr = np.load('expected.npy')\n", 2, None, "files"),
    ("numpy raw memory", "import numpy as np\nlib = np.ctypeslib\n", 2, None, "native code"),
    ("numpy submodule import", "from numpy.lib.stride_tricks import as_strided\n", 1, None,
     "`from numpy.lib.stride_tricks import ...` is not allowed here: `lib`"),
    ("torch submodule import", "import torch.utils.data\n", 1, None, "`utils`: it starts"),
    ("torch.utils through a name that is not torch.nn", "import torch\nnn = torch\n"
     "loader = nn.utils.data.DataLoader([])\n", 3, None, "processes or threads"),
    ("torch.utils by name", "from torch import utils\n", 1, None, "processes or threads"),
    ("private torch module", "from torch._refs import softmax\n", 1, None, "`_refs` is internal"),
    ("torch module re-exporting os", "import torch.os\n", 1, None, "`os` is a module"),
    ("the course's other names", "from annotated_transformer.parts import Parts\n", 1, None,
     "import only active_parts"),
    ("the course package", "from annotated_transformer import parts\n", 1, None,
     "`from annotated_transformer import ...`"),
    ("import the course module", "import annotated_transformer.parts\n", 1, None,
     "`import annotated_transformer.parts`"),
    ("the reference", "from solutions.ch02_attention import softmax\n", 1, None,
     "`from solutions.ch02_attention import ...`"),
    ("another exercise file", "from exercises import ch01_positional_encoding\n", 1, None,
     "`from exercises import ...`"),
    ("relative import", "from . import helper\n", 1, None, "relative imports"),
    ("star import", "from torch import *\n", 1, None, "name what you import"),
    ("the reference through parts", "from annotated_transformer.parts import active_parts\n"
     "ref = active_parts().reference()\n", 2, None, "`active_parts().reference`"),
    ("a chapter module through parts", "from annotated_transformer.parts import active_parts\n"
     "mod = active_parts().module(2)\n", 2, None, "take a part by its name"),
    ("a part by a computed name", "from annotated_transformer.parts import active_parts\n"
     "sm = active_parts().get('soft' + 'max')\n", 2, None, "take a part by its name"),
    ("a match capture named like the parts", "import torch.nn.functional as F\n"
     "from annotated_transformer.parts import active_parts\nparts = active_parts()\n"
     "match F:\n    case parts:\n        y = parts.softmax(x)\n", 6, "2.1", "exercise 2.1"),
    ("an exception named like the parts", "from annotated_transformer.parts import active_parts\n"
     "parts = active_parts()\ntry:\n    pass\nexcept Exception as parts:\n"
     "    parts.softmax\n", 6, "2.1", "exercise 2.1"),
    ("a fake active_parts", "import torch\n\ndef active_parts():\n    return torch\n\n"
     "y = active_parts().softmax(x)\n", 6, "2.1", "exercise 2.1"),
    ("type()", "from torch import nn\nM = type('M', (nn.Module,), {})\n", 2, None,
     "`type` is not allowed"),
    ("object's methods", "class A:\n    def f(self):\n        object.__setattr__(self, 'x', 1)\n",
     3, None, "double underscores"),
    ("type called in an annotation", "def f(x: type('X', (), {})):\n    pass\n", 1, None,
     "`type` is not allowed"),
    ("metaclass", "from torch import nn\n\nclass M(nn.Module, metaclass=Meta):\n    pass\n", 3,
     None, "metaclass"),
    ("__del__", "class A:\n    def __del__(self):\n        pass\n", 2, None, "behind your back"),
    ("__torch_function__", "class A:\n    @classmethod\n    def __torch_function__(cls):\n"
     "        pass\n", 3, None, "intercepts every PyTorch call"),
    ("module __getattr__", "def __getattr__(name):\n    return name\n", 1, None,
     "outside a class"),
    ("raw memory for numpy", "class A:\n    @property\n    def __array_interface__(self):\n"
     "        return {}\n", 3, None, "behind your back"),
    ("__reduce__", "class A:\n    def __reduce__(self):\n        return (print, ())\n", 2, None,
     "behind your back"),
    ("vars", "import torch\nns = vars(torch)\n", 2, None, "`vars` is not allowed"),
    ("globals", "g = globals()\n", 1, None, "`globals` is not allowed"),
    ("memoryview", "m = memoryview(b'x')\n", 1, None, "raw memory"),
    ("a shadowing parameter elsewhere does not help",
     "def f(open):\n    return open\n\nopen('x')\n", 4, None, "`open` is not allowed"),
    ("global declaration reaches the builtin",
     "def f():\n    global open\n    return open('x')\n", 3, None, "`open` is not allowed"),
    ("the class of something else", "def f(x):\n    return x.__class__.__name__\n", 2, None,
     "double underscores"),
    ("a class of self beyond its name", "class A:\n    def f(self):\n"
     "        return self.__class__.__mro__\n", 3, None, "double underscores"),
    ("a fake __class__", "class A:\n    @property\n    def __class__(self):\n"
     "        return int\n", 3, None, "behind your back"),
    ("__slots__ in a class", "class A:\n    __slots__ = ('x',)\n", 2, None, "`__slots__`"),
    ("__name__ outside the main guard", "name = __name__\n", 1, None, "`__name__`"),
    ("a class pattern reads an attribute", "import torch.nn.functional as F\n"
     "match F:\n    case object(softmax=sm):\n        pass\n", 3, "2.1", "exercise 2.1"),
    ("a class pattern reads a dunder", "match f:\n    case object(__globals__=g):\n"
     "        pass\n", 2, None, "double-underscore"),
    ("code in a string annotation", "x: \"__import__('os').system('ls')\" = 1\n", 1, None,
     "names types only"),
    ("numpy internals", "import numpy as np\nf = np.lib.stride_tricks.as_strided\n", 2, None,
     "`np.lib`"),
    # update_wrapper(f, g, updated=("__globals__",)) merges g's module namespace into the
    # exercise module, the attribute's name spelled as a string; what it brings in (os,
    # importlib) is then used by a name the file never binds.
    ("update_wrapper merges a module's namespace",
     "import functools\nimport torch\n\ndef f():\n    pass\n\n"
     "functools.update_wrapper(f, torch.cuda.is_available, assigned=(),\n"
     "                         updated=('__glo' + 'bals__',))\n", 7, None,
     "copies attributes by name"),
    ("update_wrapper imported", "from functools import update_wrapper\n", 1, None,
     "copies attributes by name"),
    ("wraps with updated=", "import functools\n\ndef f(g):\n"
     "    return functools.wraps(g, updated=('__globals__',))\n", 4, None,
     "this use of `wraps` is not allowed"),
    ("wraps with its other arguments by position", "from functools import wraps\n\n"
     "def f(g, h):\n    return wraps(g, (), ('__globals__',))(h)\n", 4, None,
     "this use of `wraps` is not allowed"),
    ("wraps handed on", "from functools import partial, wraps\nw = partial(wraps, assigned=())\n",
     2, None, "this use of `wraps` is not allowed"),
    ("a name from nowhere", "def softmax(x, dim=-1):\n    os.system('true')\n    return x\n", 2,
     None, "`os` is used but never defined"),
    ("wraps imported under another name", "from functools import wraps as w\n", 1, None,
     "import it by its own name"),
    # deepcopy's memo keeps every original it copied, each object's __dict__ among them.
    ("deepcopy given a memo", "import copy\n\ndef f(x, memo):\n"
     "    return copy.deepcopy(x, memo)\n", 4, None, "this use of `deepcopy` is not allowed"),
    ("deepcopy handed on", "from copy import deepcopy\ncopier = deepcopy\n", 2, None,
     "this use of `deepcopy` is not allowed"),
    ("deepcopy imported under another name", "from copy import deepcopy as dc\n", 1, None,
     "import it by its own name"),
    # copy sets a registered reducer's state with setattr, any name: Victim.__torch_function__.
    ("copy's dispatch table, through PyTorch", "import torch\n\nclass Victim:\n    pass\n\n"
     "def reducer(obj):\n    return (lambda: Victim, (), (None, {'__torch_function__': 1}))\n\n"
     "torch.nn.modules.transformer.copy.dispatch_table[object] = reducer\n", 9, None,
     "sets attributes by computed names"),
    ("copy's setattr helper through self", "import copy\n\nclass A:\n"
     "    def __init__(self):\n        self._reconstruct = None\n\n    def g(self, *args):\n"
     "        return self._reconstruct(*args)\n\nA.g(copy, 1, None, print, ())\n", 8, None,
     "`_reconstruct` is one of them"),
]


@pytest.mark.parametrize(("code", "line", "exercise", "fragment"),
                         [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_each_trick_is_refused_at_its_line(code, line, exercise, fragment):
    found = check(code)
    matching = [v for v in found if v.line == line and v.exercise == exercise
                and fragment in v.message]
    assert matching, f"expected line {line}, exercise {exercise}, '{fragment}'; got {found}"


@pytest.mark.parametrize("code", [case[1] for case in BAD], ids=[case[0] for case in BAD])
def test_messages_are_one_short_line(code):
    for violation in check(code):
        assert "\n" not in violation.message
        assert len(violation.message) <= 200, violation.message
        assert "not allowed" in violation.message or "not valid" in violation.message


def test_a_forbidden_name_counts_for_every_exercise_that_lists_it():
    found = check("import torch\ny = torch.softmax(torch.zeros(2))\n",
                  {"2.1": ("softmax",), "2.2": ("softmax",)})
    assert sorted(v.exercise for v in found) == ["2.1", "2.2"]
    assert all(v.line == 2 for v in found)


def test_each_rule_says_what_to_do_instead():
    says = {
        "getattr(x, 'a')\n": "write the attribute (x.name)",
        "def f(getattr):\n    pass\n\ngetattr(x, 'a')\n": "or rename your own `getattr`",
        "import os\n": "import only torch, numpy, math",
        "import torch\ny = torch.softmax(x)\n": "call your own function or "
                                               "`active_parts().softmax`",
        "def f(x):\n    return x._data\n": "use its public functions",
        "def f(x):\n    return x.__dict__\n": "only `super().__init__(...)`",
        "import torch\ntorch.manual_seed(0)\n": "compute with tensors only",
        "class A:\n    def __del__(self):\n        pass\n": "write a plain method",
        "class M(metaclass=Meta):\n    pass\n": "derive from nn.Module or nothing",
        "import torch\nt = torch.sys\n": "if it is your own attribute, rename it",
        "from . import helper\n": "keep helpers in the chapter file",
        "from torch import *\n": "name what you import",
        "from annotated_transformer.parts import active_parts\nactive_parts().get('x')\n":
            "take a part by its name",
        "x: 'f()' = 1\n": "an annotation names types only",
    }
    for code, advice in says.items():
        messages = " | ".join(v.message for v in check(code))
        assert advice in messages, (code, messages)


# ------------------------------------------------------------------ what an honest file may do

GOOD = [
    ("the allowed imports", "from __future__ import annotations\n\nimport math\nimport itertools\n"
     "import functools\nimport numbers\nimport typing\nimport collections.abc\n"
     "from collections.abc import Callable\nfrom dataclasses import dataclass, field\n"
     "from typing import Optional\n\nimport numpy as np\nimport torch\n"
     "import torch.nn.functional as F\nfrom torch import Tensor, nn\nfrom torch.nn import "
     "functional\n\nfrom annotated_transformer.batch import Batch\n"
     "from annotated_transformer.parts import active_parts\n"),
    ("imports inside a function", "def f():\n    import torch\n    from torch import nn\n"),
    ("The Annotated Transformer's clones", "import copy\nfrom copy import deepcopy\n\n"
     "from torch import nn\n\ndef clones(module, N):\n"
     "    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])\n\n"
     "def shallow_and_deep(module):\n    return copy.copy(module), deepcopy(module)\n"),
    ("nn.utils: tensor utilities", "import torch\nimport torch.nn as tnn\nfrom torch import nn\n"
     "from torch.nn.utils.rnn import pad_sequence\nfrom torch.nn import utils\n\n"
     "def pad(rows):\n    return (nn.utils.rnn.pad_sequence(rows), pad_sequence(rows),\n"
     "            torch.nn.utils.rnn.pad_sequence(rows), tnn.utils.clip_grad_norm_(rows, 1.0),\n"
     "            utils.rnn.pad_sequence(rows))\n"),
    ("public submodules of torch and numpy", "import torch.nn.init as init\n"
     "from torch.nn.init import xavier_uniform_\nimport numpy.linalg\n"
     "from torch.distributions import Categorical\n"),
    ("own softmax and parts", "from annotated_transformer.parts import active_parts\n\n"
     "def softmax(x, dim=-1):\n    return x\n\ny = softmax(1)\nz = active_parts().softmax(1)\n"
     "parts = active_parts()\nw = parts.softmax(1)\n"
     "attention = active_parts().scaled_dot_product_attention\n"),
    ("a parameter named like a builtin", "def forward(self, input, type=None, dir=1):\n"
     "    return input.exp(), type, dir\n\nf = lambda input: input + 1\n"
     "ys = [input for input in range(3)]\n"),
    ("classic super and Module.__init__", "from torch import nn\n\nclass LayerNorm(nn.Module):\n"
     "    def __init__(self):\n        super(LayerNorm, self).__init__()\n\n"
     "class B(nn.Module):\n    def __init__(self):\n        nn.Module.__init__(self)\n"
     "        super().__init__()\n        super().register_buffer('x', None)\n"),
    ("private names of one's own", "class A:\n    def __init__(self):\n        self._cache = {}\n"
     "        self.__private = 1\n\n    @classmethod\n    def make(cls):\n"
     "        return cls._build()\n\n    @staticmethod\n    def _build():\n        return 1\n\n"
     "    def __repr__(self):\n        return 'A'\n\n"
     "    def __len__(self):\n        return 0\n\n    def __call__(self, x):\n        return x\n"
     "\n    def __lt__(self, other):\n        return False\n\n    def __radd__(self, other):\n"
     "        return self\n\n    def __getitem__(self, i):\n        return i\n"),
    ("a class's name for a message", "class A:\n    def __repr__(self):\n"
     "        return f'{self.__class__.__name__}()'\n\n    @classmethod\n"
     "    def make(cls):\n        raise ValueError(f'{cls.__qualname__} needs x')\n"),
    ("module dunders allowed", "__all__ = ['f']\n__all__ += ['g']\n\n"
     "if __name__ == '__main__':\n    print(1)\n"),
    ("formatting", "a, b = 1, 2\ns = '{} has {:d} and {name!r}'.format(a, b, name='x')\n"
     "t = f'{a.real} {b!r:>{a}}'\nu = '%s' % a\n"),
    ("type in annotations", "from torch import nn\n\ndef f(cls: type[nn.Module]) -> type:\n"
     "    return cls\n\nx: type = int\n"),
    ("global and nonlocal, lambda, comprehension",
     "COUNT = 0\n\ndef f():\n    global COUNT\n    COUNT += 1\n    total = 0\n\n"
     "    def g():\n        nonlocal total\n        total += 1\n\n"
     "    return [lambda y: y * i for i in range(3)], {k: v for k, v in {}.items()}\n"),
    ("tensor methods that share a name with a standard module",
     "import numpy as np\nimport torch\n\ndef f(x, m):\n"
     "    return (torch.select(x, 0, 1), x.chunk(2), np.array([1.0]).copy(), torch.trace(m),\n"
     "            x.type(torch.float64), x.abs())\n"),
    ("own containers and tensors changed", "import torch\nfrom torch import nn\n\n"
     "def f(n):\n    x = torch.zeros(n)\n    x[0] = 1.0\n    x.requires_grad = True\n"
     "    rows = [x]\n    rows.append(x)\n    seen = dict()\n    seen['x'] = x\n"
     "    seen.update(y=x)\n    layers = nn.ModuleList()\n    layers.append(nn.Linear(2, 2))\n"),
    ("own attributes", "import torch\n\nclass A:\n    def __init__(self):\n"
     "        self.pending = []\n        self.softmax_scale = 1.0\n\ndef f():\n"
     "    w = torch.zeros(3)\n    w.requires_grad = True\n    w[0] = 1.0\n"
     "    b = A()\n    b.x = 1\n"),
    ("grad modes and errors", "import torch\n\n@torch.no_grad()\ndef f(x):\n"
     "    with torch.set_grad_enabled(False), torch.inference_mode():\n        pass\n"
     "    try:\n        pass\n    except (ValueError, Exception) as error:\n"
     "        raise ValueError(f'x={x}') from error\n"),
    ("object as a sentinel and a base", "MISSING = object()\n\nclass A(object):\n    pass\n"),
    ("dataclass", "from dataclasses import dataclass, field\n\n@dataclass(frozen=True)\n"
     "class Hyp:\n    score: float\n    tokens: list = field(default_factory=list)\n\n"
     "    def __post_init__(self):\n        pass\n"),
    ("keyword that is not forbidden", "import torch.nn.functional as F\n\n"
     "def loss(x, y):\n    return F.cross_entropy(x, y, ignore_index=0, reduction='sum')\n"),
    ("a string annotation naming a type", "from torch import Tensor\n\n"
     "def f(x: 'Tensor', y: 'list[int] | None' = None) -> 'Tensor':\n    return x\n"),
    ("match statements", "def f(x):\n    match x:\n        case (a, b):\n            return a\n"
     "        case {'k': v, **rest}:\n            return v\n        case int(n) if n > 0:\n"
     "            return n\n        case _:\n            return None\n"),
    ("functools.wraps as a decorator", "import functools\nfrom functools import wraps\n\n"
     "def deco(g):\n    @functools.wraps(g)\n    def inner(*a):\n        return g(*a)\n\n"
     "    @wraps(g)\n    def other(*a):\n        return g(*a)\n\n    return inner, other\n"),
    ("a docstring that names what is not allowed", "def f():\n"
     "    \"\"\"Do not call torch.softmax, open() or eval here; see torch.ops.\"\"\"\n"),
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


def test_a_forbidden_name_in_a_helper_is_charged_to_its_exercise():
    """A residual connection whose helper builds ``nn.LayerNorm``: in a learner's chapter 5
    file that is PyTorch's LayerNorm, which 5.1 asks the learner to write."""
    source = ("from torch import nn\n\n\nclass Residual(nn.Module):\n"
              "    def __init__(self, d_model):\n        super().__init__()\n"
              "        self.norm = nn.LayerNorm(d_model)\n")
    found = check_source(source, "exercises/ch05_layers.py", real_forbidden()[5])
    assert [(v.exercise, "`nn.LayerNorm`" in v.message) for v in found] == [("5.1", True)]


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
    assert len(found) == rules.MAX_VIOLATIONS
    assert found[-1].message.startswith("451 more things not allowed from line 50 on")


def test_links_fifos_and_huge_files_are_not_read(tmp_path):
    target = write(tmp_path, b"x = 1\n", "real.py")
    link = tmp_path / "ch02_attention.py"
    link.symlink_to(target)
    assert "symbolic link" in check_file(link)[0].message
    fifo = tmp_path / "ch03_multi_head.py"
    os.mkfifo(fifo)
    assert "not a regular file" in check_file(fifo)[0].message  # opening it would block
    huge = write(tmp_path, b"#" * (rules.MAX_SOURCE_BYTES + 1) + b"\n", "ch04_x.py")
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
    for module in rules.IMPORTABLE:
        importlib.import_module(module)
    roots = {m.split(".")[0] for m in rules.IMPORTABLE}
    harmless = {"math", "cmath", "copy", "abc", "numbers", "itertools", "functools"}
    escapes = set()
    for module_name, module in list(sys.modules.items()):
        if (module_name.split(".")[0] not in roots or not isinstance(module, types.ModuleType)
                or any(part.startswith("_") for part in module_name.split("."))):
            continue
        for name, value in _module_valued(module):
            if (value.__name__ in harmless or value.__name__.split(".")[0] in ("torch", "numpy")
                    or value.__name__ in rules.IMPORTABLE):
                continue
            if not check(f"import torch\nx = torch.anything.{name}\n"):
                escapes.add(f"{module_name}.{name} = {value.__name__}")
    assert sorted(escapes) == []


def test_violations_are_frozen_records():
    violation = Violation("exercises/ch02_attention.py", 3, "2.1", "m")
    with pytest.raises(FrozenInstanceError):
        violation.line = 4
    assert CHAPTER_FILE.match("ch02_attention.py")


@pytest.mark.parametrize(("chapter", "code", "exercises"), [
    (2, "import torch\n\ndef f(x):\n    return torch.logsumexp(x, -1)\n", {"2.1", "2.2"}),
    (2, "import torch\n\ndef f(p):\n    return torch.func.jacrev(torch.exp)(p)\n", {"2.3"}),
    (2, "import torch\n\ndef f(z):\n    return torch.autograd.grad(z.exp().sum(), z)\n", {"2.3"}),
    (3, "from torch import nn\n\nlayer = nn.Transformer(8, 2).encoder.layers[0]\n", {"3.3"}),
    (4, "from torch import nn\n\nmask = nn.Transformer.generate_square_subsequent_mask(3)\n",
     {"4.2"}),
    (5, "import torch.nn.functional as F\n\ndef f(x):\n    return F.rms_norm(x, (4,))\n",
     {"5.1"}),
    (5, "from torch import nn\n\nlayer = nn.TransformerEncoderLayer(8, 2)\n",
     {"5.1", "5.4", "5.5", "5.6", "5.7", "5.8"}),
], ids=["logsumexp", "jacrev", "autograd.grad", "nn.Transformer", "PyTorch's causal mask",
        "rms_norm", "PyTorch's encoder layer"])
def test_pytorchs_other_roads_to_a_result_are_refused_by_name(chapter, code, exercises):
    """The graded tests' forbidden names cover the roads the dispatch level cannot tell
    from an honest answer (a causal mask, rms_norm) and name the others early."""
    found = check_source(code, f"exercises/ch{chapter:02d}_x.py", real_forbidden()[chapter])
    assert {v.exercise for v in found} == exercises, found
