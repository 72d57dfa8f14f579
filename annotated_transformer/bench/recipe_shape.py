"""``--recipe-shape``: the CPU recipe's step (``--model cpu`` on Multi30k), the fast parts
against ``nn.Transformer`` on one thread and on two, interleaved in one run.

The steps train on the recipe's real batches (:mod:`~annotated_transformer.bench.
recipe_batches`: Multi30k by the recipe's budget of tokens, random tokens with the real rows'
lengths, padding included), each round on the next few of them, the same for every
contender; a contender's rate is in scored target tokens a second. ``nn.Transformer``
computes on every padded position; the fast parts on the positions that count
(:mod:`~annotated_transformer.fast_parts._packed`), so their matrix products are fewer,
and each contender's GFLOP/s counts its own.

Each round times every (threads, contender) pair in turn, the order rotating from round
to round, so that a busy spell of a shared machine slows all of them. It reports, per
thread count: the matmul ceiling measured with that many threads (the best product of the
run: it is timed again between the steps), each contender's target tokens a second
(median and range), its ratio to ``nn.Transformer``, its matrix-product GFLOP/s and their
share of the ceiling, the same from the best rounds (on a shared machine, the least
disturbed ones), the share of each part of a step (timed one part at a time over a few
steps, after the rounds), and the bound the arithmetic sets: the fast parts' matrix
products of a step alone at the ceiling, and the ratio to ``nn.Transformer`` that no
contender computing the same products can pass.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch import nn

from annotated_transformer.bench import recipe_batches
from annotated_transformer.bench.contenders import Trainer
from annotated_transformer.bench.recipe_batches import Lengths
from annotated_transformer.bench.shapes import SHAPES, step_flops
from annotated_transformer.bench.timing import summary
from annotated_transformer.machine import matmul_ceiling, timed

SHAPE = next(s for s in SHAPES if s.name == "multi30k-cpu")
CONTENDERS = ("fast", "torch")
GOAL = 1.5  # the fast parts against nn.Transformer at this shape (issue #36)
PARTS = ("layers (forward)", "generator and loss", "backward", "clip gradients", "Adam")


def step_parts(trainer: Trainer, steps: int) -> dict[str, float]:
    """Milliseconds of each part of ``trainer``'s step, the mean of ``steps`` steps (its
    batches in turn): the layers' forward pass, the generator and the loss (for the fast
    parts, the gradients of the generator too: they are computed in that pass), the
    backward pass, clipping and Adam."""
    model, loss_fn = trainer.model, trainer.loss_fn
    totals = dict.fromkeys(PARTS, 0.0)
    for index in range(steps):
        inputs = trainer.batches[index % len(trainer.batches)]
        marks = [time.perf_counter()]
        scored = getattr(loss_fn, "scored_features", None)
        if scored is not None:  # the fast parts: the scored positions only
            flat, labels = scored(model, inputs)
        else:
            hidden = model.features(*inputs.args)
            flat, labels = hidden.reshape(-1, hidden.size(-1)), inputs.labels.reshape(-1)
        marks.append(time.perf_counter())
        projected = getattr(loss_fn, "projected", None)
        if projected is not None:
            loss = projected(flat, model.generator.weight, model.generator.bias, labels)
        else:
            loss = loss_fn(model.generator(flat), labels)
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


def contender_flops(batches: list[Lengths]) -> dict[str, float]:
    """Matrix-product FLOPs a step (the mean over ``batches``) of each contender:
    ``nn.Transformer`` computes every padded position (the generator too), the fast parts
    the positions that count (attention on the padded layout)."""
    totals = dict.fromkeys(CONTENDERS, 0.0)
    for src, tgt in batches:
        rows, ls, lt = len(src), max(src), max(tgt) - 1
        scored = sum(tgt) - rows
        totals["torch"] += step_flops(SHAPE, rows, ls, lt, rows * ls, rows * lt, rows * lt)
        totals["fast"] += step_flops(SHAPE, rows, ls, lt, sum(src), scored, scored)
    return {name: total / len(batches) for name, total in totals.items()}


def recipe_shape(threads: tuple[int, ...] = (1, 2), rounds: int = 8, steps: int = 4,
                 part_steps: int = 4, dataset: str | None = None, log=print) -> dict:
    """The section's figures (see the module's docstring); ``dataset``: the batches drawn
    from this corpus rather than the committed lengths (:mod:`~annotated_transformer.
    bench.recipe_batches`)."""
    device = torch.device("cpu")
    batches = recipe_batches.from_corpus(dataset) if dataset else load_batches()
    pad = recipe_batches.padding(batches)
    flops = contender_flops(batches)
    tokens = pad["target_scored"]  # scored target tokens a step, the mean over the batches
    load_before = os.getloadavg()
    log(f"the CPU recipe's step: d_model={SHAPE.d_model}, h={SHAPE.num_heads}, "
        f"N={SHAPE.num_layers}+{SHAPE.num_layers}, d_ff={SHAPE.d_ff}, V={SHAPE.vocab}; "
        f"threads {', '.join(map(str, threads))} and contenders interleaved, {rounds} rounds "
        f"of {steps} steps")
    log(f"  batches: {pad['batches']} of Multi30k's by --max-tokens "
        f"{recipe_batches.MAX_TOKENS} ({dataset or 'their lengths as committed'}), "
        f"{pad['rows']:.0f} rows a batch; a step {pad['source_real']:,.0f} source tokens "
        f"padded to {pad['source_padded']:,.0f} ({pad['source_padding']:.0%} padding), "
        f"{pad['target_scored']:,.0f} scored target tokens padded to "
        f"{pad['target_padded']:,.0f} ({pad['target_padding']:.0%}); matrix products a "
        f"step: nn.Transformer {flops['torch'] / 1e9:.1f} GFLOP (every padded position), "
        f"the fast parts {flops['fast'] / 1e9:.1f} (the positions that count)")
    ceilings = {}
    for n in threads:
        torch.set_num_threads(n)
        ceilings[n] = matmul_ceiling(device, torch.float32, (512, 1024), rounds=3)["gflops"]
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    trainers = {name: Trainer(name, SHAPE, device, lengths=batches) for name in CONTENDERS}
    pairs = [(n, name) for n in threads for name in CONTENDERS]
    for n, name in pairs:  # warm up each pair: the allocator, the thread pool
        torch.set_num_threads(n)
        trainers[name].step(0)
    samples: dict[tuple[int, str], list[float]] = {pair: [] for pair in pairs}
    for r in range(rounds):
        indices = range(r * steps, (r + 1) * steps)  # every pair: the same batches
        scored = sum(_scored(batches[i % len(batches)]) for i in indices)
        for n, name in pairs[r % len(pairs):] + pairs[: r % len(pairs)]:
            torch.set_num_threads(n)
            trainer = trainers[name]
            seconds = timed(lambda t=trainer, ks=indices: [t.step(k) for k in ks], device)
            samples[(n, name)].append(scored / seconds)
            # the ceiling again, between the steps: the best of the run (a busy spell
            # slows a timing, never speeds it up)
            rate = 2 * 1024**3 * 4 / timed(lambda: a @ b, device, 4) / 1e9
            ceilings[n] = max(ceilings[n], rate)
    load_after = os.getloadavg()  # the machine is shared: how busy it was
    log(f"  load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load_before)} before, "
        f"{', '.join(f'{x:.2f}' for x in load_after)} after the rounds, on "
        f"{os.cpu_count()} cores")
    result: dict = {"shape": SHAPE.name, "batches": pad, "flops_per_step": flops,
                    "model_flops_per_step": flops["fast"], "rounds": rounds,
                    "steps_per_round": steps, "load_before": load_before,
                    "load_after": load_after, "threads": {}}
    for n in threads:
        torch.set_num_threads(n)
        entry = {"ceiling_gflops": ceilings[n], "contenders": {}}
        torch_median = statistics.median(samples[(n, "torch")])
        torch_best = max(samples[(n, "torch")])
        for name in CONTENDERS:
            stats = summary(samples[(n, name)])
            gflops = stats["median"] / tokens * flops[name] / 1e9
            stats.update(ratio_to_torch=stats["median"] / torch_median, gflops=gflops,
                         best_ratio_to_torch=stats["max"] / torch_best,
                         best_gflops=stats["max"] / tokens * flops[name] / 1e9,
                         utilisation=gflops / ceilings[n],
                         step_ms=1000 * tokens / stats["median"],
                         parts_ms=step_parts(trainers[name], part_steps))
            entry["contenders"][name] = stats
        entry["goal_met"] = entry["contenders"]["fast"]["ratio_to_torch"] >= GOAL
        entry.update(products_bound(flops["fast"], ceilings[n], 1000 * tokens / torch_best))
        result["threads"][str(n)] = entry
        log(format_entry(n, entry))
    return result


def _scored(lengths: Lengths) -> int:
    """The scored target tokens of a batch (the labels: its targets less BOS)."""
    return sum(lengths[1]) - len(lengths[1])


def load_batches() -> list[Lengths]:
    """The committed batches' lengths (a test replaces them by small ones)."""
    return recipe_batches.load()


def products_bound(flops: float, ceiling_gflops: float, torch_ms: float) -> dict:
    """What the arithmetic allows: the fast parts' matrix products of a step (``flops``)
    alone at the ceiling (``floor_ms``), and the ratio to ``nn.Transformer``'s step of
    ``torch_ms`` (its best rounds, as the ceiling is the run's best) that no contender
    computing them can pass, were every other operation free (``bound_ratio``)."""
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
    lines.append(f"    bound: the fast parts' matrix products alone, at the ceiling, take "
                 f"{entry['floor_ms']:.0f} ms a step, so nothing computing them passes "
                 f"{entry['bound_ratio']:.2f}x "
                 f"nn.Transformer's best rounds")
    met = "met" if entry["goal_met"] else "not met"
    lines.append(f"    goal: fast >= {GOAL}x nn.Transformer: "
                 f"{entry['contenders']['fast']['ratio_to_torch']:.2f}x, {met}")
    return "\n".join(lines)
