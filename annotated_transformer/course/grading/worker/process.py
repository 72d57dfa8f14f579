"""The worker: the only process in which a learner's code runs while it is graded.

Started by :mod:`annotated_transformer.course.grading.supervisor`, one per source under test. It
only computes: it receives a *probe* (a function of a graded test file, named by file
and name) and its arguments, runs it with the chapter module under test, and sends back
what came out (tensors, numbers, state dicts) or what went wrong. It never decides a
verdict and never writes a report: the trusted grader compares what it receives with
what it computes itself.

Before any learner code is imported the worker lowers its own limits (no file may grow, no
core dump, a ceiling on memory), can drop to an unprivileged user, confines the parts
registry to the learner's folder and installs an audit hook (:func:`audit_hook_factory`).
While a probe of an exercise that asks the learner to write an op runs (the chapter's
import included), only elementary aten ops are allowed at PyTorch's dispatch level,
whatever name reached them (:mod:`.allowed_ops`): a first line, for the learner's message.
Nothing here is a guarantee: the learner's code can undo anything in this process, which is
why the boundary around it (:mod:`~annotated_transformer.course.grading.boundary`) and the
verdict outside it are what the grade rests on.

Usage (by the supervisor): ``python -I -B -c BOOT ROOT CONFIG`` (``supervisor.WORKER_BOOT``)
where CONFIG is a :class:`~.protocol.WorkerConfig` (its JSON); :class:`~.protocol.Request`
frames arrive on stdin, :class:`~.protocol.Reply` frames go to the descriptor that was
stdout; what the learner's code prints goes to stderr, and so does the stack of every
thread on SIGUSR1 (the supervisor asks for it to name the line of an endless loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import resource
import signal
import sys
import traceback
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from typing import Any

from annotated_transformer.course.grading.protocol import (
    STAND_IN,
    STAND_INS,
    Ended,
    Reply,
    Request,
    WorkerConfig,
    cut,
)
from annotated_transformer.course.grading.worker import (
    allowed_ops,
    calls,
    standins,
    switches,
    trusted,
)
from annotated_transformer.sources import VARIANT

# Modules an exercise file may import (grading/source_rules.py), and what probes use.
PRELOADED = ("math", "typing", "collections.abc", "dataclasses", "functools", "itertools",
             "numbers", "numpy", "torch.nn.functional", "torch.autograd.functional",
             "annotated_transformer.batch", "annotated_transformer.model",
             "annotated_transformer.train", "annotated_transformer.data")


def _text(error: BaseException) -> str:
    """``str(error)``, or a note when the exception cannot be printed."""
    try:
        return cut(str(error))
    except BaseException:  # noqa: BLE001 - a learner's __str__ may raise anything
        return f"<a {type(error).__name__} whose message cannot be printed>"


FILE_LIMIT = 16 * 2**20  # bytes any file the worker writes may reach (PyTorch needs a few)


def limit_resources(memory_bytes: int) -> None:
    """Small files only (a longer write fails), no core dumps, bounded address space.
    The worker's home and temporary folder are deleted with it; with a ``user`` the rest
    of the disk is read-only to it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for which in (resource.RLIMIT_DATA, resource.RLIMIT_CPU):  # the graded tests' own bounds
        resource.setrlimit(which, (resource.getrlimit(which)[1],) * 2)  # (engine), not ours
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def drop_privileges(user: str) -> None:
    """Become ``user`` (for example ``nobody``): the course and the reports, owned by
    another user, are then read-only to the learner's code."""
    import pwd

    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (512, 512))  # threads count too


# What no exercise needs, refused in the worker by an audit hook, and why (the reason a
# learner reads, after "the grading worker refuses EVENT: ").
REFUSED_EVENTS = {
    "gc.get_objects": "it lists every object of the process, the grader's own included",
    "gc.get_referrers": "it leads to the grader's own objects",
    "gc.get_referents": "it leads to the grader's own objects",
    "sys._current_frames": "it leads to the grader's own frames",
    "sys.settrace": "a trace function runs inside the grader's code and rewrites its frames",
    "sys.setprofile": "a profile function runs inside the grader's code",
    "sys.addaudithook": "the grader's audit hook is the only one",
    "function.__new__": "a function rebuilt from another's code would run it with your names",
    "code.__new__": "it makes or changes code at run time, which no exercise needs",
}


def audit_hook_factory():
    """``(hook, settrace)``: a PEP 578 audit hook, and the one ``sys.settrace`` it lets
    through (the worker's own, :mod:`.calls`). Installed after the grader's own set-up,
    before any learner code, the hook refuses the events no honest exercise raises:
    :data:`REFUSED_EVENTS`, every ``ctypes.*`` event (``ctypes`` reads and writes any
    memory) and a function's ``__code__`` set (``f.__code__ = g.__code__``). A refusal is a
    ``RuntimeError`` with a one-line reason, raised where the learner's code made the call:
    the learner reads it as an error of the exercise. (No grader code of the worker raises
    one of them past its set-up: measured over the whole course and its right variants.)

    Its limits: it cannot be removed, but it stops nothing that raises no event (a cell's
    ``cell_contents`` set, ``__closure__``, ``f_back`` and ``f_locals`` read, code that
    writes its process's memory by a road other than ``ctypes``); a second hook of the
    learner's is not added, silently (Python suppresses a ``RuntimeError`` there). Left
    allowed because honest code needs them: ``compile`` and ``exec`` (a dataclass or a
    namedtuple is made by ``exec``), ``sys._getframe`` (the dispatch guard calls it on every
    op; ``typing`` and ``namedtuple`` call it), and ``object.__getattr__`` (the guard reads
    a frame's ``f_code``, the worker a traceback's ``tb_frame``). Those roads rest on the
    source rules (no ``sys``, no names with double underscores)."""
    refused, error, text, set_trace = dict(REFUSED_EVENTS), RuntimeError, str, sys.settrace
    tracing = [False]  # while the worker's own settrace runs

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in refused:
            if event == "sys.settrace" and tracing[0]:
                return
            raise error(f"the grading worker refuses {event}: {refused[event]}")
        if event[:7] == "ctypes.":
            raise error(f"the grading worker refuses {event}: ctypes reads and writes the "
                        f"process's memory, the grader's included")
        if event == "object.__setattr__" and text(args[1]) == "__code__":
            raise error("the grading worker refuses setting a function's __code__: it would "
                        "run another's code with your names")

    def settrace(function: Any) -> None:
        tracing[0] = True
        try:
            set_trace(function)
        finally:
            tracing[0] = False

    return hook, settrace


# ---------------------------------------------------------------- running a probe


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.learner_dir = config.learner_dir.resolve() if config.learner_dir else None
        sys.path.insert(0, str(config.tests_dir))  # checks.py, the probes' modules
        if self.learner_dir is None:  # the course's own variants/ (not in a release)
            sys.path.append(str(config.variants_dir))
        self.test_modules: dict[str, ModuleType] = {}
        import torch  # imported before any learner code, then watched

        # torch.func's vmap registers its decompositions (a torch.library of aten kernels)
        # at its first call: done now, before the switches are sealed, so that a learner's
        # torch.func is judged by the ops it runs, not refused as a switch.
        try:
            from torch._functorch.predispatch import lazy_load_decompositions
        except ImportError:  # another PyTorch, which registers them elsewhere or not at all
            pass
        else:
            lazy_load_decompositions()

        # What the grader's stand-ins for the earlier exercises an exercise builds on compute
        # with ops the guard refuses (grading.worker.standins), made now; the stand-ins
        # themselves are made for each request that is handed them, and revoked when it
        # ends. Each notes here that it ran, or that it was called once revoked.
        self.stood_in: list[str] = []
        self.kept: list[tuple[str, str]] = []  # (the stand-in's exercise, the test's)
        self._computed, entries, inner = trusted.computations()
        # The guard of a probe, built now, before any learner code, and held here only: an
        # exercise file that replaces a name of this module or of allowed_ops changes nothing.
        # It exempts the ops that the computations' own code objects call.
        self._guard = allowed_ops.guard_factory(entries, inner)
        # Then every other way to the mode stacks is taken away (grading.worker.switches): a call
        # of one is recorded here, and the probe that made it is refused.
        self.attempts: list[str] = []
        switches.seal(self.attempts)
        self._plain = plain_factory()  # the reply's conversion, bound before learner code too
        torch.set_num_threads(1)  # its time limit counts CPU seconds: one core is enough
        # Installed by main() once the worker's set-up is done (it makes no grader call fail).
        self.audit_hook, self._settrace = audit_hook_factory()

        from annotated_transformer import parts
        from annotated_transformer.course.grading.worker import confinement

        if self.learner_dir is not None:  # every source, the reference included, is its folder
            parts.install_policy(confinement.Confinement(
                self.learner_dir, config.blocked))
        self.parts = parts
        for name in PRELOADED:  # what an exercise file may import, loaded once, up front
            try:
                importlib.import_module(name)
            except ImportError:
                pass

    def chapter_module(self, source: str, chapter: int, stand_ins: dict[str, Any]
                       ) -> tuple[ModuleType, Any]:
        """The chapter module under test and the parts its code builds with: those of
        other chapters named in ``stand_ins`` (``{name: stand-in}``) are the stand-ins."""
        parts = self.parts
        if source.startswith(VARIANT) and self.learner_dir is None:  # Source's text of one
            import variants

            module = variants.load(chapter, source.removeprefix(VARIANT))
            return module, isolated(parts.Parts("solutions", {chapter: "solutions"}),
                                    stand_ins)
        if self.learner_dir is not None:
            built = parts.Parts(str(self.learner_dir))
        else:
            built = parts.Parts(source)
        return built.module(chapter), isolated(built, stand_ins)

    def probe(self, path: str, name: str) -> Any:
        if path not in self.test_modules:
            module_name = Path(path).stem
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            self.test_modules[path] = module
        target: Any = self.test_modules[path]
        for part in name.split("."):
            target = getattr(target, part)
        return target

    def handle(self, request: Request) -> Reply:
        import torch

        from annotated_transformer.course.grading.worker.confinement import BlockedChapter
        from annotated_transformer.parts import use_parts

        probe = self.probe(request.file, request.function)
        seen = calls.Observed(request.observe, self._settrace)  # the chapters' functions
        # (grading.worker.calls), for an exercise that builds on others
        guarded = self._guard(request.forbid_ops, request.exercise) if (
            request.forbid_ops) else None
        hits: list[str] = guarded[1] if guarded is not None else []
        switched, ran, kept = len(self.attempts), len(self.stood_in), len(self.kept)
        made, revoke = standins.build(self._computed, self.stood_in.append, self.kept.append,
                                      str(request.exercise)) if request.standins else ({}, None)
        stand_ins = {STAND_INS[e]: made[e] for e in request.standins if e in made} if made else {}
        patched: dict[str, Any] = {}  # the chapter module's own names, while it runs
        # The guard is on before the chapter module is imported and stays on until the
        # reply is plain data: whatever the learner's code runs (its import, the probe, an
        # exception's message) runs under it. What that import changes (the default dtype,
        # grad mode, the random state) is reset before the probe runs.
        with guarded[0] if guarded is not None else contextlib.nullcontext():
            try:
                module, built = self.chapter_module(request.source, request.chapter, stand_ins)
                patched = {name: module.__dict__[name] for name in stand_ins
                           if name in module.__dict__}
                module.__dict__.update({name: stand_ins[name] for name in patched})
                torch.set_default_dtype(torch.float32)
                torch.set_grad_enabled(True)
                torch.manual_seed(request.seed)
                random.seed(request.seed)
                with use_parts(built), seen:
                    value = probe(module, **request.kwargs)
                try:
                    reply = Reply(value=self._plain(value))
                except TypeError as error:
                    reply = unsendable(error)
            except BlockedChapter as error:
                reply = Reply(Ended.BLOCKED, message=_text(error))
            except BaseException as error:  # noqa: BLE001 - the learner's code may raise anything
                reply = self.describe(error, request.chapter)
            finally:
                if revoke is not None:
                    revoke()
                module_dict = module.__dict__ if patched else {}
                module_dict.update(patched)
            called = seen.names() + [STAND_IN + e for e in dict.fromkeys(
                self.stood_in[ran:])]  # the stand-ins it called: what a note may name
        own = request.exercise in self.stood_in[ran:]
        revoked = self.kept[kept:]
        del self.stood_in[ran:], self.kept[kept:]
        forbidden = ""
        if len(self.attempts) > switched:
            forbidden = (f"your code reached {self.attempts[switched]}, which turns the "
                         f"grader's check of PyTorch's ops off; an answer never needs it")
        elif revoked:
            exercise, owner = revoked[0]
            forbidden = (f"your code ran the grader's stand-in for exercise {exercise} "
                         f"({STAND_INS[exercise]}), which a test of exercise {owner} "
                         f"was handed and your code kept: a stand-in serves only the test it "
                         f"is handed to (ask active_parts() for a part where you use it, and "
                         f"keep none)")
        elif own:
            forbidden = (f"your code ran the grader's stand-in for exercise "
                         f"{request.exercise} while that exercise was graded; write it "
                         f"yourself")
        elif hits and hits[0] == allowed_ops.TAMPERED:
            forbidden = f"your code reached {hits[0]}; an answer never needs them"
        elif hits:
            at = f" (at {reply.where})" if reply.where and "ForbiddenOpUsed" in reply.types else ""
            forbidden = (f"Exercise {request.exercise} may not use PyTorch's {hits[0]}{at}: "
                         f"write it yourself with elementary tensor operations (see the "
                         f"docstring)")
        if forbidden:
            reply = Reply(Ended.FORBIDDEN, message=forbidden)
        return dataclasses.replace(reply, called=tuple(called))

    def describe(self, error: BaseException, chapter: int | None = None) -> Reply:
        """What the grader needs to tell the learner about an exception: its types, its
        message, whether it is an untouched stub's (:func:`is_stub`), and where: the
        innermost line of the learner's files, and, when that is in another chapter's file,
        the line of chapter ``chapter``'s file (the one graded) that led there."""
        where = ""
        frames = traceback.extract_tb(error.__traceback__)
        if isinstance(error, SyntaxError) and error.filename:
            where = f"{Path(error.filename).name}:{error.lineno}"
        learner = [(Path(frame.filename).name, frame.lineno) for frame in frames
                   if self.learner_dir is not None
                   and Path(frame.filename).resolve().is_relative_to(self.learner_dir)]
        if learner:
            name, line = learner[-1]
            graded = f"ch{chapter:02d}_" if isinstance(chapter, int) else None
            callers = [f for f in learner if graded and f[0].startswith(graded)]
            where = f"{name}:{line}" + (f", called from {callers[-1][0]}:{callers[-1][1]}"
                                        if callers and callers[-1][0] != name else "")
        return Reply(Ended.RAISED, message=_text(error), where=where,
                     stub=is_stub(error, frames[-1].filename if frames else ""),
                     types=tuple(cls.__name__ for cls in type(error).__mro__))


_NOT_IMPLEMENTED = NotImplementedError  # the built-in, held before any learner code runs


def is_stub(error: BaseException, raised_in: str) -> bool:
    """Whether ``error`` is a release stub's (``raise NotImplementedError("Exercise 2.1:
    softmax is not implemented yet")``, :mod:`~annotated_transformer.course.authoring.stubs`),
    raised in the file ``raised_in``: exactly the built-in class, raised by a chapter file,
    with a stub's words. A subclass or a class of that name is the learner's own exception,
    an error (which blames it for what later parts do) and never a stub (which is not to
    blame); PyTorch's own ``NotImplementedError`` is an error too."""
    text = _text(error)
    return (type(error) is _NOT_IMPLEMENTED and Path(raised_in).name.startswith("ch")
            and text.startswith("Exercise ") and "is not implemented yet" in text)


def unsendable(error: BaseException) -> Reply:
    """The reply for a result that is not plain data."""
    return Reply(Ended.RAISED, message=f"the result could not be sent back to the grader: "
                                       f"{_text(error)}", types=("TypeError",))


def isolated(built: Any, stand_ins: dict[str, Any]) -> Any:
    """``built`` (a ``Parts``) whose parts named in ``stand_ins`` are those stand-ins."""
    if not stand_ins:
        return built
    if not _ISOLATED:
        _ISOLATED.append(_isolated_parts_class())
    return _ISOLATED[0](built.default, dict(built.chapters), tuple(sorted(stand_ins.items())))


_ISOLATED: list[type] = []


def _isolated_parts_class() -> type:
    import dataclasses

    from annotated_transformer.parts import Parts

    @dataclasses.dataclass(frozen=True)
    class IsolatedParts(Parts):
        """Parts whose names in ``stand_ins`` are the grader's stand-ins."""

        stand_ins: tuple[tuple[str, Any], ...] = ()

        def __hash__(self) -> int:
            return hash((super().__hash__(), tuple(n for n, _ in self.stand_ins)))

        def get(self, name: str) -> Any:
            for known, stand_in in self.stand_ins:
                if known == name:
                    return stand_in
            return super().get(name)

    return IsolatedParts


def plain_factory():
    """A function ``plain(value)``: ``value`` as plain data (what a frame may carry). It
    accepts only what the learner's code cannot attach code to: tensors of exactly
    ``torch.Tensor`` or ``nn.Parameter`` (no subclass), ``None``, numbers, strings, dtypes,
    sizes and devices, and lists, tuples and dicts of exactly those types; tensors come back
    detached, on the CPU and cloned, through functions held since before any learner code
    ran (no method of the value is looked up). Anything else is a ``TypeError`` naming it."""
    import torch

    tensor_types = (torch.Tensor, torch.nn.Parameter)
    detach, to, clone, as_tensor = (torch.Tensor.detach, torch.Tensor.to, torch.Tensor.clone,
                                    torch.Tensor.as_subclass)
    atoms = (bool, int, float, complex, str, torch.dtype)
    type_of, integer, listed, text = type, int, list, str

    def plain(value: Any) -> Any:
        of = type_of(value)
        if of in tensor_types:
            return clone(as_tensor(to(detach(value), "cpu"), torch.Tensor))
        if value is None or of in atoms:
            return value
        if of is torch.Size:
            return tuple(integer(n) for n in tuple.__iter__(value))
        if of is torch.device:
            return text(value)
        if of is dict or of is OrderedDict:  # a state dict is an OrderedDict
            return {plain(key): plain(item) for key, item in dict.items(value)}
        if of is listed or of is tuple:
            items = [plain(item) for item in listed.__iter__(value)] if of is listed else [
                plain(item) for item in tuple.__iter__(value)]
            return tuple(items) if of is tuple else items
        raise TypeError(f"a {of.__name__} is not plain data (tensors, numbers, strings, lists, "
                        f"tuples and dicts of them, none of a subclass)")

    return plain


def main() -> int:
    import faulthandler

    from annotated_transformer.course.grading import protocol

    config = WorkerConfig.from_wire(sys.argv[-1])  # after the folder the grader put on the path
    replies = os.fdopen(os.dup(1), "wb")
    requests = os.dup(0)
    os.dup2(2, 1)  # the learner's print() goes where the sandbox bounds it
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    limit_resources(config.memory_bytes)
    worker = Worker(config)  # PyTorch and the tests imported: no learner code has run yet
    if config.user:
        import torch

        protocol.decode(protocol.encode({"ready": torch.zeros(1)}))  # load what replies need
        drop_privileges(config.user)
    # No thread or process of its own from here on (the guard is per thread): worker.switches
    refused = None if config.new_tasks else switches.forbid_new_tasks()
    if refused is not None:
        print(f"grading worker: {refused}; threads are not refused", file=sys.stderr)
    handle = worker.handle  # bound now: a learner's change to the class changes nothing
    sys.addaudithook(worker.audit_hook)  # the last of the grader's set-up: no learner code yet
    protocol.write_frame(replies, protocol.READY)
    while True:
        try:
            request = Request.from_wire(protocol.read_frame(requests))
        except EOFError:
            return 0
        except protocol.ProtocolError as error:  # nothing to answer: the grader says so
            print(f"grading worker: a request that cannot be read: {error}", file=sys.stderr)
            return 2
        reply = handle(request)
        for stream in (sys.stdout, sys.stderr):  # what it printed goes out before the reply
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a learner may have replaced or closed them
                pass
        try:
            protocol.write_frame(replies, reply.to_wire())
        except Exception as error:  # noqa: BLE001 - e.g. a value that is not plain data
            protocol.write_frame(replies, unsendable(error).to_wire())
