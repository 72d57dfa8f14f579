"""The door between the grader's two rooms: the messages between the trusted grader and
the worker that runs a learner's code, the one module of the grader that both import.

A message is a length-prefixed frame of plain data (tensors, numbers, strings, ``None``,
lists, tuples and dicts of them, dtypes and sizes), written by ``torch.save`` and read with
``torch.load(weights_only=True)``, which builds only those types: a hostile worker's frame
can carry wrong numbers but never run code in the grader. Every frame is bounded
(:func:`decode`); what crosses is typed and checked where it arrives (:class:`WorkerConfig`,
:class:`Request`, :class:`Reply`; else a :class:`ProtocolError`). Both sides also agree here
on how long a message may be (:func:`cut`) and which stand-ins a request may ask for
(:data:`STAND_INS`).
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from types import NoneType
from typing import Any, BinaryIO

# Bytes a frame may hold. The largest of the reference's whole course is 2.6 MB (a model's
# weights); the grader holds a few copies of a reply while it reads it, outside any cgroup.
MAX_FRAME = 32 * 2**20
# Lists, tuples, dicts and what they hold, each time it appears. The reference's whole course
# sends at most 618 in a message; a million took the grader 4 s to read.
MAX_ITEMS = 100_000
HEADER = struct.Struct(">Q")

# The most characters of a message that travels or is reported (the marker of the cut included):
# the worker cuts an exception's text to it, the grader what it records and reports.
MESSAGE_LIMIT = 2000


def cut(text: Any, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` (made a string) of at most ``limit`` characters: a longer one keeps its
    beginning and ends with ``[... cut: N characters]``; a lone surrogate (which no file
    can hold) becomes its escape."""
    text = str(text)
    if any("\ud800" <= c <= "\udfff" for c in text[:limit * 2]):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    keep = limit - len(f" [... cut: {len(text)} characters]")
    return f"{text[:keep]} [... cut: {len(text) - keep} characters]"


# The exercises whose stand-ins a request may ask for (its ``standins``: the grader's own
# versions of earlier exercises, :mod:`.worker.standins`), and the name each replaces in the chapter
# module under test.
STAND_INS = {
    "1.2": "PositionalEncoding", "1.3": "TokenEmbedding", "2.1": "softmax",
    "2.2": "scaled_dot_product_attention", "3.1": "split_heads", "3.2": "merge_heads",
    "3.3": "MultiHeadAttention", "4.1": "padding_mask",
    "4.2": "causal_mask", "4.3": "target_mask", "5.1": "LayerNorm",
    "5.2": "PositionwiseFeedForward", "5.3": "ResidualConnection", "5.4": "EncoderLayer",
    "5.5": "DecoderLayer", "5.6": "Encoder", "5.7": "Decoder", "6.2": "LabelSmoothingLoss",
}
# A reply's ``called`` names a stand-in that ran as this prefix and its exercise
# (``stand-in:3.3``): what a note about an earlier part may name (:mod:`.dependencies`).
STAND_IN = "stand-in:"


# The worker's first message: it has imported PyTorch and the tests, and no learner code has
# run yet (a failure before it is the grader's).
READY = {"ready": True}


class ProtocolError(RuntimeError):
    """A frame that is not a well-formed message (the worker died or misbehaved)."""


class Ended(str, Enum):
    """How a call the worker answered without a value ended."""

    RAISED = "raised"  # the code under test raised (its types, message, place)
    BLOCKED = "blocked"  # its chapter file may not be imported (a source rule)
    FORBIDDEN = "forbidden"  # it reached what an exercise may not use


@dataclass(frozen=True)
class Reply:
    """The worker's answer to one call: ``value``, the probe's result (plain data), when
    ``ended`` is None; else ``message``, and for :attr:`Ended.RAISED` the exception's
    ``types`` (most derived first), ``where`` (the learner's ``file:line``) and ``stub``
    (an untouched stub's ``NotImplementedError``, exactly the built-in:
    ``worker.process.is_stub``). ``called``: the chapters' functions its code entered
    (:mod:`.worker.calls`)."""

    ended: Ended | None = None
    value: Any = None
    message: str = ""
    types: tuple[str, ...] = ()
    where: str = ""
    stub: bool = False
    called: tuple[str, ...] = ()

    MESSAGE = 4000  # characters of a message kept; 200 of a place or a name
    NAMES = 200  # names (types, functions called) kept

    def to_wire(self) -> dict[str, Any]:
        return {"ended": None if self.ended is None else self.ended.value, "value": self.value,
                "message": self.message, "types": list(self.types), "where": self.where,
                "stub": self.stub, "called": list(self.called)}

    @classmethod
    def from_wire(cls, data: Any) -> Reply:
        """The reply a frame holds, trusting nothing: a wrong type is a
        :class:`ProtocolError`, text is cut to its limits."""
        if not isinstance(data, dict) or set(data) != set(cls().to_wire()):
            raise ProtocolError("something that is not a reply")
        try:
            ended = None if data["ended"] is None else Ended(data["ended"])
        except (ValueError, TypeError):
            raise ProtocolError("a reply that ends in no known way") from None
        lists = all(type(data[k]) is list for k in ("types", "called"))
        texts = [data["message"], data["where"], *data["types"], *data["called"]] if lists else []
        if not lists or not all(type(t) is str for t in texts) or type(data["stub"]) is not bool:
            raise ProtocolError("a reply whose fields are not of their types")
        return cls(ended, data["value"] if ended is None else None,
                   data["message"][:cls.MESSAGE], tuple(data["types"][:20]),
                   data["where"][:cls.NAMES], data["stub"],
                   tuple(name[:cls.NAMES] for name in data["called"][:cls.NAMES]))


def _check(message: Any, allowed: dict[str, tuple[type, ...]], what: str) -> None:
    """A :class:`ProtocolError` unless each field of ``message`` named in ``allowed`` is of
    one of its types (a ``bool`` is no ``int`` here) and a tuple's items are strings."""
    for name, types in allowed.items():
        value = getattr(message, name)
        if not isinstance(value, types) or type(value) is bool and bool not in types:
            raise ProtocolError(f"{what}'s {name} is a {type(value).__name__}, not a "
                                f"{' or '.join(k.__name__ for k in types)}")
        if isinstance(value, tuple) and any(type(item) is not str for item in value):
            raise ProtocolError(f"{what}'s {name} holds something else than strings")


def _wire(message: Any) -> dict[str, Any]:
    """``{field: value}`` of a message (its values as they are: never copied)."""
    return {f.name: getattr(message, f.name) for f in fields(message)}


def _fields(data: Any, cls: type, what: str) -> dict[str, Any]:
    """``data``, a dict of exactly the fields of ``cls``; else a :class:`ProtocolError`."""
    names = {f.name for f in fields(cls)}
    if not isinstance(data, dict) or set(data) != names:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ProtocolError(f"something that is not {what}: {str(keys)[:200]} (expected the "
                            f"keys {sorted(names)})")
    return data


@dataclass(frozen=True)
class Request:
    """What the grader asks the worker to run: the probe ``function`` (a qualified name) of
    the graded test file ``file``, called with chapter ``chapter``'s module of ``source``
    (the text of an :class:`~annotated_transformer.sources.Source`) and ``kwargs`` (plain
    data). ``exercise``: the exercise under test (None: none, the import alone);
    ``forbid_ops``: the ops refused while it runs; ``seed``: the random state it starts
    from; ``observe``: note the chapters' functions it enters; ``standins``: the earlier
    exercises (keys of :data:`STAND_INS`) to run on the grader's stand-ins."""

    file: str
    function: str
    chapter: int
    source: str
    exercise: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    forbid_ops: tuple[str, ...] = ()
    seed: int = 0
    observe: bool = False
    standins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(self, {"file": (str,), "function": (str,), "chapter": (int,), "source": (str,),
                      "exercise": (str, NoneType), "kwargs": (dict,), "forbid_ops": (tuple,),
                      "seed": (int,), "observe": (bool,), "standins": (tuple,)}, "a request")
        if any(type(name) is not str for name in self.kwargs):
            raise ProtocolError("a request's kwargs are named by something else than strings")
        if unknown := [e for e in self.standins if e not in STAND_INS]:
            raise ProtocolError(f"a request for stand-ins that do not exist: {unknown[:5]}")

    def to_wire(self) -> dict[str, Any]:
        return _wire(self)

    @classmethod
    def from_wire(cls, data: Any) -> Request:
        """The request a frame holds (a :class:`ProtocolError` for what is none)."""
        return cls(**_fields(data, cls, "a request"))


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker is set up, once, before any request: the ``source`` it runs (the text
    of an :class:`~annotated_transformer.sources.Source`), the learner's folder it is
    confined to (``learner_dir``; None for the course's own code), the ``blocked`` chapters
    of that folder (``{chapter: why}``, never imported), where the probes' files are
    (``tests_dir``) and the folder that holds ``variants`` (``variants_dir``), the ``user``
    it becomes (None: it stays who it is), its address space (``memory_bytes``) and whether
    it may start threads and processes (``new_tasks``: the boundary's own tests only). It
    travels as the worker's last argument, JSON text (:meth:`to_wire`)."""

    source: str
    learner_dir: Path | None
    tests_dir: Path
    variants_dir: Path
    blocked: dict[int, str] = field(default_factory=dict)
    user: str | None = None
    memory_bytes: int = 0
    new_tasks: bool = False

    def __post_init__(self) -> None:
        _check(self, {"source": (str,), "learner_dir": (str, Path, NoneType),
                      "tests_dir": (str, Path), "variants_dir": (str, Path), "blocked": (dict,),
                      "user": (str, NoneType), "memory_bytes": (int,), "new_tasks": (bool,)},
               "a worker's configuration")
        for name in ("learner_dir", "tests_dir", "variants_dir"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if any(type(c) is not int or type(why) is not str for c, why in self.blocked.items()):
            raise ProtocolError("a worker's blocked chapters are {chapter: why}")

    def to_wire(self) -> str:
        return json.dumps(_wire(self), default=str)  # paths as text, chapters as digits

    @classmethod
    def from_wire(cls, text: str) -> WorkerConfig:
        """The configuration the JSON ``text`` holds (a :class:`ProtocolError` for what is
        none)."""
        try:
            data = _fields(json.loads(text), cls, "a worker's configuration")
            blocked = {int(c): why for c, why in data["blocked"].items()}
        except (ValueError, AttributeError) as error:
            raise ProtocolError(f"a worker's configuration that cannot be read: "
                                f"{str(error)[:200]}") from None
        return cls(**{**data, "blocked": blocked})


def encode(message: Any) -> bytes:
    import torch  # here, not at the top: the grader starts its worker before it loads PyTorch

    buffer = io.BytesIO()
    torch.save(message, buffer)
    return buffer.getvalue()


def decode(data: bytes) -> Any:
    """The message ``data`` holds; a :class:`ProtocolError` when it is not plain data, its
    parts are compressed or it stands for too much once read (the checks below)."""
    import torch

    _check_stored(data)
    try:
        message = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - any malformed frame is the same failure
        raise ProtocolError(f"a message that is not plain data: {type(error).__name__}: "
                            f"{str(error)[:300]}") from None
    _check_expanded(message)
    return message


def _check_stored(data: bytes) -> None:
    """A :class:`ProtocolError` unless every part of the archive ``data`` is stored as is,
    as ``torch.save`` writes it: ``torch.load`` would inflate a compressed part before any
    other check, and a megabyte of deflated zeros stands for a gigabyte."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        raise ProtocolError(f"a message that is not plain data: {error}") from None
    if any(p.compress_type != zipfile.ZIP_STORED or p.file_size != p.compress_size
           for p in parts) or sum(p.file_size for p in parts) > len(data):
        raise ProtocolError("a message whose parts are compressed (torch.save stores them "
                            "as they are)")


def _check_expanded(message: Any) -> None:
    """A :class:`ProtocolError` when ``message``, with every shared part counted each time
    it appears (as reading, printing or comparing it would), holds more than
    :data:`MAX_ITEMS` items or :data:`MAX_FRAME` bytes of tensors and text: pickle's shared
    references let a frame of a few kilobytes stand for a list of 2**40 items."""
    import torch

    items, payload, todo = 0, 0, [message]
    while todo:
        item = todo.pop()
        items += 1
        if isinstance(item, torch.Tensor):
            payload += item.numel() * item.element_size()
        elif isinstance(item, (str, bytes)):
            payload += len(item)
        elif isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            todo += item
        if items + len(todo) > MAX_ITEMS or payload > MAX_FRAME:  # todo: items still to count
            raise ProtocolError(f"a message that stands for more than {MAX_ITEMS:,} items or "
                                f"{MAX_FRAME:,} bytes once its shared parts are counted")


def frame(message: Any) -> bytes:
    """``message`` as the bytes of one frame."""
    data = encode(message)
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(data):,} bytes (at most {MAX_FRAME:,})")
    return HEADER.pack(len(data)) + data


def write_frame(stream: BinaryIO, message: Any) -> None:
    stream.write(frame(message))
    stream.flush()


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _announced(header: bytes | bytearray) -> int:
    """The size a frame's header announces (a :class:`ProtocolError` over :data:`MAX_FRAME`)."""
    (size,) = HEADER.unpack_from(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"a message of {size:,} bytes announced (at most {MAX_FRAME:,})")
    return size


def read_frame(fd: int) -> Any:
    """One message from the file descriptor ``fd`` (blocking: the worker's side only; the
    grader reads with :class:`FrameReader` and a deadline)."""
    return decode(_read_exactly(fd, _announced(_read_exactly(fd, HEADER.size))))


class FrameReader:
    """A frame read piece by piece, as its bytes arrive (without ever blocking)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self.buffer += data
        self.complete()  # refuses a header that announces too much as soon as it arrives

    @property
    def started(self) -> bool:
        return bool(self.buffer)

    def complete(self) -> bool:
        return (len(self.buffer) >= HEADER.size
                and len(self.buffer) >= HEADER.size + _announced(self.buffer))

    def message(self) -> Any:
        """The message of the complete frame (any bytes after it are refused)."""
        if len(self.buffer) != HEADER.size + _announced(self.buffer):
            raise ProtocolError("more bytes than the message announced")
        return decode(bytes(self.buffer[HEADER.size:]))
