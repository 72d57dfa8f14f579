"""The package's own tests: every test starts from the seed 0, and global torch settings
are restored after it. (The graded tests have their own ``graded/conftest.py``; the grader
never reads this file.)"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _isolated_torch_state() -> Iterator[None]:
    import torch

    torch.manual_seed(0)
    random.seed(0)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
