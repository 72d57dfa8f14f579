"""Several processes, one model: PyTorch's DistributedDataParallel, started by ``torchrun``.

``torchrun --nproc_per_node=N -m annotated_transformer train ...`` sets ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK``; :func:`setup` then joins the process group (NCCL on CUDA, gloo
on a CPU). Without ``torchrun`` everything here is a no-op for a single process.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def setup(device: torch.device) -> torch.device:
    """Join the process group when started by ``torchrun``; return this process's device
    (``cuda:LOCAL_RANK`` on GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def teardown() -> None:
    if is_distributed():
        dist.destroy_process_group()


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when there are several processes."""
    if not is_distributed():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def all_sum(value: float | int | torch.Tensor, device: torch.device
            ) -> float | int | torch.Tensor:
    """The sum of ``value`` over all processes (``value`` itself for one process); a tensor
    (on ``device``) is summed in place and returned."""
    if not is_distributed():
        return value
    if isinstance(value, torch.Tensor):
        dist.all_reduce(value)
        return value
    tensor = torch.tensor(value, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return type(value)(tensor.item())


def barrier() -> None:
    if is_distributed():
        dist.barrier()
