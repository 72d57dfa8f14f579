"""Graded tests of chapter 3: splitting into heads, merging them, multi-head attention.

Reference: ``torch.nn.MultiheadAttention(batch_first=True)`` with the same weights, in
float64. PyTorch's masks are True where attention is *blocked*: the tests translate.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from checks import assert_close, assert_tensor

CHAPTER = 3
EXERCISES = {
    "3.1": "split_heads: [B, L, D] -> [B, H, L, d_k]",
    "3.2": "merge_heads: [B, H, L, d_k] -> [B, L, D]",
    "3.3": "MultiHeadAttention: project, split, attend, merge, project",
}
FORBIDDEN = {"3.3": ("MultiheadAttention", "scaled_dot_product_attention")}
f64 = torch.float64


def reference_split(x, heads):
    """Head h of position l is x[b, l, h*d_k:(h+1)*d_k], built slice by slice."""
    d_k = x.size(-1) // heads
    return torch.stack([x[..., h * d_k:(h + 1) * d_k] for h in range(heads)], dim=1)


# ---------------------------------------------------------------- 3.1 and 3.2


@pytest.mark.grade("3.1", points=3)
@pytest.mark.parametrize("batch, length, d_model, heads", [(2, 5, 8, 2), (1, 7, 12, 3),
                                                           (3, 4, 16, 16), (2, 6, 8, 1)])
def test_split_heads(impl, batch, length, d_model, heads):
    x = torch.randn(batch, length, d_model, dtype=f64)
    out = assert_tensor(impl.split_heads(x, heads), "split_heads(x)",
                        shape=(batch, heads, length, d_model // heads))
    assert_close(out, reference_split(x, heads), "split_heads(x)",
                 hint="Head h of position l is x[b, l, h*d_k:(h+1)*d_k]. Reshape to "
                 "[B, L, H, d_k] first, then transpose L and H; a single view to "
                 "[B, H, L, d_k] mixes positions into heads.")


@pytest.mark.grade("3.1", points=1)
def test_split_heads_accepts_non_contiguous_input(impl):
    x = torch.randn(6, 2, 8, dtype=f64).transpose(0, 1)  # [B=2, L=6, D=8], not contiguous
    assert_close(impl.split_heads(x, 4), reference_split(x, 4),
                 "split_heads of a non-contiguous tensor")


@pytest.mark.grade("3.1", points=1)
def test_split_heads_explains_indivisible_width(impl):
    with pytest.raises(ValueError) as info:
        impl.split_heads(torch.randn(2, 3, 10), 4)
    assert "10" in str(info.value) and "4" in str(info.value), (
        f"the error should name d_model (10) and num_heads (4); it says {str(info.value)!r}"
    )


@pytest.mark.grade("3.2", points=3)
@pytest.mark.parametrize("batch, heads, length, d_k", [(2, 2, 5, 4), (1, 3, 7, 4), (3, 8, 2, 2)])
def test_merge_heads(impl, batch, heads, length, d_k):
    x = torch.randn(batch, length, heads * d_k, dtype=f64)
    split = reference_split(x, heads)  # a non-contiguous [B, H, L, d_k]
    assert_close(impl.merge_heads(split), x, "merge_heads(split)",
                 hint="Transpose H and L back to [B, L, H, d_k], then reshape (view fails on "
                 "non-contiguous memory) to [B, L, H*d_k], head 0's features first.")


@pytest.mark.grade("3.2", points=1)
def test_merge_inverts_split_both_ways(impl):
    x = torch.randn(2, 5, 12, dtype=f64)
    heads = reference_split(x, 3)
    assert_close(impl.merge_heads(heads), x, "merge_heads(split_heads(x))")
    assert_close(reference_split(impl.merge_heads(heads), 3), heads,
                 "split_heads(merge_heads(h))")


# ---------------------------------------------------------------- 3.3 MultiHeadAttention


def paired(impl, d_model=16, heads=4, bias=True):
    """The learner's module and PyTorch's, with the same weights, in float64."""
    ours = impl.MultiHeadAttention(d_model, heads, bias=bias).double()
    theirs = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).double()
    with torch.no_grad():
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            layer = getattr(ours, proj, None)
            assert isinstance(layer, nn.Linear), (
                f"MultiHeadAttention should hold {proj} = nn.Linear(d_model, d_model)")
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                               ours.v_proj.weight]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias,
                                                 ours.v_proj.bias]))
            theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, theirs


@pytest.mark.grade("3.3", points=3)
@pytest.mark.parametrize("lq, lk", [(5, 5), (4, 7)], ids=["self", "cross"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_pytorch(impl, lq, lk, bias):
    ours, theirs = paired(impl, bias=bias)
    query = torch.randn(3, lq, 16, dtype=f64)
    memory = query if lq == lk else torch.randn(3, lk, 16, dtype=f64)
    out = ours(query, memory, memory)
    expected, weights = theirs(query, memory, memory, average_attn_weights=False)
    assert_close(out, expected, "MultiHeadAttention(query, key, value)",
                 hint="Project, split into heads, attend, merge, then out_proj. Are query, key "
                 "and value each projected by their own layer?")
    assert_tensor(ours.attention_weights, "attention_weights", shape=(3, 4, lq, lk))
    assert_close(ours.attention_weights, weights, "attention_weights (one map per head)")


@pytest.mark.grade("3.3", points=3)
@pytest.mark.parametrize("kind", ["padding [B, 1, 1, Lk]", "causal [Lq, Lk]",
                                  "per head [B, H, Lq, Lk]"])
def test_masks_match_pytorch(impl, kind):
    ours, theirs = paired(impl)
    x = torch.randn(2, 6, 16, dtype=f64)
    if kind.startswith("padding"):
        lengths = torch.tensor([6, 4])
        mask = (torch.arange(6) < lengths[:, None]).view(2, 1, 1, 6)
        expected, _ = theirs(x, x, x, key_padding_mask=~mask.view(2, 6))
    elif kind.startswith("causal"):
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        expected, _ = theirs(x, x, x, attn_mask=~mask)
    else:
        mask = torch.rand(2, 4, 6, 6) > 0.5
        mask[..., 0] = True
        expected, _ = theirs(x, x, x, attn_mask=~mask.reshape(8, 6, 6))
    out = ours(x, x, x, mask=mask)
    assert_close(out, expected, f"MultiHeadAttention with a {kind} mask",
                 hint="Pass the mask on to the attention of 2.2 unchanged: it broadcasts over "
                 "heads and queries ([B, H, Lq, Lk]). True means allowed.")


@pytest.mark.grade("3.3", points=1)
def test_weights_rows_sum_to_one(impl):
    module = impl.MultiHeadAttention(8, 2)
    module(torch.randn(2, 5, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    weights = assert_tensor(module.attention_weights, "attention_weights", shape=(2, 2, 5, 3))
    assert not weights.requires_grad, "attention_weights should be detached (weights.detach())"
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 5)), (
        "each row of attention_weights should sum to 1 over the keys")


@pytest.mark.grade("3.3", points=1)
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_names(impl, bias):
    module = impl.MultiHeadAttention(8, 2, bias=bias)
    names = {name for name, _ in module.named_parameters()}
    expected = {f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                for w in (("weight", "bias") if bias else ("weight",))}
    assert names == expected, f"parameters should be {sorted(expected)}, got {sorted(names)}"


@pytest.mark.grade("3.3", points=1)
def test_gradients_reach_every_projection(impl):
    module = impl.MultiHeadAttention(8, 2)
    query, memory = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    module(query, memory, memory).pow(2).sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, (
            f"no gradient reached {name}: is it used in forward?")


@pytest.mark.grade("3.3", points=1)
def test_dropout_on_the_weights_only_in_training(impl):
    module = impl.MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 6, 8)
    module.eval()
    first, second = module(x, x, x), module(x, x, x)
    assert torch.equal(first, second), "in eval mode the output must not be random"
    assert torch.allclose(module.attention_weights.sum(-1), torch.ones(2, 2, 6))
    module.train()
    module(x, x, x)
    weights = module.attention_weights
    zeros = (weights == 0).double().mean().item()
    assert 0.3 < zeros < 0.7, (
        f"with dropout=0.5 in training about half the attention weights should be dropped "
        f"(zero); {zeros:.0%} are. Pass dropout to the attention, applied to the weights.")


@pytest.mark.grade("3.3", points=1)
def test_bad_shapes_are_explained(impl):
    with pytest.raises(ValueError, match="10|4"):
        impl.MultiHeadAttention(10, 4)
    module = impl.MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="mask"):
        module(x, x, x, mask=torch.ones(2, 3, 3, dtype=torch.bool))  # 3-D: ambiguous
