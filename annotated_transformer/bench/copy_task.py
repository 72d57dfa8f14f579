"""Section 4: training seconds until the copy task is learnt, the course's recipe against
the Annotated Transformer's."""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import asdict, replace

import torch

from annotated_transformer.bench.contenders import REFERENCE, TorchTransformer
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.vocab import PAD
from annotated_transformer.machine import synchronize
from annotated_transformer.model import EncoderDecoder
from annotated_transformer.parts import Parts
from annotated_transformer.recipes import RECIPES
from annotated_transformer.train import (
    TrainConfig,
    adam,
    evaluate,
    learning_rate,
    make_optimizer,
    train_step,
    training_batches,
)


def _time_to_exact_match(model, task, config: TrainConfig, optimizer, scheduler, loss_fn,
                         held_out, eval_every: int, device, log, label: str) -> dict:
    """Train until greedy decoding reproduces every held-out sequence (or the recipe's
    steps run out): seconds of training (evaluation not counted), steps, exact match."""
    batches = training_batches(task, config, torch.Generator().manual_seed(config.seed))
    torch.manual_seed(config.seed)
    seconds, curve, reached = 0.0, [], None
    for step in range(1, config.steps + 1):
        synchronize(device)
        started = time.perf_counter()
        batch = model.teacher_forcing(*next(batches)).to(device)
        train_step(model, batch, loss_fn, optimizer, scheduler, config.clip_norm)
        synchronize(device)
        seconds += time.perf_counter() - started
        if step % eval_every == 0 or step == config.steps:
            with warnings.catch_warnings():  # nn.Transformer's inference path: a prototype
                warnings.filterwarnings("ignore", message=".*nested tensors.*")
                _, exact = evaluate(model, *held_out, loss_fn)
            curve.append({"step": step, "seconds": seconds, "exact_match": exact})
            if exact == 1.0:
                reached = {"step": step, "seconds": seconds}
                break
    last = curve[-1]
    log(f"    {label}: " + (f"100% at step {reached['step']} after {reached['seconds']:.1f} s"
                            if reached else f"{last['exact_match']:.1%} after {last['step']} "
                                            f"steps, {last['seconds']:.1f} s"))
    return {"reached": reached, "final_exact_match": last["exact_match"],
            "final_step": last["step"], "seconds": last["seconds"], "curve": curve}


def annotated_transformer_recipe(steps: int = 400) -> tuple[dict, TrainConfig]:
    """The Annotated Transformer's copy-task run (its ``example_simple_model``): Adam with
    a base rate of 0.5 times the Noam schedule (factor 1, warmup 400, the model's
    ``d_model``), batch 80, 400 steps, no label smoothing; here on ``nn.Transformer`` of the
    copy-task shape (post-LN, two layers, dropout 0.1)."""
    model = {"d_model": 64, "num_heads": 4, "num_layers": 2, "d_ff": 256, "dropout": 0.1,
             "norm_first": False}
    return model, TrainConfig(steps=steps, batch_size=80, lr_factor=1.0, warmup_steps=400,
                              decay="noam", label_smoothing=0.0, clip_norm=0.0)


def copy_task(device: torch.device, seeds: tuple[int, ...], held_out_size: int,
              parts_names: tuple[str, ...], eval_every: int | None, max_steps: int | None,
              at_steps: int, max_tokens: int | None = None, log=print) -> dict:
    """Time to 100% held-out exact match: the default recipe per parts and seed (its
    batches by a budget of ``max_tokens`` tokens when given), and the Annotated
    Transformer's recipe on ``nn.Transformer``."""
    recipe = RECIPES["copy"]
    task = CopyTask()
    held_out = tuple(x.to(device) for x in task.held_out_set(held_out_size))
    results: dict = {"held_out": held_out_size, "recipe": {
        "model": {**asdict(recipe.model_config(task)), **recipe.model},
        "train": asdict(recipe.train)}, "default": {}}
    for parts_name in parts_names:
        parts = Parts(parts_name)
        runs = []
        for seed in seeds:
            config = recipe.train_config(seed=seed, steps=max_steps and min(
                max_steps, recipe.train.steps), max_tokens=max_tokens)
            torch.manual_seed(seed)
            model = EncoderDecoder(recipe.model_config(task), parts=parts).to(device)
            optimizer, scheduler = make_optimizer(model, config)
            loss_fn = parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
            runs.append(_time_to_exact_match(
                model, task, config, optimizer, scheduler, loss_fn, held_out,
                eval_every or config.eval_every, device, log, f"{parts_name}, seed {seed}"))
        times = [r["reached"]["seconds"] for r in runs if r["reached"]]
        results["default"][parts_name] = {
            "runs": runs, "all_reached": len(times) == len(runs),
            "median_seconds": statistics.median(times) if len(times) == len(runs) else None,
            "median_final_exact_match": statistics.median(r["final_exact_match"]
                                                          for r in runs)}
    model_changes, config = annotated_transformer_recipe(at_steps)
    torch.manual_seed(0)
    model = TorchTransformer(replace(recipe.model_config(task), **model_changes)).to(device)
    optimizer = adam(model.parameters(), lr=0.5)
    d_model = model.config.d_model
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate(step, config, REFERENCE.noam_lr, d_model))
    loss_fn = REFERENCE.LabelSmoothingLoss(0.0, ignore_index=PAD)
    results["annotated_transformer"] = {
        "recipe": {"model": model_changes, "train": asdict(config), "adam_lr": 0.5},
        **_time_to_exact_match(model, task, config, optimizer, scheduler, loss_fn, held_out,
                               eval_every or 100, device, log,
                               "Annotated Transformer's recipe, nn.Transformer")}
    return results

