"""The translation task's libraries, imported when they are first needed.

``datasets``, ``tokenizers`` and ``sacrebleu`` are pinned in ``requirements.txt`` and
listed in the package's ``translation`` extra; the rest of the package works without
them. A missing one is reported in one line with the command that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from annotated_transformer.data.tsv import DataError

INSTALL = "pip install -r requirements.txt (or pip install 'annotated-transformer[translation]')"


class MissingLibrary(DataError):
    """A library of the translation task that is not installed."""


def require(name: str) -> ModuleType:
    """``import name``, or :class:`MissingLibrary` naming the command that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise MissingLibrary(f"the translation task needs the {name!r} library: {INSTALL}"
                             ) from None
