"""Chapter 8 on real text: the text task's split, perplexity, and writing from prompts
(prefill, positions while cached, prompts of different lengths in one batch, the context
window), and ``train``, ``evaluate`` and ``translate`` on a text file."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer.data import BOS, EOS, PAD, DataError, make_task
from annotated_transformer.data.text import TINY_SHAKESPEARE, TextTask
from annotated_transformer.incremental import DecoderCache
from annotated_transformer.model import DecoderOnlyTransformer, TransformerConfig
from annotated_transformer.parts import Parts
from annotated_transformer.sampling import complete, crop
from annotated_transformer.text_model import count_model_perplexity, perplexity, write_text

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / TINY_SHAKESPEARE


@pytest.fixture(scope="module")
def random_text(tmp_path_factory) -> Path:
    """3,000 characters drawn from 20 letters with a fixed seed: every 12 characters in a
    row occur once, so a window tells where it comes from."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("text") / "random.txt"
    path.write_text("".join(rng.choice("abcdefghijklmnopqrst") for _ in range(3000)),
                    encoding="utf-8")
    return path


def small_model(vocab_size: int, max_len: int = 16, seed: int = 0) -> DecoderOnlyTransformer:
    """A random decoder-only model in float64 that never writes PAD, BOS or EOS."""
    torch.manual_seed(seed)
    config = TransformerConfig.small(vocab_size, d_model=32, d_ff=64, num_layers=2,
                                     max_len=max_len)
    model = DecoderOnlyTransformer(config, parts=Parts("solutions")).double().eval()
    with torch.no_grad():
        model.generator.bias[[PAD, BOS, EOS]] = -1e9
    return model


# ---------------------------------------------------------------- the task


def test_the_split_is_by_position_disjoint_and_deterministic(random_text):
    task = TextTask(str(random_text), context=12)
    text = random_text.read_text(encoding="utf-8")
    assert task.split == 2700 and task.vocab.decode(task.ids.tolist()) == text
    training, held_out = text[:task.split], text[task.split:]
    src, tgt = task.sample(200, torch.Generator().manual_seed(0))
    assert (src == BOS).all() and src.shape == (200, 1) and tgt.shape == (200, 12)
    for row in tgt.tolist():
        window = task.vocab.decode(row)
        assert window in training and window not in held_out
    _, held = task.held_out_set(1000)
    assert held.size(0) == 300 // 12  # every whole window of the held-out part
    assert "".join(task.vocab.decode(r) for r in held.tolist()) == held_out[:25 * 12]
    again = TextTask(str(random_text), context=12)
    assert again.split == task.split
    assert torch.equal(again.sample(200, torch.Generator().manual_seed(0))[1], tgt)
    assert torch.equal(again.held_out_set(1000)[1], held)


def test_every_character_of_a_window_is_scored_and_none_is_eos(random_text):
    task = TextTask(str(random_text), context=12)
    model = small_model(len(task.vocab), max_len=task.context)
    src, tgt = task.sample(4, torch.Generator().manual_seed(1))
    batch = model.teacher_forcing(src, tgt)
    tokens, _ = batch.args
    assert tokens.size(1) == task.context  # BOS and 11 characters: the model's max_len
    assert torch.equal(tokens[:, 0], torch.full((4,), BOS))
    assert torch.equal(tokens[:, 1:], tgt[:, :-1]) and torch.equal(batch.labels, tgt)
    assert not (batch.labels == EOS).any()


def test_tiny_shakespeare_is_in_the_repository_and_split_nine_to_one():
    task = make_task("text", path=str(CORPUS))
    assert len(task.text) == 1_115_394 and task.text.startswith("First Citizen:\n")
    assert task.split == round(0.9 * 1_115_394) and len(task.vocab) == 3 + 65
    assert task.context == 64 and task.spec()["path"] == str(CORPUS)


@pytest.mark.parametrize("content, message", [(None, "no such file"), ("", "empty"),
                                               ("too short", "too few")])
def test_a_bad_text_file_is_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        make_task("text", path=str(path))
    with pytest.raises(DataError, match="--data FILE"):
        make_task("text")


# ---------------------------------------------------------------- perplexity


def test_perplexity_is_the_exp_of_torchs_cross_entropy(random_text):
    task = TextTask(str(random_text), context=12)
    model = small_model(len(task.vocab), max_len=task.context)
    _, held = task.held_out_set(10**6)
    inputs = torch.cat([torch.full((held.size(0), 1), BOS), held[:, :-1]], dim=1)
    logits = model(inputs, model.parts.causal_mask(inputs.size(1)))
    expected = math.exp(F.cross_entropy(logits.flatten(0, 1), held.flatten()).item())
    assert perplexity(model, task, batch_size=7) == pytest.approx(expected, rel=1e-9)
    assert perplexity(model, task, windows=3) != pytest.approx(expected, rel=1e-6)


def test_a_uniform_model_has_the_vocabularys_size_as_perplexity(random_text):
    task = TextTask(str(random_text), context=12)
    model = small_model(len(task.vocab), max_len=task.context)
    with torch.no_grad():
        model.generator.weight.zero_()
        model.generator.bias.zero_()
    assert perplexity(model, task) == pytest.approx(len(task.vocab), rel=1e-9)


def overlapping_count(text: str, sub: str) -> int:
    return sum(text.startswith(sub, i) for i in range(len(text)))


@pytest.mark.parametrize("order", [1, 2, 3])
def test_a_count_model_scores_each_held_out_character_from_its_window(tmp_path, order):
    rng = random.Random(1)
    path = tmp_path / "text.txt"
    path.write_text("".join(rng.choice("abcd") for _ in range(400)), encoding="utf-8")
    task = TextTask(str(path), context=8)
    training = task.vocab.decode(task.part(held_out=False).tolist())
    log_p, scored = 0.0, 0
    for window in task.held_out_set(10**6)[1].tolist():
        window = task.vocab.decode(window)
        for i, c in enumerate(window):
            h = window[max(0, i - order + 1):i]  # never a character of the window before
            seen = overlapping_count(training, h) if h else len(training)
            log_p += math.log((overlapping_count(training, h + c) + 0.5) / (seen + 0.5 * 4))
            scored += 1
    expected = math.exp(-log_p / scored)
    assert count_model_perplexity(task, order, smoothing=0.5) == pytest.approx(expected, rel=1e-12)


def test_counting_learns_a_periodic_text_and_the_unigram_does_not(tmp_path):
    path = tmp_path / "abc.txt"
    path.write_text("abc" * 200, encoding="utf-8")
    task = TextTask(str(path), context=9)
    assert count_model_perplexity(task, 1) == pytest.approx(3, rel=1e-2)
    assert count_model_perplexity(task, 3, smoothing=1e-6) < 1.2  # only a window's start unsure
    with pytest.raises(ValueError, match="order"):
        count_model_perplexity(task, 0)


# ---------------------------------------------------------------- writing


def record_positions(monkeypatch) -> list[int]:
    """How many positions each pass of the cache computes."""
    widths: list[int] = []
    original = DecoderCache.run_layers

    def run_layers(self, x, *args):
        widths.append(x.size(1))
        return original(self, x, *args)

    monkeypatch.setattr(DecoderCache, "run_layers", run_layers)
    return widths


def test_prefill_then_cached_steps_give_the_full_forward_pass_logits(monkeypatch):
    model = small_model(30, max_len=16)
    tokens = torch.cat([torch.full((3, 1), BOS),
                        torch.randint(3, 30, (3, 11), generator=torch.Generator()
                                      .manual_seed(2))], dim=1)  # [3, 12]
    widths = record_positions(monkeypatch)
    cache = DecoderCache(model)
    never_written = torch.tensor([PAD, BOS, EOS])  # their logits are -1e9 plus a logit
    written = torch.ones(30, dtype=torch.bool).index_fill(0, never_written, False)
    for t in range(5, 13):  # a prompt of 5, then 7 steps of one token
        mask = model.parts.causal_mask(t)
        cached = cache.next_logits(tokens[:, :t], mask)
        full = model(tokens[:, :t], mask)[:, -1]
        # float64 logits of order 1, summed in another order: agree to ~1e-15 (1e-10 leaves
        # room for any processor's kernels); the masked ones are compared as masked (at
        # -1e9, one rounding step of float64 is already 1.2e-7).
        assert torch.allclose(cached[:, written], full[:, written], rtol=0, atol=1e-10), (
            f"position {t - 1}")
        assert (cached[:, ~written] < -1e8).all() and (full[:, ~written] < -1e8).all()
    assert cache.enabled and cache.recomputed == 0
    assert widths == [5] + [1] * 7  # the prompt in one pass, then one position a step


def test_complete_prefills_the_prompt_in_one_pass(monkeypatch):
    model = small_model(30)
    prompt = torch.tensor([[BOS, 5, 6, 7, 8, 9]])
    widths = record_positions(monkeypatch)
    out = complete(model, prompt, 4)
    assert out.shape == (1, 4) and widths == [6, 1, 1, 1]


@pytest.mark.parametrize("cache", [True, False])
def test_prompts_of_different_lengths_in_one_batch_continue_as_alone(cache):
    model = small_model(30, max_len=32)
    generator = torch.Generator().manual_seed(4)
    prompts = [[BOS] + torch.randint(3, 30, (n,), generator=generator).tolist()
               for n in (1, 6, 3, 9)]
    batch = torch.tensor([p + [PAD] * (10 - len(p)) for p in prompts])
    together = complete(model, batch, 12, cache=cache)
    for row, prompt in zip(together.tolist(), prompts, strict=True):
        alone = complete(model, torch.tensor([prompt]), 12, cache=cache)
        assert row == alone[0].tolist()


def by_hand(model: DecoderOnlyTransformer, prompt: list[int], new: int, window: int
            ) -> list[int]:
    """Greedy writing with the whole window recomputed each step: BOS and the latest
    ``window - 1`` tokens once the sequence is longer than ``window``."""
    sequence = list(prompt)
    for _ in range(new):
        seen = sequence if len(sequence) <= window else [sequence[0]] + sequence[1 - window:]
        tokens = torch.tensor([seen])
        logits = model(tokens, model.parts.causal_mask(len(seen)))[0, -1]
        sequence.append(int(logits.argmax()))
    return sequence[len(prompt):]


@pytest.mark.parametrize("cache", [True, False])
def test_writing_past_the_context_window_crops_it_as_by_hand(cache):
    model = small_model(30, max_len=8)
    prompts = [[BOS, 4, 5, 6], [BOS, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]  # 4 and 11 > 8
    batch = torch.tensor([p + [PAD] * (11 - len(p)) for p in prompts])
    out = complete(model, batch, 20, cache=cache)
    for row, prompt in zip(out.tolist(), prompts, strict=True):
        assert row == by_hand(model, prompt, 20, window=8)


def test_crop_keeps_bos_and_the_latest_tokens():
    tokens = torch.arange(10)[None]
    assert crop(tokens, 10) is tokens and crop(tokens, None) is tokens
    assert crop(tokens, 4).tolist() == [[0, 7, 8, 9]]
    with pytest.raises(ValueError, match="no room"):
        crop(tokens, 1)


def test_write_text_returns_the_prompts_and_their_continuations(random_text):
    task = TextTask(str(random_text), context=12)
    model = small_model(len(task.vocab), max_len=task.context)
    written = write_text(model, task, ["abc", "q"], 20, temperature=1.0, top_k=5, seed=3)
    assert [w[:3] for w in written] == ["abc", "q" + written[1][1:3]]
    assert [len(w) for w in written] == [23, 21]
    assert write_text(model, task, ["abc", "q"], 20, temperature=1.0, top_k=5,
                      seed=3) == written
    assert write_text(model, task, ["abc"], 20) == write_text(model, task, ["abc"], 20,
                                                              cache=False)


# ---------------------------------------------------------------- the command line


def test_train_evaluate_and_translate_a_text_file(tmp_path, capsys):
    from annotated_transformer import cli

    corpus = tmp_path / "slice.txt"
    corpus.write_text(CORPUS.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    out = tmp_path / "run"
    assert cli.main(["train", "--task", "text", "--data", str(corpus), "--context", "16",
                     "--steps", "3",
                     "--eval-every", "3", "--eval-size", "8", "--layers", "1",
                     "--d-model", "32", "--device", "cpu", "--no-progress",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out perplexity" in printed and "exact match" not in printed
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["perplexity"] == pytest.approx(math.exp(record["eval_loss"]), rel=1e-3)
    assert "exact_match" not in record
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["task"]["context"] == state["model_config"]["max_len"] == 16

    assert cli.main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--json",
                     "--size", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_examples"] == 8 and "exact_match" not in result
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))

    assert cli.main(["translate", "--checkpoint", str(out / "checkpoint.pt"),
                     "--temperature", "1", "ROMEO:"]) == 0
    assert capsys.readouterr().out.strip()

    # the maps are of one pass over the prompt and the output: no more than 16 positions
    assert cli.main(["attention", "--checkpoint", str(out / "checkpoint.pt"), "ROMEO:",
                     "--out", str(tmp_path / "maps.png")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert cli.main(["attention", "--checkpoint", str(out / "checkpoint.pt"), "a" * 20,
                     "--out", str(tmp_path / "maps.png")]) == 2
    assert "too long for the model's 16 positions" in capsys.readouterr().err


def test_train_refuses_the_text_task_without_its_file(tmp_path, capsys):
    from annotated_transformer import cli

    assert cli.main(["train", "--task", "text", "--out", str(tmp_path), "--device",
                     "cpu"]) == 2
    assert "--data FILE" in capsys.readouterr().err
    assert cli.main(["train", "--task", "text", "--data", str(tmp_path / "none.txt"),
                     "--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["train", "--task", "copy", "--context", "16", "--out", str(tmp_path),
                     "--device", "cpu"]) == 2
    assert "--context is for --task text" in capsys.readouterr().err


def test_the_chapters_checkpoint_beats_the_uniform_guess_on_held_out_shakespeare():
    """``chapters/checkpoints/shakespeare.pt`` (``train --task text`` on Tiny Shakespeare,
    exported in float16), which Chapter 8 loads: the repository's corpus, and a held-out
    perplexity far below the vocabulary's size."""
    from annotated_transformer import checkpoint

    state = checkpoint.load(ROOT / "chapters" / "checkpoints" / "shakespeare.pt")
    assert state["task"]["path"] == TINY_SHAKESPEARE and state["kind"] == "decoder-only"
    task = checkpoint.build_task(state, str(CORPUS))
    model = checkpoint.build_model(state)
    assert model.config.max_len == task.context == 64
    assert perplexity(model, task, windows=100) < 6 < len(task.vocab)
