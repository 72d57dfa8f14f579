"""Batches by a token budget: within the budget, every example once, similar lengths
together, the same batches for the same seed; and the training command's --max-tokens."""

from __future__ import annotations

import json

import pytest
import torch

from annotated_transformer import cli
from annotated_transformer.data import PAD, make_task
from annotated_transformer.data.batching import TokenBudgetStream, token_batches
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.train import Runtime, TrainConfig, train


def lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 40, (n,), generator=generator).tolist()
    tgt = [s + int(d) for s, d in zip(src, torch.randint(0, 6, (n,), generator=generator),
                                      strict=True)]
    return src, tgt


@pytest.mark.parametrize("max_tokens", [45, 100, 1000])
def test_token_batches_keep_the_budget_and_cover_every_example_once(max_tokens):
    src, tgt = lengths(500)
    batches = token_batches(src, tgt, max_tokens, torch.Generator().manual_seed(0))
    for batch in batches:
        assert batch, "an empty batch"
        assert len(batch) * max(src[i] for i in batch) <= max_tokens, "source side over budget"
        assert len(batch) * max(tgt[i] for i in batch) <= max_tokens, "target side over budget"
    flat = sorted(i for batch in batches for i in batch)
    assert flat == list(range(500)), "every example exactly once"


def test_token_batches_put_similar_lengths_together_and_fill_the_budget():
    src, tgt = lengths(500)
    batches = token_batches(src, tgt, 200, torch.Generator().manual_seed(0))
    spans = sorted((min((src[i], tgt[i]) for i in b), max((src[i], tgt[i]) for i in b))
                   for b in batches)
    for (_, high), (low, _) in zip(spans, spans[1:], strict=False):
        assert high <= low, f"batches of overlapping lengths: {spans}"
    # the padding a batch carries is small next to random batches of the same sizes
    def padding(groups):
        return sum(len(g) * max(tgt[i] for i in g) - sum(tgt[i] for i in g) for g in groups)
    sizes = [len(b) for b in batches]
    order = torch.randperm(500, generator=torch.Generator().manual_seed(1)).tolist()
    random, start = [], 0
    for size in sizes:
        random.append(order[start:start + size])
        start += size
    assert padding(batches) < 0.5 * padding(random)
    used = sum(len(b) * max(max(src[i], tgt[i]) for i in b) for b in batches)
    assert used > 0.8 * 200 * len(batches), "the batches are much smaller than the budget"


def test_token_batches_are_deterministic_given_the_seed():
    src, tgt = lengths(300)
    first = token_batches(src, tgt, 150, torch.Generator().manual_seed(3))
    assert first == token_batches(src, tgt, 150, torch.Generator().manual_seed(3))
    assert first != token_batches(src, tgt, 150, torch.Generator().manual_seed(4))


@pytest.mark.parametrize("max_tokens, message", [(0, "at least 1"), (30, "longest example")])
def test_token_batches_refuse_a_budget_below_one_example(max_tokens, message):
    with pytest.raises(ValueError, match=message):
        token_batches([3, 40], [5, 9], max_tokens, torch.Generator())


@pytest.mark.parametrize("name", ["dates", "addition"])
def test_token_batches_of_a_task(name):
    task = make_task(name)
    batches = TokenBudgetStream(task, max_tokens=300, seed=0, pool_size=200)
    pool = task.pairs(200, batches.generator(0))
    count = len(token_batches([len(task.source_ids(s)) for s, _ in pool],
                              [len(task.target_ids(t)) for _, t in pool], 300,
                              batches.generator(0)))  # the same draws: pool, then batches
    seen = []
    for k, (src, tgt) in zip(range(count), batches, strict=False):
        assert src.numel() <= 300 and tgt.numel() <= 300, f"batch {k} over budget"
        assert src.size(0) == tgt.size(0) and (src[:, -1] != PAD).any(), "trimmed to its longest"
        seen += [(tuple(s), tuple(t)) for s, t in zip(src.tolist(), tgt.tolist(), strict=True)]
    expected = task.encode_pairs(pool)
    assert len(seen) == 200
    assert sorted(len([x for x in s if x != PAD]) for s, _ in seen) == sorted(
        int(n) for n in (expected[0] != PAD).sum(dim=1)), "the pool's examples, each once"
    again = TokenBudgetStream(task, max_tokens=300, seed=0, pool_size=200)
    for (a, b), (c, d) in zip(batches, again, strict=False):
        assert torch.equal(a, c) and torch.equal(b, d)
        break
    with pytest.raises(ValueError, match="longest sequence"):
        TokenBudgetStream(task, max_tokens=5)


def _run(out, steps, resume=False):
    torch.manual_seed(0)
    task = CopyTask(min_len=2, max_len=9)
    model = EncoderDecoder(TransformerConfig.small(task.vocab_size, num_layers=1, dropout=0.1))
    history = train(model, task, TrainConfig(steps=steps, max_tokens=60, eval_every=4,
                                             eval_size=10),
                    runtime=Runtime(out=out, resume=resume, log_every=4))
    return model, history


def test_a_resumed_run_by_token_budget_takes_the_same_batches(tmp_path):
    straight, history = _run(tmp_path / "straight", 10)
    _run(tmp_path / "resumed", 6)
    resumed, _ = _run(tmp_path / "resumed", 10, resume=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), f"{name} differs after resuming"
    assert len(history.loss) == 10 and history.tokens > 0


def test_train_with_max_tokens_on_the_command_line(capsys, tmp_path):
    status = cli.main(["train", "--task", "dates", "--max-tokens", "400", "--steps", "3",
                       "--eval-size", "8", "--device", "cpu", "--no-progress", "--out",
                       str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "3 steps of at most 400 tokens" in out
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--max-tokens", "0"], "error: --max-tokens must be at least 1"),
    (["--max-tokens", "10"], "error: --max-tokens 10 is smaller than the longest sequence"),
    (["--max-tokens", "400", "--batch-size", "8"], "error: --max-tokens and --batch-size"),
])
def test_bad_max_tokens_exit_2_with_one_line(capsys, tmp_path, argv, message):
    status = cli.main(["train", "--task", "dates", "--out", str(tmp_path), "--device", "cpu",
                       *argv])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(message) and len(err.splitlines()) == 1, err
