"""The grading worker's policy for the parts registry: the learner's folder is every source.

Installed once by the worker (:mod:`.worker`) before any learner code runs, through the
registry's one hook (:func:`annotated_transformer.parts.install_policy`): whatever a
learner's file asks for, the reference included, it gets the learner's own parts.
"""

from __future__ import annotations

from pathlib import Path

from annotated_transformer import parts


class Confinement(parts.SourcePolicy):
    """Every source means ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder.resolve())

    def only_source(self) -> str:
        return self.folder
