"""Graded tests of chapter 6: the schedule, label smoothing, teacher forcing, greedy decoding,
the training step, and the capstone: the learner's parts, assembled by the package, learn
the copy task.

References: the formula of section 5.3, ``F.cross_entropy(..., label_smoothing=...)``, and a
row-by-row greedy decode (``torch_models.greedy_decode``) on a Transformer made of PyTorch's
own modules (``torch_models.TorchEncoderDecoder``).

The functions above the tests (``noam_rates``, ``smoothed_loss``, ...) are *probes*: they run
in the grading worker, with ``impl`` the chapter module under test, and return plain data.
Everything else runs in the grader, which never imports the code under test.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from annotated_transformer.batch import Batch
from annotated_transformer.course.grading.outcomes import LearnerNotImplemented

from checks import (
    LOGSUMEXP_OPS,
    NLL_OPS,
    SOFTMAX_OPS,
    assert_close,
    assert_tensor,
    check_trained_config,
    on_meta,
)
from mistakes import DEVICE_CLASH, first_match, mistake_of, named, run_naming
from torch_models import TorchEncoderDecoder, greedy_decode

CHAPTER = 6
EXERCISES = {
    "6.1": "noam_lr: warmup, then 1/sqrt(step)",
    "6.2": "LabelSmoothingLoss: equals F.cross_entropy(label_smoothing=...)",
    "6.3": "make_batch: the shifted target and both masks",
    "6.4": "greedy_decode: batched, stops at EOS, pads after it",
    "6.5": "train_step: zero, loss, backward, clip, step, schedule",
    "6.6": "Capstone: your parts, assembled, learn the copy task",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"6.3": ("4.1", "4.3"), "6.4": ("4.2",),
             "6.6": ("1.2", "1.3", "5.1", "5.4", "5.5", "5.6", "5.7", "5.8", "6.1", "6.2",
                     "6.3", "6.4", "6.5")}
# Graded by a whole-course test rather than one solution region (see test_grading.py).
INTEGRATION = {"6.6"}
# While the 6.2 loss runs: elementary ops only (an allow-list, grading/worker/allowed_ops.py), with
# log_softmax, logsumexp and PyTorch's plain cross-entropy ("+": allowed too), and never
# F.cross_entropy given a label smoothing, by keyword, by position or through a module.
FORBIDDEN_OPS = {"6.2": (*(f"+{op}" for op in (*SOFTMAX_OPS, *LOGSUMEXP_OPS, *NLL_OPS)),
                         "F.cross_entropy:label_smoothing")}
f64 = torch.float64
BATCH_FIELDS = ("src", "src_mask", "tgt_input", "tgt_labels", "tgt_mask", "num_tokens")
# A small encoder-decoder (TransformerConfig.small(11, dropout=0.0, tie_embeddings=False)) for
# decoding tests. (Untrained with tied embeddings, it only ever repeats BOS.)
SMALL = dict(src_vocab_size=11, tgt_vocab_size=11, num_layers=2, d_model=64, d_ff=256,
             num_heads=4, dropout=0.0, max_len=512, norm_first=True, tie_embeddings=False)
CAPSTONE_STEPS = 400
CAPSTONE_THRESHOLD = 0.9
CAPSTONE_EVAL_SIZE = 200


# ---------------------------------------------------------------- probes (run in the worker)


def noam_rates(impl, steps, d_model, warmup_steps, factor=None):
    """``noam_lr`` at each step: its value (as a float when it is a number) and its type."""
    args = () if factor is None else (factor,)
    rates = [impl.noam_lr(step, d_model, warmup_steps, *args) for step in steps]
    values = []
    for rate in rates:
        try:
            values.append(float(rate))
        except (TypeError, ValueError, RuntimeError):
            values.append(None)
    return {"values": values, "types": [type(r).__name__ for r in rates],
            "floats": [isinstance(r, float) for r in rates]}


def smoothed_loss(impl, logits, target, smoothing, ignore_index=None):
    return impl.LabelSmoothingLoss(smoothing, ignore_index=ignore_index)(logits, target)


def smoothed_loss_and_gradient(impl, logits, target, smoothing, ignore_index=None):
    logits = logits.clone().requires_grad_(True)
    loss = impl.LabelSmoothingLoss(smoothing, ignore_index=ignore_index)(logits, target)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        return {"loss": loss, "grad": None}
    (grad,) = torch.autograd.grad(loss, logits, allow_unused=True, materialize_grads=True)
    return {"loss": loss, "grad": grad}


def loss_on_meta(impl, logits, target, smoothing, ignore_index=None):
    """The device of LabelSmoothingLoss's loss for ``logits`` and ``target`` moved to the
    "meta" device (a stand-in for a GPU; None when its code cannot run there,
    checks.on_meta)."""
    loss = on_meta(lambda: smoothed_loss(impl, logits.to("meta"), target.to("meta"), smoothing,
                                         ignore_index))
    return loss.device.type if isinstance(loss, torch.Tensor) else None


def batch_fields(impl, src, tgt, pad_id):
    """The Batch's fields as a dict (the ones it has), and the type of ``num_tokens``."""
    batch = impl.make_batch(src, tgt, pad_id=pad_id)
    fields = {name: getattr(batch, name) for name in BATCH_FIELDS if hasattr(batch, name)}
    if "num_tokens" in fields:
        count = fields["num_tokens"]
        fields["num_tokens_type"] = type(count).__name__
        if not isinstance(count, (int, float, torch.Tensor)):
            fields["num_tokens"] = repr(count)
    return fields


def batch_on_meta(impl, src, tgt, pad_id):
    """make_batch of ``src`` and ``tgt`` moved to the "meta" device (a stand-in for a GPU; the
    values its code reads there, num_tokens's count, read as 0): the device and dtype of each
    tensor field it has; None when its code cannot run there (checks.on_meta)."""
    batch = on_meta(lambda: impl.make_batch(src.to("meta"), tgt.to("meta"), pad_id=pad_id))
    if batch is None:
        return None
    return {name: (value.device.type, str(value.dtype)) for name in BATCH_FIELDS
            if isinstance(value := getattr(batch, name, None), torch.Tensor)}


def decode_on_meta(impl, config):
    """greedy_decode with a float32 :class:`TorchEncoderDecoder` of ``config`` and a source on
    the "meta" device (a stand-in for a GPU; the values its code reads there read as 0 or
    False: no row finishes): the device and dtype of what it returns; None when its code
    cannot run there (checks.on_meta)."""
    model = TorchEncoderDecoder(SimpleNamespace(**config)).float().to("meta").eval()
    src = torch.full((2, 4), 5, device="meta")
    out = on_meta(lambda: impl.greedy_decode(model, src, (src != 0)[:, None, None, :], 5, 1,
                                             2, 0))
    if not isinstance(out, torch.Tensor):
        return None if out is None else {"type": type(out).__name__}
    return {"device": out.device.type, "dtype": str(out.dtype)}


def decode_scripted(impl, script, src, max_len, bos, eos, pad):
    """greedy_decode on a :class:`ScriptedModel`; what it produced and what the model saw."""
    model = ScriptedModel(script)
    out = impl.greedy_decode(model, src, None, max_len, bos, eos, pad)
    return {"out": out, "encode_calls": model.encode_calls, "problems": model.problems}


def decode_torch_model(impl, config, state, src, src_mask, max_len, bos, eos, pad):
    """greedy_decode on a :class:`TorchEncoderDecoder` with the test's weights."""
    model = TorchEncoderDecoder(SimpleNamespace(**config)).double()
    model.load_state_dict(state)
    return impl.greedy_decode(model.eval(), src, src_mask, max_len, bos, eos, pad)


def trained_copy_model(impl, steps):
    """Train the course's copy-task model built from the parts under test; its weights."""
    from annotated_transformer.parts import active_parts
    from annotated_transformer.train import TrainConfig, train_copy_task

    config = TrainConfig(steps=steps, eval_every=steps, seed=0)
    model, _ = train_copy_task(parts=active_parts(), config=config, log=None)
    return {"state": model.state_dict(), "config": dataclasses.asdict(model.config)}


class ScriptedModel(nn.Module):
    """A fake model whose row ``b`` emits ``script[b][t]`` at step ``t``; it checks its inputs
    and notes in ``problems`` what greedy decoding passed it wrong."""

    def __init__(self, script, vocab_size=9):
        super().__init__()
        self.script, self.vocab_size = script, vocab_size
        self.encode_calls = self.decode_calls = 0
        self.problems = []

    def encode(self, src, src_mask):
        self.encode_calls += 1
        return torch.arange(src.size(0), dtype=torch.float64).view(-1, 1, 1)  # row ids

    def decode(self, memory, src_mask, tgt, tgt_mask):
        self.decode_calls += 1
        length = tgt.size(1)
        if tgt_mask is None:
            self.problems.append("greedy_decode passed tgt_mask=None; pass a causal mask")
        else:
            mask = torch.as_tensor(tgt_mask).to("cpu").bool()
            full = mask.expand(tgt.size(0), 1, length, length) if mask.dim() <= 4 else mask
            if not torch.equal(full[0, 0], torch.ones(length, length, dtype=torch.bool).tril()):
                self.problems.append(
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


# ---------------------------------------------------------------- 6.1 noam_lr


@pytest.mark.grade("6.1", points=3, values=True)
@pytest.mark.parametrize("d_model, warmup, factor", [(512, 4000, 1.0), (64, 100, 2.0),
                                                     (128, 10, 0.5)])
def test_noam_lr_formula(learner, d_model, warmup, factor):
    steps = [1, 2, 5, warmup // 2, warmup, warmup + 1, 3 * warmup, 100_000]
    rates = learner.run(noam_rates, steps=steps, d_model=d_model, warmup_steps=warmup,
                        factor=factor)
    def noam(step, scale=d_model ** -0.5, warmup_power=-1.5):
        return factor * scale * min(step ** -0.5, step * warmup ** warmup_power)

    mistakes = {"6.1/warmup-exponent": [noam(s, warmup_power=-0.5) for s in steps],
                "6.1/d_model-to-minus-1": [noam(s, scale=1 / d_model) for s in steps]}
    got_all = rates["values"]
    for mistake, mistaken in mistakes.items():
        assert not (None not in got_all and any(not math.isclose(g, noam(s), rel_tol=1e-9)
                                                for g, s in zip(got_all, steps, strict=True))
                    and all(math.isclose(g, m, rel_tol=1e-9)
                            for g, m in zip(got_all, mistaken, strict=True))), named(mistake)
    for step, got, is_float, kind in zip(steps, rates["values"], rates["floats"],
                                         rates["types"], strict=True):
        expected = noam(step)
        # A number of another type (a tensor) is the contract's too: named when its value is
        # the rate (float32's rounding allowed).
        right = got is not None and math.isclose(got, expected, rel_tol=1e-6)
        assert is_float, named("6.1/not-a-float", kind=kind) if right else (
            f"noam_lr should return a Python float, got {kind}")
        assert math.isclose(got, expected, rel_tol=1e-9), (
            f"noam_lr(step={step}, d_model={d_model}, warmup_steps={warmup}, factor={factor}) "
            f"is {got:.6g}, expected {expected:.6g}: factor * d_model^-0.5 * "
            f"min(step^-0.5, step * warmup^-1.5)")


@pytest.mark.grade("6.1", points=1)
def test_noam_lr_step_zero_is_step_one(learner):
    at_zero, at_one = learner.run(noam_rates, steps=[0, 1], d_model=64, warmup_steps=100)["values"]
    assert at_zero is not None and at_one is not None and math.isclose(at_zero, at_one), (
        named("6.1/step-zero", at_zero=at_zero, at_one=at_one))


@pytest.mark.grade("6.1", points=1)
def test_noam_lr_peaks_at_warmup(learner):
    rates = learner.run(noam_rates, steps=list(range(1, 200)), d_model=64,
                        warmup_steps=50)["values"]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 50, (
        "the rate should rise until step warmup_steps, then fall")


# ---------------------------------------------------------------- 6.2 label smoothing


def mistaken_losses(logits, target, smoothing, ignore_index):
    """``{mistake id: the loss it gives}`` for the plausible mistakes of 6.2, in float64."""
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else (
        target != ignore_index)
    log_p = torch.log_softmax(logits.double(), -1)
    nll = -log_p.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
    others = -(log_p.sum(-1) + nll) / (logits.size(-1) - 1)  # mean -log p over the V - 1 others
    smoothed = (1 - smoothing) * nll - smoothing * log_p.mean(-1)
    found = {"6.2/smoothing-over-the-other-classes":
             (((1 - smoothing) * nll + smoothing * others) * keep).sum() / keep.sum()}
    if not keep.all():
        found["6.2/mean-includes-ignored"] = (smoothed * keep).sum() / len(target)
    return {m: v for m, v in found.items() if not torch.allclose(
        v, (smoothed * keep).sum() / keep.sum())}


@pytest.mark.grade("6.2", points=3, values=True)
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [None, 0, -100])
def test_matches_cross_entropy(learner, smoothing, ignore_index):
    logits = torch.randn(12, 7, dtype=f64) * 2
    target = torch.randint(0, 7, (12,))
    if ignore_index is not None:
        target[[1, 4, 5]] = ignore_index
    expected = F.cross_entropy(logits, target, label_smoothing=smoothing,
                               ignore_index=-100 if ignore_index is None else ignore_index)
    got = learner.run(smoothed_loss, logits=logits, target=target, smoothing=smoothing,
                      ignore_index=ignore_index)
    got = assert_tensor(got, "the loss", shape=())
    mistake = None if torch.allclose(got.double(), expected) else first_match(
        got, mistaken_losses(logits, target, smoothing, ignore_index))
    assert_close(got, expected, f"LabelSmoothingLoss(smoothing={smoothing}, ignore_index="
                 f"{ignore_index})", hint=named(mistake) if mistake else "(1 - s) * (-log "
                 "p[target]) + s * mean over all V classes of -log p, averaged over the targets "
                 "that are not ignored.")


@pytest.mark.grade("6.2", points=1, values=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_gradient_matches_cross_entropy(learner, dtype):
    logits = torch.randn(10, 5, dtype=f64, requires_grad=True)
    target = torch.randint(1, 5, (10,))
    target[2] = 0
    result = learner.run(smoothed_loss_and_gradient, logits=logits.detach().to(dtype),
                         target=target, smoothing=0.2, ignore_index=0)
    what = f"the loss of {dtype} logits"
    loss = assert_tensor(result["loss"], what, shape=())
    want = F.cross_entropy(logits.detach().to(dtype).double(), target, label_smoothing=0.2,
                           ignore_index=0)
    right = torch.allclose(loss.double(), want, atol=1e-5)
    # Right values: the dtype and the graph of the loss are the contract's too.
    assert loss.dtype == dtype or not right, named("6.2/dtype-changed", dtype=dtype,
                                                   got=loss.dtype)
    assert_tensor(loss, what, dtype=dtype)
    assert result["grad"] is not None, named("6.2/detached") if right else (
        f"{what} should be on autograd's graph (requires_grad=True), but it is not: no "
        f"gradient reaches the logits. A step left PyTorch's graph (.detach(), .item(), "
        f"NumPy, torch.tensor(...) of computed values): build the loss from torch operations "
        f"on the logits alone.")
    (expected,) = torch.autograd.grad(F.cross_entropy(logits, target, label_smoothing=0.2,
                                                      ignore_index=0), logits)
    assert_close(result["grad"], expected, f"the gradient of {what}")


@pytest.mark.grade("6.2", points=1)
def test_every_target_ignored_gives_zero(learner):
    logits = torch.randn(4, 6, dtype=f64)
    result = learner.run(smoothed_loss_and_gradient, logits=logits,
                         target=torch.zeros(4, dtype=torch.long), smoothing=0.1, ignore_index=0)
    loss = assert_tensor(result["loss"], "the loss", shape=())
    assert not torch.isnan(loss), named("6.2/nan-when-all-ignored")
    assert torch.isfinite(loss) and loss.item() == 0.0, (
        f"with every target ignored the loss should be 0 (not NaN), got {loss.item()}")
    assert result["grad"] is not None, (
        "with every target ignored the loss should still be a tensor connected to the logits, "
        "so that loss.backward() works (e.g. a sum of nothing, not torch.tensor(0.0))")
    assert torch.all(result["grad"] == 0), "ignored targets should give no gradient"


@pytest.mark.grade("6.2", points=1)
@pytest.mark.parametrize("ignore_index", [None, 0])
def test_loss_keeps_the_device(learner, ignore_index):
    device = run_naming(learner, loss_on_meta, DEVICE_CLASH, "6.2/device-not-kept",
                        logits=torch.randn(6, 5), target=torch.randint(0, 5, (6,)),
                        smoothing=0.1, ignore_index=ignore_index)
    assert device in ("meta", None), (
        f"LabelSmoothingLoss(ignore_index={ignore_index}) of logits on the meta device (a "
        f"stand-in for a GPU) gives its loss on {device}: compute it with torch operations on "
        f"the logits (a masked sum divided by the count), never rebuild it with "
        f"torch.tensor(...), which takes the CPU")


@pytest.mark.grade("6.2", points=1)
def test_large_logits_stay_finite(learner):
    logits = (torch.tensor([[1000.0, -1000.0, 0.0], [0.0, 500.0, -500.0]], dtype=f64)
              + torch.randn(2, 3, dtype=f64))
    target = torch.randint(3, (2,))
    got = learner.run(smoothed_loss, logits=logits, target=target, smoothing=0.1)
    infinite = isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all())
    assert_close(got, F.cross_entropy(logits, target, label_smoothing=0.1), "the loss for "
                 "logits of +-1000", hint=named("6.2/log-of-softmax") if infinite else
                 "Use log_softmax, which never computes log(0).")


# ---------------------------------------------------------------- 6.3 make_batch

SRC = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
TGT = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])


@pytest.mark.grade("6.3", points=3, values=True)
def test_make_batch(learner):
    src, tgt = SRC.clone(), TGT.clone()
    batch = learner.run(batch_fields, src=src, tgt=tgt, pad_id=0)
    for name in BATCH_FIELDS:
        assert name in batch, f"the batch should have a field {name}"
    assert torch.equal(batch["src"], src), "batch.src should be src unchanged"
    assert not torch.equal(batch["tgt_input"], tgt), named("6.3/target-not-shifted")
    reversed_shift = (torch.equal(batch["tgt_input"], tgt[:, 1:])
                      and torch.equal(batch["tgt_labels"], tgt[:, :-1]))
    assert not reversed_shift, named("6.3/shift-reversed")
    assert not (torch.equal(batch["tgt_labels"], tgt[:, :-1])  # and the input is right
                and torch.equal(batch["tgt_input"], tgt[:, :-1])), named("6.3/labels-include-bos")
    assert torch.equal(batch["tgt_input"], tgt[:, :-1]), (
        f"tgt_input should be tgt[:, :-1] (starts with BOS, drops the last token), got "
        f"{batch['tgt_input'].tolist()}")
    assert torch.equal(batch["tgt_labels"], tgt[:, 1:]), (
        f"tgt_labels should be tgt[:, 1:] (the next token at every position), got "
        f"{batch['tgt_labels'].tolist()}")
    assert batch["num_tokens"] != tgt[:, 1:].numel(), named("6.3/padding-counted",
                                                           counted=tgt[:, 1:].numel())
    assert batch["num_tokens"] == 6 and batch["num_tokens_type"] == "int", (
        f"num_tokens should be the int number of labels that are not padding (6), got "
        f"{batch['num_tokens']!r} of type {batch['num_tokens_type']}")


@pytest.mark.grade("6.3", points=2, values=True)
def test_make_batch_masks(learner):
    src, tgt = SRC.clone(), TGT.clone()
    batch = learner.run(batch_fields, src=src, tgt=tgt, pad_id=0)
    expected_src = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)[:, None, None]
    assert_tensor(batch.get("src_mask"), "src_mask", shape=(2, 1, 1, 4), dtype=torch.bool)
    assert torch.equal(batch["src_mask"], expected_src), "src_mask should be True at real tokens"
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    real = (tgt[:, :-1] != 0)[:, None, None, :]
    assert_tensor(batch.get("tgt_mask"), "tgt_mask", shape=(2, 1, 4, 4), dtype=torch.bool)
    assert not torch.equal(batch["tgt_mask"], real.expand(2, 1, 4, 4)), named(
        "6.3/target-mask-not-causal")
    assert torch.equal(batch["tgt_mask"], real & causal), (
        "tgt_mask should be the target mask of tgt_input: causal and padding together")


# What each tensor of a Batch is made of: token ids keep src's and tgt's dtype, masks are bool.
BATCH_DTYPES = {"src": "torch.int64", "src_mask": "torch.bool", "tgt_input": "torch.int64",
                "tgt_labels": "torch.int64", "tgt_mask": "torch.bool"}


@pytest.mark.grade("6.3", points=1)
def test_make_batch_keeps_the_device_and_the_dtypes(learner):
    found = run_naming(learner, batch_on_meta, DEVICE_CLASH, "6.3/device-not-kept",
                       src=SRC, tgt=TGT, pad_id=0)
    if found is None:  # its code reads values the meta device does not hold: not checked
        return
    for name, dtype in BATCH_DTYPES.items():
        assert name in found, f"the batch should have a tensor field {name}"
        device, got = found[name]
        assert device == "meta", (
            f"batch.{name} is on {device} for src and tgt on the meta device (a stand-in for a "
            f"GPU): every tensor of the batch should be on theirs. Slice tgt for the ids, and "
            f"make the masks with Chapter 4's padding_mask and target_mask "
            f"(active_parts()), which keep the tokens' device")
        assert got == dtype, (
            f"batch.{name} should have dtype {dtype}, but it has {got}: " + (
                "token ids keep tgt's dtype (nn.Embedding reads integer ids): slice tgt, "
                "tgt[:, :-1] and tgt[:, 1:]" if "int" in dtype else "a mask is True where "
                "attention is allowed: make it by comparison (tokens != pad_id) and combine "
                "masks with &"))


# ---------------------------------------------------------------- 6.4 greedy_decode


def check_inputs(problems: list[str]) -> None:
    """Fail with the first thing greedy decoding passed the scripted model wrong."""
    if problems:
        raise AssertionError(named("6.4/no-target-mask") if "tgt_mask=None" in problems[0]
                             else problems[0])


@pytest.mark.grade("6.4", points=3, values=True)
def test_greedy_decode_stops_and_pads(learner):
    bos, eos, pad = 1, 2, 0
    script = [[5, 6, 2, 7, 7, 7], [4, 2, 8, 8, 8, 8], [3, 3, 3, 2, 5, 5]]
    src = torch.zeros(3, 4, dtype=torch.long)
    result = learner.run(decode_scripted, script=script, src=src, max_len=10, bos=bos, eos=eos,
                         pad=pad)
    check_inputs(result["problems"])
    out = result["out"]
    expected = torch.tensor([[1, 5, 6, 2, 0], [1, 4, 2, 0, 0], [1, 3, 3, 3, 2]])
    assert_tensor(out, "greedy_decode(...)", dtype=torch.long)
    unpadded = torch.tensor([[1, 5, 6, 2, 7], [1, 4, 2, 8, 8], [1, 3, 3, 3, 2]])
    assert not torch.equal(out, unpadded), named("6.4/generates-after-eos")
    assert not (out.size(1) == 10 and torch.equal(out[:, :5], expected)), named(
        "6.4/never-stops-early")
    assert out.tolist() == expected.tolist(), (
        f"expected {expected.tolist()} (BOS first, pad_id after each row's EOS, stop once "
        f"every row has produced EOS), got {out.tolist()}")
    assert result["encode_calls"] == 1, named("6.4/source-encoded-every-step",
                                              calls=result["encode_calls"])


@pytest.mark.grade("6.4", points=1)
def test_greedy_decode_respects_max_len(learner):
    result = learner.run(decode_scripted, script=[[5] * 20, [6] * 20],
                         src=torch.zeros(2, 3, dtype=torch.long), max_len=6, bos=1, eos=2, pad=0)
    check_inputs(result["problems"])
    out = assert_tensor(result["out"], "greedy_decode(...)")
    assert tuple(out.shape) == (2, 6), (
        f"without EOS the output should stop at max_len=6 columns (BOS counted); got shape "
        f"{list(out.shape)}")
    assert out[:, 0].tolist() == [1, 1], "the first column should be BOS"


@pytest.mark.grade("6.4", points=2)
def test_greedy_decode_matches_row_by_row_decoding(learner):
    torch.manual_seed(0)  # weights and source for which rows stop at different steps, or not
    model = TorchEncoderDecoder(SimpleNamespace(**SMALL)).double().eval()
    for parameter in model.parameters():  # the course's initialisation
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)
    with torch.no_grad():  # sharpen the generator so that EOS (2) comes up in some rows
        model.projection.bias[2] += 1.5
    src = torch.randint(3, 11, (6, 5))
    src[3:, 4] = 0
    src_mask = (src != 0)[:, None, None, :]
    # [[1, 8, 4, 2, 0, 0, 0, 0], [1, 8, 8, 4, 2, 0, 0, 0], ..., [1, 8, 8, 8, 8, 8, 8, 8]]
    out = learner.run(decode_torch_model, config=SMALL, state=model.state_dict(), src=src,
                      src_mask=src_mask, max_len=8, bos=1, eos=2, pad=0)
    out = assert_tensor(out, "greedy_decode(...)")
    expected = greedy_decode(model, src, src_mask, 8, 1, 2, 0)
    assert out.tolist() == expected.tolist(), (
        f"batched greedy decoding differs from decoding each row alone: got {out.tolist()}, "
        f"expected {expected.tolist()}")


@pytest.mark.grade("6.4", points=1)
def test_greedy_decode_gives_int64_ids_on_the_source_device_under_a_float32_model(learner):
    found = run_naming(learner, decode_on_meta, DEVICE_CLASH, "6.4/device-not-kept",
                       config=dict(SMALL, num_layers=1, d_model=16, d_ff=32, max_len=8))
    if found is None:  # its code reads values the meta device does not hold: not checked
        return
    what = "greedy_decode(...) with a float32 model and a source on the meta device"
    assert "type" not in found, f"{what} returned a {found.get('type')}, not a tensor of ids"
    assert found["dtype"] == "torch.int64", (
        f"{what} returned ids of dtype {found['dtype']}: token ids are src's dtype, "
        f"torch.int64, whatever the model computes in. Start from torch.full(..., bos_id, "
        f"dtype=src.dtype, device=src.device) and append the argmax (int64)")
    assert found["device"] == "meta", (
        f"{what} returned its ids on {found['device']}: make every tensor on src's device "
        f"(device=src.device), the ids, the finished flags and the causal mask")


# ---------------------------------------------------------------- 6.5 the training step


class TinyTranslator(nn.Module):
    """The grader's model for the training step (built in the worker by the probe, and in
    the grader for the expected values): logits ``[B, Lt, V]`` of a chapter-6 ``Batch``'s
    ``args``, ``(src [B, Ls], tgt_input [B, Lt], src_mask [B, 1, 1, Ls], tgt_mask)``: each
    target token's embedding plus the mean of the source's unpadded ones, through tanh and a
    linear layer. It notes whether each forward pass ran in training mode."""

    def __init__(self, vocab: int = 7, width: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab)
        self.modes: list[bool] = []

    def forward(self, src, tgt_input, src_mask, tgt_mask):
        self.modes.append(self.training)
        kept = src_mask[:, 0, 0, :, None].to(self.embed.weight.dtype)  # [B, Ls, 1]
        source = (self.embed(src) * kept).sum(1, keepdim=True) / kept.sum(1, keepdim=True)
        return self.out(torch.tanh(self.embed(tgt_input) + source))


STEP_LR = 0.5  # SGD's rate; LambdaLR halves it at every scheduler.step()


def tiny_training(state):
    """The grader's model with the weights ``state`` (in their dtype), SGD and a schedule."""
    model = TinyTranslator().to(next(iter(state.values())).dtype)
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=STEP_LR)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 ** s)


def train_step_run(impl, state, fields, clip_norm):
    """Two calls of ``train_step`` on the grader's model (which starts in eval mode) and a
    chapter-6 ``Batch`` of ``fields`` (what 6.3's make_batch returns, as the chapter's loop
    hands it over), SGD and a schedule that halves the rate: the weights after each, the
    losses returned, the rates and the model's modes."""
    model, optimizer, scheduler = tiny_training(state)
    model.eval()
    batch = Batch(**fields)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    found = {"weights": [], "losses": [], "on_graph": [], "rates": []}
    for _ in range(2):
        loss = impl.train_step(model, batch, loss_fn, optimizer, scheduler, clip_norm)
        found["losses"].append(loss.detach().clone() if isinstance(loss, torch.Tensor) else loss)
        found["on_graph"].append(isinstance(loss, torch.Tensor) and loss.requires_grad)
        found["weights"].append({k: v.detach().clone() for k, v in model.state_dict().items()})
        found["rates"].append(optimizer.param_groups[0]["lr"])
    found["modes"] = list(model.modes)
    return found


def train_step_on_meta(impl, state, fields):
    """One call of ``train_step`` with the grader's model and a chapter-6 ``Batch`` of
    ``fields`` on the "meta" device (a stand-in for a GPU; the values its code reads there
    read as 0): the devices of the loss it returns and of the weights after it; None when
    its code cannot run there (checks.on_meta)."""
    model, optimizer, scheduler = tiny_training(state)
    model.to("meta")  # in place: the optimizer holds the same parameters, now on meta
    batch = Batch(**{name: value.to("meta") if isinstance(value, torch.Tensor) else value
                     for name, value in fields.items()})
    loss = on_meta(lambda: impl.train_step(model, batch, nn.CrossEntropyLoss(ignore_index=0),
                                           optimizer, scheduler, 1.0))
    if loss is None:
        return None
    return {"loss": getattr(loss, "device", None) and loss.device.type,
            "weights": {name: value.device.type for name, value in model.state_dict().items()}}


def expected_steps(state, fields, clip_norm, zero=True, schedule=True,
                   zero_before_step=False, schedule_first=False):
    """The weights and losses of two right steps, computed here with PyTorch (clipped to
    ``clip_norm``, none when None); or of one mistake: no zeroing, no schedule, the gradients
    zeroed between backward and the update, the schedule stepped before the update."""
    model, optimizer, scheduler = tiny_training(state)
    batch = Batch(**fields)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    weights, losses = [], []
    for _ in range(2):
        if zero and not zero_before_step:
            optimizer.zero_grad()
        logits = model(*batch.args)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))
        loss.backward()
        if zero_before_step:
            optimizer.zero_grad()
        if clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if schedule and schedule_first:
            with warnings.catch_warnings():  # PyTorch warns of this order: the mistake's
                warnings.simplefilter("ignore")
                scheduler.step()
        optimizer.step()
        if schedule and not schedule_first:
            scheduler.step()
        losses.append(loss.detach())
        weights.append(torch.cat([v.detach().flatten() for v in model.state_dict().values()]))
    return weights, losses


def step_case():
    """The grader's weights and a Batch's fields: 3 sources of 5 tokens (the last two of row
    2 padding), targets of 4, labels with padding (0, not scored)."""
    state = {k: v.double() for k, v in TinyTranslator().state_dict().items()}
    src = torch.randint(1, 7, (3, 5))
    src[2, 3:] = 0
    labels = torch.randint(1, 7, (3, 4))
    labels[2, 2:] = 0
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    fields = {"src": src, "src_mask": (src != 0)[:, None, None, :],
              "tgt_input": torch.randint(1, 7, (3, 4)), "tgt_labels": labels,
              "tgt_mask": causal.expand(3, 1, 4, 4), "num_tokens": int((labels != 0).sum())}
    return state, fields


def flat(weights):
    return torch.cat([v.flatten() for v in weights.values()])


@pytest.mark.grade("6.5", points=3, values=True)
@pytest.mark.parametrize("clip_norm", [0.05, None, 0.0],
                         ids=["clipped", "no clipping", "clip_norm 0: no clipping"])
def test_train_step_updates_like_pytorch(learner, clip_norm):
    state, fields = step_case()
    result = learner.run(train_step_run, state=state, fields=fields, clip_norm=clip_norm)
    clip = clip_norm or None  # 0 clips nothing
    weights, losses = expected_steps(state, fields, clip)
    assert result["rates"] != [STEP_LR, STEP_LR], named("6.5/schedule-not-stepped")
    mistakes = {  # the weights after each call
        "6.5/gradients-not-zeroed": expected_steps(state, fields, clip, zero=False)[0],
        "6.5/zeroed-before-step": expected_steps(state, fields, clip, zero_before_step=True)[0],
        "6.5/schedule-before-step": expected_steps(state, fields, clip, schedule_first=True)[0]}
    if clip_norm:
        mistakes["6.5/not-clipped"] = expected_steps(state, fields, None)[0]
    for i in range(2):  # each call's loss (before its update), then the weights after it
        returned = result["losses"][i]
        if type(returned) is float:  # loss.item(): its value counts here, its type in the
            returned = torch.tensor(returned, dtype=f64)  # test of what train_step returns
        assert_tensor(returned, f"the loss train_step returns (call {i + 1})", shape=())
        assert_close(returned, losses[i], f"the loss of call {i + 1}",
                     hint="The mean of loss_fn over logits [B*L, V] and labels [B*L], computed "
                     "before the update.")
        got = flat(result["weights"][i])
        mistake = mistake_of(got, weights[i], {name: after[i] for name, after in mistakes.items()})
        if clip_norm == 0 and mistake == "6.5/zeroed-before-step":
            mistake = clipped_at_zero(learner, state, fields)
        assert_close(got, weights[i], f"the weights after call {i + 1} of train_step"
                     + {0.0: " (clip_norm=0)", None: " (no clipping)"}.get(
                         clip_norm, f" (clip_norm={clip_norm})"),
                     hint=named(mistake) if mistake else "Zero the gradients, compute the loss, "
                     "backward, clip, optimizer.step(), scheduler.step(), in that order.")


def clipped_at_zero(learner, state, fields):
    """For weights left as they were by a step with clip_norm=0 (clipped to a norm of 0, or
    zeroed before the update): the first when the same train_step without clipping updates
    them right, else the second."""
    result = learner.run(train_step_run, state=state, fields=fields, clip_norm=None)
    weights, _ = expected_steps(state, fields, None)
    right = all(torch.allclose(flat(result["weights"][i]), weights[i]) for i in range(2))
    return "6.5/clipped-at-zero" if right else "6.5/zeroed-before-step"


@pytest.mark.grade("6.5", points=1)
def test_train_step_trains_in_training_mode_and_returns_a_detached_loss(learner):
    state, fields = step_case()
    result = learner.run(train_step_run, state=state, fields=fields, clip_norm=1.0)
    assert result["modes"] and all(result["modes"]), named("6.5/eval-mode")
    assert not any(result["on_graph"]), named("6.5/loss-not-detached")
    returned = result["losses"][0]
    assert type(returned) is not float, named("6.5/loss-as-a-number", number=f"{returned:.6g}")
    assert_tensor(returned, "the loss train_step returns", shape=())


# PyTorch's words for a gradient assigned in another dtype than its parameter's.
GRADIENT_DTYPE_CLASH = re.compile(r"assign a gradient with dtype|assigned grad has data of a "
                                  r"different type")


@pytest.mark.grade("6.5", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_train_step_keeps_the_model_s_dtype_and_updates_every_parameter(learner, dtype):
    state, fields = step_case()
    state = {name: value.to(dtype) for name, value in state.items()}
    result = run_naming(learner, train_step_run, GRADIENT_DTYPE_CLASH,
                        "6.5/gradient-dtype-changed", state=state, fields=fields, clip_norm=0.05)
    what = f"a {dtype} model"
    returned = result["losses"][0]
    if type(returned) is not float:  # a number is 6.5/loss-as-a-number, named by the test of
        # what train_step returns
        _, losses = expected_steps(state, fields, 0.05)
        right = (isinstance(returned, torch.Tensor) and returned.shape == ()
                 and torch.allclose(returned.double(), losses[0].double(), atol=1e-5))
        assert not right or returned.dtype == dtype, named(
            "6.5/loss-dtype-changed", dtype=dtype, got=returned.dtype)
        assert_tensor(returned, f"the loss train_step returns for {what}", shape=(),
                      dtype=dtype)
    for name, value in result["weights"][0].items():
        assert value.dtype == dtype, (
            f"after train_step, {name} of {what} is {value.dtype}: the step changes the "
            f"weights' values, never their dtype. Let optimizer.step() update them")
        assert not torch.equal(value, state[name]), (
            f"train_step left {name} of {what} as it was: every parameter the loss depends on "
            f"should move. Is the loss computed from model(*batch.args) on autograd's graph "
            f"(no torch.no_grad(), .detach() or .item() before backward), and is "
            f"optimizer.step() called after backward and before anything zeroes the gradients?")


@pytest.mark.grade("6.5", points=1)
def test_train_step_keeps_the_device(learner):
    state, fields = step_case()
    found = run_naming(learner, train_step_on_meta, DEVICE_CLASH, "6.5/device-not-kept",
                       state=state, fields=fields)
    if found is None:  # its code reads values the meta device does not hold: not checked
        return
    assert found["loss"] == "meta", (
        f"with the model and the batch on the meta device (a stand-in for a GPU), train_step "
        f"returns its loss on {found['loss']}: return loss.detach(), on the model's device, "
        f"never a tensor rebuilt from a number (torch.tensor(loss.item()) is made on the CPU)")
    moved = [name for name, device in found["weights"].items() if device != "meta"]
    assert not moved, (
        f"after train_step on the meta device, {', '.join(moved)} moved to the CPU: leave the "
        f"model where it is (no .cpu() or .to('cpu') in the step)")


# ---------------------------------------------------------------- 6.6 capstone


@pytest.mark.grade("6.6", points=5, values=True)
@pytest.mark.cpu_seconds(300)
def test_capstone_your_parts_learn_to_copy(learner):
    from annotated_transformer.data.copy import CopyTask
    from annotated_transformer.data.vocab import BOS, EOS, PAD
    from annotated_transformer.train import COPY_MODEL, model_config

    try:
        trained = learner.run(trained_copy_model, steps=CAPSTONE_STEPS)
    except LearnerNotImplemented as error:
        raise LearnerNotImplemented(
            f"the capstone builds and trains the whole model from your parts of chapters 1 to "
            f"6, and met a stub while building it: {error}") from error
    # The grader's model is the copy task's, as the package's recipe builds it, never one
    # the reply describes: the reply's config and weights are checked against it.
    config = dataclasses.asdict(model_config(CopyTask(), **COPY_MODEL))
    check_trained_config(trained["config"], config, "the model your parts trained",
                         hint="does your train_step (6.5), which holds the model while it "
                         "trains, change model.config?")
    model = TorchEncoderDecoder(SimpleNamespace(**config))
    try:
        model.load_course_state_dict(trained["state"])
    except KeyError as error:
        raise AssertionError(
            f"the trained model's weights do not have the names and shapes the syllabus "
            f"gives them: {error}") from error
    # Held-out copy sequences (never trained on), drawn with the run's seed.
    src, tgt = CopyTask().held_out_set(CAPSTONE_EVAL_SIZE, seed=int(torch.randint(2**31, ())))
    decoded = greedy_decode(model.eval(), src, (src != PAD)[:, None, None, :], tgt.size(1),
                            BOS, EOS, PAD)
    decoded = F.pad(decoded, (0, tgt.size(1) - decoded.size(1)), value=PAD)
    accuracy = (decoded == tgt).all(dim=1).float().mean().item()
    assert accuracy >= CAPSTONE_THRESHOLD, (
        f"after {CAPSTONE_STEPS} steps your model copies {accuracy:.0%} of the held-out "
        f"sequences exactly; at least {CAPSTONE_THRESHOLD:.0%} is expected. If every other "
        f"exercise passes, check that nothing is computed in the wrong dtype or detached.")


# ---------------------------------------------------------------- not graded: the trusted model


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_torch_model_matches_the_course_model(norm_first, tie_embeddings):
    """TorchEncoderDecoder, given the course's EncoderDecoder's weights, computes what it does
    (the course's own reference model; not a learner's: not graded)."""
    from annotated_transformer.model import EncoderDecoder, TransformerConfig
    from annotated_transformer.parts import Parts, has_reference

    if not has_reference():
        pytest.skip("checks the torch model against the reference solutions, not in a release")
    config = TransformerConfig.small(11, norm_first=norm_first, tie_embeddings=tie_embeddings)
    course = EncoderDecoder(config, parts=Parts.reference()).double().eval()
    model = TorchEncoderDecoder(config)
    model.load_course_state_dict(course.state_dict())
    model = model.double().eval()
    src = torch.randint(3, 11, (4, 6))
    src[2:, 4:] = 0
    tgt = torch.randint(3, 11, (4, 5))
    tgt[:, 0], tgt[3, 3:] = 1, 0
    src_mask = (src != 0)[:, None, None, :]
    tgt_mask = (tgt != 0)[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    expected = course(src, tgt, src_mask, tgt_mask).log_softmax(-1)
    # The positional table is computed here in float64 and rounded to float32, as the
    # course's is: the two may differ in the last bit of float32.
    assert_close(model(src, tgt, src_mask, tgt_mask), expected, "the torch model's "
                 "log-probabilities", atol=1e-6, rtol=1e-6)
    with pytest.raises(KeyError, match="unknown.weight"):
        model.load_course_state_dict({**course.state_dict(), "unknown.weight": torch.ones(1)})
