"""The summary of a list of timed rates (the clocks and the matmul ceiling are
:mod:`annotated_transformer.machine`'s, which ``train`` uses too)."""

from __future__ import annotations

import statistics


def summary(samples: list[float]) -> dict:
    """Median, smallest and largest of a list of rates, and the spread (range / median)."""
    median = statistics.median(samples)
    return {"median": median, "min": min(samples), "max": max(samples),
            "spread": (max(samples) - min(samples)) / median if median else 0.0,
            "samples": samples}
