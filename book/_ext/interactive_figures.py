"""Serve plotly.js once with the book, for the interactive figures of the notebooks.

The figures (``annotated_transformer/interactive.py``) are HTML blocks that call
``Plotly.newPlot`` and carry no JavaScript library of their own. This extension copies
plotly.js from the installed plotly package into the built site's ``_static`` folder once,
and loads it on the pages that hold such a figure only: nothing is fetched from a CDN.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util.fileutil import copy_asset_file

MARKER = 'class="interactive-figure"'
SCRIPT = "plotly.min.js"


def plotly_js() -> Path:
    path = Path(str(files("plotly") / "package_data" / SCRIPT))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed plotly has no {SCRIPT} "
                                "(install the book's dependencies: pip install -e '.[book]')")
    return path


def load_where_needed(app: Sphinx, pagename: str, templatename: str, context: dict,
                      doctree) -> None:
    if MARKER in context.get("body", ""):
        app.add_js_file(SCRIPT)  # during html-page-context: on this page only


def copy_script(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        copy_asset_file(str(plotly_js()), str(Path(app.outdir) / "_static"))


def setup(app: Sphinx) -> dict:
    plotly_js()  # fail at the start of the build, not at its end
    app.connect("html-page-context", load_where_needed)
    app.connect("build-finished", copy_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
