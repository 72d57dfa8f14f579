"""Graded tests of chapter 7: beam search.

References, all written here without beam search's code: a brute-force search that scores
every sequence the model can produce, the rules of the search followed literally one row
at a time with Python lists, a greedy decoder (6.4) written with PyTorch's own model, and
hand-built models whose best sequence is worked out in the comments. A fake model
(``RuleModel``) takes its next-token log-probabilities from a Python function of the source
and the prefix; a small random encoder-decoder in float64 built from PyTorch's own layers
(``torch_models.TorchEncoderDecoder``) is the real thing.

The functions of the probes section (``beam_search_of``) run in the grading worker, with
``impl`` the chapter module under test; they build the model there (a rule is named by a
string and plain parameters, a Transformer travels as its state dict) and return plain data.
Everything else runs in the grader, which never imports the code under test.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re

import pytest
import torch
from torch import nn

from annotated_transformer.model import TransformerConfig

from checks import assert_tensor
from mistakes import DTYPE_CLASH, named, run_naming
from torch_models import TorchEncoderDecoder, greedy_decode

CHAPTER = 7
EXERCISES = {
    "7.1": "beam_search: the best-scoring hypotheses, batched, with a length penalty",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"7.1": ("4.2",)}
PAD, BOS, EOS = 0, 1, 2
f64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: one thread runs them faster than several that wait for
    each other (much faster on a busy machine). The probes do the same in the worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- probes (run in the worker)


def beam_search_of(impl, model, src, src_mask, max_len, **options):
    """``beam_search`` of the model described by ``model`` (see ``build_model``)."""
    with one_thread(), torch.no_grad():
        return impl.beam_search(build_model(**model), src, src_mask, max_len, BOS, EOS, PAD,
                                **options)


def beam_search_contract(impl, model, src, src_mask, max_len, **options):
    """``beam_search_of``, with the devices of the source and of what came back."""
    out = beam_search_of(impl, model, src, src_mask, max_len, **options)
    return {"output": out, "device": getattr(out, "device", None) and out.device.type,
            "src_device": src.device.type}


# ---------------------------------------------------------------- models


@contextlib.contextmanager
def one_thread():
    """One thread in the worker too, as ``_one_thread`` in the grader."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_model(rule=None, params=None, logits=False, transformer=None, vocab_size=None,
                log_softmax=False):
    """The model a probe searches with, from plain data: ``rule`` names a rule maker of this
    file (``RULES``) called with ``params``; or ``transformer`` is the state dict of
    ``transformer(vocab_size, seed)`` (in the dtype of its weights), whose generator returns
    log-probabilities if ``log_softmax``, logits if not."""
    if rule is not None:
        return RuleModel(RULES[rule](**params), params["vocab_size"], logits=logits)
    model = transformer_model(vocab_size, log_softmax)
    model.load_state_dict(transformer)
    return model.to(next(iter(transformer.values())).dtype)


class RuleModel(nn.Module):
    """A stand-in for the Transformer whose next-token log-probabilities come from a rule.

    ``rule(src, prefix)`` gets one row's source (a tuple of ints, padding included) and the
    tokens generated so far (a tuple, BOS left out) and returns ``vocab_size``
    log-probabilities. ``decode`` writes the source and the prefix into each position's
    hidden vector; ``generator`` reads them back and asks the rule. With ``logits=True``
    it adds a different constant to each hypothesis's log-probabilities, as a real model's
    unnormalised logits do. It checks the shapes and masks it is given.
    """

    def __init__(self, rule, vocab_size, logits=False):
        super().__init__()
        self.rule, self.vocab_size, self.logits = rule, vocab_size, logits

    def encode(self, src, src_mask):
        return src.to(f64).unsqueeze(-1)  # [B, Ls, 1]: the source itself

    def decode(self, memory, src_mask, tgt, tgt_mask):
        rows, length = tgt.shape
        assert memory.size(0) == rows, (
            f"decode got memory for {memory.size(0)} hypotheses but tgt for {rows}; repeat the "
            f"memory once per hypothesis (repeat_interleave(beam_size, dim=0))")
        if src_mask is not None:
            real = (memory[..., 0] != PAD)[:, None, None, :]
            assert torch.equal(src_mask.to("cpu").bool().expand_as(real), real), (
                "src_mask does not belong to the memory it is given with; repeat both the "
                "same way (repeat_interleave(beam_size, dim=0))")
        assert tgt_mask is not None, "beam_search passed tgt_mask=None; pass a causal mask"
        mask = torch.as_tensor(tgt_mask).to("cpu").bool()
        full = mask.expand(rows, 1, length, length) if mask.dim() <= 4 else mask
        assert torch.equal(full[0, 0], torch.ones(length, length, dtype=torch.bool).tril()), (
            "tgt_mask should be the causal mask (True on and below the diagonal)")
        src = memory[..., 0].to("cpu")  # [N, Ls]
        visible = torch.ones(length, length, dtype=torch.bool).tril()
        prefixes = tgt.to("cpu", f64)[:, None, :].expand(rows, length, length)
        prefixes = prefixes.masked_fill(~visible, -1.0)  # position i sees tgt[:, :i + 1]
        header = torch.full((rows, length, 1), float(src.size(1)), dtype=f64)
        return torch.cat([header, src[:, None, :].expand(rows, length, -1), prefixes], -1)

    def generator(self, hidden):
        flat = hidden.reshape(-1, hidden.size(-1)).tolist()
        out = []
        for h in flat:
            src_len = int(h[0])
            src = tuple(int(x) for x in h[1:1 + src_len])
            prefix = tuple(int(x) for x in h[1 + src_len:] if x >= 0)[1:]  # BOS left out
            log_probs = torch.as_tensor(self.rule(src, prefix), dtype=f64)
            if self.logits:
                log_probs = log_probs + 2.5 * len(prefix) - 1.5 * sum(prefix) + 0.7 * sum(src)
            out.append(log_probs)
        return torch.stack(out).view(*hidden.shape[:-1], self.vocab_size)


def table_rule(seed, vocab_size, max_len):
    """A random next-token distribution for each (source, last token, position)."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(7, vocab_size, max_len, vocab_size, generator=generator, dtype=f64) * 1.5
    table[:, :, :, EOS] -= 1.5  # longer sequences, so that the length penalty matters
    table[:, :, :, [PAD, BOS]] -= 6.0  # possible, but rare: the outputs stay readable
    table = torch.log_softmax(table, dim=-1)

    def rule(src, prefix):
        last = prefix[-1] if prefix else BOS
        return table[sum(src) % 7, last, len(prefix)].tolist()

    return rule


def tree_rule(tree, vocab_size):
    """Log-probabilities from ``{prefix: {token: probability}}``; other tokens share the rest
    equally; a prefix not in the tree gets the uniform distribution."""

    def rule(src, prefix):
        given = tree.get(prefix, {})
        rest = (1.0 - sum(given.values())) / (vocab_size - len(given))
        return [math.log(given.get(token, rest)) for token in range(vocab_size)]

    return rule


def format_rule(vocab_size):
    """The rule of ``test_output_format``: row 0 ends at once (EOS is almost certain after
    BOS); row 1 after two tokens; a source that sums to a multiple of 3 never produces EOS."""

    def rule(src, prefix):
        src = [t for t in src if t != PAD]
        if sum(src) % 3 == 0:
            return tree_rule({(): {4: 0.9}}, vocab_size)(src, ())
        if src[0] == 4:
            return tree_rule({(): {EOS: 0.99}}, vocab_size)(src, ())
        return tree_rule({(): {5: 0.9}, (5,): {3: 0.9}, (3,): {EOS: 0.9}}, vocab_size)(
            src, prefix[-1:])

    return rule


RULES = {"table": table_rule, "tree": tree_rule, "format": format_rule}


class Transformer(TorchEncoderDecoder):
    """PyTorch's Transformer with the course's interface (``torch_models``), whose generator
    returns logits, as the course's does, or log-probabilities with ``log_softmax=True``."""

    def __init__(self, config, log_softmax=False):
        super().__init__(config)
        self.log_softmax = log_softmax

    def generator(self, hidden):
        logits = self.projection(hidden)
        return torch.log_softmax(logits, dim=-1) if self.log_softmax else logits


def transformer_model(vocab_size, log_softmax=False):
    """A small encoder-decoder of PyTorch's own layers in float64."""
    config = TransformerConfig.small(vocab_size, dropout=0.0, tie_embeddings=False)
    return Transformer(config, log_softmax).double().eval()


def transformer(vocab_size, seed):
    """A small random encoder-decoder in float64."""
    torch.manual_seed(seed)
    model = transformer_model(vocab_size)
    with torch.no_grad():
        model.projection.bias[[PAD, BOS]] -= 6.0  # possible, but rare: the outputs stay readable
    return model


def transformer_rule(model, src_row, vocab_size, max_len):
    """The model's log-probabilities after every prefix the search can extend (up to
    ``max_len - 2`` tokens, none of them EOS) of one row, by teacher forcing: one decode
    per prefix length, for all the prefixes of that length at once."""
    src = torch.tensor([[t for t in src_row if t != PAD]])
    mask = torch.ones(1, 1, 1, src.size(1), dtype=torch.bool)
    others = [t for t in range(vocab_size) if t != EOS]
    table, raw = {}, {}
    with torch.no_grad():
        memory = model.encode(src, mask)
        for n in range(max_len - 1):
            prefixes = list(itertools.product(others, repeat=n))
            tgt = torch.tensor([(BOS, *prefix) for prefix in prefixes])
            causal = torch.ones(n + 1, n + 1, dtype=torch.bool).tril()
            hidden = model.decode(memory.repeat(len(prefixes), 1, 1), mask, tgt, causal)
            logits = model.generator(hidden[:, -1])
            table.update(zip(prefixes, torch.log_softmax(logits, -1).tolist(), strict=True))
            raw.update(zip(prefixes, logits.tolist(), strict=True))

    def rule(src, prefix):
        return table[prefix]

    rule.logits = lambda src, prefix: raw[prefix]  # what the generator returns, not normalised
    return rule


@functools.cache
def transformer_rules(seed, vocab_size, max_len, src_rows):
    """``transformer_rule`` of each row of a source, for ``transformer(vocab_size, seed)``
    (kept for the test's other cases: teacher forcing every prefix takes a while)."""
    model = transformer(vocab_size, seed)
    return [transformer_rule(model, row, vocab_size, max_len) for row in src_rows]


def sources(rows, length, vocab_size, seed):
    """Random sources of real tokens (3 and up), the later rows ending in padding."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab_size, (rows, length), generator=generator)
    for row in range(1, rows):
        src[row, length - row % length:] = PAD
    return src, (src != PAD)[:, None, None, :]


# ---------------------------------------------------------------- references


def penalised(total, n, alpha):
    """The score of a hypothesis of ``n`` generated tokens whose log-probabilities sum to
    ``total`` (Wu et al. 2016)."""
    return total / ((5 + n) / 6) ** alpha


def log_prob(rule, src, tokens):
    """The sum of the log-probabilities of ``tokens`` (generated after BOS)."""
    return sum(rule(src, tokens[:t])[token] for t, token in enumerate(tokens))


def every_sequence(vocab_size, max_len):
    """Every hypothesis the search can finish with: ended by EOS, or cut at ``max_len``."""
    others = [t for t in range(vocab_size) if t != EOS]
    for n in range(1, max_len):
        for body in itertools.product(others, repeat=n - 1):
            yield (*body, EOS)
            if n == max_len - 1:
                yield from ((*body, last) for last in others)


def brute_force(rule, src, vocab_size, max_len, alpha):
    """``(score, tokens)`` of the best-scoring sequence, every sequence scored."""
    return max((penalised(log_prob(rule, src, seq), len(seq), alpha), seq)
               for seq in every_sequence(vocab_size, max_len))


def by_the_rules(rule, src, max_len, beam_size, alpha, mistake=None):
    """One row's beam search with Python lists, exactly as the syllabus words it; with
    ``mistake`` (an id of ``BEAM_MISTAKES``), as that mistake makes it."""
    live, finished = [((), 0.0)] * (beam_size if mistake == "7.1/beam-of-bos-copies" else 1), []
    if mistake == "7.1/no-log-softmax":  # a rule of log-probabilities is normalised already
        rule = getattr(rule, "logits", rule)
    if mistake == "7.1/length-penalty-ignored":
        alpha = 0.0
    n_offset = 1 if mistake == "7.1/penalty-counts-bos" else 0
    per_token = mistake == "7.1/penalty-per-token"
    parked = []  # finished hypotheses that (wrongly) keep a place in the beam
    while live and 1 + len(live[0][0]) < max_len:
        length = 1 + len(live[0][0])
        extensions = []
        for tokens, total in live:
            for token, lp in enumerate(rule(src, tokens)):
                lp = penalised(lp, length, alpha) if per_token else lp
                extensions.append((tokens + (token,),
                                   lp if mistake == "7.1/scores-not-accumulated" else total + lp))
        kept = sorted(extensions + parked, key=lambda e: e[1], reverse=True)[:beam_size]
        if mistake == "7.1/finished-extended":
            live = kept
            continue
        ended = [e for e in kept if e[0][-1] == EOS]
        if mistake != "7.1/finished-dropped":
            finished += [e for e in ended if e not in parked]
        if mistake == "7.1/finished-keep-places":
            parked = ended
        live = [e for e in kept if e[0][-1] != EOS]
    finished += live
    if not finished:
        return ()
    best = max(finished, key=lambda e: e[1] if per_token else penalised(e[1], len(e[0]) + n_offset,
                                                                         alpha))[0]
    return best[:best.index(EOS) + 1] if EOS in best else best


BEAM_MISTAKES = ("7.1/beam-of-bos-copies", "7.1/penalty-counts-bos", "7.1/no-log-softmax",
                 "7.1/length-penalty-ignored", "7.1/penalty-per-token",
                 "7.1/scores-not-accumulated", "7.1/finished-dropped",
                 "7.1/finished-keep-places", "7.1/finished-extended")


def beam_mistake(rules, src_rows, got, max_len, beam_size, alpha, designed_for=None):
    """The id of ``BEAM_MISTAKES`` whose search gives exactly ``got`` (one token tuple per
    row) while the right search does not; None when none does, or when several do (another
    test tells them apart), unless one of them is the mistake the test is ``designed_for``
    (the others then fail an earlier test, whose name comes first)."""
    right = [by_the_rules(rule, row, max_len, beam_size, alpha)
             for rule, row in zip(rules, src_rows, strict=True)]
    if list(got) == right:
        return None
    found = []
    for mistake in BEAM_MISTAKES:
        try:
            mistaken = [by_the_rules(rule, row, max_len, beam_size, alpha, mistake)
                        for rule, row in zip(rules, src_rows, strict=True)]
        except KeyError:  # a prefix the rule was not tabulated for (after an EOS)
            continue
        if mistaken == list(got):
            found.append(mistake)
    if designed_for in found:
        return designed_for
    return found[0] if len(found) == 1 else None


def greedy(model, src, src_mask, max_len):
    """Greedy decoding (6.4) of a PyTorch-built model, written with PyTorch alone."""
    with torch.no_grad():
        return greedy_decode(model, src, src_mask, max_len, BOS, EOS, PAD)


def as_rows(hypotheses, width=None):
    """Token tuples as the expected output: BOS first, padded to the longest row."""
    width = width or 1 + max(len(h) for h in hypotheses)
    return [[BOS, *h] + [PAD] * (width - 1 - len(h)) for h in hypotheses]


def hypotheses_of(out, rows, max_len):
    """Read the output back into token tuples, checking its format on the way."""
    assert_tensor(out, "beam_search(...)")
    assert out.dim() == 2 and out.size(0) == rows and 1 <= out.size(1) <= max_len, (
        f"the output should be [B={rows}, <= max_len={max_len}], got shape {list(out.shape)}")
    found = []
    for b, row in enumerate(out.tolist()):
        assert row[0] == BOS, f"row {b} should start with BOS ({BOS}), got {row}"
        tokens = row[1:]
        if EOS in tokens:
            end = tokens.index(EOS) + 1
            assert all(t == PAD for t in tokens[end:]), (
                f"row {b} should hold pad_id ({PAD}) after its EOS, got {row}: a finished "
                f"hypothesis is never extended")
            tokens = tokens[:end]
        else:
            assert len(row) == max_len, (
                f"row {b} has no EOS, so its hypothesis ran to max_len={max_len} columns, but "
                f"the output has {len(row)}: {row}")
        found.append(tuple(tokens))
    return found


def rule_model(rule, logits=False, **params):
    """The probe's description of a ``RuleModel`` with the rule ``RULES[rule](**params)``."""
    return {"rule": rule, "params": params, "logits": logits}


def transformer_spec(vocab_size, seed, log_softmax=False, dtype=f64):
    """The probe's description of ``transformer(vocab_size, seed)``: its weights (in
    ``dtype``)."""
    return {"transformer": transformer(vocab_size, seed).to(dtype).state_dict(),
            "vocab_size": vocab_size, "log_softmax": log_softmax}


def model_and_rules(kind, src, vocab_size, max_len, rule_seed, transformer_seed):
    """The probe's description of a model of that kind (a ``table`` ``RuleModel`` made with
    ``rule_seed``, or ``transformer(vocab_size, transformer_seed)``) and, for each row of
    ``src``, the rule it follows there."""
    if kind == "rule":
        return (rule_model("table", seed=rule_seed, vocab_size=vocab_size, max_len=max_len),
                [table_rule(rule_seed, vocab_size, max_len)] * len(src))
    return (transformer_spec(vocab_size, seed=transformer_seed),
            transformer_rules(transformer_seed, vocab_size, max_len,
                              tuple(map(tuple, src.tolist()))))


# ---------------------------------------------------------------- the best sequence

ALPHAS = [0.0, 0.6, 1.0]


@pytest.mark.grade("7.1", points=3, values=True)
@pytest.mark.parametrize("kind", ["rule", "transformer"])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_a_beam_as_wide_as_every_sequence_finds_the_best(learner, kind, alpha):
    vocab_size, max_len = 6, (5 if kind == "rule" else 4)
    src, src_mask = sources(3, 4, vocab_size, seed=1)
    model, rules = model_and_rules(kind, src, vocab_size, max_len, rule_seed=4,
                                   transformer_seed=3)
    beam_size = sum(1 for _ in every_sequence(vocab_size, max_len))
    out = learner.run(beam_search_of, model=model, src=src, src_mask=src_mask, max_len=max_len,
                      beam_size=beam_size, length_penalty=alpha)
    found = hypotheses_of(out, len(src), max_len)
    rows = [tuple(row) for row in src.tolist()]
    mistake = beam_mistake(rules, rows, found, max_len, beam_size, alpha)
    for b, tokens in enumerate(found):
        row = rows[b]
        best, best_tokens = brute_force(rules[b], row, vocab_size, max_len, alpha)
        got = penalised(log_prob(rules[b], row, tokens), len(tokens), alpha)
        assert got >= best - 1e-9 or not mistake, (
            f"row {b}: expected {list(best_tokens)}, got {list(tokens)}. " + named(mistake))
        assert got >= best - 1e-9, (
            f"row {b}: expected the best sequence {list(best_tokens)} (score {best:.4f}), got "
            f"{list(tokens)} (score {got:.4f}), length_penalty={alpha}. With beam_size="
            f"{beam_size}, as many as there are sequences, nothing is pruned. Score = sum of "
            f"log_softmax log-probabilities / ((5 + n) / 6) ** length_penalty, n counting EOS; "
            f"keep every finished hypothesis's score")


@pytest.mark.grade("7.1", points=2, values=True)
@pytest.mark.parametrize("kind", ["rule", "transformer"])
@pytest.mark.parametrize("beam_size", [2, 3])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_a_narrow_beam_keeps_the_beam_size_best_extensions(learner, kind, beam_size, alpha):
    vocab_size, max_len = 6, (6 if kind == "rule" else 5)
    src, src_mask = sources(4, 5, vocab_size, seed=2)
    model, rules = model_and_rules(kind, src, vocab_size, max_len, rule_seed=3,
                                   transformer_seed=7)
    out = learner.run(beam_search_of, model=model, src=src, src_mask=src_mask, max_len=max_len,
                      beam_size=beam_size, length_penalty=alpha)
    got = hypotheses_of(out, len(src), max_len)
    expected = [by_the_rules(rules[b], tuple(row), max_len, beam_size, alpha)
                for b, row in enumerate(src.tolist())]
    rows = [tuple(row) for row in src.tolist()]
    mistake = beam_mistake(rules, rows, got, max_len, beam_size, alpha)
    for b, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, (
            f"row {b}: expected {list(theirs)}, got {list(mine)} (beam_size={beam_size}, "
            f"length_penalty={alpha}). " + (named(mistake) if mistake else
            "Each step extends every live hypothesis by every token and keeps the beam_size "
            "best of the row; those ending in EOS are finished for good and free their place, "
            "the rest are live; at max_len the live ones finish"))
    assert out.size(1) == 1 + max(len(h) for h in expected), (
        f"the output should be as wide as its longest row ({1 + max(map(len, expected))}), "
        f"got {out.size(1)} columns")


@pytest.mark.grade("7.1", points=1, values=True)
def test_beam_size_one_is_greedy_decoding(learner):
    model = transformer(9, seed=3)
    with torch.no_grad():  # make EOS likely enough to end some rows early
        model.projection.bias[EOS] += 1.0
    src, src_mask = sources(6, 5, 9, seed=3)
    out = learner.run(beam_search_of, model={"transformer": model.state_dict(), "vocab_size": 9},
                      src=src, src_mask=src_mask, max_len=8, beam_size=1, length_penalty=0.6)
    expected = greedy(model, src, src_mask, 8)
    assert_tensor(out, "beam_search(..., beam_size=1)")
    assert out.tolist() == expected.tolist(), (
        f"with beam_size=1 the search keeps the single best extension at every step, which "
        f"is greedy decoding (6.4): expected {expected.tolist()}, got {out.tolist()}")


# ---------------------------------------------------------------- the length penalty

# Tokens 3, 4, 5 are a, b, c. After BOS: a with probability e^-1, b e^-1.08, c e^-1.36;
# then each path goes on almost surely (0.999):
#   A = a EOS            log-prob ~ -1.00, n = 2, penalty (7/6)^alpha
#   C = b c c EOS        log-prob ~ -1.08, n = 4, penalty (9/6)^alpha
#   B = c c c c c c EOS  log-prob ~ -1.37, n = 7, penalty (12/6)^alpha
# alpha = 0:   A -1.00, C -1.08, B -1.37       -> A, the shortest
# alpha = 0.6: A -0.91, C -0.85, B -0.90       -> C
# alpha = 1:   A -0.86, C -0.72, B -0.68       -> B, the longest
PENALTY_TREE = {
    (): {3: math.exp(-1.0), 4: math.exp(-1.08), 5: math.exp(-1.36)},
    (3,): {EOS: 0.999},
    (4,): {5: 0.999}, (4, 5): {5: 0.999}, (4, 5, 5): {EOS: 0.999},
    **{(5,) * n: {5: 0.999} for n in range(1, 6)}, (5,) * 6: {EOS: 0.999},
}


# Where the penalty is applied matters too. Tokens 3, 4, 5 are a, b, c; 6 is d. After BOS:
# a 0.5, b 0.2, c 0.15; then a EOS (0.3), b d (0.8) EOS, c c c c (0.99 each) EOS. At alpha = 1:
#   A = a EOS           sum -1.90, n = 2: -1.63; each token divided at its place: -1.73
#   B = b d EOS         sum -1.83, n = 3: -1.38;                                 -1.80
#   C = c c c c EOS     sum -1.93, n = 5: -1.16;                                 -1.92
# the whole sum divided once -> C; no penalty -> B; a penalty per token -> A
WHERE_TREE = {(): {3: 0.5, 4: 0.2, 5: 0.15}, (3,): {EOS: 0.3}, (4,): {6: 0.8},
              (4, 6): {EOS: 0.999}, **{(5,) * n: {5: 0.99} for n in range(1, 4)},
              (5,) * 4: {EOS: 0.999}}


@pytest.mark.grade("7.1", points=2, values=True)
@pytest.mark.parametrize("alpha, winner, tree, vocab_size", [
    (0.0, (3, EOS), PENALTY_TREE, 6), (0.6, (4, 5, 5, EOS), PENALTY_TREE, 6),
    (1.0, (5, 5, 5, 5, 5, 5, EOS), PENALTY_TREE, 6), (1.0, (5, 5, 5, 5, EOS), WHERE_TREE, 7)])
def test_the_length_penalty_decides_between_short_and_long(learner, alpha, winner, tree,
                                                           vocab_size):
    src = torch.tensor([[3, 4]])
    out = learner.run(beam_search_of, model=rule_model("tree", tree=tree, vocab_size=vocab_size),
                      src=src, src_mask=(src != PAD)[:, None, None], max_len=8, beam_size=3,
                      length_penalty=alpha)
    (got,) = hypotheses_of(out, 1, 8)
    mistake = beam_mistake([tree_rule(tree, vocab_size)], [(3, 4)], [got], 8, 3, alpha,
                           designed_for="7.1/penalty-per-token" if tree is WHERE_TREE else None)
    assert got == winner, (
        f"expected {list(winner)} at length_penalty={alpha}, got {list(got)}. " + (
            named(mistake) if mistake else "Divide each finished hypothesis's sum of "
            "log-probabilities, once, by ((5 + n) / 6) ** length_penalty with n its generated "
            "tokens, EOS included (BOS not)"))


@pytest.mark.grade("7.1", points=1, values=True)
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_hypothesis_that_ended_early_keeps_its_score(learner, alpha):
    # After BOS: a 0.5, b 0.45. "a EOS" ends at step 2 with log-prob ln 0.5 + ln 0.6 = -1.20,
    # while "b c" is live and better (-0.90); but b c goes on with 0.7 a step and ends,
    # cut at max_len, as b c c c c at -1.97. The early "a EOS" must win.
    tree = {(): {3: 0.5, 4: 0.45}, (3,): {EOS: 0.6}, (4,): {5: 0.9},
            **{(4,) + (5,) * n: {5: 0.7} for n in range(1, 4)}}
    src = torch.tensor([[3, 3, 3]])
    out = learner.run(beam_search_of, model=rule_model("tree", tree=tree, vocab_size=6),
                      src=src, src_mask=(src != PAD)[:, None, None], max_len=6, beam_size=2,
                      length_penalty=alpha)
    (got,) = hypotheses_of(out, 1, 6)
    mistake = beam_mistake([tree_rule(tree, 6)], [(3, 3, 3)], [got], 6, 2, alpha,
                           designed_for="7.1/finished-dropped")
    assert got == (3, EOS), (
        f"expected [3, {EOS}] (it ended at step 2 and nothing later scores better), got "
        f"{list(got)}, length_penalty={alpha}. " + (named(mistake) if mistake else "A "
        "hypothesis that ends in EOS is finished for good: keep it, with its score, until the "
        "end, even once it has left the beam"))


@pytest.mark.grade("7.1", points=1, values=True)
def test_a_finished_hypothesis_frees_its_place_in_the_beam(learner):
    # beam_size=2, length_penalty=1. Step 1 keeps a (0.6) and b (0.3). Step 2 keeps
    # "a c" (-1.11) and "a EOS" (-1.43), which is finished. Step 3 extends "a c" alone and
    # keeps two: "a c d" (-1.71) and "a c c" (-2.03). From there "a c c" goes on with
    # probability 0.99 a step and is cut at max_len as a c c c c c c: log-prob -2.06,
    # n = 7, score -2.06 / 2 = -1.03, which beats "a EOS" (-1.43 / (7/6) = -1.22).
    # A search that let "a EOS" keep a place in the beam would have dropped "a c c".
    tree = {(): {3: 0.6, 4: 0.3}, (3,): {EOS: 0.4, 5: 0.55}, (3, 5): {6: 0.55, 5: 0.4},
            (3, 5, 6): {EOS: 0.5}, **{(3,) + (5,) * n: {5: 0.99} for n in range(2, 6)}}
    src = torch.tensor([[4, 4]])
    out = learner.run(beam_search_of, model=rule_model("tree", tree=tree, vocab_size=7),
                      src=src, src_mask=(src != PAD)[:, None, None], max_len=8, beam_size=2,
                      length_penalty=1.0)
    (got,) = hypotheses_of(out, 1, 8)
    mistake = beam_mistake([tree_rule(tree, 7)], [(4, 4)], [got], 8, 2, 1.0,
                           designed_for="7.1/finished-keep-places")
    assert got == (3, 5, 5, 5, 5, 5, 5), (
        f"expected [3, 5, 5, 5, 5, 5, 5], got {list(got)}. " + (named(mistake) if mistake else
        "A hypothesis that ends in EOS leaves the beam: the next step again keeps beam_size "
        "live hypotheses"))


# ---------------------------------------------------------------- batching and format


@pytest.mark.grade("7.1", points=1)
def test_each_row_is_decoded_as_if_alone(learner):
    model = transformer_spec(9, seed=4)
    src, src_mask = sources(5, 6, 9, seed=4)
    out = learner.run(beam_search_of, model=model, src=src, src_mask=src_mask, max_len=7,
                      beam_size=3, length_penalty=0.6)
    alone = []
    for row in src.tolist():
        one = torch.tensor([[t for t in row if t != PAD]])
        alone.append(learner.run(
            beam_search_of, model=model, src=one,
            src_mask=torch.ones(1, 1, 1, one.size(1), dtype=torch.bool), max_len=7,
            beam_size=3, length_penalty=0.6)[0].tolist())
    assert_tensor(out, "beam_search(...)")
    width = max(map(len, alone))
    expected = [r + [PAD] * (width - len(r)) for r in alone]
    assert out.tolist() == expected, (
        f"decoding the batch should give what decoding each row alone (without its padding) "
        f"gives: expected {expected}, got {out.tolist()}. The beam_size best are chosen per "
        f"row, never across rows; the memory and src_mask of row b go with its hypotheses")


@pytest.mark.grade("7.1", points=1)
def test_output_format(learner):
    # Row 0 ends at once (EOS is almost certain after BOS); row 1 after two tokens; row 2,
    # whose source sums to a multiple of 3, never produces EOS (see format_rule).
    model = rule_model("format", vocab_size=6)
    src = torch.tensor([[4, 4, 5], [5, 5, 0], [3, 3, 0]], dtype=torch.int32)
    out = learner.run(beam_search_of, model=model, src=src, src_mask=(src != PAD)[:, None, None],
                      max_len=7, beam_size=2)
    assert_tensor(out, "beam_search(...)", dtype=torch.int32)
    expected = as_rows([(EOS,), (5, 3, EOS), (4, 4, 4, 4, 4, 4)])
    assert out.tolist() == expected, (
        f"expected {expected} (BOS first, pad_id after EOS, at most max_len=7 columns, BOS "
        f"counted), got {out.tolist()}")
    out = learner.run(beam_search_of, model=model, src=src[:2],
                      src_mask=(src[:2] != PAD)[:, None, None], max_len=7, beam_size=2)
    assert_tensor(out, "beam_search(...)")
    assert out.tolist() == as_rows([(EOS,), (5, 3, EOS)]), (
        f"the output should be as wide as its longest row (4 columns): expected "
        f"{as_rows([(EOS,), (5, 3, EOS)])}, got {out.tolist()}")


@pytest.mark.grade("7.1", points=1)
def test_a_float32_model_gives_token_ids_in_the_source_dtype_and_device(learner):
    # The course's model computes in float32 (the other tests use float64 models): the
    # search's own tensors must follow its log-probabilities, and the ids are src's.
    vocab_size, max_len, beam_size = 6, 5, 3
    src, src_mask = sources(4, 5, vocab_size, seed=2)
    result = run_naming(learner, beam_search_contract, DTYPE_CLASH,
                        "7.1/scores-in-another-dtype",
                        model=transformer_spec(vocab_size, seed=7, dtype=torch.float32),
                        src=src, src_mask=src_mask, max_len=max_len, beam_size=beam_size,
                        length_penalty=0.6)
    out = assert_tensor(result["output"], "beam_search(...) with a float32 model",
                        dtype=torch.int64)
    assert result["device"] == result["src_device"], (
        f"beam_search(...) returned its ids on {result['device']}, src is on "
        f"{result['src_device']}: make every tensor on src's device")
    # The same weights in float64 decide: their best hypotheses are far enough apart that
    # float32's rounding (about 1e-6 here) does not change them: every log-probability moved
    # at random by up to 0.01 leaves them as they are (20 draws tried).
    rules = transformer_rules(7, vocab_size, max_len, tuple(map(tuple, src.tolist())))
    expected = [by_the_rules(rules[b], tuple(row), max_len, beam_size, 0.6)
                for b, row in enumerate(src.tolist())]
    got = hypotheses_of(out, len(src), max_len)
    assert got == expected, (
        f"with the model in float32 the search gives {got}, in float64 {expected}: keep the "
        f"scores in the dtype of the model's log-probabilities (or promote them with "
        f"+, torch.where), never write a float32 score into a float64 tensor in place")


@pytest.mark.grade("7.1", points=1, errors=True)
@pytest.mark.parametrize("beam_size", [0, -1])
def test_a_beam_of_no_hypotheses_is_an_error(learner, beam_size):
    src = torch.tensor([[3, 4]])
    message = learner.raises("ValueError", beam_search_of,
                             model=rule_model("tree", tree={}, vocab_size=5), src=src,
                             src_mask=(src != PAD)[:, None, None], max_len=5,
                             beam_size=beam_size)
    assert re.search("beam_size", message), (
        f"beam_search(..., beam_size={beam_size}) raised ValueError({message!r}); name the "
        f"argument in the message: beam_size must be at least 1")


@pytest.mark.grade("7.1", points=1)
@pytest.mark.parametrize("kind", ["rule", "transformer"])
def test_logits_and_log_probabilities_give_the_same_result(learner, kind):
    src, src_mask = sources(4, 5, 6, seed=5)
    if kind == "rule":
        with_logits = rule_model("table", logits=True, seed=2, vocab_size=6, max_len=6)
        with_log_probs = rule_model("table", seed=2, vocab_size=6, max_len=6)
    else:
        with_logits = transformer_spec(6, seed=2)
        with_log_probs = transformer_spec(6, seed=2, log_softmax=True)
    outs = [learner.run(beam_search_of, model=model, src=src, src_mask=src_mask, max_len=6,
                        beam_size=3, length_penalty=0.6)
            for model in (with_logits, with_log_probs)]
    for out in outs:
        assert_tensor(out, "beam_search(...)")
    outs = [out.tolist() for out in outs]
    assert outs[0] == outs[1], (
        f"a generator that returns logits gave {outs[0]}, the same one returning "
        f"log-probabilities {outs[1]}. " + named("7.1/no-log-softmax"))
