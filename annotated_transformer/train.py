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

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

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

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.resume and self.out is None:
            raise ValueError("resume needs the run's folder (out)")


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
    tokens: int = 0  # target tokens trained on (all processes)
    eval_examples: int = 0  # held-out examples per evaluation (a corpus may have fewer)
    budget: dict = field(default_factory=dict)  # a budgeted run's budget and plans


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
    """One update on ``batch`` (this process's rows of the global batch, on the device).

    ``weight`` is this process's share of the global batch's scored tokens (1 for one
    process): each process's loss is weighted by it, so that the gradient DDP averages is
    the gradient of the global mean. Returns the weighted loss, a float64 scalar left on
    the device: nothing in the step waits for the device (no ``.item()``), so the host
    prepares the next batch while the device computes; :func:`train` reads the losses
    back every ``log_every`` steps."""
    net = model if net is None else net
    model.train()
    with autocast(batch.labels.device, precision):
        loss = model.loss(batch, loss_fn, net)
    optimizer.zero_grad(set_to_none=True)
    (loss * weight * distributed.world_size()).backward()  # DDP averages over processes
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    return loss.detach().double() * weight


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


@torch.no_grad()
def evaluate(model: Model, src: Tensor, tgt: Tensor, loss_fn: nn.Module,
             precision: str = "fp32", batch_size: int = 500) -> tuple[float, float]:
    """``(loss, exact match)`` on a held-out set: teacher-forced loss per token, and the
    fraction of sequences that greedy decoding reproduces exactly (in chunks of
    ``batch_size`` rows of similar length)."""
    model.eval()
    losses, tokens, correct = 0.0, 0, 0
    # Batching by length: rows sorted by length, so that each chunk, trimmed, has little padding.
    order = torch.argsort((src != PAD).sum(dim=1), stable=True)
    src, tgt = src[order], tgt[order]
    for start in range(0, src.size(0), batch_size):
        s, t = trim(src[start:start + batch_size]), trim(tgt[start:start + batch_size])
        with autocast(s.device, precision), eager():
            loss, n = loss_and_tokens(model, model, s, t, loss_fn)
            decoded = model.generate(s, t.size(1))  # greedy
        losses += loss.item() * n
        tokens += n
        width = max(decoded.size(1), t.size(1))
        decoded = nn.functional.pad(decoded, (0, width - decoded.size(1)), value=PAD)
        target = nn.functional.pad(t, (0, width - t.size(1)), value=PAD)
        correct += int((decoded == target).all(dim=1).sum())
    return losses / max(tokens, 1), correct / src.size(0)


def trim(ids: Tensor) -> Tensor:
    """Drop the columns that are padding in every row (a chunk of a length-sorted set)."""
    width = int((ids != PAD).sum(dim=1).max()) if ids.numel() else 0
    return ids[:, :max(width, 1)]


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
    is set; resume from the checkpoint when ``runtime.resume``."""
    runtime = runtime or Runtime()
    clock_start = time.perf_counter() if runtime.started is None else runtime.started
    device = next(model.parameters()).device
    rank, world = distributed.rank(), distributed.world_size()
    if config.time_budget is not None and (runtime.resume or world > 1):
        raise ValueError("a run to a time budget trains in one process from its start (its "
                         "schedule ends at its deadline): give a number of steps instead to "
                         + ("resume" if runtime.resume else "train with several processes"))
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    loss_fn = model.parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
    optimizer, scheduler = make_optimizer(model, config)
    history, start_step = History(), 0
    if runtime.resume:
        state = checkpoint.load(runtime.out / checkpoint.FILE_NAME, map_location=device)
        checkpoint.check_compatible(state, model, task)
        check_same_schedule(state, config, model)
        start_step = checkpoint.restore_training(state, model, optimizer, scheduler, generator)
        history = History(**state.get("history", {}))
    held_out = [x.to(device) for x in task.held_out_set(config.eval_size)]
    history.eval_examples = held_out[0].size(0)
    if runtime.compile:
        compile_model(model, runtime.compile_backend)
        # the loss too: over a large vocabulary its elementwise work is a step's largest
        loss_fn.compile(dynamic=True, backend=runtime.compile_backend)
    net = distributed.wrap(model, device)
    metrics = Metrics(runtime.out if rank == 0 else None, append=runtime.resume)
    planner = None if config.time_budget is None else Planner(
        config.time_budget, clock_start, config.eval_every, config.warmup_steps, config.steps,
        average_checkpoints=runtime.keep_last)
    total = config.steps if planner is None else 10**9  # a budget's total: once planned
    bar = tqdm(total=config.steps if planner is None else None, initial=start_step,
               disable=not runtime.progress or rank, unit="step", dynamic_ncols=True)
    say = log if log is None or not runtime.progress else tqdm.write
    started, tokens_since, since = time.perf_counter(), 0, time.perf_counter()
    seconds_before = history.seconds
    batches = training_batches(task, config, generator, start_step)
    pending: list[Tensor] = []  # the steps' losses, on the device until they are logged

    def read_losses() -> float:
        """The losses of the steps since the last call, summed over processes: the only
        place where the training loop waits for the device."""
        if pending:
            history.loss.extend(distributed.all_sum(torch.stack(pending), device).tolist())
            pending.clear()
        return history.loss[-1]

    def evaluate_and_save(step: int) -> None:
        """Evaluate on the held-out set, log it and save the checkpoint (rank 0); with a
        budget, time both for the planner."""
        loss = read_losses()
        if rank == 0:
            began = time.perf_counter()
            eval_loss, accuracy = evaluate(model, *held_out, loss_fn, runtime.precision)
            history.eval_step.append(step)
            history.eval_loss.append(eval_loss)
            history.exact_match.append(accuracy)
            metrics.write(step=step, eval_loss=round(eval_loss, 5),
                          exact_match=accuracy, num_examples=held_out[0].size(0))
            if say:
                say(f"step {step:5d}  train loss {loss:.3f}  held-out loss "
                    f"{eval_loss:.3f}  exact match {accuracy:.1%}")
            history.seconds = seconds_before + time.perf_counter() - started
            saving = time.perf_counter()
            if runtime.out is not None:
                saved = config
                if planner is not None:
                    history.budget = planner.record()
                    schedule = scheduler.lr_lambdas[0]
                    saved = dataclasses.replace(config, steps=min(total, schedule.total),
                                                warmup_steps=schedule.warmup)
                checkpoint.save_training(runtime.out / checkpoint.FILE_NAME, model, task,
                                         saved, step, optimizer, scheduler, generator, history)
                if runtime.keep_last:  # copies for `average` (average.py)
                    from annotated_transformer.average import keep_copy
                    keep_copy(runtime.out, step, runtime.keep_last)
            if planner is not None:
                now = time.perf_counter()
                planner.eval_done(now - began, now - saving)
                evaluating[0] += now - began  # not a step's time
        distributed.barrier()

    def replan(step: int) -> int:
        """A budget's (new) plan at ``step``: its total, logged when it moved."""
        previous = planner.plans[-1].total if planner.plans else None
        plan = planner.plan(step, time.perf_counter())
        scheduler.lr_lambdas[0].replan(step, plan.total, plan.warmup)
        metrics.write(step=step, plan=dataclasses.asdict(plan))
        bar.total = plan.total
        if say and (previous is None or abs(plan.total - previous) > 0.01 * previous):
            when = f"{format_duration(plan.seconds)} into {format_duration(planner.budget)}"
            say(f"time budget: {'planned' if previous is None else 're-planned'} at step "
                f"{step} ({when}): {plan.describe()}")
        return plan.total

    step, mark, evaluating = start_step, time.perf_counter(), [0.0]
    while step < total:
        step += 1
        lr = scheduler.get_last_lr()[0]
        # The global batch, its masks and its token counts are made on the host; each
        # process trains on its own rows, weighted by its share of the scored tokens.
        batch = model.teacher_forcing(*next(batches))
        batch_tokens = batch.num_tokens()
        mine = batch.rows(rank, world)
        weight = mine.num_tokens() / max(batch_tokens, 1)
        pending.append(train_step(model, mine.to(device), loss_fn, optimizer, scheduler,
                                  config.clip_norm, net, runtime.precision, weight))
        history.step.append(step)
        history.lr.append(lr)
        history.tokens += batch_tokens
        tokens_since += batch_tokens
        bar.update(1)
        evaluated = False
        if planner is not None:
            # a step's time: since the last one's end, less any evaluation in between
            now = time.perf_counter()
            planner.step_done(step, now - mark - evaluating[0])
            mark, evaluating[0] = now, 0.0
            if planner.wants_eval(step):  # the first plan needs an evaluation's time
                evaluate_and_save(step)
                evaluated = True
            if planner.due(step, time.perf_counter()):
                total = replan(step)
            if step < total and planner.must_stop(step, time.perf_counter()):
                if say:
                    say(f"time budget: stopping at step {step}, "
                        + (f"{total - step} steps before the plan's end: " if planner.plans
                           else "before any plan: ")
                        + "one more step would leave too little time for the final evaluation")
                total = step
        if step % runtime.log_every == 0 or step == total:
            loss = read_losses()
            now = time.perf_counter()
            rate = tokens_since / (now - since)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}")
            metrics.write(step=step, loss=round(loss, 5), lr=lr, tokens_per_second=round(rate),
                          seconds=round(seconds_before + now - started, 2))
            tokens_since, since = 0, now
        if (step % config.eval_every == 0 or step == total) and not evaluated:
            evaluate_and_save(step)
    bar.close()
    metrics.close()
    history.seconds = seconds_before + time.perf_counter() - started
    if planner is not None:
        history.budget = planner.record()
    return history


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
