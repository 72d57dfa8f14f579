"""The command line for models: train, evaluate, translate, attention, export, average.

    python -m annotated_transformer train --task dates --out runs/dates
    python -m annotated_transformer evaluate --checkpoint runs/dates/checkpoint.pt --json
    python -m annotated_transformer translate --checkpoint runs/dates/checkpoint.pt "3 May 98"
    python -m annotated_transformer attention --checkpoint runs/dates/checkpoint.pt "3 mai 1998" \
        --out maps.png
    python -m annotated_transformer export --checkpoint runs/dates/checkpoint.pt --out dates.pt
    python -m annotated_transformer train --task translation --dataset bentrevett/multi30k \
        --source-lang de --target-lang en --out runs/multi30k --keep-last 5
    python -m annotated_transformer average --last 5 runs/multi30k --out runs/multi30k/avg.pt
    python -m annotated_transformer evaluate --checkpoint runs/multi30k/avg.pt   # BLEU, chrF

Bad arguments and bad data end with a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import warnings
from pathlib import Path

import torch

from annotated_transformer import checkpoint, distributed
from annotated_transformer.data import TASKS, DataError, Task, VocabularyError, make_task
from annotated_transformer.model import Model, UnsupportedDecoding, model_for
from annotated_transformer.parts import RELEASE_NOTE, Parts, has_reference


class UsageError(Exception):
    """Bad arguments or data: reported in one line, exit status 2."""


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA, then Apple's MPS, then the CPU; otherwise the device named."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device (auto, cpu, cuda, cuda:1, mps)"
                         ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this PyTorch has no CUDA device (see the README "
                         "for a CUDA build)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS is not available here")
    return device


def parse_parts(source: str | None) -> Parts | None:
    if source is None:
        return None
    try:
        Parts(source).module(1)
    except (ValueError, LookupError, ModuleNotFoundError) as error:
        raise UsageError(f"--parts: {error}") from None
    return Parts(source)


def add_model_options(p) -> None:
    """``--parts`` and ``--device`` of the commands that rebuild a checkpoint's model."""
    p.add_argument("--parts", help="rebuild the model from other parts (default: its own)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")


def load_checkpoint(args) -> tuple[dict, Task, Model]:
    device = pick_device(args.device)
    state = checkpoint.load(args.checkpoint)
    task = checkpoint.build_task(state, getattr(args, "data", None))
    return state, task, checkpoint.build_model(state, parse_parts(args.parts), device)


# ---------------------------------------------------------------- train

def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model on a task; write checkpoint and metrics",
                       description="Train a Transformer with the task's default recipe.")
    p.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)}")
    p.add_argument("--data", help="the source<TAB>target file of --task tsv")
    p.add_argument("--level", choices=("char", "word"), default="char",
                   help="--task tsv: a vocabulary of characters (default) or of words")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for checkpoint.pt and metrics.jsonl")
    p.add_argument("--parts", default="solutions",
                   help="solutions (default; yours in a student release), exercises "
                   "(yours), fast (fused kernels) or a "
                   "folder of chNN_*.py")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: autocast to bfloat16 (for GPUs that support it)")
    p.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile the model's layers, once for every batch shape "
                   "(BACKEND: inductor, the default, generates kernels; aot_eager only "
                   "traces, a quick check that the model compiles)")
    p.add_argument("--steps", type=int, help="training steps (default: the recipe's)")
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
    p.set_defaults(run=run_train)


def run_train(args) -> int:
    from annotated_transformer.recipes import RECIPES
    from annotated_transformer.train import Runtime, train

    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}: choose one of {', '.join(TASKS)}")
    options = {"path": args.data, "level": args.level} if args.task == "tsv" else {}
    options = translation_task_options(args) or options  # --task translation's corpus
    if args.data and args.task != "tsv":
        raise UsageError(f"--data is for --task tsv; {args.task!r} generates its own data")
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
    parts = parse_parts(args.parts)
    recipe = RECIPES[args.task] if args.model is None else RECIPES[args.task].with_model(
        args.model)  # --model small|base|big
    if args.lr_factor is not None and not args.lr_factor > 0:
        raise UsageError(f"--lr-factor must be positive, got {args.lr_factor}")
    config = recipe.train_config(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                                 eval_every=args.eval_every, eval_size=args.eval_size,
                                 decay=args.decay, lr_factor=args.lr_factor,
                                 max_tokens=args.max_tokens, warmup_steps=args.warmup)
    if args.resume and not (args.out / checkpoint.FILE_NAME).is_file():
        raise UsageError(f"--resume: {args.out / checkpoint.FILE_NAME} does not exist")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = distributed.setup(pick_device(args.device))
    try:
        torch.manual_seed(config.seed)
        model_config = recipe.model_config(task)
        model = model_for(task)(model_config, parts=parts).to(device)
        runtime = Runtime(precision=args.precision, compile=args.compile is not None,
                          compile_backend=args.compile or "inductor",
                          out=args.out, resume=args.resume, keep_last=args.keep_last or 0,
                          progress=not args.no_progress and sys.stderr.isatty())
        main = distributed.rank() == 0
        if main:
            print(f"task {args.task}, {sum(p.numel() for p in model.parameters()):,} parameters, "
                  f"parts from {parts.describe()}, {device}, {args.precision}"
                  f"{f', compiled ({args.compile})' if args.compile else ''}, "
                  f"{torch.get_num_threads()} "
                  f"thread(s), {distributed.world_size()} "
                  f"process(es), {config.steps} steps of "
                  + (f"{config.batch_size} examples" if config.max_tokens is None else
                     f"at most {config.max_tokens} tokens"))
        log = functools.partial(print, flush=True) if main else None
        history = train(model, task, config, log=log, runtime=runtime)
        if main:
            rate = history.tokens / max(history.seconds, 1e-9)
            print(f"held-out exact match {history.exact_match[-1]:.1%} "
                  f"({history.eval_examples} examples), {history.seconds:.1f} s, "
                  f"{rate:,.0f} target tokens/s\nwrote {args.out / checkpoint.FILE_NAME} and "
                  f"{args.out / 'metrics.jsonl'}")
    finally:
        distributed.teardown()
    return 0


# ---------------------------------------------------------------- evaluate

def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="held-out exact match and loss of a checkpoint "
                       "(translation: BLEU and chrF too)")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--size", type=int, help="held-out examples (default 1000; translation: "
                   "the whole split)")
    p.add_argument("--data", help="--task tsv: read the pairs from this file instead; "
                   "translation: this corpus instead (--dataset's forms)")
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
    loss, exact = evaluate(model, src, tgt, loss_fn)
    result = {"task": state["task"]["task"], "step": state["step"], "exact_match": exact,
              "loss": loss, "num_examples": int(src.size(0))}
    if args.json:
        print(json.dumps(result))
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
    texts = args.inputs or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise UsageError("nothing to translate: give inputs or lines on stdin")
    _, task, model = load_checkpoint(args)
    try:
        model.check_decoding(args.beam, args.temperature, args.top_k)
    except UnsupportedDecoding as error:
        raise UsageError(str(error)) from None
    if task.name == "translation":  # the paper's decoding, detokenized output
        return run_translate_translation(args, task, model, texts)
    for line in translate(model, task, texts, args.beam, args.temperature, args.top_k,
                          args.seed):
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

    _, task, model = load_checkpoint(args)
    maps = attention_maps(model, task, args.input)
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
    p.set_defaults(run=run_export)


def run_export(args) -> int:
    checkpoint.export(checkpoint.load(args.checkpoint), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


# ---------------------------------------------------------------- translation

def add_translation_options(p) -> None:
    """``train``'s options for ``--task translation``, ``--model`` and ``--keep-last``."""
    from annotated_transformer.recipes import MODEL_SIZES

    p.add_argument("--dataset", metavar="NAME_OR_PATH",
                   help="--task translation: a Hugging Face hub dataset (bentrevett/multi30k, "
                   "wmt/wmt14), a .jsonl or .tsv file, or a folder of train/validation/test files")
    p.add_argument("--dataset-config", metavar="NAME",
                   help="--task translation: the hub dataset's config (wmt/wmt14: de-en)")
    p.add_argument("--source-lang", metavar="LANG",
                   help="--task translation: the source language's column (default de)")
    p.add_argument("--target-lang", metavar="LANG",
                   help="--task translation: the target language's column (default en)")
    p.add_argument("--vocab-size", type=int, metavar="N",
                   help="--task translation: tokens of the shared BPE vocabulary (default "
                   "8000; the paper's WMT English-German: 37000)")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="--task translation: leave out training pairs longer than N tokens "
                   "(default 256)")
    p.add_argument("--model", choices=tuple(MODEL_SIZES),
                   help="the model's size: small (2 layers of 64), or the paper's base or "
                   "big (Table 3, with label smoothing 0.1) (default: the recipe's; "
                   "translation: base)")
    p.add_argument("--warmup", type=int, metavar="STEPS",
                   help="steps of the learning rate's warmup (default: the recipe's)")
    p.add_argument("--keep-last", type=int, metavar="N",
                   help="also keep the last N checkpoints as checkpoint-STEP.pt, for "
                   "`average`")


def translation_task_options(args) -> dict:
    """``make_task``'s options for ``--task translation`` from ``args`` (``{}`` for another
    task, after checking that no translation option was given to it)."""
    given = {name: getattr(args, name) for name in
             ("dataset", "dataset_config", "source_lang", "target_lang", "vocab_size",
              "max_length") if getattr(args, name) is not None}
    for name in ("keep_last", "warmup"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.task != "translation":
        if given:
            raise UsageError(f"--{next(iter(given)).replace('_', '-')} is for --task "
                             f"translation")
        return {}
    if args.data:
        raise UsageError("--task translation reads its corpus from --dataset, not --data")
    for name in ("vocab_size", "max_length"):
        if given.get(name) is not None and given[name] < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    return {"dataset": None, **given}


def reuse_saved_vocabulary(args, task) -> None:
    """On ``--resume`` of a translation run, take the vocabulary saved in its checkpoint
    instead of training the tokenizer again."""
    saved = args.out / checkpoint.FILE_NAME
    if task.name == "translation" and args.resume and saved.is_file():
        object.__setattr__(task, "vocab", checkpoint.build_task(checkpoint.load(saved)).vocab)


def add_decoding_options(p, evaluate: bool) -> None:
    """The translation task's decoding: beam, length penalty, maximum output length."""
    if evaluate:
        p.add_argument("--split", default="test",
                       help="translation: the split to score (default test)")
        p.add_argument("--beam", type=int,
                       help="translation: beam size (default 4, the paper's; 1 is greedy)")
        p.add_argument("--greedy", action="store_true", help="translation: --beam 1")
    p.add_argument("--alpha", type=float, default=0.6,
                   help="translation: the beam's length penalty exponent (default 0.6)")
    p.add_argument("--extra-len", type=int, default=50,
                   help="translation: an output's tokens at most its input's plus this "
                   "(default 50)")


def decoding_of(args):
    """The :class:`~annotated_transformer.metrics.Decoding` that ``args`` ask for."""
    from annotated_transformer.metrics import Decoding

    beam = 1 if getattr(args, "greedy", False) else (args.beam if args.beam is not None else 4)
    try:
        return Decoding(beam_size=beam, alpha=args.alpha, extra_len=args.extra_len)
    except ValueError as error:
        raise UsageError(str(error)) from None


def run_evaluate_translation(args, state: dict, task, model) -> int:
    """``evaluate`` of a translation checkpoint: BLEU and chrF (``sacrebleu``, with their
    signatures), exact match and loss on ``--split``."""
    from annotated_transformer.metrics import evaluate_split

    result = evaluate_split(model, task, args.split, args.size, decoding_of(args))
    result = {"task": "translation", "step": state["step"],
              **{k: v for k, v in result.items() if k != "hypotheses"}}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"translation {task.source_lang}-{task.target_lang} at step {result['step']}, "
              f"{result['split']} split ({result['num_examples']} sentences, beam "
              f"{result['beam_size']}):\n"
              f"BLEU {result['bleu']:.2f}  {result['bleu_signature']}\n"
              f"chrF {result['chrf']:.2f}  {result['chrf_signature']}\n"
              f"exact match {result['exact_match']:.1%}, loss {result['loss']:.4f} per token")
    return 0


def run_translate_translation(args, task, model, texts: list[str]) -> int:
    """``translate`` with a translation checkpoint: detokenized text, one line each."""
    from annotated_transformer.metrics import translate_texts

    if args.temperature or args.top_k:
        raise UsageError("--temperature and --top-k are for decoder-only checkpoints")
    for line in translate_texts(model, task, texts, decoding_of(args)):
        print(line)
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


# ---------------------------------------------------------------- entry

def build_parser(prog: str = "python -m annotated_transformer") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_train, add_evaluate, add_translate, add_attention, add_export,
                add_average):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            # A student release, where the reference was asked for: a line of its own.
            warnings.showwarning = functools.partial(release_note, warnings.showwarning)
            return args.run(args)
    except (UsageError, DataError, VocabularyError, checkpoint.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except NotImplementedError as error:  # a stub of the parts the model is built from
        print(f"error: {unfinished(error)}", file=sys.stderr)
        return 1


def release_note(show, message, category, filename, lineno, file=None, line=None) -> None:
    """Print the release's note (the reference replaced by exercises/) as ``note: ...``."""
    if str(message) == RELEASE_NOTE:
        print(f"note: {RELEASE_NOTE}", file=sys.stderr)
    else:
        show(message, category, filename, lineno, file, line)


def unfinished(error: NotImplementedError) -> str:
    """What to do when the model needs an exercise that is still a stub."""
    match = re.match(r"Exercise (\d+\.\d+)", str(error))
    check = f" --exercise {match[1]}" if match else ""
    other = ", or train with other --parts" if has_reference() else ""
    return (f"{error}: the model is built from parts that include this stub (the first one "
            f"met while building it). Write it in exercises/ (`python -m "
            f"annotated_transformer.grade{check}` checks it; without --exercise it lists "
            f"every unfinished one){other}")
