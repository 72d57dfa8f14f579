"""Numbers for the book's prose, taken from the cell that computes them.

``glue("name", value)`` in a chapter's code cell records the value in the cell's output;
the markdown cites it as ``{glue:text}`name``` and the built book prints it there, so the
prose cannot drift from the output (myst-nb's glue). Where myst-nb is not installed (a
notebook opened in Colab with the package alone), it does nothing.
"""

from __future__ import annotations


def glue(name: str, value: object) -> None:
    """Record ``value`` under ``name`` for the book, without displaying it in the notebook."""
    try:
        from myst_nb import glue as record
    except ImportError:
        return
    record(name, value, display=False)
