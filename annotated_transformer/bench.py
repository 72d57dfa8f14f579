"""How fast the course's Transformer trains, beside PyTorch's own, measured in one run.

    python -m annotated_transformer.bench [--quick] [--json PATH] [--plot PATH] [--rounds N]
        [--max-tokens N] [--shapes copy,medium,base] [--profile]

What it measures, in this order (the book's performance page shows the latest figures):

1. **The matmul ceiling**: the best fp32 matrix-product rate of this machine (GFLOP/s,
   the best of a few timings of square products of a few sizes), against which
   utilisation is reported.
2. **Training throughput** of three contenders of the same size, post-LN, ReLU, dropout
   0.1, label smoothing 0.1, the same masks, tied embeddings, sinusoidal positions and a
   generator: the model built from the reference parts, the one built from the fast parts
   (:mod:`annotated_transformer.fast_parts`), and ``torch.nn.Transformer`` wrapped in the
   same embeddings and generator. One step is forward, loss, backward, gradient clipping
   and Adam (:func:`~annotated_transformer.train.adam`: the paper's settings, PyTorch's
   fused kernel, the same for all three). The contenders take turns round by round (a
   slow spell of the machine hits all of them), and the figure is target tokens per
   second: median and range over the rounds, and its ratio to ``nn.Transformer``'s
   median. Three shapes:
   the copy task's (``d_model=64``), a middle one (``d_model=256``) and the paper's base
   model (``d_model=512``). At the copy shape every contender also runs under
   ``torch.compile`` (the whole model, its one static shape; ``--quick`` traces with the
   ``eager`` backend only), the reference parts compiled among them.
3. **Attention alone**, forward and backward, ``B=8, H=8, d_k=64``, ``L = 64, 256, 1024``:
   the reference (Exercise 2.2) against ``F.scaled_dot_product_attention``, and the fast
   parts' explicit formula.
4. **The copy task**: the training time until greedy decoding reproduces all of 1,000
   held-out sequences, with the course's default recipe (``recipes.RECIPES["copy"]``),
   three seeds, the reference and the fast parts; beside it the Annotated Transformer's
   recipe on ``nn.Transformer`` (Adam at ``0.5 x`` Noam, warmup 400, batch 80, 400 steps,
   post-LN, two layers, no label smoothing) and the exact match it reaches. Evaluation
   is not counted in the time; sampling the batches is. ``--max-tokens N``: the default
   recipe trains on batches by a token budget of ``N`` instead of 128 sequences.
5. **On a CUDA device** (the rest runs there unchanged), the paper's scale: the base
   model with a 37,000-token vocabulary at about 25,000 target tokens a step
   (``--max-tokens`` changes it) in bf16 autocast, every contender eager and
   ``torch.compile``-d, with its model-FLOPs utilisation against the bf16 matrix-product
   rate measured on the same GPU; and the dates recipe (fast parts, bf16) eager and
   compiled, as ``train`` reports its time. Without a GPU these rows say
   "not measured (no GPU)".
6. **The goals**, one line each: met, not met, or not measured (and why).

``--profile`` instead profiles the copy recipe's training step with ``torch.profiler``
(:func:`profile_step`): the time of each phase and of the busiest operators.

**How FLOPs are counted.** Only matrix products, ``2·m·n·k`` each, as the model's
arithmetic requires them: the projections, the feed-forward layers, the generator, and
both attention products over the full ``Lq x Lk`` square (masked entries included, as
every kernel here computes them). The backward pass counts twice the forward (one product
for the input's gradient, one for the weight's). Softmax, LayerNorm, dropout, the loss
and Adam are not counted. The same count serves all contenders, so utilisation compares
them on the work the model needs, not on the work an implementation chose to do.

``--quick`` runs every section with tiny rounds in under a minute (a smoke test: its
numbers mean nothing). ``--json PATH`` writes every figure; ``--plot PATH`` a PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.data.copy import CopyTask
from annotated_transformer.data.vocab import BOS, PAD
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts, has_reference, load_chapter, use_parts
from annotated_transformer.recipes import RECIPES
from annotated_transformer.train import (
    TrainConfig,
    adam,
    evaluate,
    learning_rate,
    make_optimizer,
    model_batch,
    train_step,
    training_batches,
)

REFERENCE = Parts.reference()
CONTENDERS = ("reference", "fast", "torch")


# ---------------------------------------------------------------- shapes and FLOPs


@dataclass(frozen=True)
class Shape:
    """A model's size and one training batch: ``batch`` sequences of ``length`` tokens
    each side (source, and target labels)."""

    name: str
    d_model: int
    num_heads: int
    num_layers: int
    d_ff: int
    vocab: int
    batch: int
    length: int

    def config(self, dropout: float = 0.1) -> TransformerConfig:
        return TransformerConfig(self.vocab, self.vocab, num_layers=self.num_layers,
                                 d_model=self.d_model, d_ff=self.d_ff,
                                 num_heads=self.num_heads, dropout=dropout,
                                 max_len=max(64, self.length + 1), norm_first=False)

    @property
    def tokens(self) -> int:
        """Target tokens (labels) a step."""
        return self.batch * self.length


SHAPES = (
    Shape("copy", d_model=64, num_heads=4, num_layers=2, d_ff=256, vocab=11, batch=80,
          length=10),
    Shape("medium", d_model=256, num_heads=8, num_layers=3, d_ff=1024, vocab=1000, batch=32,
          length=64),
    Shape("base", d_model=512, num_heads=8, num_layers=6, d_ff=2048, vocab=1000, batch=16,
          length=32),
)


def model_flops(shape: Shape) -> float:
    """Matrix-product FLOPs of one training step (forward and backward) of an
    encoder-decoder of ``shape``, source and target both ``shape.length`` long (see the
    module docstring for what is counted)."""
    d, f, n, v = shape.d_model, shape.d_ff, shape.num_layers, shape.vocab
    ls = lt = shape.length
    src, tgt = shape.batch * ls, shape.batch * lt  # tokens on each side
    attention = 2 * 2 * d  # QK^T and weights @ V: 2·d FLOPs each per (query, key) pair
    encoder = src * (4 * 2 * d * d + 2 * 2 * d * f) + shape.batch * ls * ls * attention
    decoder = (tgt * (4 * 2 * d * d + 2 * 2 * d * f)  # self-attention projections, FFN
               + shape.batch * lt * lt * attention  # self-attention
               + tgt * 2 * 2 * d * d + src * 2 * 2 * d * d  # cross: Q, out; K, V of memory
               + shape.batch * lt * ls * attention)  # cross-attention
    forward = n * (encoder + decoder) + tgt * 2 * d * v  # and the generator
    return 3.0 * forward


# ---------------------------------------------------------------- devices and clocks


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int = 1) -> float:
    """Seconds for ``repeat`` calls of ``fn``, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize(device)
    return time.perf_counter() - start


def matmul_ceiling(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...],
                   rounds: int) -> dict:
    """The best rate of square matrix products ``n x n @ n x n`` over ``sizes`` (GFLOP/s):
    for each size the best of ``rounds`` timings (a ceiling is what the machine can do;
    another program's spell slows a timing down, never up), then the best size."""
    rates = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        repeat = max(1, int(2e9 // (2 * n**3))) if device.type == "cpu" else 20
        timed(lambda a=a, b=b: a @ b, device, 2)  # warm-up
        samples = [2 * n**3 * repeat / timed(lambda a=a, b=b: a @ b, device, repeat) / 1e9
                   for _ in range(rounds)]
        rates[n] = max(samples)
    best = max(rates, key=rates.get)
    return {"dtype": str(dtype).removeprefix("torch."), "gflops": rates[best], "size": best,
            "by_size": {str(n): r for n, r in rates.items()}}


def summary(samples: list[float]) -> dict:
    """Median, smallest and largest of a list of rates, and the spread (range / median)."""
    median = statistics.median(samples)
    return {"median": median, "min": min(samples), "max": max(samples),
            "spread": (max(samples) - min(samples)) / median if median else 0.0,
            "samples": samples}


# ---------------------------------------------------------------- nn.Transformer contender


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with the course model's embeddings (scaled by
    ``sqrt(d_model)``, plus the sinusoidal table, dropout), tied generator and masks.

    ``forward(src, tgt, src_mask, tgt_mask)`` takes the course's masks (``True`` =
    allowed: ``src_mask [B, 1, 1, Ls]`` padding, ``tgt_mask [B, 1, Lt, Lt]`` or
    ``[Lt, Lt]``) and hands PyTorch its own convention (``True`` = masked): a key padding
    mask for the source, and the target's causal mask with its key padding mask. It also
    has ``encode``, ``decode`` and ``generator``, so that the course's greedy decoding
    runs it."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        self.parts = REFERENCE  # decoding and masks: the reference's chapter 4 and 6
        self.embedding = nn.Embedding(c.src_vocab_size, c.d_model)
        table = load_chapter("solutions", 1).positional_encoding(c.max_len, c.d_model)
        self.register_buffer("pe", table)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(
            c.d_model, c.num_heads, c.num_layers, c.num_layers, c.d_ff, c.dropout,
            activation="relu", batch_first=True, norm_first=c.norm_first)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        self.generator.weight = self.embedding.weight

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.pe[: tokens.size(1)])

    @staticmethod
    def _key_padding(mask: Tensor | None) -> Tensor | None:
        """``[B, 1, 1, L]`` allowed -> ``[B, L]`` masked (PyTorch's convention)."""
        return None if mask is None else ~mask.reshape(mask.size(0), mask.size(-1))

    @staticmethod
    def _target(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The course's target mask -> ``(causal [Lt, Lt], key padding [B, Lt])``, masked =
        True. A ``[B, 1, Lt, Lt]`` target mask is causal & padding: its last row is the
        padding of the keys (the last query sees every earlier key)."""
        if mask is None:
            return None, None
        length = mask.size(-1)
        causal = ~torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
        if mask.dim() == 2:
            return causal, None
        return causal, ~mask[:, 0, -1, :]

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self.transformer.encoder(self.embed(src),
                                        src_key_padding_mask=self._key_padding(src_mask))

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        causal, padding = self._target(tgt_mask)
        return self.transformer.decoder(
            self.embed(tgt), memory, tgt_mask=causal, tgt_key_padding_mask=padding,
            memory_key_padding_mask=self._key_padding(src_mask), tgt_is_causal=True)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


def build(contender: str, config: TransformerConfig, device: torch.device
          ) -> tuple[nn.Module, Callable[[Tensor, Tensor], Tensor]]:
    """A contender's model (on ``device``) and its loss function."""
    if contender == "torch":
        model = TorchTransformer(config)

        def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
            return F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=0.1)
    else:
        parts = REFERENCE if contender == "reference" else Parts("fast")
        model = EncoderDecoder(config, parts=parts)
        with use_parts(parts):
            loss_fn = parts.LabelSmoothingLoss(0.1, ignore_index=PAD)
    return model.to(device), loss_fn


# ---------------------------------------------------------------- training throughput


class Trainer:
    """One contender at one shape: a model, its optimizer and a fixed batch."""

    def __init__(self, contender: str, shape: Shape, device: torch.device,
                 precision: str = "fp32", compile: bool = False, seed: int = 0,
                 backend: str = "inductor") -> None:
        torch.manual_seed(seed)
        self.model, self.loss_fn = build(contender, shape.config(), device)
        # The whole model, its one batch shape: a static graph (the training command
        # compiles the layers for every shape instead, train.compile_model)
        self.net = (torch.compile(self.model, dynamic=False, backend=backend) if compile
                    else self.model)
        self.optimizer = adam(self.model.parameters(), lr=1e-4)  # small: no step diverges
        self.device, self.shape, self.precision = device, shape, precision
        generator = torch.Generator().manual_seed(seed)
        src = torch.randint(3, shape.vocab, (shape.batch, shape.length), generator=generator)
        tgt = torch.randint(3, shape.vocab, (shape.batch, shape.length + 1),
                            generator=generator)
        tgt[:, 0] = BOS
        self.src, self.tgt = src.to(device), tgt.to(device)
        self.batch = REFERENCE.make_batch(self.src, self.tgt, PAD)  # the same masks for all
        self.model.train()
        self.parameters = list(self.model.parameters())

    def step(self) -> Tensor:
        """One training step; returns the loss, left on the device (nothing waits for it)."""
        device, batch = self.device, self.batch
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                    if self.precision == "bf16" else _nothing())
        with autocast:
            logits = self.net(batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask)
            loss = self.loss_fn(logits.reshape(-1, logits.size(-1)),
                                batch.tgt_labels.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.parameters, 1.0, foreach=True)
        self.optimizer.step()
        return loss.detach()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


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


# ---------------------------------------------------------------- attention alone


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


# ---------------------------------------------------------------- the copy task


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
        batch = model_batch(model, *next(batches)).to(device)
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
            with use_parts(parts):
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


# ---------------------------------------------------------------- the report


def environment(device: torch.device, threads: int) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "threads": threads, "device": str(device),
            "command": " ".join(["python -m annotated_transformer.bench", *sys.argv[1:]])}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def markdown(report: dict) -> str:
    """The figures as Markdown tables (what the book's performance page shows)."""
    env = report["environment"]
    out = [f"Measured by `{env['command']}` on {env['cpu']} ({env['cpu_count']} cores, "
           f"{env['threads']} threads), torch {env['torch']}, {report['rounds']} rounds, "
           f"{report['seconds'] / 60:.1f} minutes"
           + (f", {env['gpu']}" if env.get("gpu") else "") + ".", "",
           f"Matmul ceiling (fp32): **{report['ceiling']['gflops']:.0f} GFLOP/s** "
           f"(n = {report['ceiling']['size']}).", "",
           "| shape | contender | target tokens/s | range | vs nn.Transformer "
           "| utilisation | ms/step |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    labels = {"reference": "reference parts", "fast": "fast parts", "torch": "nn.Transformer",
              "solutions": "reference parts"}
    labels.update({f"{name}+compile": f"{label}, compiled" for name, label in labels.items()})
    for shape, entry in report["throughput"].items():
        for name, s in entry["contenders"].items():
            ratio = f"{s['ratio_to_torch']:.2f}x" if s["ratio_to_torch"] else "-"
            out.append(f"| {shape} | {labels.get(name, name)} | {s['median']:,.0f} | "
                       f"{s['min']:,.0f}-{s['max']:,.0f} | {ratio} | {s['utilisation']:.0%} | "
                       f"{s['step_ms']:.1f} |")
    out += ["", "| L | reference (Exercise 2.2) | fast parts, explicit | "
            "F.scaled_dot_product_attention |", "| ---: | ---: | ---: | ---: |"]
    for length, entry in report["attention"].items():
        out.append(f"| {length} | " + " | ".join(
            f"{entry[name]['median']:.2f} ms ({entry[name]['ratio_to_fused']:.2f}x)"
            for name in ("reference", "fast_explicit", "fused")) + " |")
    copy = report["copy_task"]
    out += ["", f"| copy task ({copy['held_out']} held-out sequences) | seeds | training "
            "seconds to 100% | steps | exact match reached |", "| --- | --- | ---: | ---: | ---: |"]
    for name, entry in copy["default"].items():
        runs = entry["runs"]
        seconds = ", ".join(f"{r['reached']['seconds']:.1f}" if r["reached"] else "-"
                            for r in runs)
        median = entry["median_seconds"]
        seconds += (f" (median {median:.1f})" if median is not None
                    else " (not every seed reached 100%)")
        steps = ", ".join(str(r["reached"]["step"]) if r["reached"] else "-" for r in runs)
        reached = ", ".join(f"{r['final_exact_match']:.1%}" for r in runs)
        out.append(f"| default recipe, {labels.get(name, name + ' parts')} | {len(runs)} | "
                   f"{seconds} | {steps} | {reached} |")
    at = copy["annotated_transformer"]
    out.append("| Annotated Transformer's recipe, nn.Transformer | 1 | "
               + (f"{at['reached']['seconds']:.1f}" if at["reached"] else
                  f"- ({at['seconds']:.1f} s trained)")
               + f" | {at['final_step']} | {at['final_exact_match']:.1%} |")
    out += [""] + gpu_lines(report.get("cuda"), labels)
    out += ["", "| goal | this run | |", "| --- | ---: | --- |"]
    for name, goal in report["goals"].items():
        shown = verdict(goal) if goal["met"] is not None else goal["note"] or "not measured"
        if goal["met"] is False:
            shown = "**not met**"
        out.append(f"| {name.replace('_', ' ')} | {goal['shown']} | {shown} |")
    return "\n".join(out) + "\n"


def gpu_lines(cuda: dict | None, labels: dict[str, str]) -> list[str]:
    """The GPU section as Markdown: the paper-scale step and the dates recipe."""
    title = (f"GPU, the paper's scale: the base model with a {PAPER.vocab:,}-token "
             f"vocabulary, about {PAPER_TOKENS:,} target tokens a step, bf16 autocast")
    if not cuda:
        return [f"{title}: {NO_GPU}.", "",
                "| contender | target tokens/s | vs nn.Transformer | model-FLOPs utilisation |",
                "| --- | ---: | ---: | ---: |"] + [
                    f"| {labels[name]}{compiled} | {NO_GPU} | - | - |"
                    for compiled in ("", ", compiled") for name in CONTENDERS]
    out = [f"{title} ({cuda['tokens_per_step']:,} in this run); {cuda['ceiling']['dtype']} "
           f"matmul "
           f"{cuda['ceiling']['gflops'] / 1000:,.0f} TFLOP/s:", "",
           "| contender | target tokens/s | vs nn.Transformer | model-FLOPs utilisation |",
           "| --- | ---: | ---: | ---: |"]
    for name, s in cuda["contenders"].items():
        ratio = f"{s['ratio_to_torch']:.2f}x" if s["ratio_to_torch"] else "-"
        out.append(f"| {labels.get(name, name)} | {s['median']:,.0f} | {ratio} | "
                   f"{s['mfu']:.0%} |")
    out += ["", "| dates recipe, fast parts, bf16 | seconds | held-out exact match |",
            "| --- | ---: | ---: |"]
    for name, d in cuda["dates"].items():
        out.append(f"| {name} | {d['seconds']:.1f} | {d['exact_match']:.1%} of "
                   f"{d['held_out']} |")
    return out


def plot(report: dict, path: Path) -> None:
    """One figure: throughput ratios, utilisation, attention alone, the copy task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colours = {"reference": "tab:blue", "fast": "tab:orange", "torch": "tab:gray"}
    labels = {"reference": "reference parts", "fast": "fast parts", "torch": "nn.Transformer"}
    shapes = list(report["throughput"])
    width = 0.8 / len(CONTENDERS)
    ax = axes[0, 0]
    for i, name in enumerate(CONTENDERS):
        stats = [report["throughput"][s]["contenders"][name] for s in shapes]
        base = [report["throughput"][s]["contenders"]["torch"]["median"] for s in shapes]
        values = [st["median"] / b for st, b in zip(stats, base, strict=True)]
        low = [v - st["min"] / b for v, st, b in zip(values, stats, base, strict=True)]
        high = [st["max"] / b - v for v, st, b in zip(values, stats, base, strict=True)]
        xs = [j + (i - 1) * width for j in range(len(shapes))]
        ax.bar(xs, values, width, yerr=[low, high], capsize=3, color=colours[name],
               label=labels[name])
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v + 0.03, f"{v:.2f}", ha="center", fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("training tokens/s relative to nn.Transformer")
    ax.set_title("Training throughput (median; bars: range over rounds)")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    for i, name in enumerate(CONTENDERS):
        values = [100 * report["throughput"][s]["contenders"][name]["utilisation"]
                  for s in shapes]
        xs = [j + (i - 1) * width for j in range(len(shapes))]
        ax.bar(xs, values, width, color=colours[name], label=labels[name])
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v + 0.5, f"{v:.0f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("% of the measured fp32 matmul rate")
    ax.set_title(f"Utilisation (ceiling {report['ceiling']['gflops']:.0f} GFLOP/s)")
    ax = axes[1, 0]
    lengths = [int(n) for n in report["attention"]]
    for name, colour in (("reference", "tab:blue"), ("fast_explicit", "tab:orange"),
                         ("fused", "tab:green")):
        ax.plot(lengths, [report["attention"][str(n)][name]["median"] for n in lengths], "o-",
                color=colour, label={"fused": "F.scaled_dot_product_attention",
                                     "fast_explicit": "fast parts, explicit",
                                     "reference": "reference (Exercise 2.2)"}[name])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("ms, forward + backward")
    ax.set_title("Attention alone (B=8, H=8, d_k=64)")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    copy = report["copy_task"]
    for parts_name, entry in copy["default"].items():
        for k, run in enumerate(entry["runs"]):
            ax.plot([0] + [p["seconds"] for p in run["curve"]],
                    [0] + [100 * p["exact_match"] for p in run["curve"]], "o-", ms=3,
                    color=colours["fast" if parts_name == "fast" else "reference"],
                    label=(f"default recipe, {labels.get(parts_name, 'reference parts')}, "
                           f"{len(entry['runs'])} seeds") if k == 0 else None)
    at = copy["annotated_transformer"]
    ax.plot([0] + [p["seconds"] for p in at["curve"]],
            [0] + [100 * p["exact_match"] for p in at["curve"]], "s--", ms=3,
            color=colours["torch"], label="Annotated Transformer's recipe, nn.Transformer")
    ax.axvline(20, color="black", lw=0.8, ls=":")
    ax.set_ylim(0, 102)
    ax.set_xlabel("training seconds (evaluation not counted)")
    ax.set_ylabel(f"% exact match, {copy['held_out']} held-out sequences")
    ax.set_title("The copy task")
    ax.legend(fontsize=8)
    env = report["environment"]
    fig.suptitle(f"{env['cpu']}, {env['threads']} threads, torch {env['torch']}"
                 + (f", {env['gpu']}" if env.get("gpu") else ""), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- CUDA

# The paper's base model at the paper's scale: a 37,000-token shared vocabulary and about
# 25,000 target tokens a step (section 5.1), as sequences of 32 tokens each side.
PAPER = Shape("paper", d_model=512, num_heads=8, num_layers=6, d_ff=2048, vocab=37000,
              batch=781, length=32)
PAPER_TOKENS = 25_000


def paper_shape(max_tokens: int | None, quick: bool) -> Shape:
    """:data:`PAPER` with about ``max_tokens`` target tokens a step (default 25,000);
    ``quick``: one layer, a small vocabulary and batch (only that the code runs)."""
    if quick:
        return replace(PAPER, num_layers=1, d_model=64, num_heads=4, d_ff=128, vocab=500,
                       batch=4, length=8)
    return replace(PAPER, batch=max(1, (max_tokens or PAPER_TOKENS) // PAPER.length))


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


# ---------------------------------------------------------------- goals

NO_GPU = "not measured (no GPU)"


def goals(report: dict) -> dict:
    """The goals, checked against this run's figures: ``{name: {"value", "shown", "met",
    "note"}}`` with ``met`` None where this run did not measure the goal (``note`` says
    why). The first are the GPU issue's table; the last the earlier CPU goals."""
    t = report["throughput"]
    on_cpu = report["environment"]["device"].startswith("cpu")
    cuda = report.get("cuda")

    def ratio(shape: str, name: str, entry: dict | None = None) -> float | None:
        stats = (entry or t.get(shape, {})).get("contenders", {}).get(name)
        return stats["ratio_to_torch"] if stats else None

    def goal(value, threshold, shown, note=None, at_most=False) -> dict:
        met = None if value is None else value <= threshold if at_most else value >= threshold
        return {"value": value, "shown": "-" if value is None else shown.format(value),
                "met": met, "note": note if value is None else None}

    cpu_note = None if on_cpu else "not measured (this run was on a GPU)"
    copy = report.get("copy_task", {}).get("default", {})
    seconds = [e["median_seconds"] for e in copy.values() if e["median_seconds"] is not None]
    fast = [r for r in (ratio("copy", "fast"), ratio("copy", "fast+compile")) if r]
    dates = cuda and [d["seconds"] for d in cuda["dates"].values() if d["exact_match"] == 1.0]
    result = {
        "train_compile_every_task": {
            "value": None, "shown": "-", "met": None,
            "note": "checked by tests/test_compile.py (CPU) and tests/test_cuda.py (GPU)"},
        "copy_task_100%_within_5s_cpu": goal(min(seconds) if seconds and on_cpu else None,
                                             5.0, "{:.1f} s", cpu_note, at_most=True),
        "fast_at_least_2x_copy_cpu": goal(max(fast) if fast and on_cpu else None, 2.0,
                                          "{:.2f}x", cpu_note),
        "reference_compiled_at_least_1x_cpu": goal(
            ratio("copy", "reference+compile") if on_cpu else None, 1.0, "{:.2f}x",
            cpu_note or "not measured (no compiled reference in this run)"),
        "reference_compiled_at_least_1x_gpu": goal(
            cuda and ratio("paper", "reference+compile", cuda), 1.0, "{:.2f}x", NO_GPU),
        "fast_compiled_bf16_mfu_at_least_40%_gpu": goal(
            cuda and cuda["contenders"].get("fast+compile", {}).get("mfu"), 0.40, "{:.0%}",
            NO_GPU),
        "dates_recipe_within_10s_gpu": goal(
            min(dates) if dates else None, 10.0, "{:.1f} s",
            "not measured (no run reached 100%)" if cuda else NO_GPU, at_most=True),
    }
    earlier = {"fast_copy_at_least_1.3x": (ratio("copy", "fast"), 1.3, "{:.2f}x"),
               "fast_medium_at_least_1.05x": (ratio("medium", "fast"), 1.05, "{:.2f}x"),
               "fast_base_at_least_1.05x": (ratio("base", "fast"), 1.05, "{:.2f}x"),
               "reference_at_least_0.95x": (
                   min((ratio(s, "reference") or 0.0) for s in t) if t else None, 0.95,
                   "{:.2f}x"),
               "fast_base_utilisation_at_least_65%": (
                   t.get("base", {}).get("contenders", {}).get("fast", {}).get("utilisation"),
                   0.65, "{:.0%}")}
    for name, (value, threshold, shown) in earlier.items():
        result[name] = goal(value, threshold, shown, "not measured")
    median = copy.get("solutions", {}).get("median_seconds")
    result["copy_default_recipe_100%_within_20s"] = goal(median, 20.0, "{:.1f} s",
                                                         "not measured", at_most=True)
    for name, measured in (("copy_task_100%_within_5s_cpu", on_cpu and copy),
                           ("copy_default_recipe_100%_within_20s", "solutions" in copy)):
        if measured and result[name]["value"] is None:  # a seed never reached 100%
            result[name].update(met=False, note=None)
    return result


def verdict(goal: dict) -> str:
    return {True: "met", False: "not met"}.get(goal["met"], goal["note"] or "not measured")


# ---------------------------------------------------------------- profile

PHASES = ("draw the examples", "masks and labels", "forward and loss", "backward",
          "clip gradients", "Adam")


def profile_step(parts_name: str, steps: int = 30, warmup: int = 10, rows: int = 14,
                 log=print) -> dict:
    """Where the copy recipe's training step (the steps of :func:`~annotated_transformer.
    train.train_step`, each phase under ``record_function``) spends its time on this
    machine's CPU, by ``torch.profiler``: milliseconds a step per phase, and the operators
    with the most time of their own (the ``rows`` first)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from annotated_transformer.train import model_loss

    task, recipe = CopyTask(), RECIPES["copy"]
    config = recipe.train_config()
    torch.manual_seed(0)
    parts = Parts(parts_name)
    model = EncoderDecoder(recipe.model_config(task), parts=parts)
    optimizer, scheduler = make_optimizer(model, config)
    with use_parts(parts):
        loss_fn = parts.LabelSmoothingLoss(config.label_smoothing, ignore_index=PAD)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        with record_function(PHASES[0]):
            src, tgt = task.sample(config.batch_size, generator)
        with record_function(PHASES[1]):
            batch = model_batch(model, src, tgt)
        with record_function(PHASES[2]):
            loss = model_loss(model, model, batch, loss_fn)
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


# ---------------------------------------------------------------- main


def run(quick: bool = False, rounds: int | None = None, device: str | None = None,
        threads: int | None = None, max_tokens: int | None = None,
        shapes: tuple[str, ...] | None = None, log=print) -> dict:
    """Every section (the throughput at ``shapes`` only, default all); returns the report
    (see the module docstring)."""
    started = time.perf_counter()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    rounds = rounds or (2 if quick else 7)
    report: dict = {"environment": environment(dev, threads), "quick": quick, "rounds": rounds,
                    "max_tokens": max_tokens}
    log(f"annotated_transformer.bench on {dev} ({report['environment']['cpu']}, "
        f"{threads} threads), torch {torch.__version__}, {rounds} rounds"
        + (" [quick: the numbers mean nothing]" if quick else ""))
    log("matmul ceiling (fp32)")
    report["ceiling"] = matmul_ceiling(dev, torch.float32, (256,) if quick else (512, 1024, 2048),
                                       rounds=3 if quick else 5)
    log(f"  {report['ceiling']['gflops']:.1f} GFLOP/s (n={report['ceiling']['size']})")
    log("training throughput (forward, backward, clipping, Adam; target tokens/s)")
    selected = tuple(s for s in SHAPES if shapes is None or s.name in shapes)
    if quick:  # the same, much smaller: only that the code runs
        selected = tuple(replace(s, num_layers=1, batch=4, length=8) for s in selected)
    steps = ({s.name: 1 for s in selected} if quick
             else {"copy": 20, "medium": 2, "base": 2} if dev.type == "cpu"
             else {"copy": 50, "medium": 20, "base": 20})
    # Compiled too at the copy shape: on a CPU each compilation takes about a minute.
    # --quick compiles with the "eager" backend (tracing only, no code generated).
    report["throughput"] = throughput(selected, dev, rounds, steps, warmup=1 if quick else 3,
                                      ceiling=report["ceiling"]["gflops"], compile=CONTENDERS,
                                      compile_at=("copy",),
                                      backend="eager" if quick else "inductor", log=log)
    log("attention alone (forward and backward, B=8, H=8, d_k=64)")
    report["attention"] = attention_alone((16, 64) if quick else (64, 256, 1024), dev,
                                          rounds=1 if quick else 5, log=log,
                                          seconds=0.01 if quick else 0.25)
    log("the copy task: training seconds to 100% exact match on held-out sequences")
    report["copy_task"] = copy_task(
        dev, seeds=(0,) if quick else (0, 1, 2), held_out_size=50 if quick else 1000,
        parts_names=("solutions",) if quick else ("solutions", "fast"),
        eval_every=5 if quick else None, max_steps=10 if quick else None,
        at_steps=10 if quick else 400, max_tokens=max_tokens, log=log)
    for name, entry in report["copy_task"]["default"].items():
        seconds = entry["median_seconds"]
        log(f"  default recipe, {name} parts: " + (
            f"median {seconds:.1f} s to 100%" if seconds is not None else
            f"not every seed reached 100% (median final {entry['median_final_exact_match']:.1%})"))
    report["cuda"] = None
    if dev.type == "cuda":
        log(f"GPU: the base model at the paper's scale in bf16 (vocabulary {PAPER.vocab:,}, "
            f"about {max_tokens or PAPER_TOKENS:,} target tokens a step)")
        report["cuda"] = cuda_section(dev, quick, rounds, max_tokens, log=log)
    else:
        log(f"GPU: the base model at the paper's scale in bf16: {NO_GPU}")
    report["goals"] = goals(report)
    report["seconds"] = time.perf_counter() - started
    log("goals:")
    for name, goal in report["goals"].items():
        log(f"  {name.replace('_', ' ')}: {goal['shown']}  {verdict(goal)}")
    log(f"done in {report['seconds']:.0f} s")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m annotated_transformer.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny rounds of every section, under a minute (a smoke test)")
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--plot", type=Path, help="draw the figures into this PNG file")
    parser.add_argument("--markdown", type=Path,
                        help="write the figures as Markdown tables (for the book)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 7; quick 2)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--threads", type=int,
                        help="CPU threads (default: torch.get_num_threads())")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="batches by a token budget: the copy task trains on batches of "
                        "at most N tokens each side (instead of the recipe's 128 sequences), "
                        f"and the GPU's paper-scale step has about N target tokens (default "
                        f"{PAPER_TOKENS:,})")
    parser.add_argument("--profile", action="store_true",
                        help="only profile the copy recipe's training step (reference and "
                        "fast parts): time per phase and per operator")
    parser.add_argument("--shapes", help="the throughput's shapes, comma-separated "
                        f"(default: all of {', '.join(s.name for s in SHAPES)})")
    args = parser.parse_args(argv)
    shapes = None if args.shapes is None else tuple(args.shapes.split(","))
    if shapes and not set(shapes) <= {s.name for s in SHAPES}:
        parser.error(f"--shapes: choose among {', '.join(s.name for s in SHAPES)}, got "
                     f"{args.shapes!r}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    longest = max(CopyTask().max_source_len, CopyTask().max_target_len)
    if args.max_tokens is not None and args.max_tokens < longest:
        parser.error(f"--max-tokens must be at least the copy task's longest sequence "
                     f"({longest} tokens), got {args.max_tokens}")
    if not has_reference():
        print("error: the benchmark compares the reference and the fast parts, which a "
              "student release leaves out; run it in the course's repository", file=sys.stderr)
        return 2
    if args.profile:
        if args.threads:
            torch.set_num_threads(args.threads)
        steps, warmup = (2, 1) if args.quick else (30, 10)
        profiles = [profile_step(name, steps, warmup) for name in ("solutions", "fast")]
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(profiles, indent=1) + "\n")
        return 0
    report = run(quick=args.quick, rounds=args.rounds, device=args.device, threads=args.threads,
                 max_tokens=args.max_tokens, shapes=shapes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(report))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
