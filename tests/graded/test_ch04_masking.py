"""Graded tests of chapter 4: padding, causal and target masks.

Besides the masks' values, shapes, dtype and device, the leakage tests run attention
(PyTorch's ``F.scaled_dot_product_attention``) with the learner's masks: no output may
depend on a later token, and padded keys must receive zero weight.

The functions above the tests (``padding_mask_of``, ...) are *probes*: they run in the
grading worker, with ``impl`` the chapter module under test, and return plain data.
Everything else runs in the grader, which never imports the code under test.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer.course.grading.outcomes import LearnerRaised

from checks import assert_tensor
from mistakes import DEVICE_CLASH, first_match, named, run_naming

CHAPTER = 4
EXERCISES = {
    "4.1": "padding_mask: True at real tokens, [B, 1, 1, L]",
    "4.2": "causal_mask: True on and below the diagonal",
    "4.3": "target_mask: padding and causality together",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"4.3": ("4.1", "4.2")}
# What each exercise may not use: PyTorch's own causal mask (it computes with the same ops
# an honest answer uses, so only its name can be refused).
FORBIDDEN = {"4.2": ("generate_square_subsequent_mask",)}
PADDED = [  # (tokens, pad_id)
    (torch.tensor([[5, 6, 7, 0, 0], [3, 4, 0, 0, 0]]), 0),
    (torch.tensor([[1, 2, 3, 9], [9, 9, 4, 5], [6, 9, 7, 9]]), 9),
]
# No padding at all: a mask that allows everything is right here, so this case pays only
# with the padded ones (a test not marked values=True).
UNPADDED = (torch.tensor([[2, 2, 2]]), 1)
BATCHES = [*PADDED, UNPADDED]
f64 = torch.float64


# ---------------------------------------------------------------- probes (run in the worker)


def padding_mask_of(impl, tokens, pad_id):
    return impl.padding_mask(tokens, pad_id)


def causal_mask_of(impl, size):
    return impl.causal_mask(size)


def target_mask_of(impl, tokens, pad_id):
    return impl.target_mask(tokens, pad_id)


BOOLEAN_ONLY = re.compile(r"\"(bitwise|logical)_\w+\" not implemented for '(\w+)'")


def run_mask(learner, probe, **inputs):
    """``learner.run(probe, ...)``; PyTorch refusing ``&``, ``|`` or ``~`` on a float tensor
    is explained: masks are ``torch.bool`` (an error of the code under test all the same)."""
    try:
        return learner.run(probe, **inputs)
    except LearnerRaised as error:
        found = BOOLEAN_ONLY.search(error.message)
        if found is None:
            raise
        raise LearnerRaised(error.types, f"{error.message}: "
                            f"{named('4.3/float-mask', dtype=found[2])}", error.where) from None


def padding_mask_device(impl):
    """The "meta" device stands in for a GPU: a mask made on the CPU would clash with it."""
    return impl.padding_mask(torch.zeros(2, 3, dtype=torch.long, device="meta"), 0).device.type


def causal_mask_device(impl):
    return impl.causal_mask(4, device="meta").device.type


def target_mask_device(impl):
    return impl.target_mask(torch.ones(2, 3, dtype=torch.long, device="meta"), 0).device.type


# The tokens whose masks the device tests also compute on the CPU (pad_id 0): a mask on
# another device is named a mistake of its own only when its values are right.
DEVICE_TOKENS = torch.tensor([[4, 5, 0], [6, 0, 0]])


def check_device(device, what, mistake, on_the_cpu, expected):
    """``device``, where the mask ``what`` of inputs on the "meta" device came back, is meta;
    else a message that names ``mistake`` when the same mask made on the CPU (``on_the_cpu``)
    is ``expected``."""
    right = (isinstance(on_the_cpu, torch.Tensor) and on_the_cpu.dtype == torch.bool
             and on_the_cpu.shape == expected.shape and torch.equal(on_the_cpu, expected))
    assert device == "meta", f"{what} is on {device}. " + (
        named(mistake) if right else "The mask should be on the device of the tokens.")


def allowed_by_loop(tokens, pad_id, causal):
    """mask[b, 0, i, j] = (token j is not pad) and (j <= i if causal), entry by entry."""
    batch, length = tokens.shape
    mask = torch.zeros(batch, 1, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            for j in range(length):
                mask[b, 0, i, j] = bool(tokens[b, j] != pad_id) and (j <= i or not causal)
    return mask


def check_mask(mask, name, shape, expected, mistakes=None, float_mask=None):
    """``mask`` against ``expected``; one that equals a known mistake's mask (``mistakes``:
    ``{mistake id: its mask}``) fails with that mistake's message, and one of numbers, 1 where
    ``expected`` is True and 0 elsewhere, with ``float_mask``'s (the exercise's id)."""
    right = (isinstance(mask, torch.Tensor) and mask.shape == expected.shape
             and mask.dtype == expected.dtype and torch.equal(mask, expected))
    mistake = None if right else first_match(mask, mistakes or {})
    assert mistake is None, named(mistake)
    assert_tensor(mask, name, shape=shape)
    numbers = mask.dtype.is_floating_point or mask.dtype in (torch.uint8, torch.int64)
    assert not (float_mask and numbers and torch.equal(mask, expected.to(mask.dtype))), (
        named(float_mask, dtype=mask.dtype))
    assert mask.dtype == torch.bool, (
        f"{name} should have dtype torch.bool, but it has {mask.dtype}: a mask is True where "
        f"attention is allowed, False elsewhere. A comparison (tokens != pad_id) gives one; "
        f"make new masks with dtype=torch.bool (torch.ones(n, n, dtype=torch.bool, "
        f"device=device)) and combine them with & rather than *")
    wrong = (mask != expected).nonzero()
    assert not len(wrong), (
        f"{name} is {bool(mask[tuple(wrong[0])])} at index {tuple(wrong[0].tolist())} where it "
        f"should be {bool(expected[tuple(wrong[0])])} (True = attention allowed)"
    )


def mistaken_masks(tokens, pad_id, causal):
    """``{mistake id: the mask it gives}`` for the plausible mistakes of 4.1 (``causal``
    False, tokens [B, L]), 4.2 (True, tokens [1, L]: the [L, L] masks) and 4.3 (None)."""
    batch, length = tokens.shape
    keys = (tokens != pad_id)[:, None, None, :]
    lower = torch.ones(length, length, dtype=torch.bool).tril()
    if causal is False:
        return {"4.1/inverted": ~keys, "4.1/masks-queries": keys.transpose(-1, -2),
                "4.1/every-key-allowed": torch.ones_like(keys)}
    if causal:
        return {"4.2/upper-triangle": lower.T.clone(), "4.2/true-hides": ~lower,
                "4.2/no-diagonal": lower.tril(-1),
                "4.2/diagonal-only": torch.eye(length, dtype=torch.bool)}
    if not (~keys).any():  # no padding: only the causal mistakes can be told apart
        return {"4.3/padding-only": keys.expand(batch, 1, length, length)}
    return {"4.3/causal-only": lower.expand(batch, 1, length, length),
            "4.3/padding-only": keys.expand(batch, 1, length, length),
            "4.3/or-for-and": keys | lower,
            "4.3/padding-on-queries": keys.transpose(-1, -2) & lower}


def usable_mask(mask, name, scores):
    """``mask`` checked to be a bool tensor that broadcasts to the scores' shape ``scores``."""
    assert_tensor(mask, name, dtype=torch.bool)
    try:
        shape = torch.broadcast_shapes(mask.shape, scores)
    except RuntimeError:
        shape = None
    assert shape == tuple(scores), (
        f"{name} of shape {list(mask.shape)} does not broadcast to the attention scores "
        f"{list(scores)}"
    )
    return mask


def weights_of(query, key, mask):
    """The attention weights softmax(Q K^T / sqrt(d_k)) with masked keys at 0: PyTorch's
    attention with the identity as values returns the weights themselves."""
    identity = torch.eye(key.size(-2), dtype=key.dtype).expand(*key.shape[:-1], -1)
    return F.scaled_dot_product_attention(query, key, identity, attn_mask=mask)


# ---------------------------------------------------------------- 4.1 padding_mask


@pytest.mark.grade("4.1", points=2, values=True)
@pytest.mark.parametrize("tokens, pad_id", PADDED)
def test_padding_mask(learner, tokens, pad_id):
    check_padding_mask(learner, tokens, pad_id)


@pytest.mark.grade("4.1", points=1)
def test_padding_mask_without_padding(learner):
    check_padding_mask(learner, *UNPADDED)


def check_padding_mask(learner, tokens, pad_id):
    batch, length = tokens.shape
    expected = allowed_by_loop(tokens, pad_id, causal=False)[:, :, :1, :]
    check_mask(learner.run(padding_mask_of, tokens=tokens, pad_id=pad_id),
               f"padding_mask(tokens, pad_id={pad_id})", (batch, 1, 1, length), expected,
               mistaken_masks(tokens, pad_id, causal=False), float_mask="4.1/float-mask")


@pytest.mark.grade("4.1", points=1)
def test_padding_mask_broadcasts_over_heads_and_queries(learner):
    tokens, pad_id = BATCHES[0]
    mask = assert_tensor(learner.run(padding_mask_of, tokens=tokens, pad_id=pad_id),
                         f"padding_mask(tokens, pad_id={pad_id})")
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
def test_padding_mask_keeps_device(learner):
    device = run_naming(learner, padding_mask_device, DEVICE_CLASH, "4.1/device-not-kept")
    check_device(device, "padding_mask of tokens", "4.1/device-not-kept", learner.run(
        padding_mask_of, tokens=DEVICE_TOKENS, pad_id=0), (DEVICE_TOKENS != 0)[:, None, None, :])


@pytest.mark.grade("4.1", points=2)
def test_padded_keys_get_zero_weight(learner):
    tokens, pad_id = BATCHES[0]
    q, k = (torch.randn(2, 4, 5, 8, dtype=f64) for _ in range(2))
    mask = usable_mask(learner.run(padding_mask_of, tokens=tokens, pad_id=pad_id),
                       "your padding mask", (2, 4, 5, 5))
    weights = weights_of(q, k, mask)
    padded = (tokens == pad_id)[:, None, None, :].expand_as(weights)
    assert torch.all(weights[padded] == 0), (
        "with your padding mask, attention still gives weight to padded keys")
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5, dtype=f64)), (
        "every query should still attend to the real tokens (rows sum to 1)")


# ---------------------------------------------------------------- 4.2 causal_mask


@pytest.mark.grade("4.2", points=3, values=True)
@pytest.mark.parametrize("sizes", [(2, 1), (5,), (9,)])  # size 1, which any mask passes,
def test_causal_mask(learner, sizes):                    # pays only with size 2
    for size in sizes:
        expected = allowed_by_loop(torch.ones(1, size, dtype=torch.long), 0, causal=True)[0, 0]
        mistakes = mistaken_masks(torch.ones(1, size, dtype=torch.long), 0, causal=True)
        check_mask(learner.run(causal_mask_of, size=size), f"causal_mask({size})",
                   (size, size), expected, mistakes if size > 1 else None,
                   float_mask="4.2/float-mask" if size > 1 else None)


@pytest.mark.grade("4.2", points=1)
def test_causal_mask_on_the_given_device(learner):
    device = run_naming(learner, causal_mask_device, DEVICE_CLASH, "4.2/device-not-kept")
    check_device(device, "causal_mask(4, device='meta')", "4.2/device-not-kept",
                 learner.run(causal_mask_of, size=4), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.grade("4.2", points=2)
def test_no_output_depends_on_a_later_position(learner):
    x = torch.randn(1, 6, 8, dtype=f64)
    changed = x.clone()
    changed[:, 4:] = torch.randn(1, 2, 8, dtype=f64)  # change positions 4 and 5
    mask = usable_mask(learner.run(causal_mask_of, size=6), "causal_mask(6)", (1, 6, 6))
    before = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    after = F.scaled_dot_product_attention(changed, changed, changed, attn_mask=mask)
    leaked = (before[:, :4] - after[:, :4]).abs().amax(-1)
    assert torch.allclose(before[:, :4], after[:, :4]), (
        f"changing positions 4 and 5 changed the outputs at positions "
        f"{(leaked[0] > 1e-12).nonzero().flatten().tolist()}: the future leaks through the mask"
    )


# ---------------------------------------------------------------- 4.3 target_mask


@pytest.mark.grade("4.3", points=2, values=True)
@pytest.mark.parametrize("tokens, pad_id", PADDED)
def test_target_mask(learner, tokens, pad_id):
    check_target_mask(learner, tokens, pad_id)


@pytest.mark.grade("4.3", points=1)
def test_target_mask_without_padding(learner):
    check_target_mask(learner, *UNPADDED)


def check_target_mask(learner, tokens, pad_id):
    batch, length = tokens.shape
    check_mask(run_mask(learner, target_mask_of, tokens=tokens, pad_id=pad_id),
               f"target_mask(tokens, pad_id={pad_id})", (batch, 1, length, length),
               allowed_by_loop(tokens, pad_id, causal=True),
               mistaken_masks(tokens, pad_id, causal=None), float_mask="4.3/float-mask")


@pytest.mark.grade("4.3", points=1)
def test_target_mask_keeps_device(learner):
    device = run_naming(learner, target_mask_device, DEVICE_CLASH, "4.3/device-not-kept")
    check_device(device, "target_mask of tokens", "4.3/device-not-kept", learner.run(
        target_mask_of, tokens=DEVICE_TOKENS, pad_id=0),
        (DEVICE_TOKENS != 0)[:, None, None, :] & torch.ones(3, 3, dtype=torch.bool).tril())


def self_attention(x, mask, projections, heads):
    """Multi-head self-attention of ``x [B, L, D]`` with the query, key and value
    ``projections``: the output ``[B, L, D]`` and the weights ``[B, H, L, L]``."""
    batch, length, d_model = x.shape
    q, k, v = ((x @ w).view(batch, length, heads, -1).transpose(1, 2) for w in projections)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return output.transpose(1, 2).reshape(batch, length, d_model), weights_of(q, k, mask)


@pytest.mark.grade("4.3", points=2)
def test_decoder_self_attention_does_not_leak(learner):
    embedding, positions = torch.randn(20, 16, dtype=f64), torch.randn(7, 16, dtype=f64)
    projections = torch.randn(3, 16, 16, dtype=f64) / 4
    tokens = torch.tensor([[1, 5, 6, 7, 8, 0, 0], [1, 9, 4, 3, 2, 11, 12]])
    changed = tokens.clone()
    changed[1, 4:] = torch.tensor([13, 14, 15])  # the future of row 1 from position 4 on
    outputs = []
    for batch in (tokens, changed):
        mask = usable_mask(run_mask(learner, target_mask_of, tokens=batch, pad_id=0),
                           "target_mask(tokens, 0)", (2, 4, 7, 7))
        x = embedding[batch] * 4 + positions  # token embeddings scaled by sqrt(16), positions
        output, weights = self_attention(x, mask, projections, heads=4)
        outputs.append(output)
    assert not torch.isnan(outputs[1]).any(), "NaN in the attention output"
    assert torch.allclose(outputs[0][1, :4], outputs[1][1, :4]), (
        "changing tokens 4..6 of a sequence changed its outputs at positions 0..3: "
        "the decoder sees the future")
    assert torch.all(weights[0, :, :, 5:] == 0), "padded keys (positions 5, 6) got attention"
