"""Attention maps of a trained model for one input: what each head of each layer looks at.

The model decodes the input greedily; then one teacher-forced pass over the input and the
output reads the weights every ``MultiHeadAttention`` keeps after its forward
(``attention_weights [B, H, Lq, Lk]``, Exercise 3.3). ``head_statistics`` measures what
each head looks at over many sentences, so that a head's pattern is named from a test set,
not from one map.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from annotated_transformer.data.subword import SubwordVocabulary
from annotated_transformer.data.task import Task, pad_rows
from annotated_transformer.data.tsv import DataError
from annotated_transformer.data.vocab import EOS, SPECIALS
from annotated_transformer.model import Model
from annotated_transformer.plots import heatmap
from annotated_transformer.sampling import context_window

SHORT = {"<pad>": "·", "<bos>": "^", "<eos>": "$"}


@dataclass
class AttentionMaps:
    """Weights per layer, each ``[H, queries, keys]``, and the tokens on both axes.

    Encoder-decoder: ``encoder`` (source over source), ``decoder`` (output over output)
    and ``cross`` (output over source). Decoder-only: ``decoder`` only, over the prompt
    followed by the completion."""

    source_tokens: list[str]
    output_tokens: list[str]
    output: str
    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


def _labels(task: Task, ids: list[int]) -> list[str]:
    """Each token as a label: specials by one character; a subword that continues a word
    marked ``##`` (as in BERT's vocabulary), one that starts a word (or punctuation) as it
    is, a space alone as ``_``; in a vocabulary of characters a space shown as ``␣``."""
    subwords = isinstance(task.vocab, SubwordVocabulary)
    labels = []
    for position, i in enumerate(ids):
        token = task.vocab.tokens[i]
        if i < len(SPECIALS):
            labels.append(SHORT.get(token, token))
        elif not subwords:
            labels.append(token.replace(" ", "␣"))
        elif (token.startswith(" ") or not token[:1].isalnum() or position == 0
              or ids[position - 1] < len(SPECIALS)):  # a word's start, or punctuation
            labels.append(token.strip() or "_")  # a space alone
        else:
            labels.append(f"##{token}")
    return labels


@torch.no_grad()
def attention_maps(model: Model, task: Task, text: str, max_len: int | None = None
                   ) -> AttentionMaps:
    """Decode ``text`` greedily (at most ``max_len`` tokens, default the task's longest
    target; a translation checkpoint's task without its corpus needs it given; no more
    than the model's positions hold, since the maps are of one forward pass) and collect
    every head's attention (see the module docstring)."""
    device = next(model.parameters()).device
    model.eval()
    src = pad_rows([task.source_ids(text)]).to(device)
    wanted, window = max_len or task.max_target_len, context_window(model)
    while window is not None and wanted > 1 and \
            model.longest_sequence(src.size(1), wanted) > window:
        wanted -= 1  # a decoder-only model reads the input and the output as one sequence
    if window is not None and model.longest_sequence(src.size(1), wanted) > window:
        raise DataError(f"the input is {src.size(1)} tokens: too long for the model's "
                         f"{window} positions")
    output = model.generate(src, wanted)[0].tolist()  # greedy
    if EOS in output:
        output = output[: output.index(EOS) + 1]
    source_ids, output_ids, weights = model.read_attention(src, torch.tensor([output],
                                                                             device=device))
    return AttentionMaps(_labels(task, source_ids), _labels(task, output_ids),
                         task.vocab.decode(output), **weights)


def plot_attention_maps(maps: AttentionMaps, attentions: tuple[str, ...] | None = None,
                        layers: Sequence[int] | None = None,
                        columns: int | None = None, heads: Sequence[int] | None = None
                        ) -> Figure:
    """One heatmap per layer and head of each of the ``attentions`` (``encoder``,
    ``decoder``, ``cross``; by default all the model has), of the ``layers`` given
    (default all; -1 is the last), and ``heads`` given (default all), ``columns`` to a row
    (default one per head). Each panel grows with its tokens, so that every label is
    readable; the keys' labels are written vertically; each has its colour bar (the weight,
    from 0 to at most 1)."""
    attentions = attentions or tuple(a for a in ("encoder", "decoder", "cross")
                                     if getattr(maps, a))
    source, output = ("source", maps.source_tokens), ("decoder input", maps.output_tokens)
    axes_of = {"encoder": (source, source, "encoder self-attention"),
               "decoder": (output, output, "decoder self-attention"),
               "cross": (output, source, "cross-attention")}
    count_heads = getattr(maps, attentions[0])[0].size(0)
    chosen_heads = range(count_heads) if heads is None else sorted({h % count_heads for h in heads})
    panels = []
    for attention in attentions:
        count = len(getattr(maps, attention))
        chosen = range(count) if layers is None else sorted({layer % count for layer in layers})
        panels += [(attention, layer, head) for layer in chosen for head in chosen_heads]
    columns = min(columns or len(chosen_heads), len(panels))
    rows = -(-len(panels) // columns)
    longest_keys = max(len(axes_of[attention][1][1]) for attention in attentions)
    longest_queries = max(len(axes_of[attention][0][1]) for attention in attentions)
    width, height = max(3.0, 0.16 * longest_keys + 1.8), max(2.5, 0.16 * longest_queries + 1.4)
    figure, axes = plt.subplots(rows, columns, squeeze=False, figsize=(width * columns,
                                                                       height * rows),
                                layout="constrained")
    for ax, (attention, layer, head) in zip(axes.flat, panels, strict=False):  # spare: hidden
        (query_name, queries), (key_name, keys), name = axes_of[attention]
        heatmap(ax, getattr(maps, attention)[layer][head],
                f"{name}\nlayer {layer + 1}, head {head + 1}",
                f"key: {key_name}", f"query: {query_name}", cmap="viridis", symmetric=False,
                xticklabels=keys, yticklabels=queries)
        ax.xaxis.label.set_fontsize(8)
        ax.yaxis.label.set_fontsize(8)
        ax.tick_params(labelsize=7)
        ax.tick_params(axis="x", labelrotation=90)
        ax.title.set_fontsize(8)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    return figure


def map_statistics(weights: Tensor, self_attention: bool) -> dict[str, Tensor]:
    """What each head of one map ``weights [H, Lq, Lk]`` (rows summing to 1) looks at:
    per statistic a tensor ``[H]``, each a mean over the queries (rows).

    - ``previous``: the weight on key ``t - 1`` (queries ``t >= 1``); self-attention only;
    - ``same``: the weight on key ``t``, the query's own position; self-attention only;
    - ``first``: the weight on key 0 (``^`` in the decoder);
    - ``last``: the weight on the last key (``$`` of the source; in the causal decoder
      only the last query sees it);
    - ``diagonal``: the weight within one key of the proportional diagonal, key
      ``round(t (Lk - 1) / (Lq - 1))``: an alignment that keeps the word order;
    - ``monotone``: the share of consecutive queries whose likeliest key does not move
      backwards (1 for a map that reads its keys in order).
    """
    if weights.dim() != 3 or min(weights.shape) == 0:
        raise ValueError(f"weights must be [heads, queries, keys], got {tuple(weights.shape)}")
    weights = weights.float()
    heads, queries, keys = weights.shape
    if self_attention and queries != keys:
        raise ValueError(f"self-attention has as many queries as keys, got {queries} queries "
                         f"and {keys} keys")
    rows = torch.arange(queries)
    stats = {}
    if self_attention:
        stats["previous"] = (weights[:, rows[1:], rows[1:] - 1].mean(-1) if queries > 1
                             else torch.zeros(heads))
        stats["same"] = weights[:, rows, rows].mean(-1)
    stats["first"] = weights[:, :, 0].mean(-1)
    stats["last"] = weights[:, :, -1].mean(-1)
    centre = torch.round(rows * (keys - 1) / max(queries - 1, 1)).long()
    near = (torch.arange(keys)[None, :] - centre[:, None]).abs() <= 1  # [Lq, Lk]
    stats["diagonal"] = (weights * near).sum(-1).mean(-1)
    steps = weights.argmax(-1).diff(dim=-1)  # [H, Lq - 1]
    stats["monotone"] = ((steps >= 0).float().mean(-1) if queries > 1 else torch.ones(heads))
    return stats


@torch.no_grad()
def head_statistics(model: Model, task: Task, pairs: Sequence[tuple[str, str]]
                    ) -> dict[str, dict[str, Tensor]]:
    """``map_statistics`` of every head, averaged over ``pairs`` of (source, reference):
    per attention (``encoder``, ``decoder``, ``cross``), per statistic, a tensor ``[layers, H]``.
    The decoder reads the reference (teacher forcing, one forward pass a pair, as in
    training), not its own output, so that no decoding is needed."""
    if not pairs:
        raise ValueError("head_statistics needs at least one (source, reference) pair")
    device = next(model.parameters()).device
    model.eval()
    totals: dict[str, dict[str, Tensor]] = {}
    for source, reference in pairs:
        src = torch.tensor([task.source_ids(source)], device=device)
        tgt = torch.tensor([task.target_ids(reference)], device=device)
        _, _, weights = model.read_attention(src, tgt)
        for attention, layers in weights.items():
            per_layer = [map_statistics(layer, self_attention=attention != "cross")
                         for layer in layers]
            for name in per_layer[0]:
                value = torch.stack([stats[name] for stats in per_layer])  # [layers, H]
                sums = totals.setdefault(attention, {})
                sums[name] = sums.get(name, 0) + value
    return {attention: {name: value / len(pairs) for name, value in stats.items()}
            for attention, stats in totals.items()}
