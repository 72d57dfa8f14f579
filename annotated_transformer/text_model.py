"""Chapter 8 on real text: a decoder-only model of a text's characters, scored and heard.

The task is :class:`~annotated_transformer.data.text.TextTask` (Tiny Shakespeare in the
course); the model is :class:`~annotated_transformer.model.DecoderOnlyTransformer`, built
from parts, trained like every other task (:func:`~annotated_transformer.train.train`:
the parts' ``train_step`` and loss). Here are what the chapter measures with it: the
held-out perplexity (:func:`perplexity`) beside that of count models
(:func:`count_model_perplexity`), text written from prompts (:func:`write_text`, through
:func:`~annotated_transformer.sampling.complete`, whose sampling is the parts'
``sample_next``), and how much the key/value cache saves (:func:`time_writing`). Nothing
here imports a chapter: every part is reached by name
through ``model.parts``.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import torch
import torch.nn.functional as F

from annotated_transformer.data.task import pad_rows
from annotated_transformer.data.text import TextTask
from annotated_transformer.data.vocab import PAD
from annotated_transformer.model import DecoderOnlyTransformer


@torch.no_grad()
def cross_entropy(model: DecoderOnlyTransformer, task: TextTask, windows: int | None = None,
                  batch_size: int = 64) -> float:
    """The mean cross-entropy per character, in nats, of ``model`` on the held-out
    windows of ``task`` (the first ``windows``; ``None``: every one):

    ``H = -(1/N) sum_n log p(c_n | BOS, the characters before c_n in its window)``

    over the ``N`` held-out characters, from the logits of one teacher-forced forward pass
    per batch (torch's ``cross_entropy``, summed, then divided by ``N``)."""
    model.eval()
    src, tgt = task.held_out_set(len(task.ids) if windows is None else windows)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, src.size(0), batch_size):
        batch = model.teacher_forcing(src[start:start + batch_size].to(device),
                                      tgt[start:start + batch_size].to(device))
        logits = model(*batch.args)  # [B, C, V]
        total += float(F.cross_entropy(logits.flatten(0, 1).double(), batch.labels.flatten(),
                                       ignore_index=PAD, reduction="sum"))
        count += batch.num_tokens()
    return total / count


def perplexity(model: DecoderOnlyTransformer, task: TextTask, windows: int | None = None,
               batch_size: int = 64) -> float:
    """The held-out perplexity ``exp(H)`` of ``model`` on ``task``, ``H`` the
    :func:`cross_entropy` per character.

    ``exp(H)`` is the number of equally likely characters that would leave the model as
    unsure as it is: a model that gives every one of ``V`` tokens ``1/V`` has
    ``H = log V`` and perplexity ``V``; one that is always sure and right has 1."""
    return math.exp(cross_entropy(model, task, windows, batch_size))


def count_model_perplexity(task: TextTask, order: int, smoothing: float = 1.0) -> float:
    """The held-out perplexity of a count model of ``order`` characters (1: unigram,
    2: bigram, 3: trigram), on the characters that :func:`perplexity` scores: every
    held-out window's, each predicted from the (at most ``order - 1``) characters before
    it *in its window*, as the Transformer reads them.

    ``p(c | h) = (count(h c) + a) / (count(h) + a V)``, counts over the training part's
    text, ``a`` = ``smoothing`` (1: Laplace's add-one), ``V`` the text's characters;
    ``count()`` of no characters is the training part's length. A baseline that needs no
    training: a model that does not beat it has learned less than counting does."""
    if order < 1:
        raise ValueError(f"order must be at least 1 (a unigram), got {order}")
    if smoothing <= 0:
        raise ValueError(f"smoothing must be positive (a character never seen after h "
                         f"would have probability 0), got {smoothing}")
    text = task.part(held_out=False).tolist()
    counts: Counter[tuple[int, ...]] = Counter({(): len(text)})
    for n in range(1, order + 1):
        counts.update(zip(*(text[i:] for i in range(n)), strict=False))
    size = len(set(text))
    total, scored = 0.0, 0
    for window in task.held_out_set(len(task.ids))[1].tolist():
        for i, c in enumerate(window):
            h = tuple(window[max(0, i - order + 1):i])
            total -= math.log((counts[h + (c,)] + smoothing) / (counts[h] + smoothing * size))
            scored += 1
    return math.exp(total / scored)


def write_text(model: DecoderOnlyTransformer, task: TextTask, prompts: list[str],
               length: int, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int = 0, cache: bool = True) -> list[str]:
    """Each prompt followed by ``length`` characters that ``model`` writes (greedy at
    temperature 0, else sampled with a generator seeded with ``seed``), all prompts in
    one batch (of different lengths: :func:`~annotated_transformer.sampling.complete`).
    ``VocabularyError`` for a character the text does not have."""
    model.eval()
    device = next(model.parameters()).device
    src = pad_rows([task.source_ids(p) for p in prompts]).to(device)  # BOS + prompt
    generator = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(src, length, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=generator, cache=cache)
    return [p + task.vocab.decode(row) for p, row in zip(prompts, out.tolist(), strict=True)]


def time_writing(model: DecoderOnlyTransformer, task: TextTask, prompt: str, length: int,
                 cache: bool, repeats: int = 3) -> float:
    """The best of ``repeats`` wall times, in seconds, of writing ``length`` characters
    greedily after ``prompt``, with or without the key/value cache."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        write_text(model, task, [prompt], length, cache=cache)
        best = min(best, time.perf_counter() - start)
    return best
