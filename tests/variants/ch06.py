"""Chapter 6: plausible wrong answers and other correct answers."""

from __future__ import annotations

import math

import torch
from torch import nn

from annotated_transformer.batch import Batch

from variants import right, wrong

# ------------------------------------------------------------------ 6.1


@wrong("6.1", "noam_lr", "warmup exponent -0.5 instead of -1.5",
       mistake="6.1/warmup-exponent")
def warmup_exponent(step, d_model, warmup_steps, factor=1.0):
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -0.5)


@wrong("6.1", "noam_lr", "d_model^-1 instead of d_model^-0.5",
       mistake="6.1/d_model-to-minus-1")
def d_model_exponent(step, d_model, warmup_steps, factor=1.0):
    step = max(step, 1)
    return factor / d_model * min(step ** -0.5, step * warmup_steps ** -1.5)


@wrong("6.1", "noam_lr", "step 0 not treated as step 1",
       mistake="6.1/step-zero")
def step_zero(step, d_model, warmup_steps, factor=1.0):
    return factor * d_model ** -0.5 * min(step ** -0.5 if step else math.inf,
                                          step * warmup_steps ** -1.5)


@wrong("6.1", "noam_lr", "torch.rsqrt and torch.minimum: right values in a tensor, not a "
       "Python float", mistake="6.1/not-a-float")
def rate_in_a_tensor(step, d_model, warmup_steps, factor=1.0):
    step = torch.tensor(float(max(step, 1)))
    return factor * d_model ** -0.5 * torch.minimum(torch.rsqrt(step), step * warmup_steps ** -1.5)


@right("6.1", "noam_lr", "the two branches written out")
def branches(step, d_model, warmup_steps, factor=1.0):
    step = step or 1
    if step < warmup_steps:
        return float(factor * step / (math.sqrt(d_model) * warmup_steps ** 1.5))
    return float(factor / math.sqrt(d_model * step))


# ------------------------------------------------------------------ 6.2


class _Loss(nn.Module):
    def __init__(self, smoothing=0.1, ignore_index=None):
        super().__init__()
        self.smoothing, self.ignore_index = smoothing, ignore_index

    def keep(self, target):
        if self.ignore_index is None:
            return torch.ones_like(target, dtype=torch.bool)
        return target != self.ignore_index


@wrong("6.2", "LabelSmoothingLoss", "smoothing spread over the V - 1 wrong classes",
       mistake="6.2/smoothing-over-the-other-classes")
class OverOtherClasses(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        v = logits.size(-1)
        dist = torch.full_like(logits, self.smoothing / (v - 1))
        dist.scatter_(1, target.clamp(min=0).unsqueeze(1), 1 - self.smoothing)
        loss = -(dist * torch.log_softmax(logits, -1)).sum(-1)
        return (loss * keep).sum() / keep.sum().clamp(min=1)


@wrong("6.2", "LabelSmoothingLoss", "the mean over every target, ignored ones included",
       mistake="6.2/mean-includes-ignored")
class MeanOverAll(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        lp = torch.log_softmax(logits, -1)
        nll = -lp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
        loss = (1 - self.smoothing) * nll - self.smoothing * lp.mean(-1)
        return (loss * keep).sum() / len(target)


@wrong("6.2", "LabelSmoothingLoss", "NaN when every target is ignored",
       mistake="6.2/nan-when-all-ignored")
class NanWhenEmpty(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        lp = torch.log_softmax(logits, -1)
        nll = -lp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
        loss = (1 - self.smoothing) * nll - self.smoothing * lp.mean(-1)
        return loss[keep].mean()


@wrong("6.2", "LabelSmoothingLoss", "log of softmax: -inf for extreme logits",
       mistake="6.2/log-of-softmax")
class LogOfSoftmax(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        lp = torch.log(torch.softmax(logits, -1))
        nll = -lp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
        loss = (1 - self.smoothing) * nll - self.smoothing * lp.mean(-1)
        return (loss * keep).sum() / keep.sum().clamp(min=1)


@right("6.2", "LabelSmoothingLoss", "a smoothed one-hot distribution against log_softmax")
class SmoothedOneHot(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        v = logits.size(-1)
        one_hot = nn.functional.one_hot(torch.where(keep, target, 0), v).to(logits.dtype)
        dist = one_hot * (1 - self.smoothing) + self.smoothing / v
        loss = -(dist * torch.log_softmax(logits, dim=-1)).sum(-1)
        return torch.where(keep, loss, 0.0).sum() / max(int(keep.sum()), 1)


@right("6.2", "LabelSmoothingLoss", "plain cross_entropy plus the smoothing term by logsumexp")
class CrossEntropyPlusUniform(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        if not keep.any():
            return logits.sum() * 0.0
        logits, target = logits[keep], target[keep]
        nll = nn.functional.cross_entropy(logits, target, reduction="none")
        uniform = torch.logsumexp(logits, -1) - logits.mean(-1)
        return ((1 - self.smoothing) * nll + self.smoothing * uniform).mean()


@wrong("6.2", "LabelSmoothingLoss", "the targets kept made with torch.ones(N, dtype=torch.bool), "
       "on the CPU, when nothing is ignored", mistake="6.2/device-not-kept")
class KeepMaskOnTheCpu(_Loss):
    def forward(self, logits, target):
        keep = (torch.ones(len(target), dtype=torch.bool) if self.ignore_index is None
                else target != self.ignore_index)
        lp = torch.log_softmax(logits, -1)
        nll = -lp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
        loss = (1 - self.smoothing) * nll - self.smoothing * lp.mean(-1)
        return torch.where(keep, loss, 0.0).sum() / keep.sum().clamp(min=1)


@wrong("6.2", "LabelSmoothingLoss", "a one-hot made .double(): float32 logits give a float64 loss",
       mistake="6.2/dtype-changed")
class OneHotInFloat64(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        v = logits.size(-1)
        one_hot = nn.functional.one_hot(torch.where(keep, target, 0), v).double()
        dist = one_hot * (1 - self.smoothing) + self.smoothing / v
        loss = -(dist * torch.log_softmax(logits, dim=-1)).sum(-1)
        return torch.where(keep, loss, 0.0).sum() / max(int(keep.sum()), 1)


@wrong("6.2", "LabelSmoothingLoss", "the losses gathered into a new tensor: off the graph",
       mistake="6.2/detached")
class LossesCopiedIntoATensor(_Loss):
    def forward(self, logits, target):
        keep = self.keep(target)
        lp = torch.log_softmax(logits, -1)
        nll = -lp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
        rows = (1 - self.smoothing) * nll - self.smoothing * lp.mean(-1)
        kept = [float(row) for row, k in zip(rows, keep, strict=True) if k]
        return torch.tensor(sum(kept) / max(len(kept), 1), dtype=logits.dtype)


# ------------------------------------------------------------------ 6.3


def _masks(src, tgt_input, pad_id, causal_on_the_cpu=False):
    device = None if causal_on_the_cpu else tgt_input.device
    causal = torch.ones(tgt_input.size(1), tgt_input.size(1), dtype=torch.bool,
                        device=device).tril()
    return (src != pad_id)[:, None, None], (tgt_input != pad_id)[:, None, None] & causal


@wrong("6.3", "make_batch", "the target not shifted: the decoder sees the answer",
       mistake="6.3/target-not-shifted")
def unshifted(src, tgt, pad_id):
    src_mask, tgt_mask = _masks(src, tgt, pad_id)
    return Batch(src, src_mask, tgt, tgt, tgt_mask, int((tgt != pad_id).sum()))


@wrong("6.3", "make_batch", "labels tgt[:, :-1]: they include BOS",
       mistake="6.3/labels-include-bos")
def labels_with_bos(src, tgt, pad_id):
    src_mask, tgt_mask = _masks(src, tgt[:, :-1], pad_id)
    return Batch(src, src_mask, tgt[:, :-1], tgt[:, :-1], tgt_mask,
                 int((tgt[:, :-1] != pad_id).sum()))


@wrong("6.3", "make_batch", "the shift reversed: input tgt[:, 1:], labels tgt[:, :-1]",
       mistake="6.3/shift-reversed")
def shift_reversed(src, tgt, pad_id):
    src_mask, tgt_mask = _masks(src, tgt[:, 1:], pad_id)
    return Batch(src, src_mask, tgt[:, 1:], tgt[:, :-1], tgt_mask,
                 int((tgt[:, :-1] != pad_id).sum()))


@wrong("6.3", "make_batch", "num_tokens counts the padding too",
       mistake="6.3/padding-counted")
def counts_padding(src, tgt, pad_id):
    src_mask, tgt_mask = _masks(src, tgt[:, :-1], pad_id)
    return Batch(src, src_mask, tgt[:, :-1], tgt[:, 1:], tgt_mask, tgt[:, 1:].numel())


@wrong("6.3", "make_batch", "target mask without causality",
       mistake="6.3/target-mask-not-causal")
def no_causality(src, tgt, pad_id):
    src_mask, _ = _masks(src, tgt[:, :-1], pad_id)
    tgt_mask = (tgt[:, :-1] != pad_id)[:, None, None].expand(-1, 1, tgt.size(1) - 1, -1)
    return Batch(src, src_mask, tgt[:, :-1], tgt[:, 1:], tgt_mask,
                 int((tgt[:, 1:] != pad_id).sum()))


@wrong("6.3", "make_batch", "the causal triangle made by hand on the CPU (torch.ones(n, n) with "
       "no device)", mistake="6.3/device-not-kept")
def causal_on_the_cpu(src, tgt, pad_id):
    src_mask, tgt_mask = _masks(src, tgt[:, :-1], pad_id, causal_on_the_cpu=True)
    return Batch(src, src_mask, tgt[:, :-1], tgt[:, 1:], tgt_mask,
                 int((tgt[:, 1:] != pad_id).sum()))


@right("6.3", "make_batch", "narrow() and the masks from the package's parts")
def with_narrow(src, tgt, pad_id):
    from annotated_transformer.parts import active_parts

    parts = active_parts()
    length = tgt.size(1) - 1
    tgt_input, tgt_labels = tgt.narrow(1, 0, length), tgt.narrow(1, 1, length)
    return Batch(src=src, src_mask=parts.padding_mask(src, pad_id), tgt_input=tgt_input,
                 tgt_labels=tgt_labels, tgt_mask=parts.target_mask(tgt_input, pad_id),
                 num_tokens=int(tgt_labels.ne(pad_id).sum().item()))


# ------------------------------------------------------------------ 6.4


def _greedy(model, src, src_mask, max_len, bos_id, eos_id, pad_id, *, pad_after=True,
            stop=True, mask=True, encode_each_step=False, ids_on_the_cpu=False):
    ys = torch.full((src.size(0), 1), bos_id, dtype=src.dtype,
                    device=None if ids_on_the_cpu else src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    memory = model.encode(src, src_mask)
    while ys.size(1) < max_len and not (stop and done.all()):
        if encode_each_step:
            memory = model.encode(src, src_mask)
        length = ys.size(1)
        tgt_mask = (torch.ones(length, length, dtype=torch.bool, device=src.device).tril()
                    if mask else None)
        token = model.generator(model.decode(memory, src_mask, ys, tgt_mask)[:, -1]).argmax(-1)
        if pad_after:
            token = torch.where(done, pad_id, token)
        ys = torch.cat([ys, token[:, None]], 1)
        done |= token == eos_id
    return ys


@wrong("6.4", "greedy_decode", "never stops early: always max_len columns",
       mistake="6.4/never-stops-early")
def never_stops(*args):
    return _greedy(*args, stop=False)


@wrong("6.4", "greedy_decode", "keeps generating after EOS instead of padding",
       mistake="6.4/generates-after-eos")
def no_padding(*args):
    return _greedy(*args, pad_after=False)


@wrong("6.4", "greedy_decode", "tgt_mask=None",
       mistake="6.4/no-target-mask")
def no_mask(*args):
    return _greedy(*args, mask=False)


@wrong("6.4", "greedy_decode", "the source encoded again at every step",
       mistake="6.4/source-encoded-every-step")
def encodes_every_step(*args):
    return _greedy(*args, encode_each_step=True)


@wrong("6.4", "greedy_decode", "the ids started with torch.full((B, 1), bos_id) on the CPU",
       mistake="6.4/device-not-kept")
def ids_on_the_cpu(*args):
    return _greedy(*args, ids_on_the_cpu=True)


@right("6.4", "greedy_decode", "a for loop over positions with a [B, 1, L, L] mask")
@torch.no_grad()
def for_loop_4d_mask(model, src, src_mask, max_len, bos_id, eos_id, pad_id):
    memory = model.encode(src, src_mask)
    out = src.new_full((src.size(0), 1), bos_id)
    alive = torch.ones(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        n = out.size(1)
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=src.device)).expand(
            src.size(0), 1, n, n)
        scores = model.generator(model.decode(memory, src_mask, out, mask))[:, -1]
        token = scores.argmax(-1).masked_fill(~alive, pad_id)
        out = torch.cat([out, token.unsqueeze(-1)], dim=-1)
        alive &= token != eos_id
        if not alive.any():
            break
    return out


# ------------------------------------------------------------------ 6.5 train_step


def _loss(model, batch, loss_fn):
    logits = model(*batch.args)
    return loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))


@wrong("6.5", "train_step", "the gradients never zeroed", mistake="6.5/gradients-not-zeroed")
def accumulating_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "no clipping", mistake="6.5/not-clipped")
def unclipped_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the gradients clipped after the update", mistake="6.5/not-clipped")
def clipped_too_late(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    optimizer.step()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the schedule never stepped", mistake="6.5/schedule-not-stepped")
def unscheduled_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return loss.detach()


@wrong("6.5", "train_step", "the model left in evaluation mode", mistake="6.5/eval-mode")
def eval_mode_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the loss returned with its graph", mistake="6.5/loss-not-detached")
def undetached_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss


@wrong("6.5", "train_step", "the loss returned as a Python number (loss.item())",
       mistake="6.5/loss-as-a-number")
def loss_item_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


@wrong("6.5", "train_step", "clips whenever clip_norm is not None, so 0 clips to a norm of 0",
       mistake="6.5/clipped-at-zero")
def clipped_at_zero_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the gradients zeroed between backward and the update",
       mistake="6.5/zeroed-before-step")
def zeroed_before_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.zero_grad()
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the schedule stepped before the optimizer",
       mistake="6.5/schedule-before-step")
def schedule_before_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scheduler.step()
    optimizer.step()
    return loss.detach()


@right("6.5", "train_step", "clips only for a positive clip_norm; the loss over the batch's "
       "flattened labels")
def clip_when_positive(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logits = model(*batch.args)
    loss = loss_fn(logits.flatten(0, 1), batch.labels.flatten())
    loss.backward()
    if clip_norm is not None and clip_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()


@right("6.5", "train_step", "the gradients zeroed after the update, the model's own zero_grad")
def zero_after_step(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    model.zero_grad()
    return loss.detach()


@right("6.5", "train_step", "clipping by hand: every gradient times min(1, clip / total norm)")
def clipped_by_hand(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=False)
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        total = torch.sqrt(sum((g ** 2).sum() for g in grads))
        scale = torch.clamp(clip_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale)
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "the loss rebuilt from a number, torch.tensor(loss.item()): float32 "
       "and on the CPU whatever the model's", mistake="6.5/loss-dtype-changed")
def loss_rebuilt_from_a_number(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return torch.tensor(loss.item())


def _clip_by_hand(model, clip_norm, total):
    """Every gradient times min(1, clip_norm / total norm), the squares summed into
    ``total``; a float64 ``total`` makes the gradients float64."""
    grads = [p for p in model.parameters() if p.grad is not None]
    for p in grads:
        total = total + p.grad.to(total.dtype).pow(2).sum()
    scale = (clip_norm / (total.sqrt() + 1e-6)).clamp(max=1.0)
    for p in grads:
        p.grad = p.grad * scale


@wrong("6.5", "train_step", "clipping by hand with the norm summed in float64: a float32 "
       "model's gradients become float64", mistake="6.5/gradient-dtype-changed")
def clipped_in_float64(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        _clip_by_hand(model, clip_norm, torch.zeros(1, dtype=torch.float64, device=loss.device))
    optimizer.step()
    scheduler.step()
    return loss.detach()


@wrong("6.5", "train_step", "clipping by hand with the norm summed into torch.zeros(1), on the "
       "CPU", mistake="6.5/device-not-kept")
def clipped_on_the_cpu(model, batch, loss_fn, optimizer, scheduler, clip_norm=1.0):
    model.train()
    optimizer.zero_grad()
    loss = _loss(model, batch, loss_fn)
    loss.backward()
    if clip_norm:
        _clip_by_hand(model, clip_norm, torch.zeros(1, dtype=loss.dtype))
    optimizer.step()
    scheduler.step()
    return loss.detach()
