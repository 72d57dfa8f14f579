"""``--recipe-shape``: the CPU recipe's step (``--model cpu`` on Multi30k), the fast parts
against ``nn.Transformer`` on one thread and on two, interleaved in one run.

Each round times every (threads, contender) pair in turn, the order rotating from round
to round, so that a busy spell of a shared machine slows all of them. It reports, per
thread count: the matmul ceiling measured with that many threads (the best product of the
run: it is timed again between the steps), each contender's target tokens a second
(median and range), its ratio to ``nn.Transformer``, its matrix-product GFLOP/s and their
share of the ceiling, the same from the best rounds (on a shared machine, the least
disturbed ones), the share of each part of a step (timed one part at a time over a few
steps, after the rounds), and the bound the arithmetic sets: the step's matrix products
alone at the ceiling, and the ratio to ``nn.Transformer`` that no contender computing the
same products can pass.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch import nn

from annotated_transformer.bench.contenders import Trainer
from annotated_transformer.bench.shapes import SHAPES, model_flops
from annotated_transformer.bench.timing import matmul_ceiling, summary, timed

SHAPE = next(s for s in SHAPES if s.name == "multi30k-cpu")
CONTENDERS = ("fast", "torch")
GOAL = 1.5  # the fast parts against nn.Transformer at this shape (issue #36)
PARTS = ("layers (forward)", "generator and loss", "backward", "clip gradients", "Adam")


def step_parts(trainer: Trainer, steps: int) -> dict[str, float]:
    """Milliseconds of each part of ``trainer``'s step, the mean of ``steps`` steps: the
    layers' forward pass, the generator and the loss (for the fast parts, the gradients
    of the generator too: they are computed in that pass), the backward pass, clipping
    and Adam."""
    model, inputs, loss_fn = trainer.model, trainer.inputs, trainer.loss_fn
    totals = dict.fromkeys(PARTS, 0.0)
    for _ in range(steps):
        marks = [time.perf_counter()]
        hidden = model.features(*inputs.args)
        marks.append(time.perf_counter())
        projected = getattr(loss_fn, "projected", None)
        flat, labels = hidden.reshape(-1, hidden.size(-1)), inputs.labels.reshape(-1)
        if projected is not None:
            loss = projected(flat, model.generator.weight, model.generator.bias, labels)
        else:
            logits = model.generator(flat)
            loss = loss_fn(logits, labels)
        marks.append(time.perf_counter())
        trainer.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(time.perf_counter())
        nn.utils.clip_grad_norm_(trainer.parameters, 1.0, foreach=True)
        marks.append(time.perf_counter())
        trainer.optimizer.step()
        marks.append(time.perf_counter())
        for name, begin, end in zip(PARTS, marks[:-1], marks[1:], strict=True):
            totals[name] += 1000 * (end - begin) / steps
    return totals


def recipe_shape(threads: tuple[int, ...] = (1, 2), rounds: int = 7, steps: int = 2,
                 part_steps: int = 3, log=print) -> dict:
    """The section's figures (see the module's docstring)."""
    device = torch.device("cpu")
    flops = model_flops(SHAPE)
    load_before = os.getloadavg()
    log(f"the CPU recipe's step: d_model={SHAPE.d_model}, h={SHAPE.num_heads}, "
        f"N={SHAPE.num_layers}+{SHAPE.num_layers}, d_ff={SHAPE.d_ff}, V={SHAPE.vocab}, batch "
        f"{SHAPE.batch} x {SHAPE.length} ({flops / 1e9:.1f} GFLOP of matrix products a step); "
        f"threads {', '.join(map(str, threads))} and contenders interleaved, {rounds} rounds")
    ceilings = {}
    for n in threads:
        torch.set_num_threads(n)
        ceilings[n] = matmul_ceiling(device, torch.float32, (512, 1024), rounds=3)["gflops"]
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    trainers = {name: Trainer(name, SHAPE, device) for name in CONTENDERS}
    pairs = [(n, name) for n in threads for name in CONTENDERS]
    for n, name in pairs:  # warm up each pair: the allocator, the thread pool
        torch.set_num_threads(n)
        trainers[name].step()
    samples: dict[tuple[int, str], list[float]] = {pair: [] for pair in pairs}
    for r in range(rounds):
        for n, name in pairs[r % len(pairs):] + pairs[: r % len(pairs)]:
            torch.set_num_threads(n)
            seconds = timed(trainers[name].step, device, steps)
            samples[(n, name)].append(SHAPE.tokens * steps / seconds)
            # the ceiling again, between the steps: the best of the run (a busy spell
            # slows a timing, never speeds it up)
            rate = 2 * 1024**3 * 4 / timed(lambda: a @ b, device, 4) / 1e9
            ceilings[n] = max(ceilings[n], rate)
    load_after = os.getloadavg()  # the machine is shared: how busy it was
    log(f"  load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load_before)} before, "
        f"{', '.join(f'{x:.2f}' for x in load_after)} after the rounds, on "
        f"{os.cpu_count()} cores")
    result: dict = {"shape": SHAPE.name, "model_flops_per_step": flops, "rounds": rounds,
                    "steps_per_round": steps, "load_before": load_before,
                    "load_after": load_after, "threads": {}}
    for n in threads:
        torch.set_num_threads(n)
        entry = {"ceiling_gflops": ceilings[n], "contenders": {}}
        torch_median = statistics.median(samples[(n, "torch")])
        torch_best = max(samples[(n, "torch")])
        for name in CONTENDERS:
            stats = summary(samples[(n, name)])
            gflops = stats["median"] / SHAPE.tokens * flops / 1e9
            stats.update(ratio_to_torch=stats["median"] / torch_median, gflops=gflops,
                         best_ratio_to_torch=stats["max"] / torch_best,
                         best_gflops=stats["max"] / SHAPE.tokens * flops / 1e9,
                         utilisation=gflops / ceilings[n],
                         step_ms=1000 * SHAPE.tokens / stats["median"],
                         parts_ms=step_parts(trainers[name], part_steps))
            entry["contenders"][name] = stats
        entry["goal_met"] = entry["contenders"]["fast"]["ratio_to_torch"] >= GOAL
        entry.update(products_bound(flops, ceilings[n], 1000 * SHAPE.tokens / torch_best))
        result["threads"][str(n)] = entry
        log(format_entry(n, entry))
    return result


def products_bound(flops: float, ceiling_gflops: float, torch_ms: float) -> dict:
    """What the arithmetic allows: a step's matrix products alone at the ceiling
    (``floor_ms``), and the ratio to ``nn.Transformer``'s step of ``torch_ms`` (its best
    rounds, as the ceiling is the run's best) that no contender computing them can pass,
    were every other operation free (``bound_ratio``)."""
    floor_ms = 1000 * flops / (ceiling_gflops * 1e9)
    return {"floor_ms": floor_ms, "bound_ratio": torch_ms / floor_ms}


def format_entry(threads: int, entry: dict) -> str:
    lines = [f"  {threads} thread(s): matmul ceiling {entry['ceiling_gflops']:.1f} GFLOP/s (the "
             f"best 1024 x 1024 product of the run)"]
    for name, s in entry["contenders"].items():
        lines.append(f"    {name:6s} {s['median']:7,.0f} tokens/s (range {s['min']:,.0f}-"
                     f"{s['max']:,.0f})  {s['ratio_to_torch']:.2f}x nn.Transformer (best "
                     f"rounds {s['best_ratio_to_torch']:.2f}x)  {s['gflops']:5.1f} GFLOP/s = "
                     f"{s['utilisation']:5.1%} of the ceiling (best rounds "
                     f"{s['best_gflops'] / entry['ceiling_gflops']:.0%})  "
                     f"{s['step_ms']:6.0f} ms a step")
        parts = s["parts_ms"]
        whole = sum(parts.values())
        lines.append("           parts: " + ", ".join(
            f"{part} {ms:.0f} ms ({ms / whole:.0%})" for part, ms in parts.items()))
    lines.append(f"    bound: the matrix products alone, at the ceiling, take "
                 f"{entry['floor_ms']:.0f} ms a step, so nothing computing them passes "
                 f"{entry['bound_ratio']:.2f}x "
                 f"nn.Transformer's best rounds")
    met = "met" if entry["goal_met"] else "not met"
    lines.append(f"    goal: fast >= {GOAL}x nn.Transformer: "
                 f"{entry['contenders']['fast']['ratio_to_torch']:.2f}x, {met}")
    return "\n".join(lines)
