"""The fast parts' training loss on the scored positions only (``fast_parts/_packed.py``)
equals the padded model's: float64, the reference parts' loss and every gradient, with
padding on both sides; and where it does not apply, the model runs as it is."""

from __future__ import annotations

import pytest
import torch

from annotated_transformer import Parts
from annotated_transformer.fast_parts import _packed
from annotated_transformer.model import EncoderDecoder, TransformerConfig

REF, FAST = Parts.reference(), Parts("fast")
TOL = dict(rtol=1e-10, atol=1e-12)
VOCAB = 23
# (source length with EOS, target length with BOS and EOS) a row; PAD after
ROWS = [(9, 8), (4, 3), (7, 8), (2, 2), (5, 6)]


def batch_tokens(rows=ROWS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (len(rows), max(s for s, _ in rows)), generator=generator)
    tgt = torch.randint(3, VOCAB, (len(rows), max(t for _, t in rows)), generator=generator)
    tgt[:, 0] = 1
    for i, (s, t) in enumerate(rows):
        src[i, s - 1], src[i, s:] = 2, 0
        tgt[i, t - 1], tgt[i, t:] = 2, 0
    return src, tgt


def twins(norm_first=True, dropout=0.0, chapters=None):
    """The reference model and a fast one (``chapters``: only those chapters fast) with
    the same weights, float64."""
    config = TransformerConfig(VOCAB, VOCAB, num_layers=2, d_model=16, d_ff=32, num_heads=4,
                               dropout=dropout, max_len=40, norm_first=norm_first)
    torch.manual_seed(0)
    ref = EncoderDecoder(config, parts=REF).double()
    parts = FAST
    if chapters is not None:
        parts = REF
        for chapter in chapters:
            parts = parts.with_chapter(chapter, "fast")
    fast = EncoderDecoder(config, parts=parts).double()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def loss_and_grads(model, src, tgt, smoothing=0.1, ignore_index=0, batch=None):
    batch = batch or model.teacher_forcing(src, tgt)
    loss = model.loss(batch, model.parts.LabelSmoothingLoss(smoothing,
                                                            ignore_index=ignore_index))
    model.zero_grad()
    (loss * 1.3).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(reference, fast):
    (ref_loss, ref_grads), (fast_loss, fast_grads) = reference, fast
    assert torch.allclose(fast_loss, ref_loss, **TOL), (fast_loss, ref_loss)
    for name, want in ref_grads.items():
        got = fast_grads[name]
        assert torch.allclose(got, want, **TOL), (
            f"gradient of {name}: largest difference {(got - want).abs().max():.3g}")


def packed(model, src, tgt, ignore_index=0, batch=None):
    batch = batch or model.teacher_forcing(src, tgt)
    return _packed.scored_features(model, batch.args, batch.labels, ignore_index)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_packed_loss_equals_the_reference_with_padding(norm_first, smoothing):
    ref, fast = twins(norm_first)
    src, tgt = batch_tokens()
    found = packed(fast, src, tgt)
    assert found is not None, "the fast model in training should compute packed"
    hidden, labels = found
    scored = sum(t - 1 for _, t in ROWS)  # the labels: a target less its BOS
    assert hidden.shape == (scored, 16) and labels.shape == (scored,) and bool((labels != 0).all())
    assert_same(loss_and_grads(ref, src, tgt, smoothing), loss_and_grads(fast, src, tgt, smoothing))


def test_without_an_ignored_label_every_position_is_scored():
    ref, fast = twins()
    src, tgt = batch_tokens()
    hidden, _ = packed(fast, src, tgt, ignore_index=None)
    assert hidden.size(0) == tgt[:, 1:].numel()
    assert_same(loss_and_grads(ref, src, tgt, ignore_index=None),
                loss_and_grads(fast, src, tgt, ignore_index=None))


def test_a_row_whose_target_is_all_padding_counts_nothing():
    rows = [(5, 2), (3, 4), (4, 1)]  # the last: BOS only, no label scored
    ref, fast = twins()
    src, tgt = batch_tokens(rows)
    assert packed(fast, src, tgt) is not None
    assert_same(loss_and_grads(ref, src, tgt), loss_and_grads(fast, src, tgt))


def where_it_does_not_apply():
    """Cases the packed path refuses: ``(name, make model and batch)``."""
    src, tgt = batch_tokens()

    def evaluating():
        ref, fast = twins()
        fast.eval()
        ref.eval()  # attention weights are kept in eval mode
        return ref, fast, None

    def reference_layers():  # the fast loss over the reference's layers
        ref, fast = twins(chapters=(6,))
        return ref, fast, None

    def empty_source():
        ref, fast = twins()
        batch = fast.teacher_forcing(src, tgt)
        src_mask = batch.args[2].clone()
        src_mask[1] = False  # a source with nothing to attend to
        args = (batch.args[0], batch.args[1], src_mask, batch.args[3])
        return ref, fast, type(batch)(args, batch.labels)

    def every_key_seen():  # a target mask without causality: scored positions read padding
        ref, fast = twins()
        batch = fast.teacher_forcing(src, tgt)
        allowed = torch.ones(tgt.size(1) - 1, tgt.size(1) - 1, dtype=torch.bool)
        args = (*batch.args[:3], allowed)
        return ref, fast, type(batch)(args, batch.labels)

    return {"eval": evaluating, "reference layers": reference_layers,
            "empty source": empty_source, "every key": every_key_seen}


@pytest.mark.parametrize("case", list(where_it_does_not_apply()))
def test_where_it_does_not_apply_the_model_runs_as_it_is(case):
    ref, fast, batch = where_it_does_not_apply()[case]()
    src, tgt = batch_tokens()
    assert packed(fast, src, tgt, batch=batch) is None
    assert_same(loss_and_grads(ref, src, tgt, batch=batch),
                loss_and_grads(fast, src, tgt, batch=batch))


def test_with_dropout_the_packed_loss_is_random_and_finite():
    _, fast = twins(dropout=0.3)
    src, tgt = batch_tokens()
    assert packed(fast, src, tgt) is not None
    torch.manual_seed(1)
    first, grads = loss_and_grads(fast, src, tgt)
    torch.manual_seed(2)
    second, _ = loss_and_grads(fast, src, tgt)
    assert first != second
    assert torch.isfinite(first) and all(torch.isfinite(g).all() for g in grads.values())
