"""The grading worker's policy for the parts registry: the learner's folder is every source.

Installed once by the worker (:mod:`.process`) before any learner code runs, through the
registry's one hook (:func:`annotated_transformer.parts.install_policy`): whatever a
learner's file asks for, the reference included, it gets the learner's own parts; the
chapters in ``blocked`` (files that broke the rules of what an exercise file may do,
:mod:`~annotated_transformer.course.grading.source_rules`, checked on the trusted side) are
never imported, and asking for them raises :class:`BlockedChapter`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from annotated_transformer import parts


class BlockedChapter(ImportError):
    """A learner's chapter file that the grader refused to import (it broke a rule)."""


class Confinement(parts.SourcePolicy):
    """Every source means ``folder``; the chapters of ``blocked`` (``{chapter: why}``) are
    refused with their reason."""

    def __init__(self, folder: Path, blocked: Mapping[int, str]) -> None:
        self.folder = str(folder.resolve())
        self.blocked = MappingProxyType(dict(blocked))

    def only_source(self) -> str:
        return self.folder

    def check(self, chapter: int | None) -> None:
        if chapter is None and self.blocked:  # a name of a chapter file that was not read
            raise BlockedChapter(next(iter(self.blocked.values())))
        if chapter is not None and chapter in self.blocked:
            raise BlockedChapter(self.blocked[chapter])
