"""How well a translation model translates: decoding a split the paper's way, then
corpus-level BLEU and chrF of the detokenized translations, computed by ``sacrebleu``.

Decoding (section 6.1): "beam search with a beam size of 4 and length penalty alpha =
0.6 ... We set the maximum output length during inference to input length + 50, but
terminate early when possible." Sentences are decoded in chunks of similar length
(sorted by their number of source tokens), so that each chunk's limit, its longest
source plus ``extra_len``, is close to every sentence's own. Beam search is Chapter 7's
``beam_search`` and ``beam_size=1`` Chapter 6's ``greedy_decode``, both from the
model's parts.

Scores: BLEU (Papineni et al. 2002) is the geometric mean of the 1- to 4-gram
precisions of the hypotheses against the references, over the whole corpus, times a
brevity penalty; chrF (Popović 2015) is an F-score of character n-grams. ``sacrebleu``
computes both on detokenized text with its own standard tokenization and reports each
with its *signature*, which names every setting (tokenizer, smoothing, casing, version)
so that two scores can be compared (Post 2018).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from annotated_transformer.data.optional import require
from annotated_transformer.data.task import Pair, Task, pad_rows
from annotated_transformer.data.vocab import PAD


@dataclass(frozen=True)
class Decoding:
    """How to decode: the paper's beam of 4, ``alpha`` = 0.6, inputs + 50 tokens."""

    beam_size: int = 4
    alpha: float = 0.6  # the length penalty's exponent
    extra_len: int = 50  # an output has at most its input's tokens + extra_len
    batch_size: int = 64  # sentences decoded together
    cache: bool = True  # keep each layer's keys and values between steps (the same tokens)

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"the beam size must be at least 1, got {self.beam_size}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be at least 0, got {self.alpha}")
        if self.extra_len < 1:
            raise ValueError(f"the extra output length must be at least 1, got "
                             f"{self.extra_len}")


def length_penalty_of(state: dict) -> float:
    """The length penalty a checkpoint's run records for its model (the recipe's, chosen on
    the validation split), or the paper's 0.6 for a run that records none."""
    return state.get("train_config", {}).get("length_penalty", Decoding.alpha)


@torch.no_grad()
def translate_texts(model: nn.Module, task: Task, texts: list[str],
                    decoding: Decoding = Decoding()) -> list[str]:
    """The detokenized translations of ``texts``, in their order."""
    model.eval()
    device = next(model.parameters()).device
    sources = [task.source_ids(text) for text in texts]
    order = sorted(range(len(texts)), key=lambda i: len(sources[i]))
    outputs: list[str] = [""] * len(texts)
    for start in range(0, len(order), decoding.batch_size):
        chunk = order[start:start + decoding.batch_size]
        src = pad_rows([sources[i] for i in chunk]).to(device)  # [B, Ls]
        # BOS, then at most (source tokens + extra_len) tokens, within the model's positions
        max_len = min(src.size(1) + decoding.extra_len + 1, model.config.max_len)
        beam = None if decoding.beam_size == 1 else decoding.beam_size
        ids = model.generate(src, max_len, beam, length_penalty=decoding.alpha,
                             cache=decoding.cache)
        for i, row in zip(chunk, ids.tolist(), strict=True):
            outputs[i] = task.vocab.decode(row)
    return outputs


@torch.no_grad()
def teacher_forced_loss(model: nn.Module, task: Task, pairs: list[Pair],
                        batch_size: int = 64) -> float:
    """The mean cross-entropy per target token (no label smoothing) of ``pairs``."""
    from annotated_transformer.train import loss_and_tokens

    model.eval()
    device = next(model.parameters()).device
    loss_fn = model.parts.LabelSmoothingLoss(0.0, ignore_index=PAD)
    total, tokens = 0.0, 0
    ordered = sorted(pairs, key=lambda p: len(p[0]))
    for start in range(0, len(ordered), batch_size):
        src, tgt = task.encode_pairs(ordered[start:start + batch_size])
        loss, n = loss_and_tokens(model, model, src.to(device), tgt.to(device), loss_fn)
        total += loss.item() * n
        tokens += n
    return total / max(tokens, 1)


def evaluate_split(model: nn.Module, task, split: str = "test", size: int | None = None,
                   decoding: Decoding = Decoding()) -> dict:
    """BLEU, chrF (with ``sacrebleu``'s signatures), exact match and loss on the first
    ``size`` pairs (default: all) of the translation task's ``split``; also the
    hypotheses, for whoever wants to look."""
    pairs = task.split(split)[:size]
    hypotheses = translate_texts(model, task, [s for s, _ in pairs], decoding)
    references = [t for _, t in pairs]
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(pairs)
    return {"split": split, "num_examples": len(pairs), **corpus_scores(hypotheses, references),
            "exact_match": exact, "loss": teacher_forced_loss(model, task, pairs),
            "beam_size": decoding.beam_size, "alpha": decoding.alpha,
            "extra_len": decoding.extra_len, "hypotheses": hypotheses}


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """``{"bleu", "bleu_signature", "chrf", "chrf_signature"}`` of ``hypotheses`` against
    one reference each (scores in percent, as ``sacrebleu`` gives them), and the BLEU of
    the lower-cased text (``bleu_lowercase``, ``bleu_lowercase_signature``), the form
    tutorials often report."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    sacrebleu = require("sacrebleu")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": bleu_score.score, "bleu_signature": str(bleu.get_signature()),
            "chrf": chrf_score.score, "chrf_signature": str(chrf.get_signature()),
            "bleu_lowercase": lowercase.corpus_score(hypotheses, [references]).score,
            "bleu_lowercase_signature": str(lowercase.get_signature())}
