"""Graded tests of chapter 6: the schedule, label smoothing, teacher forcing, greedy decoding,
and the capstone: the learner's parts, assembled by the package, learn the copy task.

References: the formula of section 5.3, ``F.cross_entropy(..., label_smoothing=...)``, and a
row-by-row greedy decode written here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts

from checks import assert_close, assert_tensor

CHAPTER = 6
EXERCISES = {
    "6.1": "noam_lr: warmup, then 1/sqrt(step)",
    "6.2": "LabelSmoothingLoss: equals F.cross_entropy(label_smoothing=...)",
    "6.3": "make_batch: the shifted target and both masks",
    "6.4": "greedy_decode: batched, stops at EOS, pads after it",
    "6.5": "Capstone: your parts, assembled, learn the copy task",
}
# Graded by a whole-course test rather than one solution region (see test_grading.py).
INTEGRATION = {"6.5"}
FORBIDDEN = {"6.2": ("label_smoothing=",)}
f64 = torch.float64


# ---------------------------------------------------------------- 6.1 noam_lr


@pytest.mark.grade("6.1", points=3)
@pytest.mark.parametrize("d_model, warmup, factor", [(512, 4000, 1.0), (64, 100, 2.0),
                                                     (128, 10, 0.5)])
def test_noam_lr_formula(impl, d_model, warmup, factor):
    for step in (1, 2, 5, warmup // 2, warmup, warmup + 1, 3 * warmup, 100_000):
        expected = factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        got = impl.noam_lr(step, d_model, warmup, factor)
        assert isinstance(got, float), f"noam_lr should return a Python float, got {type(got)}"
        assert math.isclose(got, expected, rel_tol=1e-9), (
            f"noam_lr(step={step}, d_model={d_model}, warmup_steps={warmup}, factor={factor}) "
            f"is {got:.6g}, expected {expected:.6g}: factor * d_model^-0.5 * "
            f"min(step^-0.5, step * warmup^-1.5)")


@pytest.mark.grade("6.1", points=1)
def test_noam_lr_step_zero_is_step_one(impl):
    assert math.isclose(impl.noam_lr(0, 64, 100), impl.noam_lr(1, 64, 100)), (
        "step 0 should count as step 1 (0^-0.5 is infinite, and a rate of 0 wastes a step)")


@pytest.mark.grade("6.1", points=1)
def test_noam_lr_peaks_at_warmup(impl):
    rates = [impl.noam_lr(step, 64, 50) for step in range(1, 200)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 50, (
        "the rate should rise until step warmup_steps, then fall")


# ---------------------------------------------------------------- 6.2 label smoothing


@pytest.mark.grade("6.2", points=3)
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [None, 0, -100])
def test_matches_cross_entropy(impl, smoothing, ignore_index):
    logits = torch.randn(12, 7, dtype=f64) * 2
    target = torch.randint(0, 7, (12,))
    if ignore_index is not None:
        target[[1, 4, 5]] = ignore_index
    loss_fn = impl.LabelSmoothingLoss(smoothing, ignore_index=ignore_index)
    expected = F.cross_entropy(logits, target, label_smoothing=smoothing,
                               ignore_index=-100 if ignore_index is None else ignore_index)
    got = assert_tensor(loss_fn(logits, target), "the loss", shape=())
    assert_close(got, expected, f"LabelSmoothingLoss(smoothing={smoothing}, ignore_index="
                 f"{ignore_index})", hint="(1 - s) * (-log p[target]) + s * mean over all V "
                 "classes of -log p, averaged over the targets that are not ignored.")


@pytest.mark.grade("6.2", points=1)
def test_gradient_matches_cross_entropy(impl):
    logits = torch.randn(10, 5, dtype=f64, requires_grad=True)
    target = torch.randint(1, 5, (10,))
    target[2] = 0
    (grad,) = torch.autograd.grad(impl.LabelSmoothingLoss(0.2, ignore_index=0)(logits, target),
                                  logits)
    (expected,) = torch.autograd.grad(F.cross_entropy(logits, target, label_smoothing=0.2,
                                                      ignore_index=0), logits)
    assert_close(grad, expected, "the gradient of the loss")


@pytest.mark.grade("6.2", points=1)
def test_every_target_ignored_gives_zero(impl):
    logits = torch.randn(4, 6, dtype=f64, requires_grad=True)
    loss = impl.LabelSmoothingLoss(0.1, ignore_index=0)(logits, torch.zeros(4, dtype=torch.long))
    assert torch.isfinite(loss) and loss.item() == 0.0, (
        f"with every target ignored the loss should be 0 (not NaN), got {loss.item()}")
    loss.backward()
    assert torch.all(logits.grad == 0), "ignored targets should give no gradient"


@pytest.mark.grade("6.2", points=1)
def test_large_logits_stay_finite(impl):
    logits = torch.tensor([[1000.0, -1000.0, 0.0], [0.0, 500.0, -500.0]], dtype=f64)
    target = torch.tensor([0, 1])
    got = impl.LabelSmoothingLoss(0.1)(logits, target)
    assert_close(got, F.cross_entropy(logits, target, label_smoothing=0.1), "the loss for "
                 "logits of +-1000", hint="Use log_softmax, which never computes log(0).")


# ---------------------------------------------------------------- 6.3 make_batch


@pytest.mark.grade("6.3", points=3)
def test_make_batch(impl):
    src = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    batch = impl.make_batch(src, tgt, pad_id=0)
    for name in ("src", "src_mask", "tgt_input", "tgt_labels", "tgt_mask", "num_tokens"):
        assert hasattr(batch, name), f"the batch should have a field {name}"
    assert torch.equal(batch.src, src), "batch.src should be src unchanged"
    assert torch.equal(batch.tgt_input, tgt[:, :-1]), (
        f"tgt_input should be tgt[:, :-1] (starts with BOS, drops the last token), got "
        f"{batch.tgt_input.tolist()}")
    assert torch.equal(batch.tgt_labels, tgt[:, 1:]), (
        f"tgt_labels should be tgt[:, 1:] (the next token at every position), got "
        f"{batch.tgt_labels.tolist()}")
    assert batch.num_tokens == 6 and isinstance(batch.num_tokens, int), (
        f"num_tokens should be the int number of labels that are not padding (6), got "
        f"{batch.num_tokens!r}")


@pytest.mark.grade("6.3", points=2)
def test_make_batch_masks(impl):
    src = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    batch = impl.make_batch(src, tgt, pad_id=0)
    expected_src = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)[:, None, None]
    assert_tensor(batch.src_mask, "src_mask", shape=(2, 1, 1, 4), dtype=torch.bool)
    assert torch.equal(batch.src_mask, expected_src), "src_mask should be True at real tokens"
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    real = (tgt[:, :-1] != 0)[:, None, None, :]
    assert_tensor(batch.tgt_mask, "tgt_mask", shape=(2, 1, 4, 4), dtype=torch.bool)
    assert torch.equal(batch.tgt_mask, real & causal), (
        "tgt_mask should be the target mask of tgt_input: causal and padding together")


# ---------------------------------------------------------------- 6.4 greedy_decode


class ScriptedModel(nn.Module):
    """A fake model whose row ``b`` emits ``script[b][t]`` at step ``t``; it checks its inputs."""

    def __init__(self, script, vocab_size=9):
        super().__init__()
        self.script, self.vocab_size = script, vocab_size
        self.encode_calls = self.decode_calls = 0

    def encode(self, src, src_mask):
        self.encode_calls += 1
        return torch.arange(src.size(0), dtype=torch.float64).view(-1, 1, 1)  # row ids

    def decode(self, memory, src_mask, tgt, tgt_mask):
        self.decode_calls += 1
        length = tgt.size(1)
        assert tgt_mask is not None, "greedy_decode passed tgt_mask=None; pass a causal mask"
        mask = torch.as_tensor(tgt_mask).to("cpu").bool()
        full = mask.expand(tgt.size(0), 1, length, length) if mask.dim() <= 4 else mask
        assert torch.equal(full[0, 0], torch.ones(length, length, dtype=torch.bool).tril()), (
            "tgt_mask should be the causal mask (True on and below the diagonal)")
        rows = memory.view(-1, 1).expand(-1, length)
        steps = torch.arange(length, dtype=torch.float64).expand_as(rows)
        return torch.stack([rows, steps], dim=-1)  # [B, L, 2]

    def generator(self, hidden):
        row, step = hidden[..., 0].long(), hidden[..., 1].long()
        tokens = torch.tensor([self.script[r][min(s, len(self.script[r]) - 1)]
                               for r, s in zip(row.flatten().tolist(), step.flatten().tolist(),
                                               strict=True)])
        return F.one_hot(tokens, self.vocab_size).double().view(*row.shape, -1) * 5


@pytest.mark.grade("6.4", points=3)
def test_greedy_decode_stops_and_pads(impl):
    bos, eos, pad = 1, 2, 0
    script = [[5, 6, 2, 7, 7, 7], [4, 2, 8, 8, 8, 8], [3, 3, 3, 2, 5, 5]]
    model = ScriptedModel(script)
    src = torch.zeros(3, 4, dtype=torch.long)
    out = impl.greedy_decode(model, src, None, 10, bos, eos, pad)
    expected = torch.tensor([[1, 5, 6, 2, 0], [1, 4, 2, 0, 0], [1, 3, 3, 3, 2]])
    assert_tensor(out, "greedy_decode(...)", dtype=torch.long)
    assert out.tolist() == expected.tolist(), (
        f"expected {expected.tolist()} (BOS first, pad_id after each row's EOS, stop once "
        f"every row has produced EOS), got {out.tolist()}")
    assert model.encode_calls == 1, f"encode the source once, not {model.encode_calls} times"


@pytest.mark.grade("6.4", points=1)
def test_greedy_decode_respects_max_len(impl):
    model = ScriptedModel([[5] * 20, [6] * 20])
    out = impl.greedy_decode(model, torch.zeros(2, 3, dtype=torch.long), None, 6, 1, 2, 0)
    assert tuple(out.shape) == (2, 6), (
        f"without EOS the output should stop at max_len=6 columns (BOS counted); got shape "
        f"{list(out.shape)}")
    assert out[:, 0].tolist() == [1, 1], "the first column should be BOS"


def decode_row_by_row(model, src, src_mask, max_len, bos, eos):
    """The reference: one sequence at a time, the whole prefix re-run at each step."""
    rows = []
    for b in range(src.size(0)):
        memory = model.encode(src[b:b + 1], src_mask[b:b + 1])
        ys = [bos]
        while len(ys) < max_len and ys[-1] != eos:
            tgt = torch.tensor([ys])
            mask = torch.ones(len(ys), len(ys), dtype=torch.bool).tril()
            hidden = model.decode(memory, src_mask[b:b + 1], tgt, mask)
            ys.append(int(model.generator(hidden[0, -1]).argmax()))
        rows.append(ys)
    return rows


@pytest.mark.grade("6.4", points=2)
def test_greedy_decode_matches_row_by_row_decoding(impl):
    torch.manual_seed(3)
    model = EncoderDecoder(TransformerConfig.small(11, dropout=0.0), parts=Parts.reference())
    model = model.double().eval()
    with torch.no_grad():  # sharpen the generator so that EOS (2) comes up in some rows
        model.generator.bias[2] += 1.5
    src = torch.randint(3, 11, (6, 5))
    src[3:, 4] = 0
    src_mask = (src != 0)[:, None, None, :]
    out = impl.greedy_decode(model, src, src_mask, 8, 1, 2, 0)
    expected = decode_row_by_row(model, src, src_mask, 8, 1, 2)
    width = max(len(r) for r in expected)
    expected = [r + [0] * (width - len(r)) for r in expected]
    assert out.tolist() == expected, (
        f"batched greedy decoding differs from decoding each row alone: got {out.tolist()}, "
        f"expected {expected}")


# ---------------------------------------------------------------- 6.5 capstone


@pytest.mark.grade("6.5", points=5)
@pytest.mark.timeout(400)
def test_capstone_your_parts_learn_to_copy(impl, impl_source):
    from annotated_transformer.train import TrainConfig, train_copy_task

    parts = Parts(impl_source)
    config = TrainConfig(steps=CAPSTONE_STEPS, eval_every=CAPSTONE_STEPS, seed=0)
    try:
        _, history = train_copy_task(parts=parts, config=config, log=None)
    except NotImplementedError as error:
        raise NotImplementedError(
            f"the capstone builds and trains the whole model from your parts of chapters 1 to "
            f"6, and met a stub while building it: {error}") from error
    accuracy = history.exact_match[-1]
    assert accuracy >= CAPSTONE_THRESHOLD, (
        f"after {CAPSTONE_STEPS} steps your model copies {accuracy:.0%} of the held-out "
        f"sequences exactly; at least {CAPSTONE_THRESHOLD:.0%} is expected. If every other "
        f"exercise passes, check that nothing is computed in the wrong dtype or detached.")


CAPSTONE_STEPS = 400
CAPSTONE_THRESHOLD = 0.9
