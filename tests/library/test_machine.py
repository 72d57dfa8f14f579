"""The machine's probe (annotated_transformer.machine): what it measures and how it says it.
Its speed is measured, never asserted."""

from __future__ import annotations

import torch

from annotated_transformer import machine


def test_the_probe_measures_float32_products_with_the_threads_in_use():
    figure = machine.measure(torch.device("cpu"))
    assert figure["gflops"] > 0 and figure["gflops"] == max(figure["by_size"].values())
    assert set(figure["by_size"]) == {str(n) for n in machine.SIZES}
    assert figure["size"] in machine.SIZES and figure["dtype"] == "float32"
    assert (figure["device"], figure["threads"]) == ("cpu", torch.get_num_threads())


def test_the_description_names_rate_dtype_device_and_threads():
    one = {"gflops": 67.4, "dtype": "float32", "device": "cpu", "threads": 1}
    assert machine.describe(one) == "67 GFLOP/s of float32 matrix products (cpu, 1 thread)"
    gpu = {**one, "gflops": 51234.0, "device": "cuda"}
    assert machine.describe(gpu) == "51,234 GFLOP/s of float32 matrix products (cuda)"
