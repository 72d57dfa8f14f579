"""The translation task's options and outputs: its corpus and model size for ``train``,
the paper's decoding, BLEU and chrF for ``evaluate``, detokenized text for ``translate``."""

from __future__ import annotations

import json

from annotated_transformer import checkpoint
from annotated_transformer.cli.common import UsageError

# ---------------------------------------------------------------- translation

def add_translation_options(p) -> None:
    """``train``'s options for ``--task translation``, ``--model`` and ``--keep-last``."""
    from annotated_transformer.recipes import MODEL_SIZES

    p.add_argument("--dataset", metavar="NAME_OR_PATH",
                   help="--task translation: multi30k (the hub's copy), a Hugging Face hub "
                   "dataset (wmt/wmt14, ...), a .jsonl or .tsv file, a folder of "
                   "train/validation/test files, or Multi30k's raw folder (data/task1/raw: "
                   "train.de.gz, train.en.gz, val.*, test_2016_flickr.*)")
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
    p.add_argument("--model", choices=(*MODEL_SIZES, "auto"),
                   help="the model's size: small (2 layers of 64), cpu (3 layers of 256; "
                   "with --task translation, the whole CPU run: vocabulary, batches, "
                   "schedule), auto (--task translation: the CPU run on the largest model "
                   "that this machine trains long enough in its time budget, chosen from "
                   "a few timed steps), or the paper's base or big (Table 3, with label "
                   "smoothing 0.1) (default: the recipe's; translation: base)")
    p.add_argument("--warmup", type=int, metavar="STEPS",
                   help="steps of the learning rate's warmup (default: the recipe's)")
    p.add_argument("--keep-last", type=int, metavar="N",
                   help="also keep the last N checkpoints as checkpoint-STEP.pt, for "
                   "`average`")


def translation_task_options(args, vocab_size: int | None = None) -> dict:
    """``make_task``'s options for ``--task translation`` from ``args`` (``{}`` for another
    task, after checking that no translation option was given to it); ``vocab_size``: the
    recipe's, unless ``--vocab-size`` is given."""
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
    recipe = {"vocab_size": vocab_size} if vocab_size is not None else {}
    return {"dataset": None, **recipe, **given}


def reuse_saved_vocabulary(args, task) -> None:
    """On ``--resume`` of a translation run, take the vocabulary saved in its checkpoint
    instead of training the tokenizer again."""
    saved = args.out / checkpoint.FILE_NAME
    if task.name == "translation" and args.resume and saved.is_file():
        task.vocab = checkpoint.build_task(checkpoint.load(saved)).vocab  # not trained again


def add_decoding_options(p, evaluate: bool) -> None:
    """The translation task's decoding: beam, length penalty, maximum output length."""
    if evaluate:
        p.add_argument("--split", default="test",
                       help="translation: the split to score (default test)")
        p.add_argument("--beam", type=int,
                       help="translation: beam size (default 4, the paper's; 1 is greedy)")
        p.add_argument("--greedy", action="store_true", help="translation: --beam 1")
    p.add_argument("--alpha", type=float,
                   help="translation: the beam's length penalty exponent (default: the one "
                   "the checkpoint's recipe records, 1.0 for --model cpu; else the paper's "
                   "0.6)")
    p.add_argument("--no-cache", action="store_true",
                   help="translation: recompute every prefix at each step instead of keeping "
                   "each layer's keys and values (the same tokens, slower)")
    p.add_argument("--extra-len", type=int, default=50,
                   help="translation: an output's tokens at most its input's plus this "
                   "(default 50)")


def decoding_of(args, state: dict):
    """The :class:`~annotated_transformer.metrics.Decoding` that ``args`` ask for (the
    length penalty: ``--alpha``, else the one the checkpoint ``state``'s run records)."""
    from annotated_transformer.metrics import Decoding, length_penalty_of

    beam = 1 if getattr(args, "greedy", False) else (args.beam if args.beam is not None else 4)
    alpha = length_penalty_of(state) if args.alpha is None else args.alpha
    try:
        return Decoding(beam_size=beam, alpha=alpha, extra_len=args.extra_len,
                        cache=not args.no_cache)
    except ValueError as error:
        raise UsageError(str(error)) from None


def run_evaluate_translation(args, state: dict, task, model) -> int:
    """``evaluate`` of a translation checkpoint: BLEU and chrF (``sacrebleu``, with their
    signatures), exact match and loss on ``--split``."""
    from annotated_transformer.metrics import evaluate_split

    decoding = decoding_of(args, state)
    result = evaluate_split(model, task, args.split, args.size, decoding)
    result = {"task": "translation", "step": state["step"],
              **{k: v for k, v in result.items() if k != "hypotheses"}}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"translation {task.source_lang}-{task.target_lang} at step {result['step']}, "
              f"{result['split']} split ({result['num_examples']} sentences, beam "
              f"{result['beam_size']}, length penalty {decoding.alpha:g}):\n"
              f"BLEU {result['bleu']:.2f}  {result['bleu_signature']}\n"
              f"chrF {result['chrf']:.2f}  {result['chrf_signature']}\n"
              f"BLEU lower-cased {result['bleu_lowercase']:.2f}  "
              f"{result['bleu_lowercase_signature']}\n"
              f"exact match {result['exact_match']:.1%}, loss {result['loss']:.4f} per token")
    return 0


def run_translate_translation(args, state: dict, task, model, texts: list[str]) -> int:
    """``translate`` with a translation checkpoint: detokenized text, one line each."""
    from annotated_transformer.metrics import translate_texts

    for line in translate_texts(model, task, texts, decoding_of(args, state)):
        print(line)
    return 0

