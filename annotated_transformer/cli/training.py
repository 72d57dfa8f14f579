"""``train``: a model trained on a task with the task's recipe."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from pathlib import Path

import torch

from annotated_transformer import checkpoint, distributed, machine
from annotated_transformer.cli.common import UsageError, parse_parts, pick_device
from annotated_transformer.cli.translation import (
    add_translation_options,
    reuse_saved_vocabulary,
    translation_task_options,
)
from annotated_transformer.data import TASKS, make_task
from annotated_transformer.model import model_for

# ---------------------------------------------------------------- train

def _cpu_budget_minutes() -> str:
    """The CPU recipe's time budget in minutes, for the help text."""
    from annotated_transformer.recipes import CPU_TRANSLATION

    return f"{CPU_TRANSLATION.train.time_budget / 60:g}"


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model on a task; write checkpoint and metrics",
                       description="Train a Transformer with the task's default recipe.")
    p.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    p.add_argument("--data", help="the source<TAB>target file of --task tsv; the plain-text "
                   "file of --task text (e.g. chapters/data/tiny-shakespeare/input.txt)")
    p.add_argument("--context", type=int, metavar="N",
                   help="--task text: characters per training window, the model's positions "
                   "(default 64)")
    p.add_argument("--level", choices=("char", "word"), default="char",
                   help="--task tsv: a vocabulary of characters (default) or of words")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for checkpoint.pt and metrics.jsonl")
    p.add_argument("--parts",
                   help="solutions (default, or the recipe's: --model cpu trains with "
                   "fast; yours in a student release), exercises "
                   "(yours), fast (fused kernels) or a "
                   "folder of chNN_*.py")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: autocast to bfloat16 (for GPUs that support it)")
    p.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile the model's layers, once for every batch shape "
                   "(BACKEND: inductor, the default, generates kernels; aot_eager only "
                   "traces, a quick check that the model compiles)")
    p.add_argument("--steps", type=int, help="training steps (default: the recipe's; "
                   "instead of --model cpu's time budget)")
    p.add_argument("--time-budget", metavar="DURATION",
                   help="train for this much wall time instead of a number of steps (30m, "
                   f"90s, 1h30m; --model cpu: {_cpu_budget_minutes()}m): the steps are "
                   "planned from the measured "
                   "step time, the rate decays to zero at the deadline, and the final "
                   "evaluation and checkpoint fit inside it")
    p.add_argument("--batch-size", type=int, help="global batch size (default: the recipe's)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="instead of --batch-size: batches of sequences of similar length, at "
                   "most N padded source and N target tokens each, as the paper trains")
    p.add_argument("--decay", choices=("linear", "noam"),
                   help="the learning rate after warmup: linear (to 0 at the last step) or "
                   "noam (1/sqrt(step)) (default: the recipe's)")
    p.add_argument("--lr-factor", type=float,
                   help="the Noam schedule's factor, which sets the peak (default: the recipe's)")
    p.add_argument("--eval-every", type=int, help="steps between evaluations (default: the "
                   "recipe's); each one also saves the checkpoint")
    p.add_argument("--eval-size", type=int, help="held-out examples per evaluation")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch (default: one per core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_translation_options(p)
    add_size_options(p)
    p.set_defaults(run=run_train)


# The model's sizes on the command line: flag -> TransformerConfig's field.
SIZE_FLAGS = {"layers": "num_layers", "d_model": "d_model", "heads": "num_heads",
              "d_ff": "d_ff", "dropout": "dropout"}


def add_size_options(p) -> None:
    """``--layers``, ``--d-model``, ``--heads``, ``--d-ff``, ``--dropout``: over ``--model``
    (or the recipe's model), recorded in the checkpoint's model config."""
    p.add_argument("--layers", type=int, metavar="N",
                   help="encoder and decoder layers, each (default: --model's)")
    p.add_argument("--d-model", type=int, metavar="D", help="the model's width (default: "
                   "--model's); a multiple of --heads")
    p.add_argument("--heads", type=int, metavar="H", help="attention heads (default: --model's)")
    p.add_argument("--d-ff", type=int, metavar="N",
                   help="the feed-forward layer's inner width (default: --model's)")
    p.add_argument("--dropout", type=float, metavar="P",
                   help="dropout probability in [0, 1) (default: --model's)")


def resized(recipe, args):
    """``recipe`` with the sizes given on the command line; :class:`UsageError` naming the
    flag for a bad one."""
    for flag in SIZE_FLAGS:
        value, name = getattr(args, flag), f"--{flag.replace('_', '-')}"
        if value is None:
            continue
        if flag == "dropout" and not 0.0 <= value < 1.0:
            raise UsageError(f"--dropout must be in [0, 1), got {value}")
        if flag != "dropout" and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    try:
        return recipe.resized(**{field: getattr(args, flag)
                                 for flag, field in SIZE_FLAGS.items()})
    except ValueError as error:  # d_model not divisible by num_heads
        raise UsageError(f"--d-model and --heads (or --model's): {error}") from None


def auto_ladder(args) -> tuple:
    """``--model auto``'s ladder of models (``recipes.CPU_LADDER``), or ``()`` for another
    ``--model``; :class:`UsageError` for another task or a size given with it."""
    if args.model != "auto":
        return ()
    if args.task != "translation":
        raise UsageError(f"--model auto fits the CPU translation recipe to this machine: it "
                         f"is for --task translation, not {args.task!r}")
    given = [f"--{flag.replace('_', '-')}" for flag in SIZE_FLAGS
             if getattr(args, flag) is not None]
    if given:
        raise UsageError(f"--model auto chooses the model's sizes: {', '.join(given)} goes "
                         f"with --model cpu (or small, base, big)")
    from annotated_transformer.recipes import CPU_LADDER

    return CPU_LADDER


def recipe_parts(recipe) -> str:
    """The parts a recipe trains with unless ``--parts`` says otherwise: its own (the
    fast ones compute the reference's function), or the reference where those are not
    there (a student release has no fast parts)."""
    wanted = getattr(recipe, "parts", None) or "solutions"
    try:
        parse_parts(wanted)
    except UsageError:
        return "solutions"
    return wanted


def process_started() -> float:
    """When this process started, on ``time.perf_counter()``'s clock (the interpreter's start
    and the imports count against a time budget too): from ``/proc`` on Linux, else now.
    A process older than a minute is not a command that has just started (a notebook's
    kernel, a test session calling ``main``): now."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", encoding="ascii") as stat, \
                open("/proc/uptime", encoding="ascii") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            since_boot = float(uptime.read().split()[0])
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 60 else now


def time_budget(args, recipe_budget: float | None) -> float | None:
    """The run's budget in seconds: ``--time-budget``, else the recipe's unless ``--steps``
    is given; :class:`UsageError` for a bad duration or a budget with ``--steps``,
    ``--decay noam`` or ``--resume``."""
    from annotated_transformer.time_budget import format_duration, parse_duration

    if args.time_budget is not None:
        if args.steps is not None:
            raise UsageError("--time-budget and --steps both say how long to train: give one")
        try:
            budget = parse_duration(args.time_budget)
        except ValueError as error:
            raise UsageError(f"--time-budget: {error}") from None
    else:
        budget = None if args.steps is not None else recipe_budget
    if budget is not None and args.decay == "noam":
        raise UsageError("a time budget decays the rate linearly to the deadline: --decay "
                         "noam goes with --steps")
    if budget is not None and args.resume:
        raise UsageError(f"--resume continues a run of a number of steps, and this one trains "
                         f"to a time budget ({format_duration(budget)}): give --steps N")
    return budget


def run_train(args) -> int:
    from annotated_transformer.recipes import recipe_for
    from annotated_transformer.time_budget import format_duration
    from annotated_transformer.train import Runtime, train

    started = process_started()  # a time budget counts from the command's start

    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}: choose one of {', '.join(TASKS)}")
    options = ({"path": args.data, "level": args.level} if args.task == "tsv" else
               {"path": args.data} if args.task == "text" else {})
    if args.context is not None:
        if args.task != "text":
            raise UsageError(f"--context is for --task text; {args.task!r} has no windows")
        options["context"] = args.context
    ladder = auto_ladder(args)  # --model auto: a model of CPU_LADDER, chosen below
    recipe = (ladder[0].recipe if ladder else recipe_for(args.task) if args.model is None
              else recipe_for(args.task).with_model(args.model))  # --model small|cpu|base|big
    recipe = resized(recipe, args)  # --layers, --d-model, --heads, --d-ff, --dropout
    # --task translation's corpus, and its vocabulary's size (default: the recipe's)
    options = translation_task_options(args, getattr(recipe, "vocab_size", None)) or options
    if args.data and args.task not in ("tsv", "text"):
        raise UsageError(f"--data is for --task tsv and --task text; {args.task!r} generates "
                         f"its own data")
    for name in ("steps", "batch_size", "eval_every", "eval_size", "threads", "max_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.compile is not None and args.compile not in torch.compiler.list_backends(
            exclude_tags=()):
        raise UsageError(f"--compile {args.compile!r} is not a torch.compile backend (inductor, "
                         f"aot_eager, ...)")
    if args.max_tokens is not None and args.batch_size is not None:
        raise UsageError("--max-tokens and --batch-size both size the batches: give one")
    task = make_task(args.task, **options)
    reuse_saved_vocabulary(args, task)  # --resume of a translation run: the saved BPE
    longest = max(task.max_source_len, task.max_target_len)
    if args.max_tokens is not None and args.max_tokens < longest:
        raise UsageError(f"--max-tokens {args.max_tokens} is smaller than the longest sequence "
                         f"of --task {args.task} ({longest} tokens)")
    parts = parse_parts(args.parts or recipe_parts(recipe))
    if args.lr_factor is not None and not args.lr_factor > 0:
        raise UsageError(f"--lr-factor must be positive, got {args.lr_factor}")
    # The budget first: --steps (or --decay noam) in place of the recipe's budget is no budget.
    budget = time_budget(args, recipe.train.time_budget)
    if budget is not None and distributed.world_size() > 1:
        raise UsageError("a time budget is planned by one process: under torchrun, give "
                         "--steps N")
    if ladder and budget is None:
        raise UsageError("--model auto fits the model to a time budget: give --time-budget "
                         "(or none: the recipe's), not --steps")

    def run_config(recipe):
        """The run of ``recipe`` with the budget and the command line's changes."""
        recipe = dataclasses.replace(recipe, train=dataclasses.replace(
            recipe.train, time_budget=budget,
            decay="linear" if budget is not None else recipe.train.decay))
        return recipe.train_config(steps=args.steps, batch_size=args.batch_size,
                                   seed=args.seed, eval_every=args.eval_every,
                                   eval_size=args.eval_size, decay=args.decay,
                                   lr_factor=args.lr_factor, max_tokens=args.max_tokens,
                                   warmup_steps=args.warmup)

    config = run_config(recipe)
    if args.resume and not (args.out / checkpoint.FILE_NAME).is_file():
        raise UsageError(f"--resume: {args.out / checkpoint.FILE_NAME} does not exist")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = distributed.setup(pick_device(args.device))
    try:
        figure = machine.measure(device)  # before the seed: the probe draws random matrices
        choice = None
        if ladder:  # --model auto: time each rung's steps, train the one that fits
            from annotated_transformer import recipe_fit

            seconds = (started + budget - time.perf_counter()) * recipe_fit.TRAINING_SHARE
            choice = recipe_fit.choose(ladder, lambda rung: recipe_fit.time_steps(
                rung.recipe.model_config(task), run_config(rung.recipe), task, parts, device,
                args.precision, limit=recipe_fit.TRIAL_SHARE * budget), seconds)
            recipe, config = choice.rung.recipe, run_config(choice.rung.recipe)
        torch.manual_seed(config.seed)
        model_config = recipe.model_config(task)
        model = model_for(task)(model_config, parts=parts).to(device)
        runtime = Runtime(precision=args.precision, compile=args.compile is not None,
                          compile_backend=args.compile or "inductor",
                          out=args.out, resume=args.resume, keep_last=args.keep_last or 0,
                          started=started, machine=figure,
                          recipe=None if choice is None else choice.record(),
                          progress=not args.no_progress and sys.stderr.isatty())
        main = distributed.rank() == 0
        if main:
            c = model_config
            print(f"task {args.task}, {sum(p.numel() for p in model.parameters()):,} parameters "
                  f"({c.num_layers} layers, d_model {c.d_model}, {c.num_heads} heads, d_ff "
                  f"{c.d_ff}, dropout {c.dropout}), "
                  f"parts from {parts.describe()}, {device}, {args.precision}"
                  f"{f', compiled ({args.compile})' if args.compile else ''}, "
                  f"{torch.get_num_threads()} "
                  f"thread(s), {distributed.world_size()} "
                  f"process(es), "
                  + (f"{config.steps} steps" if budget is None else
                     f"as many steps as fit in {format_duration(budget)} (time budget)")
                  + " of " + (f"{config.batch_size} examples" if config.max_tokens is None else
                              f"at most {config.max_tokens} tokens"))
            print(f"this machine: {machine.describe(figure)}")
            if choice is not None:
                print(f"--model auto chose {choice.describe()}")
        log = functools.partial(print, flush=True) if main else None
        history = train(model, task, config, log=log, runtime=runtime)
        if main:
            rate = history.tokens / max(history.seconds, 1e-9)
            exact = history.exact_match[-1]
            print((f"held-out exact match {exact:.1%}" if exact is not None else
                   f"held-out perplexity {math.exp(history.eval_loss[-1]):.3f}")
                  + f" ({history.eval_examples} examples), {history.seconds:.1f} s, "
                  f"{rate:,.0f} target tokens/s\nwrote {args.out / checkpoint.FILE_NAME} and "
                  f"{args.out / 'metrics.jsonl'}")
            if budget is not None:
                plans = history.budget["plans"]
                print(f"time budget {format_duration(budget)}: finished in "
                      f"{format_duration(time.perf_counter() - started)}, {history.step[-1]:,} "
                      f"step{'s' if history.step[-1] != 1 else ''}"
                      + (f" (planned at step {plans[0]['step']}: "
                         f"{plans[0]['total']:,}; last plan {plans[-1]['total']:,})"
                         if plans else ""))
    finally:
        distributed.teardown()
    return 0

