"""How a training run executes, apart from what it learns: :class:`Runtime` (the
precision, ``torch.compile``, where checkpoints and metrics go, a progress bar),
:func:`compile_model`, bf16 :func:`autocast`, :func:`eager` inside compiled code, the
:class:`Metrics` file, and the model and loss as chapter 6's training step sees them
(:class:`Trainee`, :class:`Weighted`: DDP, autocast and the token weighting kept out of
the learner's step)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from annotated_transformer.model import Model
from annotated_transformer.teacher_forcing import LabelledInputs


@dataclass
class Runtime:
    """How a run executes (the device is the model's own; none of this changes what is learned)."""

    precision: str = "fp32"  # or "bf16": autocast to bfloat16
    compile: bool = False  # torch.compile the model's layers for training (compile_model)
    compile_backend: str = "inductor"  # or "aot_eager": trace, but run PyTorch's kernels
    out: Path | None = None  # checkpoint.pt and metrics.jsonl go here
    resume: bool = False  # continue from out/checkpoint.pt
    progress: bool = False  # a tqdm progress bar
    log_every: int = 10  # steps between metrics lines
    keep_last: int = 0  # also keep the last N checkpoints as checkpoint-STEP.pt (averaging)
    started: float | None = None  # time.perf_counter() when the command started (a budget's
    # clock; default: when `train` starts)
    machine: dict | None = None  # the machine's measured matrix-product rate (machine.measure),
    # recorded in the metrics and the checkpoint's history
    recipe: dict | None = None  # the model `--model auto` chose and why (recipe_fit.Choice),
    # recorded there too

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.resume and self.out is None:
            raise ValueError("resume needs the run's folder (out)")


def compile_model(model: Model, backend: str = "inductor") -> Model:
    """Compile ``model``'s layers in place with ``torch.compile(dynamic=True)``; returns it.

    - **The layers, not the whole model** ("regional" compilation): every encoder and
      decoder layer of a model has the same code and shapes, so one compiled graph serves
      all of them, and compiling takes the time of one layer instead of ``N``. The
      embeddings and the generator stay eager (a few large operations each);
      :func:`train` compiles the loss as well.
    - **``dynamic=True``**: batches change shape from step to step (sampled sequences
      differ in length, and a batch by token budget also in rows), and every size is
      traced as a symbol from the first step, so the layers compile once for every
      ``[B, L]`` instead of once per shape. Padding lengths to a few buckets would
      compile a few times and compute on the padding at every step. Sizes 0 and 1 are
      still specialised (a batch of one row compiles once more).
    - ``backend``: ``"inductor"`` generates kernels (C++ on a CPU, Triton on a GPU);
      ``"aot_eager"`` traces forward and backward the same way but runs PyTorch's own
      kernels: a quicker check, without a C++ compiler, that the model compiles.

    Parameters, state dict and checkpoints are unchanged. :func:`evaluate` runs the
    layers eagerly (decoding grows its input one token at a time).
    """
    parts = model.parts
    layers = tuple(getattr(parts, name) for name in ("EncoderLayer", "DecoderLayer"))
    for module in model.modules():
        if isinstance(module, layers):
            module.compile(dynamic=True, backend=backend)
    return model


def eager():
    """Run compiled code eagerly inside this block (PyTorch 2.6 and later; before, nothing)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def autocast(device: torch.device, precision: str):
    """bf16 autocast when asked for, otherwise nothing."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Metrics:
    """Metrics as JSON lines in ``out/metrics.jsonl`` (nothing when ``out`` is None)."""

    def __init__(self, out: Path | None, append: bool) -> None:
        self.file = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.file = open(out / "metrics.jsonl", "a" if append else "w", encoding="utf-8")

    def write(self, **record) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


class Trainee:
    """The model as a training step sees it: ``trainee(*args)`` is the forward pass through
    ``net`` (the model, or its ``DistributedDataParallel`` wrapper, which must see the call
    to average the gradients) under bf16 autocast when ``precision`` asks for it (only the
    forward pass: the backward runs outside); ``loss(batch, loss_fn)`` is the model's own
    (the fast parts' step uses it: only the scored positions computed); ``train``,
    ``parameters`` and ``zero_grad`` are the model's."""

    def __init__(self, model: Model, net: nn.Module, precision: str) -> None:
        self.model, self.net, self.precision = model, net, precision

    def __call__(self, *args: Tensor) -> Tensor:
        with autocast(args[0].device, self.precision):
            return self.net(*args)

    def loss(self, batch: LabelledInputs, loss_fn: nn.Module) -> Tensor:
        with autocast(batch.labels.device, self.precision):
            return self.model.loss(batch, loss_fn, self.net)

    @property
    def training(self) -> bool:
        return self.model.training

    def train(self, mode: bool = True) -> Trainee:
        self.model.train(mode)
        return self

    def parameters(self, recurse: bool = True):
        return self.model.parameters(recurse)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none)


class Weighted(nn.Module):
    """``loss_fn`` times ``weight``, and so its ``model_loss`` when it has one (the fast
    parts' loss computed from the model)."""

    def __init__(self, loss_fn: nn.Module, weight: float) -> None:
        super().__init__()
        self.loss_fn, self.weight = loss_fn, weight
        if hasattr(loss_fn, "model_loss"):
            self.model_loss = lambda model, batch: loss_fn.model_loss(model, batch) * weight

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return self.loss_fn(logits, labels) * self.weight
