"""The messages between the trusted grader and the worker that runs a learner's code.

A message is a length-prefixed frame holding ``torch.save`` of plain data: tensors,
numbers, strings, ``None``, lists, tuples and dicts of them, dtypes and sizes. Both
sides read frames with ``torch.load(weights_only=True)``, which builds only those types,
so a frame from a hostile worker can carry wrong numbers but never run code in the
grader. A frame larger than :data:`MAX_FRAME` is refused, and so is one that stands for
more than :data:`MAX_ITEMS` items or :data:`MAX_FRAME` bytes once the parts it shares are
counted each time they appear.
"""

from __future__ import annotations

import io
import os
import struct
from typing import Any, BinaryIO

import torch

MAX_FRAME = 256 * 2**20  # bytes: a trained capstone model is well under 1 MiB
MAX_ITEMS = 1_000_000  # lists, tuples, dicts and what they hold, each time it appears
HEADER = struct.Struct(">Q")


class ProtocolError(RuntimeError):
    """A frame that is not a well-formed message (the worker died or misbehaved)."""


def encode(message: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    return buffer.getvalue()


def decode(data: bytes) -> Any:
    try:
        message = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - any malformed frame is the same failure
        raise ProtocolError(f"a message that is not plain data: {type(error).__name__}: "
                            f"{str(error)[:300]}") from None
    _check_expanded(message)
    return message


def _check_expanded(message: Any) -> None:
    """A :class:`ProtocolError` when ``message``, with every shared part counted each time
    it appears (as reading, printing or comparing it would), holds more than
    :data:`MAX_ITEMS` items or :data:`MAX_FRAME` bytes of tensors and text: pickle's shared
    references let a frame of a few kilobytes stand for a list of 2**40 items."""
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


def read_frame(fd: int) -> Any:
    """One message from the file descriptor ``fd`` (blocking: the worker's side only; the
    grader reads with :class:`FrameReader` and a deadline)."""
    (size,) = HEADER.unpack(_read_exactly(fd, HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"a message of {size:,} bytes announced (at most {MAX_FRAME:,})")
    return decode(_read_exactly(fd, size))


class FrameReader:
    """A frame read piece by piece, as its bytes arrive (without ever blocking)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= HEADER.size and self._size() > MAX_FRAME:
            raise ProtocolError(f"a message of {self._size():,} bytes announced (at most "
                                f"{MAX_FRAME:,})")

    def _size(self) -> int:
        return HEADER.unpack_from(self.buffer)[0]

    @property
    def started(self) -> bool:
        return bool(self.buffer)

    def complete(self) -> bool:
        return len(self.buffer) >= HEADER.size and len(self.buffer) >= HEADER.size + self._size()

    def message(self) -> Any:
        """The message of the complete frame (any bytes after it are refused)."""
        if len(self.buffer) != HEADER.size + self._size():
            raise ProtocolError("more bytes than the message announced")
        return decode(bytes(self.buffer[HEADER.size:]))
