"""Training: teacher forcing, label smoothing, Adam with the Noam schedule, gradient clipping.

Every step uses chapter 6's parts (``make_batch``, ``LabelSmoothingLoss``, ``noam_lr``,
``greedy_decode``) from the model's :class:`~annotated_transformer.parts.Parts`, so a
model built from the learner's parts also trains with the learner's training code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from annotated_transformer.batch import Batch
from annotated_transformer.data.copy import BOS, EOS, PAD, CopyTask
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts, use_parts


@dataclass
class TrainConfig:
    """A training run. The defaults learn the copy task on a CPU in well under a minute."""

    steps: int = 1000
    batch_size: int = 128
    lr_factor: float = 0.3  # the Noam schedule's factor: a calm end, where copying locks in
    warmup_steps: int = 100
    label_smoothing: float = 0.0
    clip_norm: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_size: int = 200


@dataclass
class History:
    """What a run measured: per step the loss and the rate; per evaluation the accuracy."""

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    exact_match: list[float] = field(default_factory=list)
    seconds: float = 0.0


def make_optimizer(model: EncoderDecoder, config: TrainConfig
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam (beta = 0.9, 0.98; eps = 1e-9, section 5.3) with the Noam rate via ``LambdaLR``."""
    noam_lr = model.parts.noam_lr
    d_model = model.config.d_model
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: noam_lr(step, d_model, config.warmup_steps, config.lr_factor))
    return optimizer, scheduler


def batch_loss(model: EncoderDecoder, batch: Batch, loss_fn: nn.Module) -> Tensor:
    """The loss of the teacher-forced predictions of ``batch``, per real label token."""
    logits = model(batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask)  # [B, Lt-1, V]
    return loss_fn(logits.reshape(-1, logits.size(-1)), batch.tgt_labels.reshape(-1))


def train_step(model: EncoderDecoder, src: Tensor, tgt: Tensor, loss_fn: nn.Module,
               optimizer: torch.optim.Optimizer, scheduler, clip_norm: float | None) -> float:
    """One update on ``(src [B, Ls], tgt [B, Lt])``; returns the loss per real label token."""
    with use_parts(model.parts):
        batch = model.parts.make_batch(src, tgt, PAD)
    model.train()
    loss = batch_loss(model, batch, loss_fn)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: EncoderDecoder, src: Tensor, tgt: Tensor, loss_fn: nn.Module
             ) -> tuple[float, float]:
    """``(loss, exact match)`` on a held-out set: teacher-forced loss, and the fraction of
    sequences that greedy decoding reproduces exactly."""
    model.eval()
    parts = model.parts
    with use_parts(parts):
        batch = parts.make_batch(src, tgt, PAD)
        loss = batch_loss(model, batch, loss_fn).item()
        decoded = parts.greedy_decode(model, src, batch.src_mask, tgt.size(1), BOS, EOS, PAD)
    width = max(decoded.size(1), tgt.size(1))
    decoded = nn.functional.pad(decoded, (0, width - decoded.size(1)), value=PAD)
    target = nn.functional.pad(tgt, (0, width - tgt.size(1)), value=PAD)
    return loss, (decoded == target).all(dim=1).float().mean().item()


def train(model: EncoderDecoder, task: CopyTask, config: TrainConfig,
          log: Callable[[str], None] | None = None) -> History:
    """Train ``model`` on ``task``; evaluate on held-out sequences every ``eval_every`` steps."""
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    with use_parts(model.parts):
        loss_fn = model.parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
    optimizer, scheduler = make_optimizer(model, config)
    held_out = task.held_out_set(config.eval_size)
    history, start = History(), time.perf_counter()
    for step in range(1, config.steps + 1):
        history.lr.append(scheduler.get_last_lr()[0])
        src, tgt = task.sample(config.batch_size, generator)
        history.loss.append(train_step(model, src, tgt, loss_fn, optimizer, scheduler,
                                       config.clip_norm))
        history.step.append(step)
        if step % config.eval_every == 0 or step == config.steps:
            loss, accuracy = evaluate(model, *held_out, loss_fn)
            history.eval_step.append(step)
            history.eval_loss.append(loss)
            history.exact_match.append(accuracy)
            if log:
                log(f"step {step:5d}  train loss {history.loss[-1]:.3f}  held-out loss "
                    f"{loss:.3f}  exact match {accuracy:.1%}")
    history.seconds = time.perf_counter() - start
    return history


def train_copy_task(parts: Parts | None = None, config: TrainConfig | None = None,
                    task: CopyTask | None = None, log: Callable[[str], None] | None = print
                    ) -> tuple[EncoderDecoder, History]:
    """The course's default recipe: a small model learns to copy, from ``parts``."""
    config = config or TrainConfig()
    task = task or CopyTask()
    torch.manual_seed(config.seed)
    # One layer each way suffices to copy: decoder position i attends to source position i.
    model = EncoderDecoder(TransformerConfig.small(task.vocab_size, num_layers=1), parts=parts)
    return model, train(model, task, config, log=log)


def main(argv: list[str] | None = None) -> int:
    """``python -m annotated_transformer.train``: train the copy task and report the result."""
    import argparse
    import statistics

    parser = argparse.ArgumentParser(prog="python -m annotated_transformer.train",
                                     description="Train a small Transformer on the copy task.")
    parser.add_argument("--parts", default="solutions",
                        help="where every chapter's parts come from: solutions (default), "
                        "exercises (yours) or a folder of chNN_*.py files")
    parser.add_argument("--seed", type=int, action="append",
                        help="random seed (repeat for several runs; default 0)")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--reverse", action="store_true", help="reverse instead of copy")
    args = parser.parse_args(argv)
    seconds, accuracies = [], []
    for seed in args.seed or [0]:
        print(f"seed {seed}, parts from {args.parts}")
        config = TrainConfig(steps=args.steps, seed=seed)
        _, history = train_copy_task(Parts(args.parts), config, CopyTask(reverse=args.reverse))
        seconds.append(history.seconds)
        accuracies.append(history.exact_match[-1])
        print(f"held-out exact match {history.exact_match[-1]:.1%} after {args.steps} steps, "
              f"{history.seconds:.1f} s\n")
    if len(seconds) > 1:
        print(f"median over {len(seconds)} seeds: {statistics.median(seconds):.1f} s, "
              f"exact match {min(accuracies):.1%} to {max(accuracies):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
