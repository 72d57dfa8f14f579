"""What every model command shares: the one-line usage error, the device, the parts, and
a checkpoint's model rebuilt."""

from __future__ import annotations

import torch

from annotated_transformer import checkpoint
from annotated_transformer.data import Task
from annotated_transformer.model import Model
from annotated_transformer.parts import Parts
from annotated_transformer.sources import Source


class UsageError(Exception):
    """Bad arguments or data: reported in one line, exit status 2."""


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA, then Apple's MPS, then the CPU; otherwise the device named."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device (auto, cpu, cuda, cuda:1, mps)"
                         ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this PyTorch has no CUDA device (see the README "
                         "for a CUDA build)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS is not available here")
    return device


def parse_parts(source: str | None) -> Parts | None:
    if source is None:
        return None
    try:
        parts = Parts(str(Source.parse(source)))
        parts.module(1)
    except (ValueError, LookupError, ModuleNotFoundError) as error:
        raise UsageError(f"--parts: {error}") from None
    return parts


def add_model_options(p) -> None:
    """``--parts``, ``--device`` and ``--threads`` of the commands that rebuild a
    checkpoint's model."""
    p.add_argument("--parts", help="rebuild the model from other parts (default: its own)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch (default: one per core)")


def load_checkpoint(args) -> tuple[dict, Task, Model]:
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    state = checkpoint.load(args.checkpoint)
    task = checkpoint.build_task(state, getattr(args, "data", None))
    return state, task, checkpoint.build_model(state, parse_parts(args.parts), device)

