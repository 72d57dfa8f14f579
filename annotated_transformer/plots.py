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
