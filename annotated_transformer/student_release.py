"""What the parts registry does in a student release, a copy of the course without
``solutions/`` (:mod:`annotated_transformer.course.distribution.release`): the parts the
reference would give come from the learner's ``exercises/``, and the first time that
happens a warning says so, pointing at the caller's line (the notebook cell or script
that asked for the parts), not at the course's own code.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from annotated_transformer.layout import (
    CHAPTER_FILE,
    EXERCISES_DIR,
    PACKAGE_DIR,
    SOLUTIONS_DIR,
    folder_name,
)

RELEASE_NOTE = (
    f"this copy of the course is a student release: it has no {folder_name(SOLUTIONS_DIR)}, "
    f"so the parts that would come from the reference come from your "
    f"{folder_name(EXERCISES_DIR)}"
)
_warned: list[bool] = []


def reference_is_missing() -> str:
    """The source that replaces the reference here (``exercises``); warns the first time."""
    if not _warned:
        _warned.append(True)
        warnings.warn(RELEASE_NOTE, stacklevel=_callers_level())
    return "exercises"


def _callers_level() -> int:
    """The ``stacklevel`` (for :func:`reference_is_missing`'s warning) of the first frame
    outside the course's code: not a line of this package, of a chapter file or of the
    ``__init__`` that dataclasses generate."""
    frame, level = sys._getframe(2), 2  # the caller of reference_is_missing is level 2
    while frame is not None:
        name = frame.f_code.co_filename
        generated = name == "<string>" and frame.f_code.co_name == "__init__"
        ours = name.startswith("<frozen") or generated or (
            not name.startswith("<") and (
                PACKAGE_DIR in Path(name).resolve().parents
                or CHAPTER_FILE.match(Path(name).name) is not None))
        if not ours:
            return level
        frame, level = frame.f_back, level + 1
    return 2
