"""The fast parts' generator-and-loss in chunks equals the generator then the loss
(float64: the value and every gradient, with label smoothing and padding ignored)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer import Parts
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.fast_parts import _projected_loss
from annotated_transformer.model import DecoderOnlyTransformer, EncoderDecoder, TransformerConfig

FAST = Parts("fast")
TOL = dict(rtol=1e-10, atol=1e-12)


def inputs(rows=300, d=16, vocab=50, pad=0, padded=0.3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, d, dtype=torch.float64, generator=generator)
    weight = torch.randn(vocab, d, dtype=torch.float64, generator=generator)
    bias = torch.randn(vocab, dtype=torch.float64, generator=generator)
    target = torch.randint(1, vocab, (rows,), generator=generator)
    target[torch.rand(rows, generator=generator) < padded] = pad
    return hidden, weight, bias, target


def value_and_grads(fn, hidden, weight, bias, target):
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    loss = fn(*leaves, target)
    (loss * 1.7).backward()  # an incoming gradient other than 1
    return loss.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [0, None])
@pytest.mark.parametrize("chunk", [7, 128, 1000])  # rows a chunk: several, a few, one
def test_projected_equals_the_generator_then_the_loss(monkeypatch, smoothing, ignore_index,
                                                      chunk):
    monkeypatch.setattr(_projected_loss, "CHUNK_ROWS", chunk)
    loss_fn = FAST.LabelSmoothingLoss(smoothing, ignore_index=ignore_index)
    data = inputs()
    fused, fused_grads = value_and_grads(loss_fn.projected, *data)

    def plain(hidden, weight, bias, target):
        return F.cross_entropy(F.linear(hidden, weight, bias), target, label_smoothing=smoothing,
                               ignore_index=-100 if ignore_index is None else ignore_index)
    expected, expected_grads = value_and_grads(plain, *data)
    assert torch.allclose(fused, expected, **TOL), (fused, expected)
    for name, got, want in zip(("hidden", "weight", "bias"), fused_grads, expected_grads,
                               strict=True):
        assert torch.allclose(got, want, **TOL), (
            f"{name}: largest difference {(got - want).abs().max():.3g}")
    if ignore_index is not None:  # an ignored row gets no gradient at all
        assert fused_grads[0][data[3] == ignore_index].abs().max() == 0


def test_every_target_ignored_gives_zero_and_no_gradient():
    loss_fn = FAST.LabelSmoothingLoss(0.1, ignore_index=0)
    hidden, weight, bias, target = inputs(rows=5)
    loss, grads = value_and_grads(loss_fn.projected, hidden, weight, bias, torch.zeros_like(target))
    assert loss == 0 and all(g.abs().max() == 0 for g in grads)


def test_without_gradients_it_gives_the_same_value():
    loss_fn = FAST.LabelSmoothingLoss(0.1, ignore_index=0)
    data = inputs()
    with torch.no_grad():
        value = loss_fn.projected(*data)
    assert torch.allclose(value, loss_fn(F.linear(*data[:3]), data[3]), **TOL)


@pytest.mark.parametrize("kind", [EncoderDecoder, DecoderOnlyTransformer])
def test_a_models_loss_uses_it_with_the_same_result(kind):
    """``Model.loss`` on the fast parts (generator inside the loss) gives the loss and the
    gradients of the forward pass then the loss, with tied embeddings."""
    task = CopyTask()
    torch.manual_seed(0)
    model = kind(TransformerConfig.small(task.vocab_size, num_layers=1, dropout=0.0),
                 parts=FAST).double()
    src, tgt = task.sample(6, torch.Generator().manual_seed(0))
    batch = model.teacher_forcing(src, tgt)
    loss_fn = FAST.LabelSmoothingLoss(0.1, ignore_index=0)
    fused = model.loss(batch, loss_fn)
    fused.backward()
    fused_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(*batch.args)
    plain = loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))
    plain.backward()
    assert torch.allclose(fused, plain, **TOL)
    for name, parameter in model.named_parameters():
        assert torch.allclose(fused_grads[name], parameter.grad, **TOL), name
