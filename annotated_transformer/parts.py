"""Where each chapter's parts come from.

A *source* is where one chapter's file is read from, and a :class:`Parts` is made of
sources, one per chapter (``--parts`` on the command line and in the grader names the
source of every chapter). A source is ``"solutions"`` (the reference), ``"exercises"``
(the learner's), ``"fast"`` (the reference on PyTorch's fused kernels,
:mod:`annotated_transformer.fast_parts`), or a folder holding ``chNN_*.py`` files (a
submission elsewhere, freshly generated stubs). Anything is looked up by the name the
syllabus gives it::

    parts = Parts.reference().with_chapter(4, "exercises")  # my masks, reference rest
    pe = parts.PositionalEncoding(d_model=64)               # chapter 1, from solutions
    batch = parts.make_batch(src, tgt, pad_id)              # chapter 6, with my masks
    parts.module(4).padding_mask                            # chapter 4's own function

A part means the parts it came from, wherever it is used. Chapter files reach earlier
chapters through :func:`active_parts` (the one name of this module they may import), and
``parts.X`` is bound to ``parts`` (:func:`bind`): a class is a subclass of the chapter's
class, with its name, whose construction runs under ``use_parts(parts)``, so a layer binds
that ``MultiHeadAttention`` when it is built and keeps it wherever the model later runs;
a function is a :class:`BoundFunction` whose calls run under ``use_parts(parts)``, so
``parts.make_batch`` takes its masks from ``parts``. No ``with`` block is needed, and one
around them changes nothing: ``Parts.reference().X`` is always the reference. A
chapter's module itself (``parts.module(4)``, or ``import solutions.ch05_layers``) is
not bound: its classes and functions use the active parts, those of the innermost
``with use_parts(...)`` block, or the reference outside any. That is how the grading
worker runs a learner's chapter on the learner's earlier chapters.

Why bound parts, and not the alternatives:

- Parts passed explicitly to every constructor (``EncoderLayer(..., parts=parts)``)
  would change the syllabus's signatures, which the learners write and the tests check.
- A constructor-like proxy (an object whose call builds the chapter's class under the
  block) would not be a class: ``issubclass``, ``class Mine(parts.EncoderLayer)`` and
  ``isinstance`` (without a hook) would fail. A bound class is a class: ``isinstance``
  with the chapter's class holds, ``repr`` and state-dict names are the chapter's,
  ``parts.X is parts.X`` (one class per part and equal parts), and ``copy.deepcopy``
  and ``pickle`` of a model name the chapter's class and the parts, which rebuild it.
- What this costs: ``type(module) is chapter.X`` is false (``isinstance`` is the test),
  and each call of a bound function sets a context variable. Inside ``torch.compile``
  that is left out (setting one breaks the graph); what a forward pass calls (chapter 2's
  attention, bound to its module when it was built) reads no parts while it runs. A
  module's methods run under whatever parts are active: modules bind their parts in
  ``__init__``, as the syllabus asks.

A student release of the course (``python -m annotated_transformer release``) has no
``solutions/`` and no fast parts: there every chapter the reference would give comes
from ``exercises/`` instead, and the first such :class:`Parts` warns once that it does.
"""

from __future__ import annotations

import ast
import contextlib
import copyreg
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, SupportsIndex

import torch

from annotated_transformer import student_release
from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    PACKAGE_DIR,
    PARTS_PACKAGES,
    SOLUTIONS_DIR,
)
from annotated_transformer.sources import Source, Word

# The course's folders of chapter files, imported as packages of these names from the
# repository (never installed: ``pyproject.toml`` installs ``annotated_transformer`` alone).
PACKAGES = {"solutions": SOLUTIONS_DIR, "exercises": EXERCISES_DIR}
NAMED = {word: f"{PACKAGE_DIR.name}.{folder.name}"  # more sources that are packages
         for word, folder in PARTS_PACKAGES.items()}
class SourcePolicy:
    """The one hook of the parts registry: a process-wide rule about sources that a tool
    installs (:func:`install_policy`) before any chapter file is imported.

    The grading worker installs one
    (:mod:`annotated_transformer.course.grading.worker.confinement`)
    so that every source means the learner's folder and the chapter files that broke the
    rules are never imported. With none installed, a source means what it names (and, in a
    student release, the reference means ``exercises``:
    :mod:`annotated_transformer.student_release`).
    """

    def only_source(self) -> str | None:
        """The source that every source means in this process, or None (each its own)."""
        return None

    def check(self, chapter: int | None) -> None:
        """Raise (an ``ImportError``) if ``chapter``'s file may not be imported here; called
        before a chapter file is imported, and with None before a name that no chapter
        exports is refused."""


_POLICY: list[SourcePolicy] = [SourcePolicy()]


def install_policy(policy: SourcePolicy) -> None:
    """Install ``policy`` for the rest of this process (once: a second one is refused)."""
    if type(_POLICY[0]) is not SourcePolicy:
        raise RuntimeError("a source policy is already installed in this process")
    _POLICY[0] = policy
    for cached in (has_reference, chapter_files, name_index, load_chapter):
        cached.cache_clear()


@cache
def has_reference() -> bool:
    """Whether the reference solutions are here (False in a student release and in a
    grading worker)."""
    return _POLICY[0].only_source() is None and SOLUTIONS_DIR.is_dir()


def _resolve(source: str) -> str:
    """``source``, or what the installed policy makes of it; the reference means
    ``exercises`` in a student release."""
    only = _POLICY[0].only_source()
    if only is not None:
        return only
    if source != "solutions" or has_reference():
        return source
    return student_release.reference_is_missing()


def _source_dir(source: str) -> Path:
    """The folder that holds a source's chapter files (see :mod:`annotated_transformer.sources`
    for what each word means)."""
    parsed = Source.parse(source)
    if parsed.word is Word.VARIANTS:
        raise ValueError("'variants' are the graded tests' wrong and right answers, graded "
                         "by the graded tests only; they are not parts to build a model from")
    source = parsed.word.value if parsed.folder is None else str(parsed.folder)
    if source in PACKAGES:
        if not PACKAGES[source].is_dir():
            raise ModuleNotFoundError(
                f"this copy of the course has no {source}/ folder beside "
                f"annotated_transformer/ (install the course with `pip install -e .` from "
                f"the repository root)")
        return PACKAGES[source]
    if source in NAMED:
        spec = importlib.util.find_spec(NAMED[source])
        if spec is None and not has_reference():
            raise ModuleNotFoundError(
                f"the {source!r} parts are not in a student release of the course (they "
                f"build on the reference solutions); use them in the course's repository"
            )
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(
                f"the package {source!r} is not importable; install the course with "
                f"`pip install -e .` from the repository root"
            )
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(source)


@cache
def chapter_files(source: str) -> Mapping[int, Path]:
    """``{chapter number: file}`` for every ``chNN_*.py`` of a source."""
    files = {}
    for path in sorted(_source_dir(source).glob("ch*.py")):
        match = CHAPTER_FILE.match(path.name)
        if match:
            files[int(match["chapter"])] = path
    return MappingProxyType(files)


def _exported_names(path: Path) -> list[str]:
    """The names in a file's ``__all__``, read without importing it (it may be broken: then
    none)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


@cache
def name_index() -> Mapping[str, int]:
    """``{public name: chapter}`` for every exercise, from the reference files' ``__all__``."""
    index: dict[str, int] = {}
    only = _POLICY[0].only_source()
    if only is not None:  # a grading worker: the learner's folder is the only source there is
        sources = [only]
    else:
        sources = [s for s, folder in PACKAGES.items() if folder.is_dir()]
    for source in sources:  # the reference first; the stubs carry the same names
        for chapter, path in chapter_files(source).items():
            for name in _exported_names(path):
                index.setdefault(name, chapter)
    return MappingProxyType(index)


@cache
def load_chapter(source: str, chapter: int) -> ModuleType:
    """Import (once) chapter ``chapter``'s module from ``source``."""
    source = _POLICY[0].only_source() or source
    _POLICY[0].check(chapter)
    files = chapter_files(source)
    if chapter not in files:
        raise LookupError(
            f"{source!r} has no file for chapter {chapter} (ch{chapter:02d}_*.py)"
        )
    path = files[chapter]
    if source in PACKAGES:
        _import_course_package(source)
    if source in PACKAGES or source in NAMED:
        return importlib.import_module(f"{NAMED.get(source, source)}.{path.stem}")
    # A folder: a module name of its own, so that it never shadows the packages. Compiled
    # from the source itself, never from a cached .pyc beside it (which could differ).
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(f"_parts_{tag}_{path.stem}", path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def _import_course_package(name: str) -> None:
    """Make ``name`` (``solutions`` or ``exercises``) mean the course's folder of that name
    in this process: imported by its path, so that it needs no installing and no
    particular working directory. Another package of that name already imported here is
    an ``ImportError`` naming both."""
    folder = PACKAGES[name]
    module = sys.modules.get(name)
    if module is not None:
        if folder.resolve() in {Path(p).resolve() for p in getattr(module, "__path__", [])}:
            return
        raise ImportError(
            f"another package named {name!r} is imported in this process (from "
            f"{getattr(module, '__file__', None) or module!r}); the course's {folder} cannot "
            f"be loaded beside it")
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


@dataclass(frozen=True)
class Parts:
    """One source per chapter: ``default`` unless ``chapters`` names another.

    In a student release, ``"solutions"`` (given or by default) becomes ``"exercises"``.
    """

    default: str = "solutions"
    chapters: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", _resolve(self.default))
        chapters = {chapter: _resolve(source) for chapter, source in self.chapters.items()}
        object.__setattr__(self, "chapters", MappingProxyType(chapters))

    def __reduce__(self) -> tuple[Any, ...]:  # copy.deepcopy and pickle of a model
        return (Parts, (self.default, dict(self.chapters)))

    def __hash__(self) -> int:  # equal parts share their bound classes (see bind)
        return hash((self.default, tuple(sorted(self.chapters.items()))))

    @classmethod
    def reference(cls) -> Parts:
        """Every chapter from ``solutions`` (from ``exercises`` in a student release)."""
        return cls("solutions")

    @classmethod
    def learner(cls) -> Parts:
        """Every chapter from ``exercises``: the learner's own model."""
        return cls("exercises")

    def with_chapter(self, chapter: int, source: str) -> Parts:
        """A copy in which ``chapter`` comes from ``source``."""
        return Parts(self.default, {**self.chapters, chapter: source})

    def source(self, chapter: int) -> str:
        return self.chapters.get(chapter, self.default)

    def module(self, chapter: int) -> ModuleType:
        """Chapter ``chapter``'s module, from its source."""
        return load_chapter(self.source(chapter), chapter)

    def get(self, name: str) -> Any:
        """A part by its syllabus name (``"MultiHeadAttention"``), from its chapter's source,
        bound to these parts (see the module's docstring): a function runs, and a class is
        built, as if inside ``with use_parts(self):``."""
        if name not in name_index():
            _POLICY[0].check(None)  # a name from a chapter file that could not be read
            raise AttributeError(f"no chapter exports a part named {name!r}")
        return bind(getattr(self.module(name_index()[name]), name), self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.get(name)

    def describe(self) -> str:
        """One line: where each chapter comes from."""
        rest = f"{self.default} for every other chapter" if self.chapters else self.default
        named = ", ".join(f"chapter {c}: {s}" for c, s in sorted(self.chapters.items()))
        return f"{named}; {rest}" if named else rest


_ACTIVE: ContextVar[Parts | None] = ContextVar("annotated_transformer_parts", default=None)


def active_parts() -> Parts:
    """The parts that modules built now take their pieces from: those of the innermost
    ``with use_parts(...)`` block, of the bound part being built or run, or else the
    reference."""
    active = _ACTIVE.get()
    return Parts.reference() if active is None else active


@contextlib.contextmanager
def use_parts(parts: Parts) -> Iterator[Parts]:
    """Build modules from ``parts`` inside this block."""
    token = _ACTIVE.set(parts)
    try:
        yield parts
    finally:
        _ACTIVE.reset(token)


is_compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)
"""Whether ``torch.compile`` is tracing this call (older PyTorch: never)."""


def bind(part: Any, parts: Parts) -> Any:
    """``part`` bound to ``parts``: what :meth:`Parts.get` hands out.

    A class becomes a subclass of itself whose construction runs under
    ``use_parts(parts)``; a function (any other callable) a :class:`BoundFunction` whose
    calls do; anything else stays as it is. A part already bound to other parts is bound
    afresh. The same ``part`` and equal ``parts`` give the same object every time.
    """
    if isinstance(part, BoundFunction) or (isinstance(part, type)
                                           and "_bound_to" in vars(part)):
        part = part.__wrapped__
    return _bind(part, parts) if callable(part) else part


@cache
def _bind(part: Callable[..., Any], parts: Parts) -> Any:
    return _bound_class(part, parts) if isinstance(part, type) else BoundFunction(part, parts)


class BoundFunction:
    """A function part that runs with the parts it came from (``parts.make_batch``).

    Calling it calls ``__wrapped__`` under ``use_parts(parts)``. Inside ``torch.compile``
    the block is left out (a ``ContextVar`` cannot be set in a traced graph): a forward
    pass calls only parts that read no other parts while they run (chapter 2's attention,
    bound to its module when the module was built).
    """

    def __init__(self, function: Callable[..., Any], parts: Parts) -> None:
        functools.update_wrapper(self, function)  # __name__, __doc__, __wrapped__, ...
        self.parts = parts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return self.__wrapped__(*args, **kwargs)
        token = _ACTIVE.set(self.parts)
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    def __reduce__(self) -> tuple[Any, ...]:  # pickle of a module that holds one
        return (bind, (self.__wrapped__, self.parts))

    def __repr__(self) -> str:
        return f"<function {self.__qualname__} from parts {self.parts.describe()!r}>"


def _bound_class(cls: type, parts: Parts) -> type:
    """A subclass of ``cls`` that builds its instances under ``use_parts(parts)``, with
    ``cls``'s name, so that ``isinstance``, ``repr`` and state-dict names are ``cls``'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        token = _ACTIVE.set(parts)
        try:
            cls.__init__(self, *args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Pickle (and ``copy.deepcopy``) name ``cls`` and ``parts``, not this class, which
        exists only in this process."""
        reduced = cls.__reduce_ex__(self, protocol)
        if (type(self) is not bound or not isinstance(reduced, tuple)
                or reduced[0] is not copyreg.__newobj__ or reduced[1] != (bound,)):
            return reduced  # a subclass of ours, or an unusual reduction: as it is
        return (_new_bound, (cls, parts), *reduced[2:])

    namespace = {
        "__init__": __init__, "__reduce_ex__": __reduce_ex__, "__doc__": cls.__doc__,
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__wrapped__": cls, "_bound_to": parts,
    }
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = getattr(cls.__init__, "__doc__", None)
    bound = type(cls)(cls.__name__, (cls,), namespace)
    return bound


def _new_bound(cls: type, parts: Parts) -> Any:
    """An empty instance of ``cls`` bound to ``parts`` (pickle fills in its state)."""
    bound = bind(cls, parts)
    return bound.__new__(bound)
