"""What this machine computes: its rate of matrix products, measured in a second or two,
which the ``train`` command prints at its start and records in its metrics and its
checkpoint (a run's speed, and so what a time budget trains, follows it), and the benchmark
reports beside its figures (:mod:`annotated_transformer.bench`).

A rate is the best of a few timings of ``n x n @ n x n`` products (``2 n^3`` floating-point
operations each): another program's busy spell slows a timing down, never up, so the best
is what the machine can do with the threads it was given. ``train``'s probe makes each timing
last at least :data:`PROBE_SECONDS`, longer than the scheduler's slices and a CPU quota's
period (a container's ``--cpus``, 100 ms): a timing of a few milliseconds fits between two
of another program's slices, or inside the quota's burst, and reads the machine as faster
than the run will find it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

SIZES = (512, 1024)  # the matrices of the probe ``train`` runs
PROBE_SECONDS = 0.2  # each of its timings: 6 of them, about 1.5 s in all


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
                   rounds: int, seconds: float = 0.0) -> dict:
    """The best rate of square matrix products ``n x n @ n x n`` over ``sizes`` (GFLOP/s):
    for each size the best of ``rounds`` timings (each of at least ``seconds``, or 2 GFLOP
    on a CPU and 20 products on a GPU), then the best size."""
    rates = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        repeat = max(1, int(2e9 // (2 * n**3))) if device.type == "cpu" else 20
        warm = timed(lambda a=a, b=b: a @ b, device, 2) / 2  # warm-up: a product's time
        repeat = max(repeat, math.ceil(seconds / max(warm, 1e-9)))
        samples = [2 * n**3 * repeat / timed(lambda a=a, b=b: a @ b, device, repeat) / 1e9
                   for _ in range(rounds)]
        rates[n] = max(samples)
    best = max(rates, key=rates.get)
    return {"dtype": str(dtype).removeprefix("torch."), "gflops": rates[best], "size": best,
            "by_size": {str(n): r for n, r in rates.items()}}


def measure(device: torch.device) -> dict:
    """This machine's float32 matrix-product rate on ``device`` with the threads PyTorch
    uses now: ``{"gflops", "size", "dtype", "device", "threads", "by_size"}``."""
    found = matmul_ceiling(device, torch.float32, SIZES, rounds=3, seconds=PROBE_SECONDS)
    return {**found, "device": device.type, "threads": torch.get_num_threads()}


def describe(figure: dict) -> str:
    """``"68 GFLOP/s of float32 matrix products (cpu, 2 threads)"``."""
    where = (f"{figure['device']}, {figure['threads']} thread"
             f"{'s' if figure['threads'] != 1 else ''}" if figure["device"] == "cpu"
             else figure["device"])
    return f"{figure['gflops']:,.0f} GFLOP/s of {figure['dtype']} matrix products ({where})"
