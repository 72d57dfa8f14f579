"""The per-head statistics that name an attention head's pattern, and the maps' figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from annotated_transformer import Parts
from annotated_transformer.data import make_task
from annotated_transformer.inspect_attention import (
    attention_maps,
    head_statistics,
    map_statistics,
    plot_attention_maps,
)
from annotated_transformer.model import EncoderDecoder, TransformerConfig


def previous_token_map(length: int) -> torch.Tensor:
    """One head, ``[1, L, L]``: query 0 on itself, every later query on the token before."""
    weights = torch.zeros(1, length, length)
    weights[0, 0, 0] = 1.0
    weights[0, torch.arange(1, length), torch.arange(length - 1)] = 1.0
    return weights


def test_a_previous_token_head_scores_1_on_previous_and_0_on_same():
    stats = map_statistics(previous_token_map(6), self_attention=True)
    assert stats["previous"].item() == pytest.approx(1.0)
    assert stats["same"].item() == pytest.approx(1 / 6)  # query 0 alone looks at itself
    assert stats["monotone"].item() == pytest.approx(1.0)


def test_identity_uniform_and_last_key_heads_in_one_map():
    length = 5
    weights = torch.stack([torch.eye(length), torch.full((length, length), 1 / length),
                           torch.zeros(length, length).index_fill_(1, torch.tensor([4]), 1.0)])
    stats = map_statistics(weights, self_attention=True)
    assert stats["same"].tolist() == pytest.approx([1.0, 0.2, 0.2])
    assert stats["previous"].tolist() == pytest.approx([0.0, 0.2, 0.0])
    assert stats["last"].tolist() == pytest.approx([0.2, 0.2, 1.0])
    assert stats["first"].tolist() == pytest.approx([0.2, 0.2, 0.0])


def test_cross_attention_along_the_stretched_diagonal_is_diagonal_and_monotone():
    queries, keys = 4, 7  # key round(t * 6 / 3) = 0, 2, 4, 6
    aligned = torch.zeros(1, queries, keys)
    aligned[0, torch.arange(queries), torch.arange(queries) * 2] = 1.0
    backwards = aligned.flip(-1)  # key 6, 4, 2, 0: against the order
    stats = map_statistics(torch.cat([aligned, backwards]), self_attention=False)
    assert "previous" not in stats and "same" not in stats
    assert stats["diagonal"].tolist() == pytest.approx([1.0, 0.0])
    assert stats["monotone"].tolist() == pytest.approx([1.0, 0.0])


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"\[heads, queries, keys\]"):
        map_statistics(torch.ones(3, 3), self_attention=True)
    with pytest.raises(ValueError, match="as many queries as keys"):
        map_statistics(torch.ones(1, 3, 4) / 4, self_attention=True)


def test_head_statistics_of_a_tiny_model_are_means_in_range_with_one_value_per_head():
    torch.manual_seed(0)
    task = make_task("dates")
    config = TransformerConfig(len(task.vocab), len(task.vocab), num_layers=2, d_model=16,
                               d_ff=32, num_heads=2, dropout=0.0)
    model = EncoderDecoder(config, Parts.reference())
    pairs = task.pairs(5, torch.Generator().manual_seed(0))
    stats = head_statistics(model, task, pairs)
    assert set(stats) == {"encoder", "decoder", "cross"}
    assert set(stats["encoder"]) == {"previous", "same", "first", "last", "diagonal", "monotone"}
    for attention in stats.values():
        for value in attention.values():
            assert value.shape == (2, 2)
            assert ((value >= 0) & (value <= 1 + 1e-6)).all()
    with pytest.raises(ValueError, match="at least one"):
        head_statistics(model, task, [])
    figure = plot_attention_maps(attention_maps(model, task, pairs[0][0]),
                                 attentions=("encoder",), layers=(-1,), heads=(1,))
    assert len([ax for ax in figure.axes if ax.get_visible()]) == 2  # one panel, its colour bar
