"""Figures to play with: plotly figures of the book's tables, curves and attention maps.

A figure goes to a notebook as two outputs (:meth:`InteractiveFigure._repr_mimebundle_`),
and each place draws the one it can:

- the web book: a small HTML block, data and a call of ``Plotly.newPlot`` with no library
  inside, drawn with the plotly.js that the book serves once, from its own ``_static``
  folder (``book/_ext/interactive_figures.py``; nothing is fetched from elsewhere);
- JupyterLab, Jupyter Notebook 7 and VS Code: plotly's own JSON output
  (``application/vnd.plotly.v1+json``), drawn by the plotly renderer that the ``plotly``
  package installs there (with its own plotly.js: it works offline;
  tests/repository/test_jupyterlab.py checks JupyterLab and Notebook 7);
- Colab, which draws neither: plotly's own HTML, which loads plotly.js from plotly's CDN.

Without plotly.js at all (a reader without JavaScript) the block says where to see the
figure, and the notebooks keep a static matplotlib image of each figure beside it.

Every figure names its own HTML id (``interactive-<name>``), so that re-executing a notebook
gives the same page. Plotly is an optional dependency (the ``book`` extra): importing this
module without it says so.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

try:
    import plotly.graph_objects as go
    import plotly.io as pio
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError("the interactive figures need plotly: pip install -e '.[book]' "
                      "(or pip install plotly)") from error

from annotated_transformer.inspect_attention import AttentionMaps

MARKER = "interactive-figure"  # the class of every figure's HTML block (the book looks for it)
CONFIG = {"displaylogo": False, "responsive": True,
          "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
FALLBACK = ("An interactive figure, drawn in the web book (bash scripts/book.sh), in "
            "JupyterLab, VS Code and Colab.")
# A notebook cell tagged so holds the static image of the figure in the next cell: in the
# web book (myst-nb writes a cell's tags as classes "tag_<tag>") the figure hides that
# image once it is drawn, so that the page shows it once; without JavaScript it stays.
TWIN = "static-twin"
PLOTLY_MIME = "application/vnd.plotly.v1+json"  # what JupyterLab's plotly renderer draws
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


class InteractiveFigure:
    """A plotly figure that a notebook displays as the book's HTML block."""

    def __init__(self, figure: go.Figure, name: str):
        if not _NAME.fullmatch(name):
            raise ValueError(f"a figure's name is lower-case letters, digits and '-', got {name!r}")
        self.figure = figure
        self.name = name

    def __repr__(self) -> str:
        return f"InteractiveFigure({self.name!r})"

    @property
    def element_id(self) -> str:
        return f"interactive-{self.name}"

    def to_html(self) -> str:
        """The HTML block: a ``div`` that holds the fallback text, and a script that
        replaces it with the figure when plotly.js is there (and hides the images of the
        cell before, if that cell is tagged ``static-twin``)."""
        spec = pio.to_json({"data": self.figure.data, "layout": self.figure.layout,
                            "config": CONFIG}, validate=False, pretty=False)
        spec = spec.replace("</", "<\\/")  # a token such as "</s>" cannot end the script
        return (f'<div class="{MARKER}" id="{self.element_id}">'
                f'<p class="{MARKER}-fallback"><em>{html.escape(FALLBACK)}</em></p></div>\n'
                f"<script>(function () {{\n"
                f'  var element = document.getElementById("{self.element_id}");\n'
                f"  if (!window.Plotly || !element) return;\n"
                f"  var spec = {spec};\n"
                f'  element.innerHTML = "";\n'
                f"  Plotly.newPlot(element, spec.data, spec.layout, spec.config);\n"
                f'  var cell = element.closest(".cell"), '
                f"before = cell && cell.previousElementSibling;\n"
                f'  if (before && before.classList.contains("tag_{TWIN}"))\n'
                f'    before.querySelectorAll(".cell_output img").forEach(function (image) {{\n'
                f'      image.style.display = "none";\n'
                f"    }});\n"
                f"}})();</script>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None
                          ) -> dict[str, Any]:
        """What a notebook shows: the book's HTML block and plotly's JSON (JupyterLab and
        VS Code prefer the JSON, the web book the HTML); in Colab, plotly's own HTML."""
        if "google.colab" in sys.modules:
            return {"text/html": self.figure.to_html(include_plotlyjs="cdn", full_html=False,
                                                     config=CONFIG, div_id=self.element_id)}
        spec = json.loads(pio.to_json(self.figure, validate=False))
        return {"text/html": self.to_html(), PLOTLY_MIME: {**spec, "config": CONFIG},
                "text/plain": repr(self)}


def _rounded(values: Tensor, digits: int) -> list:
    return torch.round(values.double(), decimals=digits).tolist()


def positional_encoding_figure(table: Tensor, name: str = "positional-encoding"
                               ) -> InteractiveFigure:
    """The table ``[positions, d_model]`` as a heatmap; the pointer reads position,
    dimension and value."""
    if table.dim() != 2:
        raise ValueError(f"the table must be [positions, d_model], got {tuple(table.shape)}")
    d_model = table.size(1)
    figure = go.Figure(go.Heatmap(
        z=_rounded(table, 4), colorscale="RdBu", reversescale=True, zmid=0, zmin=-1, zmax=1,
        hovertemplate="position %{y}<br>dimension %{x}<br>value %{z:.4f}<extra></extra>"))
    figure.update_layout(
        title=f"Sinusoidal positional encoding, d_model = {d_model}: point at a cell",
        xaxis_title="encoding dimension (even: sine, odd: cosine)", yaxis_title="position",
        yaxis_autorange="reversed", height=460, margin=dict(t=60, l=60, r=20, b=50))
    return InteractiveFigure(figure, name)


def learning_rate_figure(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
                         name: str = "learning-rate") -> InteractiveFigure:
    """One line per schedule (label: steps, rates); the pointer reads step and rate."""
    if not curves:
        raise ValueError("learning_rate_figure needs at least one curve")
    figure = go.Figure()
    for label, (steps, rates) in curves.items():
        if len(steps) != len(rates):
            raise ValueError(f"{label}: {len(steps)} steps but {len(rates)} rates")
        figure.add_trace(go.Scatter(
            x=list(steps), y=[float(f"{r:.4g}") for r in rates], mode="lines", name=label,
            hovertemplate="step %{x:d}<br>rate %{y:.3e}<extra>%{fullData.name}</extra>"))
    figure.update_layout(title="The warmup schedule: point at a curve",
                         xaxis_title="training step", yaxis_title="learning rate",
                         hovermode="closest", height=420,
                         legend=dict(x=0.98, xanchor="right", y=0.98),
                         margin=dict(t=60, l=70, r=20, b=50))
    return InteractiveFigure(figure, name)


ATTENTIONS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
              "cross": "cross-attention"}


def attention_figure(maps: AttentionMaps, name: str = "attention") -> InteractiveFigure:
    """Every attention the model has (encoder self-, decoder self- and cross-attention),
    side by side, for one layer and head at a time: a slider chooses the layer and head;
    the pointer reads query, key and weight. The colour scale runs from 0 to 1 for every
    map, so that heads compare by colour."""
    attentions = [attention for attention in ATTENTIONS if getattr(maps, attention)]
    if not attentions:
        raise ValueError("the maps hold no attention weights")
    layers, heads = len(getattr(maps, attentions[0])), getattr(maps, attentions[0])[0].size(0)
    axes = {"encoder": (maps.source_tokens, maps.source_tokens),
            "decoder": (maps.output_tokens, maps.output_tokens),
            "cross": (maps.output_tokens, maps.source_tokens)}
    widths = [len(axes[attention][1]) for attention in attentions]
    figure = go.Figure()
    domains, start, gap = [], 0.0, 0.12  # room for the next panel's query labels
    for width in widths:
        share = (1 - gap * (len(attentions) - 1)) * width / sum(widths)
        domains.append((start, start + share))
        start += share + gap
    for index, attention in enumerate(attentions):
        # plotly reads its labels as HTML: "</s>" would be a closing tag, drawn as nothing
        queries, keys = ([html.escape(t, quote=False) for t in axis] for axis in axes[attention])
        title = ATTENTIONS[attention]
        suffix = "" if index == 0 else str(index + 1)
        text = [[f"{q} → {k}" for k in keys] for q in queries]
        for layer in range(layers):
            for head in range(heads):
                weights = getattr(maps, attention)[layer][head]
                figure.add_trace(go.Heatmap(
                    z=_rounded(weights, 4), text=text, coloraxis="coloraxis",
                    xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                    visible=layer == 0 and head == 0,
                    name=f"{title}, layer {layer + 1}, head {head + 1}",
                    meta=[attention, layer + 1, head + 1],
                    hovertemplate=(f"{title}, layer {layer + 1}, head {head + 1}<br>"
                                   "query → key: %{text}<br>weight %{z:.3f}<extra></extra>")))
        figure.update_layout({
            f"xaxis{suffix}": dict(domain=domains[index], tickvals=list(range(len(keys))),
                                   ticktext=keys, tickangle=-90, title=f"key ({title})",
                                   anchor=f"y{suffix}", tickfont=dict(size=10)),
            f"yaxis{suffix}": dict(tickvals=list(range(len(queries))), ticktext=queries,
                                   autorange="reversed", anchor=f"x{suffix}",
                                   tickfont=dict(size=10),
                                   title="query" if index == 0 else None)})
    steps = []
    for layer in range(layers):
        for head in range(heads):
            shown = [(l, h) == (layer, head) for _ in attentions for l in range(layers)
                     for h in range(heads)]
            steps.append(dict(method="restyle", args=[{"visible": shown}],
                              label=f"L{layer + 1} H{head + 1}"))
    figure.update_layout(
        title="Attention of the trained translator: choose a layer and head, point at a cell",
        coloraxis=dict(colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="weight")),
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="layer and head: "),
                      pad=dict(t=110))],
        height=560, margin=dict(t=60, l=80, r=20, b=40))
    return InteractiveFigure(figure, name)
