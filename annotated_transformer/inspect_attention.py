"""Attention maps of a trained model for one input: what each head of each layer looks at.

The model decodes the input greedily; then one teacher-forced pass over the input and the
output reads the weights every ``MultiHeadAttention`` keeps after its forward
(``attention_weights [B, H, Lq, Lk]``, Exercise 3.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from annotated_transformer.data.task import Task, pad_rows
from annotated_transformer.data.vocab import EOS, SPECIALS
from annotated_transformer.model import Model
from annotated_transformer.plots import heatmap

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
    return [SHORT.get(task.vocab.tokens[i], task.vocab.tokens[i]) if i < len(SPECIALS)
            else task.vocab.tokens[i].replace(" ", "␣") for i in ids]


@torch.no_grad()
def attention_maps(model: Model, task: Task, text: str, max_len: int | None = None
                   ) -> AttentionMaps:
    """Decode ``text`` greedily (at most ``max_len`` tokens, default the task's longest
    target; a translation checkpoint's task without its corpus needs it given) and
    collect every head's attention (see the module docstring)."""
    device = next(model.parameters()).device
    model.eval()
    src = pad_rows([task.source_ids(text)]).to(device)
    output = model.generate(src, max_len or task.max_target_len)[0].tolist()  # greedy
    if EOS in output:
        output = output[: output.index(EOS) + 1]
    source_ids, output_ids, weights = model.read_attention(src, torch.tensor([output],
                                                                             device=device))
    return AttentionMaps(_labels(task, source_ids), _labels(task, output_ids),
                         task.vocab.decode(output), **weights)


def plot_attention_maps(maps: AttentionMaps, kinds: tuple[str, ...] | None = None) -> Figure:
    """One heatmap per layer and head: rows are the kinds of attention, by layer."""
    kinds = kinds or tuple(k for k in ("encoder", "decoder", "cross") if getattr(maps, k))
    axes_of = {"encoder": (maps.source_tokens, maps.source_tokens, "encoder self-attention"),
               "decoder": (maps.output_tokens, maps.output_tokens, "decoder self-attention"),
               "cross": (maps.output_tokens, maps.source_tokens, "cross-attention")}
    rows = [(kind, layer) for kind in kinds for layer in range(len(getattr(maps, kind)))]
    heads = getattr(maps, kinds[0])[0].size(0)
    figure, axes = plt.subplots(len(rows), heads, squeeze=False,
                                figsize=(2.6 * heads, 2.5 * len(rows)), layout="constrained")
    for row, (kind, layer) in enumerate(rows):
        queries, keys, name = axes_of[kind]
        for head in range(heads):
            heatmap(axes[row, head], getattr(maps, kind)[layer][head],
                    f"{name}\nlayer {layer + 1}, head {head + 1}", "key", "query",
                    cmap="viridis", symmetric=False, xticklabels=keys, yticklabels=queries,
                    colorbar=False)
            axes[row, head].tick_params(labelsize=7)
            axes[row, head].title.set_fontsize(8)
    return figure
