"""Reading a file: decoding it as Python would, and refusing anything else than UTF-8."""
from __future__ import annotations

import codecs
import io
import re
import stat
import tokenize
from pathlib import Path

from annotated_transformer.course.grading.source_rules.rules import MAX_SOURCE_BYTES
from annotated_transformer.course.grading.source_rules.violations import SourceRejected

_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


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
