"""The copy task and the training loop."""

from __future__ import annotations

import pytest
import torch

from annotated_transformer.data.copy import BOS, EOS, PAD, CopyTask
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts
from annotated_transformer.train import TrainConfig, adam, evaluate, make_optimizer, train


def test_copy_task_batches():
    task = CopyTask(vocab_size=13, min_len=3, max_len=6)
    src, tgt = task.sample(32, torch.Generator().manual_seed(0))
    assert src.dtype == tgt.dtype == torch.long and tgt.size(1) == src.size(1) + 1
    for s, t in zip(src.tolist(), tgt.tolist(), strict=True):
        symbols = [x for x in s if x not in (PAD, EOS)]
        assert 3 <= len(symbols) <= 6 and all(3 <= x < 13 for x in symbols)
        assert [x for x in t if x != PAD] == [BOS, *symbols, EOS]
    again, _ = task.sample(32, torch.Generator().manual_seed(0))
    assert torch.equal(src, again), "batches are deterministic given the seed"
    reverse, rtgt = CopyTask(reverse=True).sample(4, torch.Generator().manual_seed(1))
    first = [x for x in reverse[0].tolist() if x not in (PAD, EOS)]
    assert [x for x in rtgt[0].tolist() if x not in (PAD, BOS, EOS)] == first[::-1]


def test_held_out_sequences_never_appear_in_training():
    task = CopyTask(min_len=1, max_len=2, vocab_size=6)  # few sequences: collisions likely
    train_src, _ = task.sample(500, torch.Generator().manual_seed(0))
    held_src, _ = task.held_out_set(50)

    def rows(src):
        return {tuple(x for x in row if x not in (PAD, EOS)) for row in src.tolist()}

    assert rows(held_src) and not rows(held_src) & rows(train_src)


def test_optimizer_is_adam_with_the_noam_schedule():
    model = EncoderDecoder(TransformerConfig.small(13))
    optimizer, scheduler = make_optimizer(model, TrainConfig(warmup_steps=10, lr_factor=2.0))
    assert isinstance(optimizer, torch.optim.Adam)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    expected = 2.0 * 64 ** -0.5 * 10 ** -1.5  # step 0 counts as step 1
    assert abs(scheduler.get_last_lr()[0] - expected) < 1e-12


def rates_of(config: TrainConfig, steps: int) -> list[float]:
    model = EncoderDecoder(TransformerConfig.small(13))
    optimizer, scheduler = make_optimizer(model, config)
    rates = []
    for _ in range(steps + 1):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test_the_linear_decay_warms_up_as_noam_then_falls_to_zero_at_the_last_step():
    noam_lr = Parts.reference().noam_lr
    linear = rates_of(TrainConfig(steps=50, warmup_steps=10, lr_factor=2.0), 50)
    noam = rates_of(TrainConfig(steps=50, warmup_steps=10, lr_factor=2.0, decay="noam"), 50)
    assert noam == [noam_lr(step, 64, 10, 2.0) for step in range(51)]
    assert linear[:11] == noam[:11], "the warmup is Noam's in both"
    peak = noam[10]
    assert linear[30] == pytest.approx(peak / 2) and linear[50] == 0.0
    assert all(a > b for a, b in zip(linear[10:50], linear[11:51], strict=True))
    assert linear[40] < noam[40], "the linear decay anneals further than Noam's"
    # A run no longer than its warmup is all warmup, whatever the decay.
    assert rates_of(TrainConfig(steps=8, warmup_steps=10), 8) == [
        noam_lr(step, 64, 10, 0.3) for step in range(9)]
    with pytest.raises(ValueError, match="decay must be 'linear' or 'noam', got 'cosine'"):
        TrainConfig(decay="cosine")


def test_the_fused_adam_takes_the_steps_of_the_plain_one():
    torch.manual_seed(0)
    weights = [torch.randn(5, 3, dtype=torch.float64), torch.randn(7, dtype=torch.float64)]
    fused = [w.clone().requires_grad_() for w in weights]
    plain = [w.clone().requires_grad_() for w in weights]
    optimizers = (adam(fused, lr=1e-2),
                  torch.optim.Adam(plain, lr=1e-2, betas=(0.9, 0.98), eps=1e-9))
    assert optimizers[0].defaults["fused"], "PyTorch has a fused Adam for CPU tensors"
    for _ in range(20):
        grads = [torch.randn_like(w) for w in weights]
        for params, optimizer in zip((fused, plain), optimizers, strict=True):
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad.clone()
            optimizer.step()
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_short_run_learns_something():
    torch.manual_seed(0)
    task = CopyTask(min_len=2, max_len=4)
    model = EncoderDecoder(TransformerConfig.small(task.vocab_size, num_layers=1))
    history = train(model, task, TrainConfig(steps=60, eval_every=60, eval_size=50))
    assert history.loss[-1] < 0.7 * history.loss[0]
    assert len(history.lr) == 60 and history.lr[0] < max(history.lr)
    loss, accuracy = evaluate(model, *task.held_out_set(20), torch.nn.CrossEntropyLoss(
        ignore_index=PAD))
    assert 0.0 <= accuracy <= 1.0 and loss > 0


def _small_run(out, steps, resume=False):
    from annotated_transformer.train import Runtime

    torch.manual_seed(0)
    task = CopyTask(min_len=2, max_len=5)
    config = TransformerConfig.small(task.vocab_size, num_layers=1, dropout=0.1)
    model = EncoderDecoder(config)
    train(model, task, TrainConfig(steps=steps, batch_size=16, eval_every=5, eval_size=10),
          runtime=Runtime(out=out, resume=resume, log_every=5))
    return model


def test_a_resumed_run_reaches_the_same_parameters(tmp_path):
    """Dropout on: the random state must be restored too, not only the weights."""
    straight = _small_run(tmp_path / "straight", 12)
    _small_run(tmp_path / "resumed", 7)  # saved at step 5 and at step 7
    resumed = _small_run(tmp_path / "resumed", 12, resume=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), f"{name} differs after resuming"
    steps = [__import__("json").loads(line)["step"]
             for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 12 and 7 in steps


def test_every_task_has_a_recipe_and_every_recipe_a_task():
    from annotated_transformer.data import TASKS
    from annotated_transformer.recipes import RECIPES, recipe_for

    assert list(RECIPES) == list(TASKS)  # the command line's order too
    assert all(recipe_for(task) is RECIPES[task] for task in TASKS)


def test_a_task_without_a_recipe_is_named(monkeypatch):
    from annotated_transformer import recipes

    monkeypatch.delitem(recipes.RECIPES, "dates")
    with pytest.raises(ValueError, match="task 'dates' has no recipe: add its default run"):
        recipes.recipe_for("dates")
    with pytest.raises(ValueError, match="unknown task 'nope': choose one of copy, reverse"):
        recipes.recipe_for("nope")


def test_the_schedule_warms_up_on_every_task():
    from annotated_transformer.data import make_task
    from annotated_transformer.recipes import RECIPES

    for name, recipe in RECIPES.items():
        # a file, a text file (tests/library/test_text.py), a corpus
        # (tests/library/test_translation.py)
        if name in ("tsv", "text", "translation"):
            continue
        task = make_task(name)
        config = recipe.model_config(task)
        assert config.max_len >= task.max_source_len + task.max_target_len or \
            not task.decoder_only
        assert recipe.train.warmup_steps < recipe.train.steps


def test_language_model_batch_scores_only_the_answer():
    from annotated_transformer.teacher_forcing import language_model_batch

    prompt = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, PAD, PAD]])
    answer = torch.tensor([[9, EOS, PAD], [10, 11, EOS]])
    inputs, labels = language_model_batch(prompt, answer)
    assert inputs.tolist() == [[BOS, 5, 6, 7, 9], [BOS, 8, 10, 11, EOS]]  # EOS: label PAD
    assert labels.tolist() == [[PAD, PAD, PAD, 9, EOS], [PAD, 10, 11, EOS, PAD]]


def test_the_capstone_and_train_task_copy_train_the_same_model(tmp_path, capsys):
    """Chapter 6's capstone (``train.train_copy_task``) and ``train --task copy`` are one
    recipe (``recipes.RECIPES["copy"]``): run both for two steps, and the command's
    checkpoint holds the capstone's model, the same config (``max_len`` included) and the
    same weights."""
    import dataclasses

    from annotated_transformer import checkpoint, cli
    from annotated_transformer.recipes import RECIPES
    from annotated_transformer.train import train_copy_task

    assert cli.main(["train", "--task", "copy", "--steps", "2", "--eval-every", "2",
                     "--eval-size", "4", "--device", "cpu", "--no-progress",
                     "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    state = checkpoint.load(tmp_path / checkpoint.FILE_NAME)
    model, _ = train_copy_task(config=TrainConfig(steps=2, eval_every=2, eval_size=4),
                               log=None)
    assert state["model_config"] == dataclasses.asdict(model.config)
    assert model.config.max_len < TransformerConfig.small(13).max_len  # not the default 512
    assert RECIPES["copy"].train == TrainConfig()
    weights = checkpoint.model_weights(state)
    assert weights.keys() == model.state_dict().keys()
    different = [name for name, tensor in model.state_dict().items()
                 if not torch.equal(weights[name], tensor)]
    assert not different, f"the two runs trained different weights: {different[:5]}"


def test_a_run_without_a_progress_bar_prints_nothing_where_threads_are_refused(
        monkeypatch, capfd):
    """The grading worker refuses every new thread, and what a run prints there is shown to
    the learner as their code's output. A run without a progress bar (the default) starts
    no thread (a tqdm bar, even a disabled one, starts tqdm's monitor thread, and warns when
    it cannot) and prints nothing."""
    import threading
    import warnings

    from tqdm import tqdm

    def refused(thread):
        raise RuntimeError(f"can't start new thread ({thread.name})")

    monkeypatch.setattr(threading.Thread, "start", refused)
    monkeypatch.setattr(tqdm, "monitor_interval", 10)  # tqdm's default, as in a fresh process
    monkeypatch.setattr(tqdm, "monitor", None)
    torch.manual_seed(0)
    task = CopyTask(min_len=2, max_len=4)
    model = EncoderDecoder(TransformerConfig.small(task.vocab_size, num_layers=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, task, TrainConfig(steps=3, eval_every=3, eval_size=4), log=None)
    printed = capfd.readouterr()
    assert not caught, f"the run warned: {[str(w.message) for w in caught]}"
    assert printed.out == printed.err == "", f"the run printed: {printed}"


def test_a_batch_from_make_batch_goes_to_train_step_as_the_model_s_own_batches_do():
    """Chapter 6's loop: ``make_batch``'s ``Batch`` is what ``train_step`` reads (its
    ``args`` and ``labels``), and a step on it is the step on the model's own teacher
    forcing of the same sequences."""
    parts = Parts.reference()
    src, tgt = CopyTask().sample(16, torch.Generator().manual_seed(0))
    losses, weights = [], []
    for make in (lambda m: parts.make_batch(src, tgt, PAD), lambda m: m.teacher_forcing(src, tgt)):
        torch.manual_seed(0)
        model = EncoderDecoder(TransformerConfig.small(13, num_layers=1), parts=parts).double()
        optimizer, scheduler = make_optimizer(model, TrainConfig())
        loss_fn = parts.LabelSmoothingLoss(0.1, ignore_index=PAD)
        losses.append(parts.train_step(model, make(model), loss_fn, optimizer, scheduler))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(losses[0], losses[1]) and torch.equal(weights[0], weights[1])
    assert losses[0].requires_grad is False and losses[0].dim() == 0
