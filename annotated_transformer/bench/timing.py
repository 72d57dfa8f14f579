"""Clocks that wait for the device, the matmul ceiling, and the summary of samples."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int = 1) -> float:
    """Seconds for ``repeat`` calls of ``fn``, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize(device)
    return time.perf_counter() - start


def matmul_ceiling(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...],
                   rounds: int) -> dict:
    """The best rate of square matrix products ``n x n @ n x n`` over ``sizes`` (GFLOP/s):
    for each size the best of ``rounds`` timings (a ceiling is what the machine can do;
    another program's spell slows a timing down, never up), then the best size."""
    rates = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        repeat = max(1, int(2e9 // (2 * n**3))) if device.type == "cpu" else 20
        timed(lambda a=a, b=b: a @ b, device, 2)  # warm-up
        samples = [2 * n**3 * repeat / timed(lambda a=a, b=b: a @ b, device, repeat) / 1e9
                   for _ in range(rounds)]
        rates[n] = max(samples)
    best = max(rates, key=rates.get)
    return {"dtype": str(dtype).removeprefix("torch."), "gflops": rates[best], "size": best,
            "by_size": {str(n): r for n, r in rates.items()}}


def summary(samples: list[float]) -> dict:
    """Median, smallest and largest of a list of rates, and the spread (range / median)."""
    median = statistics.median(samples)
    return {"median": median, "min": min(samples), "max": max(samples),
            "spread": (max(samples) - min(samples)) / median if median else 0.0,
            "samples": samples}

