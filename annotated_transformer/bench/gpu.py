"""Section 5, on a CUDA device: the paper-scale step in bf16 and the dates recipe."""

from __future__ import annotations

import torch

from annotated_transformer.bench.contenders import CONTENDERS
from annotated_transformer.bench.shapes import paper_shape
from annotated_transformer.bench.throughput import throughput
from annotated_transformer.machine import matmul_ceiling
from annotated_transformer.model import EncoderDecoder
from annotated_transformer.parts import Parts
from annotated_transformer.recipes import RECIPES


def cuda_section(device: torch.device, quick: bool, rounds: int,
                 max_tokens: int | None = None, log=print, precision: str = "bf16") -> dict:
    """The paper-scale step (:func:`paper_shape`) in bf16 autocast, every contender eager
    and compiled, with its model-FLOPs utilisation against the bf16 matmul rate measured
    on the same device; and the dates recipe's training time (:func:`dates_recipe`;
    ``quick``: eager only). ``precision="fp32"`` lets a test run it all on a CPU, which
    computes bf16 slowly."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    sizes = (256, 512) if quick else (4096, 8192)
    ceiling = matmul_ceiling(device, dtype, sizes, rounds=3)
    log(f"  {ceiling['dtype']} matmul: {ceiling['gflops'] / 1000:,.1f} TFLOP/s "
        f"(n={ceiling['size']})")
    shape = paper_shape(max_tokens, quick)
    entry = throughput((shape,), device, rounds, {shape.name: 2 if quick else 10},
                       warmup=1 if quick else 3, ceiling=ceiling["gflops"],
                       precision=precision, compile=CONTENDERS,
                       backend="eager" if quick else "inductor", log=log)[shape.name]
    for name, stats in entry["contenders"].items():
        stats["name"] = name
        stats["mfu"] = stats["utilisation"]
    runs = (("eager", False),) if quick else (("eager", False), ("compiled", True))
    dates = {name: dates_recipe(device, quick, compiled, log, precision)
             for name, compiled in runs}
    return {"ceiling": ceiling, "tokens_per_step": shape.tokens, **entry, "dates": dates}


def dates_recipe(device: torch.device, quick: bool, compiled: bool, log=print,
                 precision: str = "bf16") -> dict:
    """``train --task dates --parts fast --precision bf16 [--compile]`` on ``device``: the
    run's seconds as the command reports them (compiling and evaluations included) and
    its final held-out exact match (``quick``: 3 steps of 8 examples)."""
    from annotated_transformer.data import make_task
    from annotated_transformer.train import Runtime, train

    task, recipe = make_task("dates"), RECIPES["dates"]
    config = recipe.train_config(steps=3 if quick else None, eval_every=3 if quick else None,
                                 eval_size=8 if quick else None,
                                 batch_size=8 if quick else None)
    torch.manual_seed(config.seed)
    model = EncoderDecoder(recipe.model_config(task), parts=Parts("fast")).to(device)
    runtime = Runtime(precision=precision, compile=compiled)
    history = train(model, task, config, runtime=runtime)
    result = {"seconds": history.seconds, "steps": config.steps,
              "exact_match": history.exact_match[-1], "held_out": config.eval_size}
    log(f"  dates recipe, fast parts, {precision}{', compiled' if compiled else ''}: "
        f"{result['seconds']:.1f} s, {result['exact_match']:.1%} of {config.eval_size} "
        f"held-out dates")
    return result

