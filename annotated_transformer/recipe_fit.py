"""A recipe fitted to the machine: the largest model of a ladder that a time budget trains
long enough on this machine, chosen from its measured step time (``train --model auto``).

A time budget adapts the number of steps to the machine (:mod:`~annotated_transformer.
time_budget`), not the model: on a machine at 40% of another's speed the same model trains
40% of the steps, and stops far from where it would have gone. A smaller model makes
cheaper steps and so more of them; below some number of steps it ends better than the
larger one. Each :class:`~annotated_transformer.recipes.Rung` of a ladder (largest first)
names that number, its ``min_steps`` (the book's Performance page: BLEU against the
machine's speed, and how each was chosen).

:func:`choose` times a few training steps of each rung in turn, on the run's first
batches, and keeps the first whose steps at that speed fill the budget's training time to
at least its ``min_steps`` (the last rung if none does). The steps that time a rung train a
copy that is thrown away: the run then starts from its seed, as any other, and the seconds
of the trial come out of its budget. :func:`choose` reads time only from the function it is
given, so that a test decides from given speeds (``tests/library/test_recipe_fit.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from annotated_transformer.data.task import Task
from annotated_transformer.data.vocab import PAD
from annotated_transformer.machine import synchronize
from annotated_transformer.model import TransformerConfig, model_for
from annotated_transformer.parts import Parts
from annotated_transformer.recipes import Rung
from annotated_transformer.train import TrainConfig, make_optimizer, train_step, training_batches

# Of the budget's seconds left when the choice is made, the share that steps take: the rest
# goes to the evaluations, the final one and the checkpoints (about 3% on the CPU recipe).
TRAINING_SHARE = 0.95
TRIAL_STEPS = 10  # timed steps per rung, after SKIPPED_STEPS that warm the allocator up,
SKIPPED_STEPS = 2
TRIAL_SHARE = 0.02  # and fewer if a rung's trial has taken this share of the budget


@dataclass(frozen=True)
class Trial:
    """A rung timed on this machine: ``step_seconds`` a step, so ``steps`` in the budget."""

    name: str
    step_seconds: float
    steps: int
    min_steps: int


@dataclass(frozen=True)
class Choice:
    """The rung chosen, the trials that chose it, and the training seconds they counted on."""

    rung: Rung
    trials: tuple[Trial, ...]
    seconds: float

    def describe(self) -> str:
        """Why this rung, in one line."""
        timed = "; ".join(
            f"{t.name}: {t.step_seconds:.3f} s a step, {t.steps:,} steps"
            + (f" (fewer than its {t.min_steps:,})" if t.steps < t.min_steps else "")
            for t in self.trials)
        return (f"{self.rung.name}, for {self.seconds / 60:.1f} minutes of steps "
                f"({timed})")

    def record(self) -> dict:
        """What the metrics and the checkpoint keep."""
        return {"chosen": self.rung.name, "model": dict(self.rung.recipe.model),
                "training_seconds": round(self.seconds, 1),
                "trials": [asdict(t) for t in self.trials]}


def choose(ladder: Sequence[Rung], step_seconds: Callable[[Rung], float],
           seconds: float) -> Choice:
    """The first rung of ``ladder`` (largest first) of which ``seconds`` of training make at
    least ``min_steps`` steps at ``step_seconds(rung)`` each, or its last rung; rungs after
    the chosen one are not timed. ``ValueError`` for an empty ladder or a step time that is
    not positive."""
    if not ladder:
        raise ValueError("a ladder needs at least one rung")
    trials = []
    for rung in ladder:
        per_step = step_seconds(rung)
        if not per_step > 0:
            raise ValueError(f"{rung.name}: a step time must be positive, got {per_step}")
        steps = int(max(seconds, 0.0) // per_step)
        trials.append(Trial(rung.name, per_step, steps, rung.min_steps))
        if steps >= rung.min_steps or rung is ladder[-1]:
            return Choice(rung, tuple(trials), seconds)
    raise AssertionError("unreachable: the last rung is always chosen")


def time_steps(model_config: TransformerConfig, config: TrainConfig, task: Task,
               parts: Parts, device: torch.device, precision: str = "fp32",
               steps: int = TRIAL_STEPS, skip: int = SKIPPED_STEPS,
               limit: float = float("inf")) -> float:
    """Seconds of one step of ``config``'s run of a model of ``model_config`` on this
    machine: the mean of ``steps`` steps (the batch's making included) after ``skip``
    untimed ones, on the run's first batches, from a copy of the model seeded by
    ``config.seed`` and thrown away (the run that follows seeds itself again). Fewer
    steps, at least one timed, once the trial has taken ``limit`` seconds."""
    torch.manual_seed(config.seed)
    model = model_for(task)(model_config, parts=parts).to(device)
    optimizer, scheduler = make_optimizer(model, config)
    loss_fn = model.parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
    batches = training_batches(task, config, torch.Generator().manual_seed(config.seed))
    seconds, timed, started = 0.0, 0, time.perf_counter()
    for index in range(skip + steps):
        synchronize(device)
        began = time.perf_counter()  # the batch's making too, as the run's step times count it
        batch = model.teacher_forcing(*next(batches)).to(device)
        train_step(model, batch, loss_fn, optimizer, scheduler, config.clip_norm,
                   precision=precision)
        synchronize(device)
        if index >= skip:
            seconds, timed = seconds + time.perf_counter() - began, timed + 1
        if timed and time.perf_counter() - started >= limit:
            break
    return seconds / timed
