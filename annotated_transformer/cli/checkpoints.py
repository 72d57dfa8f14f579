"""The commands that read a checkpoint: ``evaluate``, ``translate``, ``attention``,
``export`` and ``average``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from annotated_transformer import checkpoint
from annotated_transformer.cli.common import UsageError, add_model_options, load_checkpoint
from annotated_transformer.cli.translation import (
    add_decoding_options,
    run_evaluate_translation,
    run_translate_translation,
)
from annotated_transformer.model import UnsupportedDecoding

# ---------------------------------------------------------------- evaluate

def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="held-out exact match and loss of a checkpoint "
                       "(translation: BLEU and chrF too; text: perplexity)")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--size", type=int, help="held-out examples (default 1000; translation: "
                   "the whole split)")
    p.add_argument("--data", help="--task tsv: read the pairs from this file instead; "
                   "text: this text file; translation: this corpus instead (--dataset's "
                   "forms)")
    add_model_options(p)
    add_decoding_options(p, evaluate=True)
    p.set_defaults(run=run_evaluate)


def run_evaluate(args) -> int:
    from annotated_transformer.train import evaluate

    if args.size is not None and args.size < 1:
        raise UsageError("--size must be at least 1")
    state, task, model = load_checkpoint(args)
    if task.name == "translation":  # BLEU and chrF on a split
        return run_evaluate_translation(args, state, task, model)
    device = next(model.parameters()).device
    src, tgt = (x.to(device) for x in task.held_out_set(args.size or 1000))
    loss_fn = model.parts.LabelSmoothingLoss(0.0, ignore_index=task.vocab.pad_id)
    loss, exact = evaluate(model, src, tgt, loss_fn, decode=task.judged_by_decoding)
    result = {"task": state["task"]["task"], "step": state["step"], "exact_match": exact,
              "loss": loss, "num_examples": int(src.size(0))}
    if exact is None:  # a language model of text: its perplexity instead
        del result["exact_match"]
        result["perplexity"] = math.exp(loss)
    if args.json:
        print(json.dumps(result))
    elif exact is None:
        print(f"{result['task']} at step {result['step']}: held-out perplexity "
              f"{result['perplexity']:.3f} on {result['num_examples']} windows, loss "
              f"{loss:.4f} per character")
    else:
        print(f"{result['task']} at step {result['step']}: held-out exact match {exact:.1%} "
              f"of {result['num_examples']}, loss {loss:.4f} per token")
    return 0


# ---------------------------------------------------------------- translate

def add_translate(sub) -> None:
    p = sub.add_parser("translate", help="decode inputs with a checkpoint")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("inputs", nargs="*", help="texts to decode (default: lines of stdin)")
    p.add_argument("--beam", type=int, help="beam search with this many beams (else greedy; "
                   "translation: 4 unless given)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="decoder-only: sample at this temperature (0: greedy)")
    p.add_argument("--top-k", type=int, help="decoder-only: sample among the k likeliest")
    p.add_argument("--top-p", type=float, help="decoder-only: sample among the likeliest tokens "
                   "whose probabilities add up to p (nucleus sampling)")
    p.add_argument("--seed", type=int, default=0)
    add_model_options(p)
    add_decoding_options(p, evaluate=False)
    p.set_defaults(run=run_translate)


def run_translate(args) -> int:
    from annotated_transformer.decode import translate

    if args.beam is not None and args.beam < 1:
        raise UsageError(f"--beam must be at least 1, got {args.beam}")
    if args.temperature < 0:
        raise UsageError(f"--temperature must be at least 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    texts = args.inputs or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise UsageError("nothing to translate: give inputs or lines on stdin")
    state, task, model = load_checkpoint(args)
    try:
        model.check_decoding(args.beam, args.temperature, args.top_k, args.top_p)
    except UnsupportedDecoding as error:
        raise UsageError(str(error)) from None
    if task.name == "translation":  # the paper's decoding, detokenized output
        return run_translate_translation(args, state, task, model, texts)
    for line in translate(model, task, texts, args.beam, args.temperature, args.top_k,
                          args.seed, top_p=args.top_p):
        print(line)
    return 0


# ---------------------------------------------------------------- attention

def add_attention(sub) -> None:
    p = sub.add_parser("attention", help="draw every layer's and head's attention for an input")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("input", help="one input text")
    p.add_argument("--out", required=True, type=Path, help="the image to write (.png, .svg)")
    add_model_options(p)
    p.set_defaults(run=run_attention)


def run_attention(args) -> int:
    from annotated_transformer.inspect_attention import attention_maps, plot_attention_maps
    from annotated_transformer.metrics import Decoding

    _, task, model = load_checkpoint(args)
    max_len = None  # the task's longest target
    if task.name == "translation":  # no corpus needed: as translate decodes, input + 50
        max_len = min(len(task.source_ids(args.input)) + Decoding.extra_len + 1,
                      model.config.max_len)
    maps = attention_maps(model, task, args.input, max_len)
    figure = plot_attention_maps(maps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(args.out, dpi=110, bbox_inches="tight")
    except ValueError as error:  # an unknown image format
        raise UsageError(f"--out {args.out}: {error}") from None
    print(f"output {maps.output!r}; wrote {args.out}")
    return 0


# ---------------------------------------------------------------- export

def add_export(sub) -> None:
    p = sub.add_parser("export", help="a smaller copy of a checkpoint, for evaluation only")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path, help="the file to write")
    p.add_argument("--weights", choices=checkpoint.WEIGHTS, default="float32",
                   help="how the weights are stored: float32 (default), float16 (half the "
                   "size) or int8 (a quarter: each row scaled to [-127, 127]); the model "
                   "computes in float32 either way")
    p.set_defaults(run=run_export)


def run_export(args) -> int:
    checkpoint.export(checkpoint.load(args.checkpoint), args.out, args.weights)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


# ---------------------------------------------------------------- average

def add_average(sub) -> None:
    p = sub.add_parser("average", help="average the weights of several checkpoints",
                       description="One checkpoint whose weights are the mean of several "
                       "of one model (section 6.1 of the paper).")
    p.add_argument("checkpoints", nargs="+", type=Path,
                   help="checkpoint files; with --last, one run folder")
    p.add_argument("--last", type=int, metavar="N",
                   help="the N newest checkpoint-STEP.pt of the run folder given "
                   "(train --keep-last N writes them)")
    p.add_argument("--out", required=True, type=Path, help="the file to write")
    p.set_defaults(run=run_average)


def run_average(args) -> int:
    from annotated_transformer.average import last_checkpoints, write_average

    paths = args.checkpoints
    if args.last is not None:
        if len(paths) != 1 or not paths[0].is_dir():
            raise UsageError("--last N takes one run folder (holding checkpoint-STEP.pt "
                             "files)")
        paths = last_checkpoints(paths[0], args.last)
    state = write_average(paths, args.out)
    print(f"averaged {len(paths)} checkpoints (steps "
          f"{', '.join(map(str, state['averaged']['steps']))}); wrote {args.out}")
    return 0

