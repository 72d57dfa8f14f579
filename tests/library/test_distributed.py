"""Two processes started by ``torchrun`` (gloo, on the CPU) train exactly like one process
with the same global batch: the same losses and the same parameters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from annotated_transformer import checkpoint

ARGS = ["-m", "annotated_transformer", "train", "--task", "dates", "--steps", "4",
        "--batch-size", "24", "--eval-size", "10", "--device", "cpu", "--no-progress"]


def run(command, out):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, *command, "--out", str(out)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out / checkpoint.FILE_NAME, weights_only=True)


@pytest.mark.slow
@pytest.mark.alone  # two processes training together
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is missing")
def test_two_processes_equal_one(tmp_path):
    one = run(ARGS, tmp_path / "one")
    two = run(["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517",
               *ARGS], tmp_path / "two")
    assert len(one["history"]["loss"]) == len(two["history"]["loss"]) == 4
    assert torch.allclose(torch.tensor(one["history"]["loss"]),
                          torch.tensor(two["history"]["loss"]), rtol=1e-5, atol=1e-6), (
        one["history"]["loss"], two["history"]["loss"])
    for name, a in one["model"].items():
        if name.endswith("k_proj.bias"):
            # softmax ignores a shift shared by all keys: this gradient is 0 up to rounding,
            # and Adam scales rounding noise up to full-size steps
            continue
        assert torch.allclose(a, two["model"][name], rtol=1e-4, atol=1e-6), name
