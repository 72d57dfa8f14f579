"""Checkpoint averaging: one model whose parameters are the mean of several checkpoints'.

Section 6.1: "For the base models, we used a single model obtained by averaging the last
5 checkpoints, which were written at 10-minute intervals. For the big models, we
averaged the last 20 checkpoints." Late in training the weights wander around a good
region; their mean usually lies nearer its middle than any one of them.

A run keeps its last ``N`` checkpoints with ``train --keep-last N``: after each save of
``checkpoint.pt`` a copy ``checkpoint-STEP.pt`` is written beside it, and the oldest
copies beyond ``N`` are removed.

    python -m annotated_transformer average --out avg.pt runs/x/checkpoint-*.pt
    python -m annotated_transformer average --out avg.pt --last 5 runs/x
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from annotated_transformer import checkpoint
from annotated_transformer.checkpoint import CheckpointError

STEP_FILE = re.compile(r"checkpoint-(\d+)\.pt")


def step_files(folder: Path) -> list[Path]:
    """The run's ``checkpoint-STEP.pt`` files, oldest (smallest step) first."""
    found = [(int(m[1]), p) for p in Path(folder).glob("checkpoint-*.pt")
             if (m := STEP_FILE.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def keep_copy(folder: Path, step: int, keep: int) -> Path:
    """Copy ``folder/checkpoint.pt`` to ``folder/checkpoint-STEP.pt`` (through a temporary
    file, then a rename) and remove all but the ``keep`` newest copies."""
    folder = Path(folder)
    target = folder / f"checkpoint-{step}.pt"
    temporary = folder / f".{target.name}.tmp"
    shutil.copyfile(folder / checkpoint.FILE_NAME, temporary)
    os.replace(temporary, target)
    for old in step_files(folder)[:-keep]:
        old.unlink()
    return target


def last_checkpoints(folder: Path, count: int) -> list[Path]:
    """The ``count`` newest ``checkpoint-STEP.pt`` of a run's folder."""
    if count < 1:
        raise CheckpointError(f"--last must be at least 1, got {count}")
    files = step_files(folder)
    if len(files) < count:
        raise CheckpointError(f"{folder} has {len(files)} checkpoint-STEP.pt file(s), not "
                              f"{count} (train with --keep-last {count} to keep them)")
    return files[-count:]


def average_checkpoints(paths: list[Path]) -> dict:
    """A checkpoint (for evaluation, as :func:`checkpoint.export` writes) whose weights are
    the mean of ``paths``' weights: floating tensors averaged in float64, then cast back
    to their dtype; other tensors (integer buffers) taken from the last checkpoint. The
    checkpoints must hold the same kind of model, config, task and vocabulary: otherwise
    :class:`CheckpointError` naming what differs. The step is the last checkpoint's."""
    if len(paths) < 2:
        raise CheckpointError(f"averaging needs at least two checkpoints, got {len(paths)}")
    states = [checkpoint.load(path) for path in paths]
    for path, state in zip(paths, states, strict=True):
        if state.get("scales") or any(t.dtype in (torch.float16, torch.int8)
                                      for t in state["model"].values()):
            raise CheckpointError(f"{path} was exported with smaller weights (export "
                                  f"--weights): average the training checkpoints instead")
    first = states[0]
    for path, state in zip(paths[1:], states[1:], strict=True):
        different = [key for key in ("kind", "model_config", "task", "vocab")
                     if state[key] != first[key]]
        if different:
            raise CheckpointError(f"{path} differs from {paths[0]} in its "
                                  f"{', '.join(different)}: only checkpoints of one model "
                                  f"and task can be averaged")
        if state["model"].keys() != first["model"].keys():
            raise CheckpointError(f"{path} has other weights than {paths[0]}")
    averaged = {}
    for name, tensor in states[-1]["model"].items():
        if tensor.is_floating_point():
            total = sum(state["model"][name].double() for state in states)
            averaged[name] = (total / len(states)).to(tensor.dtype)
        else:
            averaged[name] = tensor.clone()
    result = {k: v for k, v in states[-1].items() if k not in ("optimizer", "scheduler", "rng")}
    result["model"] = averaged
    result["averaged"] = {"checkpoints": [str(p) for p in paths],
                          "steps": [int(s["step"]) for s in states]}
    return result


def write_average(paths: list[Path], out: Path) -> dict:
    """:func:`average_checkpoints` of ``paths``, saved (atomically) to ``out``."""
    state = average_checkpoints(paths)
    checkpoint.save(out, state)
    return state
