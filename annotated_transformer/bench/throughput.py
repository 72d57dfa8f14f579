"""Sections 2 and 3: training throughput of every contender, and attention alone."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from annotated_transformer.bench.contenders import CONTENDERS, REFERENCE, Trainer
from annotated_transformer.bench.shapes import Shape, model_flops
from annotated_transformer.bench.timing import summary
from annotated_transformer.machine import timed
from annotated_transformer.parts import Parts


def throughput(shapes: tuple[Shape, ...], device: torch.device, rounds: int,
               steps: dict[str, int], warmup: int, ceiling: float,
               contenders: tuple[str, ...] = CONTENDERS, precision: str = "fp32",
               compile: tuple[str, ...] = (), compile_at: tuple[str, ...] | None = None,
               backend: str = "inductor", log=print) -> dict:
    """Tokens per second of every contender at every shape, rounds interleaved; the
    contenders named in ``compile`` also ``torch.compile``-d (``NAME+compile``, with
    ``backend``) at the shapes named in ``compile_at`` (default: all)."""
    results = {}
    for shape in shapes:
        names = list(contenders)
        if compile_at is None or shape.name in compile_at:
            names += [f"{c}+compile" for c in compile]
        trainers = {}
        for name in names:
            trainers[name] = Trainer(name.removesuffix("+compile"), shape, device, precision,
                                     compile=name.endswith("+compile"), backend=backend)
            started = time.perf_counter()
            for _ in range(warmup + (2 if name.endswith("+compile") else 0)):
                trainers[name].step()
            if name.endswith("+compile"):
                log(f"  {shape.name}: {name} compiled and warmed up in "
                    f"{time.perf_counter() - started:.0f} s")
        samples: dict[str, list[float]] = {name: [] for name in names}
        count = steps[shape.name]
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]  # a different first each round
            for name in order:
                seconds = timed(lambda t=trainers[name]: t.step(), device, count)
                samples[name].append(shape.tokens * count / seconds)
        flops = model_flops(shape)
        entry = {"shape": asdict(shape), "model_flops_per_step": flops,
                 "steps_per_round": count, "contenders": {}}
        base = statistics.median(samples["torch"]) if "torch" in samples else None
        for name in names:
            stats = summary(samples[name])
            rate = stats["median"] / shape.tokens * flops / 1e9  # GFLOP/s
            stats.update(gflops=rate, utilisation=rate / ceiling,
                         ratio_to_torch=stats["median"] / base if base else None,
                         step_ms=1000 * shape.tokens / stats["median"])
            entry["contenders"][name] = stats
        results[shape.name] = entry
        log(format_throughput(shape, entry))
    return results


def format_throughput(shape: Shape, entry: dict) -> str:
    lines = [f"  {shape.name}: d_model={shape.d_model}, h={shape.num_heads}, "
             f"N={shape.num_layers}, d_ff={shape.d_ff}, V={shape.vocab}, batch "
             f"{shape.batch} x {shape.length} ({entry['model_flops_per_step'] / 1e9:.2f} "
             f"GFLOP a step)"]
    for name, s in entry["contenders"].items():
        ratio = f"{s['ratio_to_torch']:.2f}x" if s["ratio_to_torch"] else "-"
        lines.append(f"    {name:17s} {s['median']:10,.0f} tokens/s  (range {s['min']:,.0f}"
                     f"-{s['max']:,.0f})  {ratio:>6s} nn.Transformer  "
                     f"{s['utilisation']:5.1%} of the ceiling  {s['step_ms']:7.1f} ms/step")
    return "\n".join(lines)


def attention_alone(lengths: tuple[int, ...], device: torch.device, rounds: int,
                    log=print, batch: int = 8, heads: int = 8, d_k: int = 64,
                    seconds: float = 0.25) -> dict:
    """Milliseconds of one forward and backward of attention alone, per implementation."""
    fast = Parts("fast")
    implementations = {
        "reference": lambda q, k, v: REFERENCE.scaled_dot_product_attention(q, k, v)[0],
        "fast_explicit": lambda q, k, v: fast.scaled_dot_product_attention(q, k, v)[0],
        "fused": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }
    results = {}
    for length in lengths:
        q, k, v = (torch.randn(batch, heads, length, d_k, device=device, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(batch, heads, length, d_k, device=device)

        def run(fn, q=q, k=k, v=v, grad=grad):
            fn(q, k, v).backward(grad)
            q.grad = k.grad = v.grad = None

        once = min(timed(lambda fn=fn: run(fn), device) for fn in implementations.values())
        repeat = max(1, round(seconds / once))  # calls per sample: about `seconds` each
        samples: dict[str, list[float]] = {name: [] for name in implementations}
        for _ in range(rounds):
            for name, fn in implementations.items():
                samples[name].append(1000 * timed(lambda fn=fn: run(fn), device, repeat)
                                     / repeat)
        entry = {name: summary(s) for name, s in samples.items()}
        fused = entry["fused"]["median"]
        for stats in entry.values():
            stats["ratio_to_fused"] = stats["median"] / fused
        results[str(length)] = entry
        log(f"  L={length:5d}: " + "   ".join(
            f"{name} {s['median']:8.2f} ms ({s['ratio_to_fused']:.2f}x fused)"
            for name, s in entry.items()))
    return results

