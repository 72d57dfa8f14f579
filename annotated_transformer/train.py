"""Training: one loop for every task, on a CPU, a GPU or several.

Every step uses chapter 6's parts (``make_batch``, ``LabelSmoothingLoss``, ``noam_lr``,
``greedy_decode``) from the model's :class:`~annotated_transformer.parts.Parts`, so a
model built from the learner's parts also trains with the learner's training code.

Beyond the recipe (:class:`TrainConfig`), a :class:`Runtime` says where and how a run
executes: the device, bf16 autocast, ``torch.compile``, where checkpoints and metrics go,
a progress bar. Several processes started by ``torchrun`` train one model with PyTorch's
``DistributedDataParallel``: every process draws the same global batch and takes its own
rows, and the loss is weighted by tokens so that the update equals one process's.

A step never waits for the device: batches, masks and token counts are made on the host
(on a GPU copied through pinned memory, ``non_blocking``), and the losses stay on the
device until they are logged.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import torch
from torch import Tensor, nn
from tqdm import tqdm

from annotated_transformer import checkpoint, distributed
from annotated_transformer.data.batching import TokenBudgetStream
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.task import Task
from annotated_transformer.data.vocab import PAD
from annotated_transformer.model import EncoderDecoder, Model, TransformerConfig, model_for
from annotated_transformer.parts import Parts
from annotated_transformer.teacher_forcing import LabelledInputs
from annotated_transformer.time_budget import BudgetSchedule, Planner, format_duration
from annotated_transformer.training_runtime import (  # noqa: F401 - where callers look
    Metrics,
    Runtime,
    Trainee,
    Weighted,
    autocast,
    compile_model,
    eager,
)


@dataclass
class TrainConfig:
    """A training run. The defaults learn the copy task on a CPU in well under a minute.

    A step trains on ``batch_size`` random examples, or, with ``max_tokens``, on a batch by
    token budget (:class:`~annotated_transformer.data.batching.TokenBudgetStream`): sequences
    of similar length together, at most ``max_tokens`` padded tokens on each side."""

    steps: int = 400
    batch_size: int = 128
    lr_factor: float = 0.3  # the Noam schedule's factor, which sets the peak rate
    warmup_steps: int = 100
    decay: str = "linear"  # after warmup: "linear" (to 0 at `steps`) or "noam" (1/sqrt(step))
    label_smoothing: float = 0.0
    clip_norm: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_size: int = 200
    max_tokens: int | None = None  # batches of about this many source and target tokens
    # Decoding, recorded for the model this run makes: the beam's length penalty exponent
    # that `evaluate` and `translate` use unless told (the paper's 0.6, or the recipe's,
    # chosen on the validation split).
    length_penalty: float = 0.6
    # Seconds of wall time for the whole run instead of a number of steps: the steps are
    # planned (and re-planned) from the measured step time, `steps` only sets the warmup's
    # share when fewer fit (time_budget.py).
    time_budget: float | None = None

    def __post_init__(self) -> None:
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be positive seconds, got {self.time_budget}")
        if self.time_budget is not None and self.decay != "linear":
            raise ValueError("a run to a time budget decays its rate linearly to the deadline: "
                             f"decay must be 'linear', got {self.decay!r}")
        if self.length_penalty < 0:
            raise ValueError(f"length_penalty must be at least 0, got {self.length_penalty}")
        if self.decay not in ("linear", "noam"):
            raise ValueError(f"decay must be 'linear' or 'noam', got {self.decay!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass
class History:
    """What a run measured: per step the loss and the rate; per evaluation the accuracy."""

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    exact_match: list[float | None] = field(default_factory=list)  # None: not decoded
    seconds: float = 0.0
    tokens: int = 0  # target tokens trained on (all processes)
    eval_examples: int = 0  # held-out examples per evaluation (a corpus may have fewer)
    budget: dict = field(default_factory=dict)  # a budgeted run's budget and plans
    machine: dict = field(default_factory=dict)  # the machine's matrix-product rate, if measured
    recipe: dict = field(default_factory=dict)  # the model `--model auto` chose, and why


def make_optimizer(model: Model, config: TrainConfig
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam (beta = 0.9, 0.98; eps = 1e-9, section 5.3) with the rate of
    :func:`learning_rate` (Noam's warmup, then its decay or a linear one) via ``LambdaLR``."""
    optimizer = adam(model.parameters(), lr=1.0)  # LambdaLR multiplies 1.0 by the schedule
    if config.time_budget is not None:  # the same peak, the end planned as the run goes
        peak = model.parts.noam_lr(config.warmup_steps, model.config.d_model,
                                   config.warmup_steps, config.lr_factor)
        schedule = BudgetSchedule(peak, config.warmup_steps, config.steps)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate(step, config, model.parts.noam_lr,
                                              model.config.d_model))
    return optimizer, scheduler


def adam(parameters, lr: float) -> torch.optim.Adam:
    """The paper's Adam (betas 0.9 and 0.98, eps 1e-9), on PyTorch's fused kernel where
    the device has one: one kernel for every parameter's update instead of several per
    parameter, the same arithmetic up to rounding."""
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device, dtype or PyTorch
        return torch.optim.Adam(parameters, lr=lr, betas=(0.9, 0.98), eps=1e-9)


def learning_rate(step: int, config: TrainConfig, noam_lr: Callable[..., float],
                  d_model: int) -> float:
    """The rate at ``step``: Noam's (``noam_lr``, exercise 6.1) with ``decay="noam"``;
    with ``decay="linear"``, Noam's warmup to the same peak, then a straight line down to
    zero at the run's last step (a run no longer than its warmup is all warmup)."""
    if config.decay == "noam" or step <= config.warmup_steps:
        return noam_lr(step, d_model, config.warmup_steps, config.lr_factor)
    peak = noam_lr(config.warmup_steps, d_model, config.warmup_steps, config.lr_factor)
    return peak * max(0.0, (config.steps - step) / (config.steps - config.warmup_steps))


def check_same_schedule(state: dict, config: TrainConfig, model: Model) -> None:
    """Resuming must not change the learning rate of any step: raise
    :class:`~annotated_transformer.checkpoint.CheckpointError` naming both schedules if the
    checkpoint's run (``decay`` missing: an older run, Noam's) had another."""
    recorded = TrainConfig(**{"decay": "noam", **state["train_config"]})
    steps = range(max(recorded.steps, config.steps) + 1)
    args = model.parts.noam_lr, model.config.d_model
    if any(learning_rate(s, recorded, *args) != learning_rate(s, config, *args) for s in steps):
        def describe(c: TrainConfig) -> str:
            return (f"{c.decay} decay, warmup {c.warmup_steps}, factor {c.lr_factor}, "
                    f"{c.steps} steps")
        raise checkpoint.CheckpointError(
            f"the checkpoint's run has another learning-rate schedule ({describe(recorded)}) "
            f"than this one ({describe(config)}): resume with the same --steps, --decay and "
            f"--lr-factor, or start a new run")


def loss_and_tokens(model: Model, net: nn.Module, src: Tensor, tgt: Tensor,
                    loss_fn: nn.Module) -> tuple[Tensor, int]:
    """The mean loss of a batch and how many target tokens it scores (read back to the
    host: for evaluation, not for the training step)."""
    batch = model.teacher_forcing(src, tgt)
    return model.loss(batch, loss_fn, net), batch.num_tokens()


def train_step(model: Model, batch: LabelledInputs, loss_fn: nn.Module,
               optimizer: torch.optim.Optimizer, scheduler, clip_norm: float | None,
               net: nn.Module | None = None, precision: str = "fp32",
               weight: float = 1.0) -> Tensor:
    """One update on ``batch`` (this process's rows of the global batch, on the device):
    chapter 6's ``train_step`` of the model's parts (Exercise 6.5), given the model as a
    :class:`Trainee` (the forward pass through ``net``, under bf16 autocast when asked) and
    the loss weighted as below.

    ``weight`` is this process's share of the global batch's scored tokens (1 for one
    process): each process's loss is weighted by it (and by the number of processes, whose
    gradients DDP averages), so that the gradient is the gradient of the global mean.
    Returns the weighted loss, a float64 scalar left on the device: nothing in the step
    waits for the device (no ``.item()``), so the host prepares the next batch while the
    device computes; :func:`train` reads the losses back every ``log_every`` steps."""
    world = distributed.world_size()
    trainee = Trainee(model, model if net is None else net, precision)
    loss = model.parts.train_step(trainee, batch, Weighted(loss_fn, weight * world), optimizer,
                                  scheduler, clip_norm)
    return loss.detach().double() / world


@torch.no_grad()
def evaluate(model: Model, src: Tensor, tgt: Tensor, loss_fn: nn.Module,
             precision: str = "fp32", batch_size: int = 500, decode: bool = True
             ) -> tuple[float, float | None]:
    """``(loss, exact match)`` on a held-out set: teacher-forced loss per token, and the
    fraction of sequences that greedy decoding reproduces exactly (in chunks of
    ``batch_size`` rows of similar length); without ``decode`` (a language model of text,
    ``Task.judged_by_decoding``), nothing is decoded and the exact match is ``None``."""
    model.eval()
    losses, tokens, correct = 0.0, 0, 0
    # Batching by length: rows sorted by length, so that each chunk, trimmed, has little padding.
    order = torch.argsort((src != PAD).sum(dim=1), stable=True)
    src, tgt = src[order], tgt[order]
    for start in range(0, src.size(0), batch_size):
        s, t = trim(src[start:start + batch_size]), trim(tgt[start:start + batch_size])
        with autocast(s.device, precision), eager():
            loss, n = loss_and_tokens(model, model, s, t, loss_fn)
            decoded = model.generate(s, t.size(1)) if decode else None  # greedy
        losses += loss.item() * n
        tokens += n
        if decoded is None:
            continue
        width = max(decoded.size(1), t.size(1))
        decoded = nn.functional.pad(decoded, (0, width - decoded.size(1)), value=PAD)
        target = nn.functional.pad(t, (0, width - t.size(1)), value=PAD)
        correct += int((decoded == target).all(dim=1).sum())
    return losses / max(tokens, 1), correct / src.size(0) if decode else None


def trim(ids: Tensor) -> Tensor:
    """Drop the columns that are padding in every row (a chunk of a length-sorted set)."""
    width = int((ids != PAD).sum(dim=1).max()) if ids.numel() else 0
    return ids[:, :max(width, 1)]


def training_batches(task: Task, config: TrainConfig, generator: torch.Generator,
                     start_step: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
    """The run's global batches ``(src [B, Ls], tgt [B, Lt])`` on the host, from step
    ``start_step + 1`` on: ``config.batch_size`` examples drawn with ``generator``, or
    batches by ``config.max_tokens`` (seeded by ``config.seed``)."""
    if config.max_tokens is None:
        while True:
            yield task.sample(config.batch_size, generator)
    yield from islice(TokenBudgetStream(task, config.max_tokens, config.seed), start_step, None)


def train(model: Model, task: Task, config: TrainConfig,
          log: Callable[[str], None] | None = None, runtime: Runtime | None = None) -> History:
    """Train ``model`` (on the device it is on) on ``task``; evaluate on held-out
    examples every ``eval_every`` steps; checkpoint and write metrics when ``runtime.out``
    is set; resume from the checkpoint when ``runtime.resume`` (:class:`TrainingRun`)."""
    return TrainingRun(model, task, config, log, runtime).run()


class TrainingRun:
    """One run of :func:`train`, as one object: what its steps share (the model and its DDP
    wrapper, the optimizer and its schedule, the held-out set, the metrics, the progress
    bar, and with a time budget its :class:`~annotated_transformer.time_budget.Planner`),
    and the hooks :meth:`run` calls in turn: :meth:`step` (chapter 6's ``train_step`` on
    this process's rows of the global batch), :meth:`log` every ``log_every`` steps,
    :meth:`evaluate_and_save` every ``eval_every``, and, to a budget, :meth:`budget` after
    each step (time it, re-plan, stop in time)."""

    def __init__(self, model: Model, task: Task, config: TrainConfig,
                 log: Callable[[str], None] | None = None,
                 runtime: Runtime | None = None) -> None:
        runtime = runtime or Runtime()
        clock_start = time.perf_counter() if runtime.started is None else runtime.started
        self.model, self.config, self.runtime = model, config, runtime
        self.device = next(model.parameters()).device
        self.rank, self.world = distributed.rank(), distributed.world_size()
        if config.time_budget is not None and (runtime.resume or self.world > 1):
            raise ValueError("a run to a time budget trains in one process from its start "
                             "(its schedule ends at its deadline): give a number of steps "
                             "instead to " + ("resume" if runtime.resume
                                              else "train with several processes"))
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.loss_fn = model.parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
        self.optimizer, self.scheduler = make_optimizer(model, config)
        self.history, self.start_step = History(), 0
        if runtime.resume:
            state = checkpoint.load(runtime.out / checkpoint.FILE_NAME, map_location=self.device)
            checkpoint.check_compatible(state, model, task)
            check_same_schedule(state, config, model)
            self.start_step = checkpoint.restore_training(state, model, self.optimizer,
                                                          self.scheduler, self.generator)
            self.history = History(**state.get("history", {}))
        self.task = task
        self.held_out = [x.to(self.device) for x in task.held_out_set(config.eval_size)]
        self.history.eval_examples = self.held_out[0].size(0)
        if runtime.compile:
            compile_model(model, runtime.compile_backend)
            # the loss too: over a large vocabulary its elementwise work is a step's largest
            self.loss_fn.compile(dynamic=True, backend=runtime.compile_backend)
        self.net = distributed.wrap(model, self.device)
        self.metrics = Metrics(runtime.out if self.rank == 0 else None, append=runtime.resume)
        if runtime.machine is not None:  # this start's machine (a resumed run: the latest)
            self.history.machine = runtime.machine
            self.metrics.write(step=self.start_step, machine=runtime.machine)
        if runtime.recipe is not None:  # --model auto's choice for this machine
            self.history.recipe = runtime.recipe
            self.metrics.write(step=self.start_step, recipe=runtime.recipe)
        self.planner = None if config.time_budget is None else Planner(
            config.time_budget, clock_start, config.eval_every, config.warmup_steps,
            config.steps, average_checkpoints=runtime.keep_last)
        # A budget's total is known once planned.
        self.total = config.steps if self.planner is None else 10**9
        # Only a bar that shows is made: any tqdm bar, a disabled one too, starts tqdm's
        # monitor thread, and warns on stderr where threads are refused (the grading worker).
        self.bar = tqdm(total=config.steps if self.planner is None else None,
                        initial=self.start_step, unit="step", dynamic_ncols=True
                        ) if runtime.progress and not self.rank else None
        self.say = log if log is None or not runtime.progress else tqdm.write
        self.started = self.since = time.perf_counter()
        self.tokens_since = 0
        self.seconds_before = self.history.seconds
        self.batches = training_batches(task, config, self.generator, self.start_step)
        self.pending: list[Tensor] = []  # the steps' losses, on the device until logged
        self.mark, self.evaluating = time.perf_counter(), 0.0  # a budget's step timing

    def read_losses(self) -> float:
        """The losses of the steps since the last call, summed over processes: the only
        place where the training loop waits for the device."""
        if self.pending:
            self.history.loss.extend(
                distributed.all_sum(torch.stack(self.pending), self.device).tolist())
            self.pending.clear()
        return self.history.loss[-1]

    def step(self, step: int) -> float:
        """Train step ``step`` on this process's rows of the global batch (made on the host
        with its masks and token counts; each process weighted by its share of the scored
        tokens); its learning rate."""
        lr = self.scheduler.get_last_lr()[0]
        batch = self.model.teacher_forcing(*next(self.batches))
        batch_tokens = batch.num_tokens()
        mine = batch.rows(self.rank, self.world)
        weight = mine.num_tokens() / max(batch_tokens, 1)
        self.pending.append(train_step(
            self.model, mine.to(self.device), self.loss_fn, self.optimizer, self.scheduler,
            self.config.clip_norm, self.net, self.runtime.precision, weight))
        self.history.step.append(step)
        self.history.lr.append(lr)
        self.history.tokens += batch_tokens
        self.tokens_since += batch_tokens
        if self.bar is not None:
            self.bar.update(1)
        return lr

    def evaluate_and_save(self, step: int) -> None:
        """Evaluate on the held-out set, log it and save the checkpoint (rank 0); with a
        budget, time both for the planner."""
        loss = self.read_losses()
        if self.rank == 0:
            began = time.perf_counter()
            eval_loss, accuracy = evaluate(self.model, *self.held_out, self.loss_fn,
                                           self.runtime.precision,
                                           decode=self.task.judged_by_decoding)
            history = self.history
            history.eval_step.append(step)
            history.eval_loss.append(eval_loss)
            history.exact_match.append(accuracy)
            score = (dict(exact_match=accuracy) if accuracy is not None else
                     dict(perplexity=round(math.exp(eval_loss), 4)))
            self.metrics.write(step=step, eval_loss=round(eval_loss, 5), **score,
                               num_examples=self.held_out[0].size(0))
            if self.say:
                self.say(f"step {step:5d}  train loss {loss:.3f}  held-out loss "
                         f"{eval_loss:.3f}  " + (f"exact match {accuracy:.1%}"
                                                 if accuracy is not None else
                                                 f"perplexity {math.exp(eval_loss):.2f}"))
            history.seconds = self.seconds_before + time.perf_counter() - self.started
            saving = time.perf_counter()
            self.save(step)
            if self.planner is not None:
                now = time.perf_counter()
                self.planner.eval_done(now - began, now - saving)
                self.evaluating += now - began  # not a step's time
        distributed.barrier()

    def save(self, step: int) -> None:
        """The checkpoint (with a budget: the schedule as planned), and the copies that
        ``average`` reads."""
        runtime = self.runtime
        if runtime.out is None:
            return
        saved = self.config
        if self.planner is not None:
            self.history.budget = self.planner.record()
            schedule = self.scheduler.lr_lambdas[0]
            saved = dataclasses.replace(self.config, steps=min(self.total, schedule.total),
                                        warmup_steps=schedule.warmup)
        checkpoint.save_training(runtime.out / checkpoint.FILE_NAME, self.model, self.task,
                                 saved, step, self.optimizer, self.scheduler, self.generator,
                                 self.history)
        if runtime.keep_last:  # copies for `average` (average.py)
            from annotated_transformer.average import keep_copy
            keep_copy(runtime.out, step, runtime.keep_last)

    def replan(self, step: int) -> int:
        """A budget's (new) plan at ``step``: its total, logged when it moved."""
        planner = self.planner
        assert planner is not None
        previous = planner.plans[-1].total if planner.plans else None
        plan = planner.plan(step, time.perf_counter())
        self.scheduler.lr_lambdas[0].replan(step, plan.total, plan.warmup)
        self.metrics.write(step=step, plan=dataclasses.asdict(plan))
        if self.bar is not None:
            self.bar.total = plan.total
        if self.say and (previous is None or abs(plan.total - previous) > 0.01 * previous):
            when = f"{format_duration(plan.seconds)} into {format_duration(planner.budget)}"
            self.say(f"time budget: {'planned' if previous is None else 're-planned'} at "
                     f"step {step} ({when}): {plan.describe()}")
        return plan.total

    def budget(self, step: int) -> bool:
        """After step ``step`` of a run to a budget: time it, evaluate when the planner asks,
        re-plan when due, and end the run when one more step would not leave time for the
        final evaluation; whether it evaluated."""
        planner = self.planner
        assert planner is not None
        now = time.perf_counter()  # a step's time: since the last one's end, less evaluation
        planner.step_done(step, now - self.mark - self.evaluating)
        self.mark, self.evaluating = now, 0.0
        evaluated = False
        if planner.wants_eval(step):  # the first plan needs an evaluation's time
            self.evaluate_and_save(step)
            evaluated = True
        if planner.due(step, time.perf_counter()):
            self.total = self.replan(step)
        if step < self.total and planner.must_stop(step, time.perf_counter()):
            if self.say:
                self.say(f"time budget: stopping at step {step}, "
                         + (f"{self.total - step} steps before the plan's end: "
                            if planner.plans else "before any plan: ")
                         + "one more step would leave too little time for the final "
                           "evaluation")
            self.total = step
        return evaluated

    def log(self, step: int, lr: float) -> None:
        """The training loss, rate and speed since the last log, to the bar and metrics."""
        loss = self.read_losses()
        now = time.perf_counter()
        rate = self.tokens_since / (now - self.since)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}")
        self.metrics.write(step=step, loss=round(loss, 5), lr=lr, tokens_per_second=round(rate),
                           seconds=round(self.seconds_before + now - self.started, 2))
        self.tokens_since, self.since = 0, now

    def run(self) -> History:
        """Train to the end (``config.steps``, or the budget's plan); the run's history."""
        step = self.start_step
        while step < self.total:
            step += 1
            lr = self.step(step)
            evaluated = self.budget(step) if self.planner is not None else False
            if step % self.runtime.log_every == 0 or step == self.total:
                self.log(step, lr)
            if (step % self.config.eval_every == 0 or step == self.total) and not evaluated:
                self.evaluate_and_save(step)
        if self.bar is not None:
            self.bar.close()
        self.metrics.close()
        self.history.seconds = self.seconds_before + time.perf_counter() - self.started
        if self.planner is not None:
            self.history.budget = self.planner.record()
        return self.history


def train_copy_task(parts: Parts | None = None, config: TrainConfig | None = None,
                    task: CopyTask | None = None, log: Callable[[str], None] | None = print
                    ) -> tuple[EncoderDecoder, History]:
    """The course's default recipe (``train --task copy`` runs the same: ``recipes.RECIPES
    ["copy"]`` is :data:`COPY_MODEL` and ``TrainConfig()``): a small model learns to copy,
    from ``parts``."""
    config = config or TrainConfig()
    task = task or CopyTask()
    torch.manual_seed(config.seed)
    model = EncoderDecoder(model_config(task, **COPY_MODEL), parts=parts)
    return model, train(model, task, config, log=log)


# One layer each way suffices to copy: decoder position i attends to source position i.
COPY_MODEL = {"num_layers": 1}


def model_config(task: Task, **sizes) -> TransformerConfig:
    """:meth:`TransformerConfig.small` with ``sizes``, for ``task``: its vocabulary, and
    positions for its longest sequence (at least 64)."""
    longest = model_for(task).longest_sequence(task.max_source_len, task.max_target_len)
    return TransformerConfig.small(len(task.vocab), max_len=max(64, longest), **sizes)
