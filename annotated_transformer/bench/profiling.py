"""``--profile``: where the copy recipe's training step spends its time, by
``torch.profiler``."""

from __future__ import annotations

import time

import torch
from torch import nn

from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.vocab import PAD
from annotated_transformer.model import EncoderDecoder
from annotated_transformer.parts import Parts
from annotated_transformer.recipes import RECIPES
from annotated_transformer.train import make_optimizer

PHASES = ("draw the examples", "masks and labels", "forward and loss", "backward",
          "clip gradients", "Adam")


def profile_step(parts_name: str, steps: int = 30, warmup: int = 10, rows: int = 14,
                 log=print) -> dict:
    """Where the copy recipe's training step (the steps of :func:`~annotated_transformer.
    train.train_step`, each phase under ``record_function``) spends its time on this
    machine's CPU, by ``torch.profiler``: milliseconds a step per phase, and the operators
    with the most time of their own (the ``rows`` first)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    task, recipe = CopyTask(), RECIPES["copy"]
    config = recipe.train_config()
    torch.manual_seed(0)
    parts = Parts(parts_name)
    model = EncoderDecoder(recipe.model_config(task), parts=parts)
    optimizer, scheduler = make_optimizer(model, config)
    loss_fn = parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        with record_function(PHASES[0]):
            src, tgt = task.sample(config.batch_size, generator)
        with record_function(PHASES[1]):
            batch = model.teacher_forcing(src, tgt)
        with record_function(PHASES[2]):
            loss = model.loss(batch, loss_fn)
        optimizer.zero_grad(set_to_none=True)
        with record_function(PHASES[3]):
            loss.backward()
        with record_function(PHASES[4]):
            nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm, foreach=True)
        with record_function(PHASES[5]):
            optimizer.step()
        scheduler.step()

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - started
    events = {e.key: e for e in profiler.key_averages()}
    phases = {name: events[name].cpu_time_total / 1000 / steps for name in PHASES}
    operators = sorted((e for e in events.values() if e.key.startswith("aten::")),
                       key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in operators)
    result = {"parts": parts_name, "threads": torch.get_num_threads(),
              "step_ms": 1000 * seconds / steps, "phases_ms": phases,
              "operators": [{"name": e.key, "self_ms": e.self_cpu_time_total / 1000 / steps,
                             "share": e.self_cpu_time_total / total,
                             "calls": e.count / steps} for e in operators[:rows]]}
    log(f"  {parts_name} parts, {result['threads']} thread(s): {result['step_ms']:.1f} ms a "
        f"step under the profiler")
    for name, ms in phases.items():
        log(f"    {name:18s} {ms:7.2f} ms  {ms / result['step_ms']:5.1%}")
    for op in result["operators"]:
        log(f"    {op['name']:28s} {op['self_ms']:7.2f} ms  {op['share']:5.1%} of the "
            f"operators' time, {op['calls']:.0f} calls")
    return result

