"""Incremental decoding: the same tokens as recomputing every prefix, on the course's
trained checkpoints (greedy and beam search, both kinds of model, the reference's and the
fast parts), with the cache really used; and a clean fallback to recomputing for parts
that do not follow the chapters' contract, a mask that is not causal, or training mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from annotated_transformer import checkpoint
from annotated_transformer.data import BOS, EOS, PAD
from annotated_transformer.incremental import DecoderCache, cached, find_parents
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts

CHECKPOINTS = Path(__file__).resolve().parents[2] / "chapters" / "checkpoints"


def load(name: str, parts: str | None = None):
    state = checkpoint.load(CHECKPOINTS / name)
    task = checkpoint.build_task(state)
    return task, checkpoint.build_model(state, Parts(parts) if parts else None)


def count_full_decodes(monkeypatch) -> list[int]:
    """Calls of the decoder on the whole prefix (the cache's first-step check is one)."""
    calls = [0]
    original = EncoderDecoder.full_decode

    def counted(self, *args):
        calls[0] += 1
        return original(self, *args)

    monkeypatch.setattr(EncoderDecoder, "full_decode", counted)
    return calls


@pytest.mark.parametrize("parts", [None, "fast"])
@pytest.mark.parametrize("beam", [None, 4])
def test_dates_checkpoint_decodes_the_same_tokens(monkeypatch, parts, beam):
    task, model = load("dates.pt", parts)
    src, tgt = task.held_out_set(64)
    recomputed = model.generate(src, tgt.size(1), beam, cache=False)
    calls = count_full_decodes(monkeypatch)
    incremental = model.generate(src, tgt.size(1), beam)
    assert torch.equal(incremental, recomputed)
    assert calls[0] == 1  # only the first step's check ran the whole prefix


def test_translation_checkpoint_decodes_the_same_tokens(monkeypatch):
    pytest.importorskip("tokenizers")
    from annotated_transformer.metrics import Decoding, translate_texts

    task, model = load("tiny-de-en.pt")
    task.dataset = str(CHECKPOINTS.parent / "data" / "tiny-de-en")
    sources = [s for s, _ in task.split("test")][:20]
    for beam in (1, 4):
        before = translate_texts(model, task, sources, Decoding(beam_size=beam, cache=False))
        after = translate_texts(model, task, sources, Decoding(beam_size=beam))
        assert after == before


def test_decoder_only_checkpoint_completes_the_same_tokens():
    task, model = load("addition.pt")
    prompts, _ = task.held_out_set(100)  # prompts of several lengths, padded
    recomputed = model.generate(prompts, 8, cache=False)
    assert torch.equal(model.generate(prompts, 8), recomputed)
    generator = torch.Generator().manual_seed(3)
    sampled = model.generate(prompts, 8, temperature=1.0, generator=generator, cache=False)
    generator = torch.Generator().manual_seed(3)
    assert torch.equal(model.generate(prompts, 8, temperature=1.0, generator=generator),
                       sampled)


def test_a_cached_step_equals_the_whole_prefix_in_float64():
    """Every position's output, not only the tokens: the incremental decoder against the
    full one on a random model in float64, step by step, with the rows reordered within
    their source as a beam does (two hypotheses per source)."""
    torch.manual_seed(0)
    model = EncoderDecoder(TransformerConfig.small(40, max_len=32, norm_first=False)
                           ).double().eval()
    src = torch.randint(3, 40, (4, 7))
    src[1, 4:] = PAD
    src_mask = model.parts.padding_mask(src, PAD).repeat_interleave(2, dim=0)
    memory = model.encode(src, src_mask[::2]).repeat_interleave(2, dim=0)  # [8, 7, D]
    ys = torch.full((8, 1), BOS)
    cache = DecoderCache(model)
    for t in range(1, 12):
        mask = model.parts.causal_mask(t)
        hidden = cache.decode(memory, src_mask, ys, mask)
        torch.testing.assert_close(hidden, model.full_decode(memory, src_mask, ys, mask),
                                   rtol=1e-12, atol=1e-12)
        parent = (torch.arange(4) * 2)[:, None] + torch.randint(0, 2, (4, 2))
        ys = torch.cat([ys[parent.view(-1)], torch.randint(3, 40, (8, 1))], dim=1)
    assert cache.enabled and cache.recomputed == 0


def test_rows_are_matched_to_their_parents_within_their_source():
    previous = torch.tensor([[0, 1, 5], [0, 1, 6], [1, 1, 5], [1, 1, 7]])
    new = torch.tensor([[0, 1, 6], [0, 1, 6], [1, 1, 7], [1, 1, 5]])
    assert find_parents(previous, previous.clone()) == slice(None)  # greedy: in place
    parents = find_parents(previous, new)
    assert parents.tolist() == [1, 1, 3, 2]
    assert torch.equal(previous[parents], new)
    # the same tokens of another source's row are no parent
    assert find_parents(previous, torch.tensor([[0, 1, 7]])) is None


class Doubled(nn.Module):
    """An attention whose forward is twice the contract's (a wrong learner's part)."""

    def __init__(self, inner: nn.Module, keep_names: bool) -> None:
        super().__init__()
        self.inner = inner
        if keep_names:  # the contract's names, with a forward that computes otherwise
            for name in ("q_proj", "k_proj", "v_proj", "out_proj", "attention", "dropout",
                         "num_heads"):
                setattr(self, name, getattr(inner, name))

    def forward(self, query, key, value, mask=None):
        return 2 * self.inner(query, key, value, mask)


@pytest.mark.parametrize("keep_names", [True, False])
def test_parts_outside_the_contract_fall_back_to_recomputing(keep_names):
    torch.manual_seed(0)
    model = EncoderDecoder(TransformerConfig.small(30, max_len=40)).eval()
    for layer in model.decoder.layers:
        layer.self_attn = Doubled(layer.self_attn, keep_names)
    src = torch.randint(3, 30, (5, 6))
    src_mask = model.parts.padding_mask(src, PAD)
    expected = model.generate(src, 20, 3, cache=False)
    with cached(model) as cache:
        got = model.parts.beam_search(model, src, src_mask, 20, BOS, EOS, PAD, beam_size=3)
    assert torch.equal(got, expected)
    assert not cache.enabled and cache.recomputed > 1


def test_a_mask_that_is_not_causal_and_training_mode_fall_back():
    torch.manual_seed(0)
    model = EncoderDecoder(TransformerConfig.small(30, max_len=40, dropout=0.0)).eval()
    src = torch.randint(3, 30, (2, 5))
    memory = model.encode(src, None)
    tgt = torch.randint(3, 30, (2, 4))
    with cached(model) as cache:
        model.decode(memory, None, tgt[:, :1], None)  # one position: nothing to hide
        assert cache.enabled
        out = model.decode(memory, None, tgt, torch.ones(4, 4, dtype=torch.bool))
    assert not cache.enabled
    torch.testing.assert_close(out, model.full_decode(memory, None, tgt,
                                                      torch.ones(4, 4, dtype=torch.bool)))
    model.train()
    with cached(model) as cache:
        model.decode(memory, None, tgt[:, :1], model.parts.causal_mask(1))
    assert not cache.enabled


def test_a_new_position_goes_through_the_parts_attention_step():
    """Chapter 8's exercise computes each new position's self-attention when it works; a
    stub (or one that computes something else) is left out after its first try, and the
    tokens are the same either way."""
    task, model = load("addition.pt")
    prompts, _ = task.held_out_set(8)
    recomputed = model.generate(prompts, 8, cache=False)
    parts, calls = model.parts, []

    class Counting:
        def __init__(self, step):
            self.step = step

        def __getattr__(self, name):
            return getattr(parts, name)

        def attention_step(self, *args):
            calls.append(args[1].shape)
            return self.step(*args)

    def stub(*args):
        raise NotImplementedError("Exercise 8.3: attention_step is not implemented yet")

    def wrong(attn, x, cache):  # attends to the new position alone
        output, (k, v) = parts.attention_step(attn, x, None)
        return output, (torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2))

    for step, used in ((parts.attention_step, True), (stub, False), (wrong, False)):
        calls.clear()
        model.parts = Counting(step)
        try:
            assert torch.equal(model.generate(prompts, 8), recomputed)
        finally:
            model.parts = parts
        assert (len(calls) > 1) == used and calls  # asked once at least, then kept or dropped
        assert all(shape[1] == 1 for shape in calls)
