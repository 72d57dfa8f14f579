"""Assertions whose failure message tells a learner what to look at.

The grader shows the first line of a failed assertion's message, so every
message starts with what was expected and what came back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def assert_tensor(
    value: object,
    name: str,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Check that ``value`` is a tensor with the given shape and dtype; return it."""
    assert isinstance(value, Tensor), (
        f"{name} should be a torch.Tensor, but it is a {type(value).__name__}"
    )
    if shape is not None:
        assert tuple(value.shape) == tuple(shape), (
            f"{name} should have shape {list(shape)}, but it has shape {list(value.shape)}"
        )
    if dtype is not None:
        assert value.dtype == dtype, f"{name} should have dtype {dtype}, but it has {value.dtype}"
    return value


def assert_close(
    actual: object,
    expected: Tensor,
    name: str,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    hint: str = "",
) -> None:
    """Check ``actual`` against ``expected`` elementwise, naming the worst entry when it differs."""
    assert_tensor(actual, name, shape=expected.shape)
    assert isinstance(actual, Tensor)
    got = actual.detach().to("cpu", torch.float64)
    want = expected.detach().to("cpu", torch.float64)
    bad = torch.isnan(got) & ~torch.isnan(want)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{name} contains NaN at index {index}. {hint}".strip())
    error = (got - want).abs().nan_to_num(nan=0.0)
    tolerance = atol + rtol * want.abs().nan_to_num(nan=0.0)
    if (error > tolerance).any():
        flat = int((error - tolerance).argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), error.shape))
        raise AssertionError(
            f"{name} differs from the expected value at index {index}: got "
            f"{got[index].item():.6g}, expected {want[index].item():.6g} "
            f"(largest error {error.max().item():.3g}). {hint}".strip()
        )
