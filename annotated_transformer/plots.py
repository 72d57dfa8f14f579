"""Plotting helpers shared by the chapters: one style, labelled axes, heatmaps of matrices."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes


def use_course_style() -> None:
    """Readable defaults for every figure of the book."""
    plt.rcParams.update({
        "figure.figsize": (7.5, 3.6),
        "figure.dpi": 100,
        "savefig.dpi": 100,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "font.size": 10,
    })


def heatmap(
    ax: Axes,
    matrix: torch.Tensor,
    title: str,
    xlabel: str,
    ylabel: str,
    cmap: str = "RdBu_r",
    symmetric: bool = True,
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
    colorbar: bool = True,
) -> None:
    """Draw a 2-D tensor ``[rows, columns]`` with labelled axes (and a colour bar)."""
    data = matrix.detach().cpu().float().numpy()
    limit = float(abs(data).max()) or 1.0
    image = ax.imshow(data, cmap=cmap, aspect="auto", interpolation="nearest",
                      vmin=-limit if symmetric else None, vmax=limit if symmetric else None)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(False)
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), xticklabels)
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), yticklabels)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def residual_block_diagram(ax: Axes, norm_first: bool, sublayer: str = "Sublayer") -> None:
    """One residual sublayer as boxes and arrows, post-LN (``norm_first=False``) or pre-LN.

    The identity path (orange) runs from the block's input to its output: through the
    LayerNorm in post-LN, around it in pre-LN.
    """
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

    identity, branch = "#e07b00", "black"

    def box(y: float, text: str, colour: str) -> None:
        ax.add_patch(FancyBboxPatch((0.8, y - 0.3), 2.4, 0.6, fc=colour, ec="black",
                                    boxstyle="round,pad=0.02,rounding_size=0.12", zorder=2))
        ax.text(2.0, y, text, ha="center", va="center", fontsize=10, zorder=3)

    def arrow(points: list[tuple[float, float]], colour: str, lw: float = 1.4) -> None:
        *line, (x0, y0) = points
        if len(line) > 1:
            xs, ys = zip(*line, strict=True)
            ax.plot(xs, ys, color=colour, lw=lw, zorder=1)
        ax.add_patch(FancyArrowPatch(line[-1], (x0, y0), arrowstyle="-|>", mutation_scale=13,
                                     color=colour, lw=lw, shrinkA=0, shrinkB=0, zorder=1))

    norm_colour, sub_colour = "#c9e6f5", "#fbe3a0"
    ax.text(2.0, 0.0, "x", ha="center", va="center", fontsize=12)
    if norm_first:
        stages = [(1.4, "LayerNorm", norm_colour), (2.5, sublayer, sub_colour),
                  (3.6, "Dropout", "white")]
        add_y, top = 4.7, 5.7
        arrow([(2.0, 0.25), (2.0, 1.1)], branch)
    else:
        stages = [(1.2, sublayer, sub_colour), (2.3, "Dropout", "white"),
                  (4.4, "LayerNorm", norm_colour)]
        add_y, top = 3.3, 5.7
        arrow([(2.0, 0.25), (2.0, 0.9)], branch)
    for y, text, colour in stages:
        box(y, text, colour)
    ax.add_patch(Circle((2.0, add_y), 0.25, fc="white", ec="black", zorder=2))
    ax.text(2.0, add_y, "+", ha="center", va="center", fontsize=14, zorder=3)
    lower = [y for y, _, _ in stages if y < add_y]
    for y0, y1 in zip(lower, lower[1:], strict=False):
        arrow([(2.0, y0 + 0.3), (2.0, y1 - 0.3)], branch)
    arrow([(2.0, lower[-1] + 0.3), (2.0, add_y - 0.25)], branch)
    # the identity path: from the input, round the left, into the addition
    split = 0.55
    arrow([(2.0, split), (0.35, split), (0.35, add_y), (1.75, add_y)], identity, lw=2.2)
    ax.plot([2.0, 2.0], [0.25, split], color=identity, lw=2.2, zorder=1)
    if norm_first:
        arrow([(2.0, add_y + 0.25), (2.0, top - 0.25)], identity, lw=2.2)
    else:
        arrow([(2.0, add_y + 0.25), (2.0, 4.1)], identity, lw=2.2)
        arrow([(2.0, 4.7), (2.0, top - 0.25)], identity, lw=2.2)
    ax.text(2.0, top, "output", ha="center", va="center", fontsize=11)
    ax.text(0.25, (split + add_y) / 2, "identity path", rotation=90, ha="right",
            va="center", color=identity, fontsize=9)
    ax.set(xlim=(-0.4, 3.6), ylim=(-0.4, 6.1),
           title="pre-LN: x + Sublayer(LN(x))" if norm_first else "post-LN: LN(x + Sublayer(x))")
    ax.set_aspect("equal")
    ax.axis("off")


def key_value_cache_diagram(ax: Axes, cached: int = 5) -> None:
    """One step of writing with a key/value cache, in one attention layer.

    Positions ``0 .. cached - 1`` (grey) were computed at earlier steps: their keys and
    values are kept. The new position ``cached`` (blue) is the only one computed now: its
    query, key and value; the key and value join the cache, and the query is scored against
    every key, ``softmax(q_t K^T / sqrt(d_k)) V``, for the output at position ``cached``.
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

    old, new = "#d9d9d9", "#9ecae1"

    def cell(x: float, y: float, text: str, colour: str, w: float = 0.8) -> None:
        ax.add_patch(FancyBboxPatch((x - w / 2, y - 0.25), w, 0.5, fc=colour, ec="black",
                                    boxstyle="round,pad=0.02,rounding_size=0.08", zorder=2))
        ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=3)

    def arrow(start: tuple[float, float], end: tuple[float, float], colour: str = "black",
              lw: float = 1.0) -> None:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10,
                                     color=colour, lw=lw, shrinkA=2, shrinkB=2, zorder=1))

    t = cached
    ax.add_patch(Rectangle((-0.55, 1.45), t + 0.1, 1.6, fc="none", ec="0.5", ls="--", lw=1))
    ax.text((t - 1) / 2, 3.25, f"the cache: keys and values of positions 0-{t - 1},\n"
            "kept from earlier steps", ha="center", va="bottom", fontsize=9, color="0.35")
    for i in range(t + 1):
        colour = new if i == t else old
        cell(i, 0.0, f"$x_{{{i}}}$", colour)
        cell(i, 1.8, f"$k_{{{i}}}$", colour)
        cell(i, 2.7, f"$v_{{{i}}}$", colour)
    for y in (1.8 - 0.25, 2.7 - 0.25):
        arrow((t, 0.25), (t, y), new, lw=1.4)
    cell(t + 1.4, 1.0, f"$q_{{{t}}}$", new)
    arrow((t + 0.2, 0.25), (t + 1.3, 0.75), new, lw=1.4)
    for i in range(t + 1):  # the new query reads every key
        arrow((t + 1.0, 1.1), (i + 0.1, 1.55), "#3182bd", lw=0.7)
    cell(t + 1.4, 4.2, f"$\\mathrm{{softmax}}(q_{{{t}}} K^T / \\sqrt{{d_k}})\\, V$", new, w=3.2)
    arrow((t + 1.4, 1.25), (t + 1.4, 3.95), new, lw=1.4)
    arrow((t, 2.95), (t + 0.5, 3.95), "0.4", lw=1.2)  # every value, the new one's too
    ax.text(t + 0.4, 3.3, "$K, V$", ha="left", fontsize=9, color="0.35")
    ax.text(t + 1.4, 4.75, f"output at position {t}: the next token's logits",
            ha="center", fontsize=9)
    ax.text(t / 2, -0.75, f"the text so far: {t} positions cached, position {t} new",
            ha="center", fontsize=9, color="0.35")
    ax.set(xlim=(-0.8, t + 3.2), ylim=(-1.1, 5.1))
    ax.set_aspect("equal")
    ax.axis("off")
