"""The benchmark's command line: every section in order, then the report, the figure and
the tables (see :mod:`annotated_transformer.bench`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from annotated_transformer import bench
from annotated_transformer.bench.contenders import CONTENDERS
from annotated_transformer.bench.copy_task import copy_task
from annotated_transformer.bench.goals import NO_GPU, goals, verdict
from annotated_transformer.bench.gpu import cuda_section
from annotated_transformer.bench.plot import plot
from annotated_transformer.bench.profiling import profile_step
from annotated_transformer.bench.report import environment, markdown
from annotated_transformer.bench.shapes import PAPER, PAPER_TOKENS, SHAPES
from annotated_transformer.bench.throughput import attention_alone, throughput
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.machine import matmul_ceiling
from annotated_transformer.parts import has_reference

PROG = "python -m annotated_transformer bench"

def run(quick: bool = False, rounds: int | None = None, device: str | None = None,
        threads: int | None = None, max_tokens: int | None = None,
        shapes: tuple[str, ...] | None = None, log=print, command: str = PROG) -> dict:
    """Every section (the throughput at ``shapes`` only, default all); returns the report
    (see :mod:`annotated_transformer.bench`). ``command``: the command line the report names."""
    started = time.perf_counter()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    rounds = rounds or (2 if quick else 7)
    report: dict = {"environment": environment(dev, threads, command), "quick": quick,
                    "rounds": rounds, "max_tokens": max_tokens}
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
             else {"copy": 20, "medium": 2, "base": 2, "multi30k-cpu": 2} if dev.type == "cpu"
             else {"copy": 50, "medium": 20, "base": 20, "multi30k-cpu": 20})
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
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=PROG, description=bench.__doc__.split("\n\n")[0])
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
    parser.add_argument("--recipe-shape", action="store_true",
                        help="only the CPU recipe's step (--model cpu on Multi30k): the fast "
                        "parts against nn.Transformer on 1 and 2 threads, interleaved; ratio, "
                        "GFLOP/s against the matmul ceiling, and the share of each part")
    parser.add_argument("--decoding", type=Path, metavar="CHECKPOINT",
                        help="only time a translation checkpoint's beam search (beam 4) over "
                        "its test split, without and with the decoder's cache")
    parser.add_argument("--dataset", help="--decoding: the corpus (default: the "
                        "checkpoint's), e.g. Multi30k's data/task1/raw folder; "
                        "--recipe-shape: draw the recipe's batches from this corpus "
                        "(default: their lengths as committed)")
    parser.add_argument("--sentences", type=int, metavar="N",
                        help="--decoding: only the first N sentences (default: all)")
    parser.add_argument("--shapes", help="the throughput's shapes, comma-separated "
                        f"(default: all of {', '.join(s.name for s in SHAPES)})")
    args = parser.parse_args(argv)
    shapes = None if args.shapes is None else tuple(args.shapes.split(","))
    if shapes and not set(shapes) <= {s.name for s in SHAPES}:
        parser.error(f"--shapes: choose among {', '.join(s.name for s in SHAPES)}, got "
                     f"{args.shapes!r}")
    if args.sentences is not None and args.sentences < 1:
        parser.error("--sentences must be at least 1")
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
    if args.decoding:
        from annotated_transformer.bench.decoding import decoding
        from annotated_transformer.checkpoint import CheckpointError
        from annotated_transformer.data.tsv import DataError

        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            result = decoding(args.decoding, args.dataset, size=args.sentences)
        except (CheckpointError, DataError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        result["environment"] = environment(torch.device("cpu"), torch.get_num_threads(),
                                            " ".join([PROG, *argv]))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.recipe_shape:
        from annotated_transformer.bench.recipe_shape import recipe_shape
        from annotated_transformer.data.tsv import DataError

        threads = (args.threads,) if args.threads else (1, 2)
        try:
            result = recipe_shape(threads, rounds=args.rounds or (1 if args.quick else 8),
                                  steps=1 if args.quick else 4,
                                  part_steps=1 if args.quick else 4, dataset=args.dataset)
        except DataError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        result["environment"] = environment(torch.device("cpu"), max(threads),
                                            " ".join([PROG, *argv]))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        return 0
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
                 max_tokens=args.max_tokens, shapes=shapes, command=" ".join([PROG, *argv]))
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
