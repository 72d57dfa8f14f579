"""Graded tests of chapter 4: padding, causal and target masks.

Besides the masks' values, shapes, dtype and device, the leakage tests run the
reference attention with the learner's masks: no output may depend on a later
token, and padded keys must receive zero weight.
"""

from __future__ import annotations

import pytest
import torch

from annotated_transformer.parts import active_parts

from checks import assert_tensor

CHAPTER = 4
EXERCISES = {
    "4.1": "padding_mask: True at real tokens, [B, 1, 1, L]",
    "4.2": "causal_mask: True on and below the diagonal",
    "4.3": "target_mask: padding and causality together",
}
BATCHES = [  # (tokens, pad_id)
    (torch.tensor([[5, 6, 7, 0, 0], [3, 4, 0, 0, 0]]), 0),
    (torch.tensor([[1, 2, 3, 9], [9, 9, 4, 5], [6, 9, 7, 9]]), 9),
    (torch.tensor([[2, 2, 2]]), 1),
]


def allowed_by_loop(tokens, pad_id, causal):
    """mask[b, 0, i, j] = (token j is not pad) and (j <= i if causal), entry by entry."""
    batch, length = tokens.shape
    mask = torch.zeros(batch, 1, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            for j in range(length):
                mask[b, 0, i, j] = bool(tokens[b, j] != pad_id) and (j <= i or not causal)
    return mask


def check_mask(mask, name, shape, expected):
    assert_tensor(mask, name, shape=shape, dtype=torch.bool)
    wrong = (mask != expected).nonzero()
    assert not len(wrong), (
        f"{name} is {bool(mask[tuple(wrong[0])])} at index {tuple(wrong[0].tolist())} where it "
        f"should be {bool(expected[tuple(wrong[0])])} (True = attention allowed)"
    )


# ---------------------------------------------------------------- 4.1 padding_mask


@pytest.mark.grade("4.1", points=3)
@pytest.mark.parametrize("tokens, pad_id", BATCHES)
def test_padding_mask(impl, tokens, pad_id):
    batch, length = tokens.shape
    expected = allowed_by_loop(tokens, pad_id, causal=False)[:, :, :1, :]
    check_mask(impl.padding_mask(tokens, pad_id), f"padding_mask(tokens, pad_id={pad_id})",
               (batch, 1, 1, length), expected)


@pytest.mark.grade("4.1", points=1)
def test_padding_mask_broadcasts_over_heads_and_queries(impl):
    tokens, pad_id = BATCHES[0]
    mask = impl.padding_mask(tokens, pad_id)
    scores = (2, 4, 3, 5)  # [B, H, Lq, Lk], with Lq != Lk
    try:
        shape = torch.broadcast_shapes(mask.shape, scores)
    except RuntimeError:
        shape = None
    assert shape == scores, (
        f"a padding mask of shape {list(mask.shape)} does not broadcast to scores "
        f"[B, H, Lq, Lk] = {list(scores)}: it should be [B, 1, 1, Lk]"
    )


@pytest.mark.grade("4.1", points=1)
def test_padding_mask_keeps_device(impl):
    mask = impl.padding_mask(torch.zeros(2, 3, dtype=torch.long, device="meta"), 0)
    assert mask.device.type == "meta", "the mask should be on the device of tokens"


@pytest.mark.grade("4.1", points=2)
def test_padded_keys_get_zero_weight(impl):
    tokens, pad_id = BATCHES[0]
    attention = active_parts().scaled_dot_product_attention
    q, k, v = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    _, weights = attention(q, k, v, mask=impl.padding_mask(tokens, pad_id))
    padded = (tokens == pad_id)[:, None, None, :].expand_as(weights)
    assert torch.all(weights[padded] == 0), (
        "with your padding mask, attention still gives weight to padded keys")
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5, dtype=torch.float64)), (
        "every query should still attend to the real tokens (rows sum to 1)")


# ---------------------------------------------------------------- 4.2 causal_mask


@pytest.mark.grade("4.2", points=3)
@pytest.mark.parametrize("size", [1, 2, 5, 9])
def test_causal_mask(impl, size):
    expected = allowed_by_loop(torch.ones(1, size, dtype=torch.long), 0, causal=True)[0, 0]
    check_mask(impl.causal_mask(size), f"causal_mask({size})", (size, size), expected)


@pytest.mark.grade("4.2", points=1)
def test_causal_mask_on_the_given_device(impl):
    mask = impl.causal_mask(4, device="meta")
    assert mask.device.type == "meta", "causal_mask(size, device) should create the mask there"


@pytest.mark.grade("4.2", points=2)
def test_no_output_depends_on_a_later_position(impl):
    torch.manual_seed(1)
    attention = active_parts().scaled_dot_product_attention
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    changed = x.clone()
    changed[:, 4:] = torch.randn(1, 2, 8, dtype=torch.float64)  # change positions 4 and 5
    mask = impl.causal_mask(6)
    before, _ = attention(x, x, x, mask=mask)
    after, _ = attention(changed, changed, changed, mask=mask)
    leaked = (before[:, :4] - after[:, :4]).abs().amax(-1)
    assert torch.allclose(before[:, :4], after[:, :4]), (
        f"changing positions 4 and 5 changed the outputs at positions "
        f"{(leaked[0] > 1e-12).nonzero().flatten().tolist()}: the future leaks through the mask"
    )


# ---------------------------------------------------------------- 4.3 target_mask


@pytest.mark.grade("4.3", points=3)
@pytest.mark.parametrize("tokens, pad_id", BATCHES)
def test_target_mask(impl, tokens, pad_id):
    batch, length = tokens.shape
    check_mask(impl.target_mask(tokens, pad_id), f"target_mask(tokens, pad_id={pad_id})",
               (batch, 1, length, length), allowed_by_loop(tokens, pad_id, causal=True))


@pytest.mark.grade("4.3", points=1)
def test_target_mask_keeps_device(impl):
    mask = impl.target_mask(torch.ones(2, 3, dtype=torch.long, device="meta"), 0)
    assert mask.device.type == "meta", "the mask should be on the device of tokens"


@pytest.mark.grade("4.3", points=2)
def test_decoder_self_attention_does_not_leak(impl):
    torch.manual_seed(2)
    parts = active_parts()
    embed = parts.TokenEmbedding(20, 16).double()
    attention = parts.MultiHeadAttention(16, 4).double()
    tokens = torch.tensor([[1, 5, 6, 7, 8, 0, 0], [1, 9, 4, 3, 2, 11, 12]])
    changed = tokens.clone()
    changed[1, 4:] = torch.tensor([13, 14, 15])  # the future of row 1 from position 4 on
    outputs = []
    for batch in (tokens, changed):
        x = embed(batch) + parts.positional_encoding(7, 16).double()
        outputs.append(attention(x, x, x, mask=impl.target_mask(batch, 0)))
    assert torch.allclose(outputs[0][1, :4], outputs[1][1, :4]), (
        "changing tokens 4..6 of a sequence changed its outputs at positions 0..3: "
        "the decoder sees the future")
    weights = attention.attention_weights  # of the last call: [B, H, L, L]
    assert torch.all(weights[0, :, :, 5:] == 0), "padded keys (positions 5, 6) got attention"
    assert not torch.isnan(outputs[1]).any(), "NaN in the attention output"
