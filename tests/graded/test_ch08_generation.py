"""Graded tests of chapter 8: sampling, the key-value cache, the language model's loss, the
decoder-only model, and the capstone (a decoder-only model from the learner's parts learns a
small language).

Expected values, all computed here without the code under test: the sampling distribution
row by row with Python's ``math`` and sorted lists (the definition followed literally),
frequencies of many seeded draws against it, multi-head attention in float64 from the
grader's own weights, PyTorch's ``F.cross_entropy`` for the loss, and, for the model and the
capstone, weights run in PyTorch's own layers (``torch_models.TorchLanguageModel``).

The functions of the probes section run in the grading worker, with ``impl`` the chapter
module under test, and return plain data. Everything else runs in the grader, which never
imports the code under test.
"""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from annotated_transformer.course.grading.outcomes import LearnerNotImplemented

from checks import (
    ATTENTION_OPS,
    LAYER_OPS,
    LOGSUMEXP_OPS,
    SOFTMAX_OPS,
    assert_close,
    assert_tensor,
    check_names,
    check_trained_config,
    load_trusted,
    on_meta,
    replay_embedding,
    replay_stack,
    trusted_state,
    untied_how,
)
from mistakes import DEVICE_CLASH, first_match, mistake_of, named, run_naming
from torch_models import TorchLanguageModel, complete_greedily

CHAPTER = 8
EXERCISES = {
    "8.1": "next_token_distribution: temperature, top-k, top-p",
    "8.2": "sample_next: seeded draws from that distribution",
    "8.3": "attention_step: one new position with a key-value cache",
    "8.4": "language_model_loss: each position predicts the next token",
    "8.5": "DecoderOnlyTransformer: embedding, causal stack, tied generator",
    "8.6": "Capstone: your decoder-only model learns arithmetic progressions",
}
# What each exercise's code uses of the learner's earlier exercises (what those use counts
# too): a failure there is named first (annotated_transformer.course.grading.dependencies).
BUILDS_ON = {"8.1": ("2.1",), "8.2": ("8.1",), "8.3": ("2.2", "3.1", "3.2", "3.3"), "8.4": ("6.2",),
             "8.5": ("1.2", "1.3", "5.6"),
             "8.6": ("1.2", "1.3", "4.3", "5.1", "5.4", "5.6", "8.4", "8.5")}
# Graded by a whole-course test rather than one solution region (see test_grading.py).
INTEGRATION = {"8.6"}
# 8.3 attends with the learner's chapter 2 (through chapter 3's module), as chapter 3 does:
# PyTorch's attention and softmax are refused while it runs. Sampling may use PyTorch's
# softmax, topk, sort and multinomial: the exercise is what to keep, not how to draw.
# 8.5 composes Chapter 5's stack (the grader's stand-in while it is graded): PyTorch's fused
# layers and attention are refused, a softmax allowed (+), and its gradient, so that
# log-probabilities returned are named as that mistake.
FORBIDDEN = {"8.3": ("MultiheadAttention", "scaled_dot_product_attention"),
             "8.5": ("Transformer", "TransformerEncoder", "TransformerEncoderLayer")}
FORBIDDEN_OPS = {"8.3": (*ATTENTION_OPS, *SOFTMAX_OPS, *LOGSUMEXP_OPS),
                 "8.5": (*LAYER_OPS, *ATTENTION_OPS, "+_log_softmax", "+_softmax",
                         "+_log_softmax_backward_data", "+_softmax_backward_data")}
f64 = torch.float64
D_MODEL, HEADS = 16, 4
# A training pass with dropout is replayed from this seed, in the worker and here
# (checks.replay_stack): every module that should drop must draw, in the contract's order.
REPLAY_SEED, DROPOUT = 11, 0.25
CAPSTONE_STEPS = 300
CAPSTONE_THRESHOLD = 0.9
# The reference writes 61-74% of the held-out next terms right (seeds 0-4; chance 10%).
CAPSTONE_HELD_OUT_THRESHOLD = 0.4
# The model the package's capstone run builds (language_model.train_language_model:
# TransformerConfig.small(13, d_model=64, max_len=10)): the grader's model is this one.
CAPSTONE_CONFIG = dict(src_vocab_size=13, tgt_vocab_size=13, num_layers=2, d_model=64,
                       d_ff=256, num_heads=4, dropout=0.0, max_len=10, norm_first=True,
                       tie_embeddings=True)


# ---------------------------------------------------------------- probes (run in the worker)


def distribution_of(impl, logits, **options):
    return impl.next_token_distribution(logits, **options)


def distribution_contract(impl, logits, **options):
    """next_token_distribution of ``logits``, and the device of its result for them moved to
    the "meta" device (a stand-in for a GPU; None when its code cannot run there,
    checks.on_meta)."""
    moved = on_meta(lambda: impl.next_token_distribution(logits.to("meta"), **options))
    return {"output": impl.next_token_distribution(logits, **options),
            "device": moved.device.type if isinstance(moved, torch.Tensor) else None}


def samples_of(impl, logits, seed, **options):
    """``sample_next`` with a generator seeded ``seed``."""
    return impl.sample_next(logits, generator=torch.Generator().manual_seed(seed), **options)


def samples_contract(impl, logits, seed, **options):
    """``sample_next`` with a generator seeded ``seed``, and the device of its ids for the
    logits moved to the "meta" device (a stand-in for a GPU; None when its code cannot run
    there, checks.on_meta)."""
    moved = on_meta(lambda: samples_of(impl, logits.to("meta"), seed, **options))
    return {"ids": samples_of(impl, logits, seed, **options),
            "device": moved.device.type if isinstance(moved, torch.Tensor) else None}


def generator_moved(impl, logits, seed, **options):
    """Whether ``sample_next`` changed the state of the generator it was given."""
    generator = torch.Generator().manual_seed(seed)
    before = generator.get_state()
    impl.sample_next(logits, generator=generator, **options)
    return not torch.equal(before, generator.get_state())


def samples_twice(impl, logits, seed, **options):
    """Two calls, each with a fresh generator seeded ``seed``."""
    return [samples_of(impl, logits, seed, **options) for _ in range(2)]


def attention_steps(impl, state, xs, cache=None):
    """A fresh chapter 3 ``MultiHeadAttention(D_MODEL, HEADS)`` (float64) with the grader's
    weights; ``attention_step`` on each position of ``xs [B, n, D]`` in turn, starting from
    ``cache``. The module's state-dict names, then every output and cache."""
    from annotated_transformer.parts import active_parts

    attn = active_parts().MultiHeadAttention(D_MODEL, HEADS).double().eval()
    names = load_trusted(attn, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    outputs, caches = [], []
    for t in range(xs.size(1)):
        output, cache = impl.attention_step(attn, xs[:, t:t + 1], cache)
        keys, values = cache
        outputs.append(output)
        caches.append((keys, values))
    return {"names": names, "outputs": outputs, "caches": caches}


def attention_step_contract(impl, state, x, cache, upstream):
    """A fresh chapter 3 ``MultiHeadAttention(D_MODEL, HEADS)`` in the dtype of ``x`` with the
    grader's weights, and one ``attention_step`` of ``x`` over ``cache``, both leaves that
    require grad: the output and the new cache (detached), and the gradients of
    ``(output * upstream).sum()`` with respect to x, the cache's keys and values and every
    parameter (None for one it does not reach)."""
    from annotated_transformer.parts import active_parts

    attn = active_parts().MultiHeadAttention(D_MODEL, HEADS).to(x.dtype).eval()
    names = load_trusted(attn, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    x, keys, values = (t.clone().requires_grad_(True) for t in (x, *cache))
    output, new_cache = impl.attention_step(attn, x, (keys, values))
    inputs = {"x": x, "keys": keys, "values": values, **dict(attn.named_parameters())}
    grads = (torch.autograd.grad((output * upstream).sum(), list(inputs.values()),
                                 allow_unused=True)
             if isinstance(output, torch.Tensor) and output.requires_grad
             else [None] * len(inputs))
    return {"names": names, "output": output.detach(),
            "cache": [t.detach() for t in new_cache],
            "grads": dict(zip(inputs, grads, strict=True))}


def attention_steps_on_meta(impl, x):
    """Two ``attention_step`` calls of a chapter 3 ``MultiHeadAttention(D_MODEL, HEADS)`` on
    the "meta" device (a stand-in for a GPU), from no cache: the devices of each output and
    cache (None when its code cannot run there, checks.on_meta)."""
    from annotated_transformer.parts import active_parts

    attn = active_parts().MultiHeadAttention(D_MODEL, HEADS).to(x.dtype).to("meta").eval()
    x = x.to("meta")

    def two_steps():
        first, cache = impl.attention_step(attn, x[:, :1], None)
        second, cache_after = impl.attention_step(attn, x[:, 1:], cache)
        return [t.device.type for t in (first, *cache, second, *cache_after)]

    return on_meta(two_steps)


def attention_step_raises(impl, x):
    from annotated_transformer.parts import active_parts

    impl.attention_step(active_parts().MultiHeadAttention(D_MODEL, HEADS), x, None)


def loss_of(impl, logits, tokens, pad_id):
    return impl.language_model_loss(logits, tokens, pad_id)


def loss_and_gradient(impl, logits, tokens, pad_id):
    """language_model_loss of ``logits`` made a leaf that requires grad: the loss (detached),
    and its gradient with respect to the logits (None when the loss is off the graph)."""
    logits = logits.clone().requires_grad_(True)
    loss = impl.language_model_loss(logits, tokens, pad_id)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        return {"loss": loss, "grad": None}
    (grad,) = torch.autograd.grad(loss, logits, allow_unused=True, materialize_grads=True)
    return {"loss": loss.detach(), "grad": grad}


def trained_language_model(impl, steps):
    """The package's capstone run on the parts under test, trained on the 80 progressions
    that are not held out (``language_model.HELD_OUT``): the trained weights."""
    from annotated_transformer.language_model import train_language_model
    from annotated_transformer.parts import active_parts

    torch.set_num_threads(1)
    model, losses = train_language_model(active_parts(), steps=steps, hold_out=True)
    return {"state": model.state_dict(), "config": dataclasses.asdict(model.config),
            "last_loss": losses[-1]}


# ---------------------------------------------------------------- expected values


def expected_distribution(logits, temperature=1.0, top_k=None, top_p=None):
    """The contract of 8.1 followed literally, row by row, with Python floats."""
    rows = []
    for row in logits.tolist():
        if temperature == 0:
            best = row.index(max(row))
            rows.append([float(i == best) for i in range(len(row))])
            continue
        scaled = [x / temperature for x in row]
        kept = list(range(len(row)))
        if top_k is not None and top_k < len(row):
            kth = sorted(scaled, reverse=True)[top_k - 1]
            kept = [i for i in kept if scaled[i] >= kth]
        top = max(scaled[i] for i in kept)
        weights = {i: math.exp(scaled[i] - top) for i in kept}
        total = sum(weights.values())
        probs = {i: w / total for i, w in weights.items()}
        if top_p is not None:
            probs = {i: p for i, p in probs.items()
                     if sum(q for q in probs.values() if q > p) < top_p}
            total = sum(probs.values())
            probs = {i: p / total for i, p in probs.items()}
        rows.append([probs.get(i, 0.0) for i in range(len(row))])
    return torch.tensor(rows, dtype=f64)


def mistaken_distributions(logits, temperature, top_k, top_p):
    """``{mistake id: what it gives}`` for the plausible mistakes of 8.1 (float64)."""
    mistakes = {}
    if temperature not in (0, 1):
        softmax = torch.softmax(logits, dim=-1)
        mistakes["8.1/temperature-after-softmax"] = softmax
        mistakes["8.1/temperature-after-softmax "] = softmax / temperature  # not normalised
        mistakes["8.1/temperature-multiplied"] = torch.softmax(logits * temperature, dim=-1)
    if top_k is not None and 1 < top_k < logits.size(-1) and top_p is None:
        mistakes["8.1/top-k-keeps-k-minus-1"] = expected_distribution(
            logits, temperature, top_k - 1)
        kept = expected_distribution(logits, temperature, top_k) > 0
        full = expected_distribution(logits, temperature)
        mistakes["8.1/not-renormalised"] = full * kept
    if top_p is not None and top_p < 1 and top_k is None:
        full = expected_distribution(logits, temperature)
        # the mass of each token, its ties and the tokens more probable than it
        inclusive = torch.stack([(full >= p_i[..., None]).mul(full).sum(-1)
                                 for p_i in full.unbind(-1)], dim=-1)
        crossing = full.masked_fill(inclusive >= top_p, 0.0)
        crossing = torch.where(crossing.sum(-1, keepdim=True) > 0,
                               crossing / crossing.sum(-1, keepdim=True), crossing)
        mistakes["8.1/top-p-excludes-crossing"] = crossing
        mistakes["8.1/not-renormalised"] = full * (expected_distribution(
            logits, temperature, None, top_p) > 0)
    return mistakes


def check_distribution(got, logits, what, temperature=1.0, top_k=None, top_p=None):
    expected = expected_distribution(logits, temperature, top_k, top_p)
    right = (isinstance(got, torch.Tensor) and got.shape == expected.shape
             and torch.allclose(got.double(), expected, atol=1e-6))
    if not right:
        mistake = first_match(got, mistaken_distributions(logits, temperature, top_k, top_p))
        if mistake is not None:
            mistake = mistake.strip()
            kept = int((got[0] > 0).sum()) if isinstance(got, torch.Tensor) else 0
            raise AssertionError(named(mistake, k=top_k, kept=kept))
    assert_close(got, expected, what, atol=1e-6, hint="Each row is the distribution of the "
                 "docstring: temperature, then top-k, then top-p over what is left.")


def logits_of(rows, vocab):
    """Random float64 logits with distinct values (no ties), spread enough that top-k and
    top-p keep different sets."""
    return torch.randn(rows, vocab, dtype=f64) * 2


def heads(x):
    """``[B, L, D]`` -> ``[B, H, L, d_k]``."""
    batch, length, _ = x.shape
    return x.view(batch, length, HEADS, -1).transpose(1, 2)


def projections(state, x, name):
    return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]


def attention_over(state, x, keys, values, out_proj=True):
    """The new position's output ``[B, 1, D]``: its query over ``keys``, ``values`` (the
    heads merged, then ``out_proj``; without it, ``out_proj=False``)."""
    q = heads(projections(state, x, "q_proj"))
    weights = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1)), dim=-1)
    merged = (weights @ values).transpose(1, 2).reshape(x.size(0), 1, -1)
    return projections(state, merged, "out_proj") if out_proj else merged


MHA_SHAPES = {f"{p}_proj.{k}": [D_MODEL, D_MODEL] if k == "weight" else [D_MODEL]
              for p in ("q", "k", "v", "out") for k in ("weight", "bias")}


def some(names):
    """The first three of ``names``, and how many more (a model's fifty would bury the
    point)."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def run_steps(learner, state, xs, cache=None):
    result = learner.run(attention_steps, state=state, xs=xs, cache=cache)
    check_names(result["names"], state, "your MultiHeadAttention (3.3)",
                "attention_step uses chapter 3's q_proj, k_proj, v_proj and out_proj")
    return result


# ---------------------------------------------------------------- 8.1 next_token_distribution


@pytest.mark.grade("8.1", points=2, values=True)
@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature(learner, temperature):
    logits = logits_of(3, 7)
    check_distribution(learner.run(distribution_of, logits=logits, temperature=temperature),
                       logits, f"next_token_distribution(logits, temperature={temperature})",
                       temperature)


@pytest.mark.grade("8.1", points=1)
def test_temperature_zero_is_greedy_and_ties_go_to_the_first(learner):
    logits = torch.tensor([[0.5, 3.0, -1.0, 3.0], [2.0, 1.0, 0.0, -1.0]], dtype=f64)
    for options in ({}, {"top_k": 3}, {"top_p": 0.5}):
        got = learner.run(distribution_of, logits=logits, temperature=0.0, **options)
        extra = "".join(f", {k}={v}" for k, v in options.items())
        divided = torch.softmax(logits / 0.0, dim=-1)  # +-inf (0 / 0 is NaN): all NaN
        assert not (isinstance(got, torch.Tensor) and got.shape == divided.shape
                    and torch.allclose(got.double(), divided, equal_nan=True)), (
            named("8.1/temperature-zero-divides"))
        assert_close(got, expected_distribution(logits, 0.0),
                     f"next_token_distribution(logits, temperature=0{extra})",
                     hint="Temperature 0 is greedy: probability 1 on the argmax (the first of "
                     "tied maxima, as torch.argmax) and 0 elsewhere.")


@pytest.mark.grade("8.1", points=2, values=True)
@pytest.mark.parametrize("top_k", [1, 3, 7, 12])
def test_top_k(learner, top_k):
    logits = logits_of(3, 7)
    check_distribution(learner.run(distribution_of, logits=logits, top_k=top_k), logits,
                       f"next_token_distribution(logits, top_k={top_k}) with V = 7",
                       top_k=top_k)


@pytest.mark.grade("8.1", points=1)
def test_top_k_keeps_the_ties_of_the_kth(learner):
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=f64)
    check_distribution(learner.run(distribution_of, logits=logits, top_k=2), logits,
                       "next_token_distribution([[2, 1, 1, 0, 1], [0, 0, 0, 0, 0]], top_k=2), "
                       "whose second largest logit is tied", top_k=2)


@pytest.mark.grade("8.1", points=2, values=True)
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5, 1e-9])
def test_top_p(learner, top_p):
    logits = logits_of(3, 7)
    check_distribution(learner.run(distribution_of, logits=logits, top_p=top_p), logits,
                       f"next_token_distribution(logits, top_p={top_p})", top_p=top_p)


@pytest.mark.grade("8.1", points=1)
def test_top_p_keeps_the_ties_of_the_crossing_token(learner):
    # probabilities 0.4, 0.2, 0.2, 0.2: p = 0.5 is crossed at a tie of three tokens
    logits = torch.tensor([[math.log(0.4), math.log(0.2), math.log(0.2), math.log(0.2)]],
                          dtype=f64)
    check_distribution(learner.run(distribution_of, logits=logits, top_p=0.5), logits,
                       "next_token_distribution(log [0.4, 0.2, 0.2, 0.2], top_p=0.5)",
                       top_p=0.5)


@pytest.mark.grade("8.1", points=2, values=True)
def test_all_three_together(learner):
    logits = logits_of(4, 9)
    options = dict(temperature=0.7, top_k=5, top_p=0.8)
    check_distribution(learner.run(distribution_of, logits=logits, **options), logits,
                       "next_token_distribution(logits, temperature=0.7, top_k=5, top_p=0.8)",
                       **options)


# Rows where the order matters, whatever the run's seed: (top_k, top_p) and, for
# probabilities 0.4, 0.3, 0.2, 0.1, the right distribution, the one of a nucleus measured on
# the probabilities from before top-k (top-p first, or top-k's survivors not renormalised
# before it: the same tokens) and that of top-k alone.
ORDERED = {(2, 0.5): ([1.0, 0.0, 0.0, 0.0], [4 / 7, 3 / 7, 0.0, 0.0], [4 / 7, 3 / 7, 0.0, 0.0]),
           (3, 0.42): ([1.0, 0.0, 0.0, 0.0], [4 / 7, 3 / 7, 0.0, 0.0], [4 / 9, 3 / 9, 2 / 9, 0.0])}


@pytest.mark.grade("8.1", points=1, values=True)
def test_top_k_comes_before_top_p(learner):
    """Top-k leaves 4/7 and 3/7 (top_k=2) or 4/9, 3/9 and 2/9 (top_k=3), whose nucleus of 0.5
    (or 0.42) is the first token alone; a nucleus of the probabilities before top-k keeps
    two tokens in both; top-k alone keeps what top-k left. A mistake is named when both rows
    show it."""
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=f64).log()
    got = {options: learner.run(distribution_of, logits=logits, top_k=options[0],
                                top_p=options[1]) for options in ORDERED}

    def all_match(which):
        return all(first_match(got[options], {"": torch.tensor([rows[which]], dtype=f64)})
                   is not None for options, rows in ORDERED.items())

    if all_match(1):
        raise AssertionError(named("8.1/top-p-before-top-k"))
    if all_match(2):
        raise AssertionError(named("8.1/top-p-skipped-with-top-k"))
    for (top_k, top_p), (expected, _, _) in ORDERED.items():
        assert_close(got[top_k, top_p], torch.tensor([expected], dtype=f64),
                     f"next_token_distribution(log [0.4, 0.3, 0.2, 0.1], top_k={top_k}, "
                     f"top_p={top_p})", atol=1e-6, hint="Top-k first, renormalise, then top-p "
                     "over what it left.")


@pytest.mark.grade("8.1", points=1)
@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("options", [{"top_k": 2, "top_p": 0.9}, {"temperature": 0.0}],
                         ids=["top-k and top-p", "temperature 0"])
def test_distribution_keeps_dtype_and_device(learner, dtype, options):
    logits = logits_of(2, 5).to(dtype)
    result = run_naming(learner, distribution_contract, DEVICE_CLASH, "8.1/device-not-kept",
                        logits=logits, **options)
    what = (f"next_token_distribution({dtype} logits, "
            f"{', '.join(f'{k}={v}' for k, v in options.items())})")
    got = assert_tensor(result["output"], what, shape=(2, 5))
    right = torch.allclose(got.double(), expected_distribution(logits.double(), **options),
                           atol=1e-5)
    # Right values: the dtype and device of the probabilities are the contract's too.
    assert got.dtype == dtype or not right, named("8.1/dtype-changed", dtype=dtype,
                                                  got=got.dtype)
    assert_tensor(got, what, dtype=dtype)
    assert result["device"] in ("meta", None), (
        f"{what} for logits on the meta device is on {result['device']}. "
        + named("8.1/device-not-kept"))


@pytest.mark.grade("8.1", points=1, errors=True)
@pytest.mark.parametrize("options, named_argument", [
    ({"temperature": -1.0}, "temperature"), ({"top_k": 0}, "top_k"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")])
def test_bad_arguments_are_explained(learner, options, named_argument):
    message = learner.raises("ValueError", distribution_of, logits=torch.randn(2, 5), **options)
    assert named_argument in message, (
        f"the ValueError for {options} should name {named_argument}; it says: {message!r}")


# ---------------------------------------------------------------- 8.2 sample_next


@pytest.mark.grade("8.2", points=2, values=True)
def test_samples_follow_the_distribution(learner):
    logits = logits_of(1, 6)
    options = dict(temperature=0.8, top_k=4, top_p=0.9)
    draws = learner.run(samples_of, logits=logits.expand(20_000, -1), seed=1, **options)
    draws = assert_tensor(draws, "sample_next(logits [20000, 6], ...)", shape=(20_000,))
    assert not draws.is_floating_point(), (
        f"sample_next should return token ids (torch.long), not {draws.dtype}")
    assert bool(((draws >= 0) & (draws < 6)).all()), "a sampled id is not in the vocabulary"
    expected = expected_distribution(logits, **options)[0]
    frequencies = torch.bincount(draws.long(), minlength=6).double() / len(draws)
    never = (expected == 0) & (frequencies > 0)
    assert not never.any(), (
        f"token {int(never.nonzero()[0])} has probability 0 (removed by top-k or top-p) but "
        f"was drawn: draw from next_token_distribution (8.1)")
    worst = int((frequencies - expected).abs().argmax())
    assert abs(frequencies[worst] - expected[worst]) < 0.02, (
        f"token {worst} was drawn {frequencies[worst]:.3f} of the time in 20,000 draws, "
        f"expected {expected[worst]:.3f}: draw from next_token_distribution (8.1)")


@pytest.mark.grade("8.2", points=2)
def test_the_same_seed_gives_the_same_tokens(learner):
    logits = logits_of(500, 8)
    first, second = learner.run(samples_twice, logits=logits, seed=7, temperature=1.5)
    first = assert_tensor(first, "sample_next(logits [500, 8], ...)", shape=(500,))
    assert torch.equal(first, second), named("8.2/generator-unused")
    other = learner.run(samples_of, logits=logits, seed=8, temperature=1.5)
    # 500 draws at temperature 1.5 that are all the argmax are no chance: none was drawn.
    assert not torch.equal(first, logits.argmax(-1)), named("8.2/always-greedy")
    assert not torch.equal(first, other), (
        "seeds 7 and 8 gave the same 500 tokens: draw with the generator passed in")


@pytest.mark.grade("8.2", points=1, values=True)
def test_temperature_zero_draws_the_argmax(learner):
    logits = logits_of(6, 5)
    got = learner.run(samples_of, logits=logits, seed=0, temperature=0.0, top_k=3)
    got = assert_tensor(got, "sample_next(logits, temperature=0)", shape=(6,))
    assert got.tolist() == logits.argmax(-1).tolist(), (
        f"temperature 0 should give the argmax of each row, {logits.argmax(-1).tolist()}; "
        f"got {got.tolist()}")


@pytest.mark.grade("8.2", points=1)
def test_temperature_zero_leaves_the_generator_as_it_was(learner):
    """The docstring's contract: at temperature 0 nothing is drawn, so a generator shared
    with other draws gives them the same numbers as if this call had not been made."""
    moved = learner.run(generator_moved, logits=logits_of(3, 5), seed=2, temperature=0.0)
    assert moved is False, named("8.2/draws-at-temperature-zero")


@pytest.mark.grade("8.2", points=1)
@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_sample_next_gives_int64_ids_on_the_logits_device(learner, dtype, temperature):
    logits = logits_of(300, 6).to(dtype)
    result = run_naming(learner, samples_contract, DEVICE_CLASH, "8.2/device-not-kept",
                        logits=logits, seed=3, temperature=temperature, top_k=4)
    what = f"sample_next({dtype} logits, temperature={temperature}, top_k=4)"
    ids = assert_tensor(result["ids"], what, shape=(300,))
    kept = expected_distribution(logits.double(), temperature, 4) > 0
    drawn = (not ids.is_floating_point() and not ids.is_complex() and ids.dtype != torch.bool
             and bool(((ids >= 0) & (ids < 6)).all()))
    right = drawn and bool(kept.gather(1, ids.long()[:, None]).all())
    # Ids of the kept tokens: their dtype is the contract's too.
    assert ids.dtype == torch.int64 or not right, named("8.2/not-int64", got=ids.dtype)
    assert_tensor(ids, what, dtype=torch.int64)
    assert result["device"] in ("meta", None), (
        f"{what} for logits on the meta device gives its ids on {result['device']}. "
        + named("8.2/device-not-kept"))


@pytest.mark.grade("8.2", points=1, errors=True)
def test_sample_next_checks_its_arguments(learner):
    message = learner.raises("ValueError", samples_of, logits=torch.randn(2, 5), seed=0,
                             top_k=-2)
    assert "top_k" in message, f"the ValueError should name top_k; it says: {message!r}"


# ---------------------------------------------------------------- 8.3 attention_step


def check_step(got, expected, what, mistakes):
    mistake = first_match(got, mistakes)
    if mistake is not None and not torch.allclose(got.double(), expected, atol=1e-8):
        raise AssertionError(named(mistake))
    assert_close(got, expected, what, atol=1e-8, rtol=1e-7)


@pytest.mark.grade("8.3", points=3, values=True)
def test_one_step_over_a_given_cache(learner):
    state = trusted_state(MHA_SHAPES)
    x = torch.randn(2, 1, D_MODEL, dtype=f64)
    cache = tuple(torch.randn(2, HEADS, 3, D_MODEL // HEADS, dtype=f64) for _ in range(2))
    result = run_steps(learner, state, x, cache)
    output, (keys, values) = result["outputs"][0], result["caches"][0]
    new_k, new_v = (heads(projections(state, x, n)) for n in ("k_proj", "v_proj"))
    full_k, full_v = torch.cat([cache[0], new_k], 2), torch.cat([cache[1], new_v], 2)
    check_step(output, attention_over(state, x, full_k, full_v),
               "attention_step's output (new position over 3 cached ones)",
               {"8.3/cache-ignored": attention_over(state, x, new_k, new_v),
                "8.3/no-out-proj": attention_over(state, x, full_k, full_v, out_proj=False)})
    for got, want, old, new, name in ((keys, full_k, cache[0], new_k, "keys"),
                                      (values, full_v, cache[1], new_v, "values")):
        mistakes = {"8.3/new-position-first": torch.cat([new, old], 2),
                    "8.3/cache-not-extended": old}
        mistake = first_match(got, mistakes)
        assert mistake is None, named(mistake)
        assert_close(got, want, f"the returned cache's {name} [B, H, t + 1, d_k]",
                     atol=1e-8, hint="Append the new position along dim 2, after the old.")


@pytest.mark.grade("8.3", points=3, values=True)
def test_steps_equal_recomputing_the_prefix(learner):
    state = trusted_state(MHA_SHAPES)
    xs = torch.randn(3, 5, D_MODEL, dtype=f64)
    result = run_steps(learner, state, xs)
    # the whole prefix recomputed: causal self-attention, every position at once
    q, k, v = (heads(projections(state, xs, n)) for n in ("q_proj", "k_proj", "v_proj"))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    merged = F.scaled_dot_product_attention(q, k, v, attn_mask=causal).transpose(1, 2).reshape(
        3, 5, D_MODEL)
    full = projections(state, merged, "out_proj")
    for t, output in enumerate(result["outputs"]):
        alone = attention_over(state, xs[:, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
        check_step(output, full[:, t:t + 1],
                   f"attention_step's output at position {t}, stepping from cache=None",
                   {"8.3/no-out-proj": merged[:, t:t + 1]}
                   | ({"8.3/cache-ignored": alone} if t else {}))
    keys, values = result["caches"][-1]
    assert_close(keys, k, "the cache's keys after 5 steps", atol=1e-8,
                 hint="The cache holds every position's key, in order, [B, H, t, d_k].")
    assert_close(values, v, "the cache's values after 5 steps", atol=1e-8)


@pytest.mark.grade("8.3", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_attention_step_keeps_dtype_device_and_gradients(learner, dtype):
    state = trusted_state(MHA_SHAPES)
    x = torch.randn(2, 1, D_MODEL, dtype=f64)
    cache = [torch.randn(2, HEADS, 3, D_MODEL // HEADS, dtype=f64) for _ in range(2)]
    upstream = torch.randn(2, 1, D_MODEL, dtype=f64)
    result = learner.run(attention_step_contract, state={k: v.to(dtype) for k, v in
                                                         state.items()},
                         x=x.to(dtype), cache=[t.to(dtype) for t in cache],
                         upstream=upstream.to(dtype))
    check_names(result["names"], state, "your MultiHeadAttention (3.3)",
                "attention_step uses chapter 3's q_proj, k_proj, v_proj and out_proj")
    # The reference from the same (rounded) values in float64, each a leaf: the new key and
    # value appended to the cache, the one query over all of them.
    leaves = {name: value.to(dtype).double().requires_grad_(True) for name, value in
              [("x", x), ("keys", cache[0]), ("values", cache[1]), *state.items()]}
    weights = {name: leaves[name] for name in state}
    new_k, new_v = (heads(projections(weights, leaves["x"], n)) for n in ("k_proj", "v_proj"))
    full_k = torch.cat([leaves["keys"], new_k], 2)
    full_v = torch.cat([leaves["values"], new_v], 2)
    reference = attention_over(weights, leaves["x"], full_k, full_v)
    what = f"attention_step on {dtype} inputs"
    output = assert_tensor(result["output"], f"the output of {what}", shape=(2, 1, D_MODEL))
    assert_close(output, reference, f"the output of {what}", atol=1e-5)
    for got, want, name in zip(result["cache"], (full_k, full_v), ("keys", "values"),
                               strict=True):
        got = assert_tensor(got, f"the cache's {name} of {what}", shape=want.shape)
        assert got.dtype == dtype or not torch.allclose(got.double(), want, atol=1e-5), (
            named("8.3/dtype-changed", dtype=dtype, got=got.dtype))
        assert_tensor(got, f"the cache's {name} of {what}", dtype=dtype)
    assert_tensor(output, f"the output of {what}", dtype=dtype)
    cut = [name for name, grad in result["grads"].items() if grad is None]
    assert not cut, named("8.3/detached", names=some(cut))
    expected = dict(zip(leaves, torch.autograd.grad((reference * upstream).sum(),
                                                    list(leaves.values())), strict=True))
    for name, want in expected.items():
        assert_close(result["grads"][name], want, f"the gradient with respect to {name} "
                     f"({dtype})", atol=1e-8 if dtype == f64 else 1e-5,
                     rtol=1e-5 if dtype == f64 else 1e-4)
    devices = run_naming(learner, attention_steps_on_meta, DEVICE_CLASH, "8.3/device-not-kept",
                         x=torch.randn(2, 2, D_MODEL, dtype=dtype))
    assert devices is None or set(devices) == {"meta"}, (
        f"two steps of attention_step on the meta device, from no cache, give outputs and "
        f"caches on {devices}. " + named("8.3/device-not-kept"))


@pytest.mark.grade("8.3", points=1, errors=True)
def test_more_than_one_position_is_refused(learner):
    message = learner.raises("ValueError", attention_step_raises,
                             x=torch.randn(2, 3, D_MODEL))
    assert re.search(r"\[B, 1, D\]|one|1", message), (
        f"the ValueError for x of shape [2, 3, 16] should say that x is [B, 1, D]; it says: "
        f"{message!r}")


# ---------------------------------------------------------------- 8.4 language_model_loss


def padded_batch(batch, length, vocab, pad_id):
    tokens = torch.randint(0, vocab, (batch, length))
    tokens[tokens == pad_id] = (pad_id + 1) % vocab
    for b in range(1, batch):  # rows of different lengths, padded at the end
        tokens[b, length - b:] = pad_id
    return tokens


def mistaken_losses(logits, tokens, pad_id):
    def ce(lg, tg, ignore=pad_id):
        return F.cross_entropy(lg.reshape(-1, lg.size(-1)), tg.reshape(-1),
                               ignore_index=ignore if ignore is not None else -100)

    shifted_logits, targets = logits[:, :-1], tokens[:, 1:]
    rows = [ce(lg[None], tg[None]) for lg, tg in zip(shifted_logits, targets, strict=True)
            if (tg != pad_id).any()]
    return {"8.4/not-shifted": ce(logits, tokens),
            "8.4/shifted-backwards": ce(logits[:, 1:], tokens[:, :-1]),
            "8.4/padding-counted": ce(shifted_logits, targets, None),
            "8.4/mean-of-row-means": torch.stack(rows).mean()}


@pytest.mark.grade("8.4", points=4, values=True)
@pytest.mark.parametrize("pad_id", [0, 3])
def test_language_model_loss(learner, pad_id):
    logits = torch.randn(4, 6, 9, dtype=f64) * 2
    tokens = padded_batch(4, 6, 9, pad_id)
    got = learner.run(loss_of, logits=logits, tokens=tokens, pad_id=pad_id)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 9), tokens[:, 1:].reshape(-1),
                               ignore_index=pad_id)
    assert_tensor(got, f"language_model_loss(logits, tokens, pad_id={pad_id})", shape=())
    if not torch.allclose(got.double(), expected, atol=1e-8):
        mistake = first_match(got.reshape(()), mistaken_losses(logits, tokens, pad_id))
        assert mistake is None, named(mistake)
    assert_close(got, expected, f"language_model_loss(logits, tokens, pad_id={pad_id})",
                 atol=1e-8, hint="The logits at position i predict token i + 1; padding "
                 "targets are left out; the mean is over the tokens that count.")


@pytest.mark.grade("8.4", points=1, values=True)
def test_loss_of_one_sequence_of_two_tokens(learner):
    logits = torch.randn(1, 2, 5, dtype=f64)
    tokens = torch.tensor([[4, 2]])
    got = learner.run(loss_of, logits=logits, tokens=tokens, pad_id=0)
    assert_close(got, -torch.log_softmax(logits[0, 0], -1)[2],
                 "language_model_loss for tokens [[4, 2]]", atol=1e-8,
                 hint="Two tokens make one prediction: the first position's logits score "
                 "the second token.")


@pytest.mark.grade("8.4", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_loss_keeps_dtype_and_gradient(learner, dtype):
    logits = (torch.randn(3, 5, 7, dtype=f64) * 2).to(dtype).double().requires_grad_(True)
    tokens = padded_batch(3, 5, 7, pad_id=0)
    result = learner.run(loss_and_gradient, logits=logits.detach().to(dtype), tokens=tokens,
                         pad_id=0)
    what = f"language_model_loss of {dtype} logits"
    reference = F.cross_entropy(logits[:, :-1].reshape(-1, 7), tokens[:, 1:].reshape(-1),
                                ignore_index=0)
    loss = assert_tensor(result["loss"], what, shape=())
    assert_close(loss, reference, what, atol=1e-5, hint="The logits at position i predict "
                 "token i + 1; padding targets are left out.")
    # Right values: the dtype and the graph of the loss are the contract's too.
    assert loss.dtype == dtype, named("8.4/dtype-changed", dtype=dtype, got=loss.dtype)
    assert result["grad"] is not None, named("8.4/detached")
    (expected,) = torch.autograd.grad(reference, logits)
    assert_close(result["grad"], expected, f"the gradient of {what}",
                 atol=1e-8 if dtype == f64 else 1e-6)


@pytest.mark.grade("8.4", points=1, errors=True)
def test_loss_refuses_what_predicts_nothing(learner):
    message = learner.raises("ValueError", loss_of, logits=torch.randn(2, 1, 5),
                             tokens=torch.ones(2, 1, dtype=torch.long), pad_id=0)
    assert re.search(r"L|length|2|token", message), (
        f"the ValueError for sequences of one token should say that L must be at least 2; it "
        f"says: {message!r}")
    message = learner.raises("ValueError", loss_of, logits=torch.randn(2, 4, 5),
                             tokens=torch.ones(2, 3, dtype=torch.long), pad_id=0)
    assert re.search(r"shape|\[|match", message), (
        f"the ValueError for logits [2, 4, 5] with tokens [2, 3] should name the shapes; it "
        f"says: {message!r}")


# ---------------------------------------------------------------- 8.5 the decoder-only model

LM_VOCAB, LM_MAX_LEN = 11, 12


def language_model_run(impl, state, tie, norm_first, tokens, mask, dropout=0.0):
    """The learner's DecoderOnlyTransformer (V = 11, d_model 16, 4 heads, d_ff 32, 2 layers,
    with ``dropout``) with the grader's weights ``state``: its state-dict names and
    ``model(tokens, mask)`` in training mode after ``torch.manual_seed(REPLAY_SEED)``, with
    how many times the generator ran; for a size mismatch after a second run of the
    generator, its message."""
    model = impl.DecoderOnlyTransformer(LM_VOCAB, D_MODEL, HEADS, 32, 2, dropout=dropout,
                                        norm_first=norm_first, tie_embeddings=tie,
                                        max_len=LM_MAX_LEN).double()
    names = load_trusted(model, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    model.train()
    torch.manual_seed(REPLAY_SEED)
    return {"names": names, **forward_counting_generator(model, tokens, mask)}


def forward_counting_generator(model, tokens, mask):
    """``model(tokens, mask)`` as ``logits``, with how many times its generator ran; for a
    size mismatch after a second run of the generator, the error's message as
    ``size_error``."""
    calls = []
    generator = getattr(model, "generator", None)
    if isinstance(generator, torch.nn.Module):
        generator.register_forward_pre_hook(lambda module, args: calls.append(len(calls)))
    try:
        logits = model(tokens, mask)
    except (RuntimeError, ValueError) as error:
        if isinstance(error, NotImplementedError) or len(calls) < 2:
            raise
        return {"size_error": str(error), "generator_calls": len(calls)}
    return {"logits": logits, "generator_calls": len(calls)}


def language_model_contract(impl, state, tokens, mask, upstream):
    """The learner's DecoderOnlyTransformer (as :func:`language_model_run`, pre-LN, tied,
    without dropout) converted with ``.double()``, then, for float32 weights ``state``,
    ``.float()``; with the grader's weights, in eval mode: its logits (detached) and the
    gradients of ``(logits * upstream).sum()`` with respect to every parameter, by name (None
    for one it does not reach)."""
    model = impl.DecoderOnlyTransformer(LM_VOCAB, D_MODEL, HEADS, 32, 2, dropout=0.0,
                                        norm_first=True, tie_embeddings=True,
                                        max_len=LM_MAX_LEN).double()
    if state["generator.bias"].dtype == torch.float32:
        model = model.float()
    names = load_trusted(model, state)
    if names != {n: list(v.shape) for n, v in state.items()}:
        return {"names": names}
    found = forward_counting_generator(model.eval(), tokens, mask)
    if "size_error" in found:
        return {"names": names, **found}
    logits = found["logits"]
    parameters = dict(model.named_parameters())
    grads = (torch.autograd.grad((logits * upstream).sum(), list(parameters.values()),
                                 allow_unused=True)
             if isinstance(logits, torch.Tensor) and logits.requires_grad
             else [None] * len(parameters))
    return {"names": names, "logits": logits.detach() if isinstance(logits, torch.Tensor)
            else logits, "grads": dict(zip(parameters, grads, strict=True))}


def language_model_on_meta(impl, tokens, mask):
    """The device of the learner's DecoderOnlyTransformer's logits, the model, tokens and
    mask moved to the "meta" device (a stand-in for a GPU; None when its code cannot run
    there, checks.on_meta)."""
    model = impl.DecoderOnlyTransformer(LM_VOCAB, D_MODEL, HEADS, 32, 2, dropout=0.0,
                                        norm_first=True, tie_embeddings=True,
                                        max_len=LM_MAX_LEN).to("meta").eval()
    logits = on_meta(lambda: model(tokens.to("meta"), mask.to("meta")))
    return logits.device.type if isinstance(logits, torch.Tensor) else None


def language_model_weights(norm_first, tie):
    """The grader's weights by the contract's names: the stack's layers (``decoder.layers.i``,
    two residuals each), its last norm pre-LN, the embedding and the generator (one matrix
    under both names when ``tie``), the sinusoidal table."""
    shapes = {}
    for i in range(2):
        for p in ("q", "k", "v", "out"):
            shapes[f"decoder.layers.{i}.self_attn.{p}_proj.weight"] = (D_MODEL, D_MODEL)
            shapes[f"decoder.layers.{i}.self_attn.{p}_proj.bias"] = (D_MODEL,)
        shapes.update({f"decoder.layers.{i}.feed_forward.linear1.weight": (32, D_MODEL),
                       f"decoder.layers.{i}.feed_forward.linear1.bias": (32,),
                       f"decoder.layers.{i}.feed_forward.linear2.weight": (D_MODEL, 32),
                       f"decoder.layers.{i}.feed_forward.linear2.bias": (D_MODEL,)})
        for r in range(2):
            shapes[f"decoder.layers.{i}.residuals.{r}.norm.weight"] = (D_MODEL,)
            shapes[f"decoder.layers.{i}.residuals.{r}.norm.bias"] = (D_MODEL,)
    if norm_first:
        shapes.update({"decoder.norm.weight": (D_MODEL,), "decoder.norm.bias": (D_MODEL,)})
    shapes.update({"embed.tokens.embedding.weight": (LM_VOCAB, D_MODEL),
                   "generator.weight": (LM_VOCAB, D_MODEL), "generator.bias": (LM_VOCAB,)})
    state = trusted_state(shapes)
    if tie:
        state["generator.weight"] = state["embed.tokens.embedding.weight"]
    position = torch.arange(LM_MAX_LEN, dtype=f64)[:, None]
    rate = 10000.0 ** (-torch.arange(0, D_MODEL, 2, dtype=f64) / D_MODEL)
    table = torch.zeros(LM_MAX_LEN, D_MODEL, dtype=f64)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
    state["embed.positions.pe"] = table
    return state


def language_model_replay(tokens, state, norm_first, mask, p, embedding_p=None, stack_p=None,
                          positions=True):
    """The model's logits in training mode, replayed from the grader's weights and seeded as
    the worker's run (checks.replay_stack); a mistake's with the embedding's or the stack's
    dropout (``embedding_p``, ``stack_p``, default ``p``), the positions or the mask left
    out."""
    torch.manual_seed(REPLAY_SEED)
    x = replay_embedding(tokens, state, "embed.", p if embedding_p is None else embedding_p,
                         positions=positions)
    hidden = replay_stack(x, state, "decoder.", heads=HEADS, norm_first=norm_first,
                          p=p if stack_p is None else stack_p, self_mask=mask)
    return F.linear(hidden, state["generator.weight"], state["generator.bias"])


@pytest.mark.grade("8.5", points=3, values=True)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("tie, dropout", [(True, 0.0), (False, 0.0), (False, DROPOUT)],
                         ids=["tied", "untied", f"untied, dropout {DROPOUT} in training"])
def test_decoder_only_model_matches_pytorch(learner, norm_first, tie, dropout):
    tokens = torch.randint(3, LM_VOCAB, (2, 6))
    tokens[1, 4:] = 0  # padding
    mask = (tokens != 0)[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
    state = language_model_weights(norm_first, tie)
    result = learner.run(language_model_run, state=state, tie=tie, norm_first=norm_first,
                         tokens=tokens, mask=mask, dropout=dropout)
    assert not any(".cross_attn." in name for name in result["names"]), (
        "the stack has cross-attention: decoder is Chapter 5's Encoder (self-attention and "
        "feed-forward only), which the causal mask makes a decoder; Chapter 5's Decoder "
        "reads an encoder's memory, which a language model has not.")
    check_names(result["names"], state, f"DecoderOnlyTransformer(tie_embeddings={tie})",
                hint="embed is embeddings(...) of Chapter 5, decoder Chapter 5's Encoder, "
                "generator the last linear layer.")
    assert "size_error" not in result, named("8.5/generator-twice",
                                             calls=result["generator_calls"],
                                             error=result.get("size_error"))
    config = SimpleNamespace(src_vocab_size=LM_VOCAB, tgt_vocab_size=LM_VOCAB, num_layers=2,
                             d_model=D_MODEL, d_ff=32, num_heads=HEADS, dropout=0.0,
                             max_len=LM_MAX_LEN, norm_first=norm_first, tie_embeddings=tie)
    theirs = TorchLanguageModel(config).double().train()  # dropout 0; off the fast path
    theirs.load_course_state_dict(state)

    def replay(**mistaken):
        return language_model_replay(tokens, state, norm_first,
                                     **{"mask": mask, "p": dropout, **mistaken})

    with torch.no_grad():
        expected = replay() if dropout else theirs(tokens, mask)
        mistakes = {"8.5/log-probabilities": F.log_softmax(expected, dim=-1),
                    "8.5/mask-not-passed": replay(mask=None),
                    "8.5/positions-skipped": replay(positions=False)}
        dropless = {"the embedding": replay(embedding_p=0.0), "the stack": replay(stack_p=0.0),
                    "the embedding and the stack": replay(p=0.0)} if dropout else {}
    output = result["logits"]
    mistake = mistake_of(output, expected, mistakes)
    missing = None if mistake else mistake_of(output, expected, dropless)
    assert_close(output, expected, f"DecoderOnlyTransformer(norm_first={norm_first}, "
                 f"tie_embeddings={tie}, dropout={dropout})(tokens, mask)"
                 + (" in training" if dropout else ""),
                 hint=named(mistake) if mistake else named("8.5/dropout-not-passed-on",
                                                           parts=missing) if missing
                 else "generator(decoder(embed(tokens), mask)).")


def language_model_build(impl):
    """Whether the generator shares the embedding's matrix, tied and untied; the weights'
    largest entries at initialisation, with Xavier's bound for each."""
    found = {}
    for tie in (True, False):
        torch.manual_seed(0)
        model = impl.DecoderOnlyTransformer(40, D_MODEL, HEADS, 32, 2, tie_embeddings=tie)
        weights = dict(model.named_parameters(remove_duplicate=False))
        embedding, generator = (weights.get(name) for name in (
            "embed.tokens.embedding.weight", "generator.weight"))
        found[tie] = {
            "names": embedding is not None,
            "tied": generator is embedding,
            "how": untied_how(generator, embedding),
            "count": sum(p.numel() for p in model.parameters()),
            "largest": {name: [value.abs().max().item(),
                               math.sqrt(6 / (value.size(0) + value.size(1)))]
                        for name, value in model.state_dict().items()
                        if value.dim() == 2 and not name.endswith(".pe")}}
    return found


@pytest.mark.grade("8.5", points=2)
def test_decoder_only_model_ties_and_initialises(learner):
    found = learner.run(language_model_build)
    assert found[True]["names"], (
        "DecoderOnlyTransformer has no embed.tokens.embedding.weight: build embed with "
        "Chapter 5's embeddings(...) (active_parts().embeddings), whose modules are named "
        "tokens and positions.")
    assert found[True]["tied"], named("8.5/not-tied", how=found[True]["how"])
    assert not found[False]["tied"], (
        "DecoderOnlyTransformer(tie_embeddings=False) shares the embedding's matrix: "
        "untied, the generator keeps a matrix of its own.")
    assert found[False]["count"] - found[True]["count"] == 40 * D_MODEL, (
        f"tied, the model should have V x d_model = {40 * D_MODEL} parameters fewer than "
        f"untied; it has {found[False]['count'] - found[True]['count']} fewer.")
    for name, (largest, bound) in found[False]["largest"].items():
        assert largest <= bound * (1 + 1e-6), named(
            "8.5/not-xavier", name=name, largest=f"{largest:.3g}", bound=f"{bound:.3g}")
        assert largest > 0.5 * bound, (
            f"{name} is at most {largest:.3g} at initialisation, far inside Xavier's bound "
            f"{bound:.3g}: use nn.init.xavier_uniform_.")


@pytest.mark.grade("8.5", points=1)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_decoder_only_model_follows_its_dtype_and_device_and_trains_every_parameter(learner,
                                                                                   dtype):
    tokens = torch.randint(3, LM_VOCAB, (2, 6))
    tokens[1, 4:] = 0
    mask = (tokens != 0)[:, None, None, :] & torch.ones(6, 6, dtype=torch.bool).tril()
    state = language_model_weights(norm_first=True, tie=True)
    upstream = torch.randn(2, 6, LM_VOCAB, dtype=f64)
    theirs = {name: value.to(dtype) for name, value in state.items()}
    theirs["generator.weight"] = theirs["embed.tokens.embedding.weight"]  # still one matrix
    result = learner.run(language_model_contract, state=theirs, tokens=tokens, mask=mask,
                         upstream=upstream.to(dtype))
    check_names(result["names"], state, "DecoderOnlyTransformer(tie_embeddings=True)")
    assert "size_error" not in result, named("8.5/generator-twice",
                                             calls=result["generator_calls"],
                                             error=result.get("size_error"))
    # The reference from the same (rounded) weights in float64, each matrix a leaf once (the
    # tied one gathers the gradients of both its uses).
    leaves = {id(value): value.to(dtype).double().requires_grad_(True)
              for value in state.values()}
    weights = {name: leaves[id(value)] for name, value in state.items()}
    reference = language_model_replay(tokens, weights, True, mask, 0.0)
    what = ("DecoderOnlyTransformer(...).double()" + (".float()" if dtype != f64 else "")
            + "(tokens, mask)")
    logits = assert_tensor(result["logits"], what, shape=(2, 6, LM_VOCAB))
    assert_close(logits, reference, what, atol=1e-5, rtol=1e-4)
    assert logits.dtype == dtype, named("8.5/dtype-changed", dtype=dtype, got=logits.dtype)
    trained = {name: weights[name] for name in result["grads"]}
    cut = [name for name, grad in result["grads"].items() if grad is None]
    assert not cut, named("8.5/detached", names=some(cut))
    expected = torch.autograd.grad((reference * upstream).sum(), list(trained.values()))
    for (name, grad), want in zip(result["grads"].items(), expected, strict=True):
        assert_close(grad, want, f"the gradient with respect to {name} ({dtype})",
                     atol=1e-8 if dtype == f64 else 1e-4, rtol=1e-5 if dtype == f64 else 1e-3)
    device = run_naming(learner, language_model_on_meta, DEVICE_CLASH, "8.5/device-not-kept",
                        tokens=tokens, mask=mask)
    assert device in ("meta", None), (
        f"DecoderOnlyTransformer moved to the meta device, with tokens and mask there, gives "
        f"its logits on {device}. " + named("8.5/device-not-kept"))


# ---------------------------------------------------------------- 8.6 capstone


def progressions():
    """Every progression's tokens, as the package's capstone task writes them: BOS (1),
    8 terms a, a + d, ... modulo 10 as ids 3..12, EOS (2); 100 rows."""
    start, step = torch.arange(10).repeat_interleave(10), torch.arange(10).repeat(10)
    terms = (start[:, None] + step[:, None] * torch.arange(8)) % 10 + 3
    return torch.cat([torch.ones(100, 1, dtype=torch.long), terms,
                      torch.full((100, 1), 2)], dim=1)


@pytest.mark.grade("8.6", points=5, values=True)
@pytest.mark.cpu_seconds(300)
def test_capstone_your_decoder_only_model_learns_progressions(learner):
    try:
        trained = learner.run(trained_language_model, steps=CAPSTONE_STEPS)
    except LearnerNotImplemented as error:
        raise LearnerNotImplemented(
            f"the capstone builds and trains your decoder-only model (8.5) from your parts "
            f"of chapters 1 to 5 with your language_model_loss (8.4), and met a stub: "
            f"{error}") from error
    check_trained_config(trained["config"], CAPSTONE_CONFIG, "your trained model")
    model = TorchLanguageModel(SimpleNamespace(**CAPSTONE_CONFIG))
    try:
        model.load_course_state_dict(trained["state"])
    except KeyError as error:
        raise AssertionError(
            f"the trained model's weights do not have the names and shapes the syllabus "
            f"gives them: {error}") from error
    from annotated_transformer.language_model import HELD_OUT as HELD_OUT_ROWS

    rows = progressions()
    seen = [row for row in range(100) if row not in HELD_OUT_ROWS]
    continued = complete_greedily(model.eval(), rows[seen, :3], 7)  # 6 terms and EOS
    accuracy = (continued == rows[seen, 3:]).all(dim=1).double().mean().item()
    assert accuracy >= CAPSTONE_THRESHOLD, (
        f"after {CAPSTONE_STEPS} steps your model continues {accuracy:.0%} of the "
        f"progressions it was trained on exactly from their first two terms (its last loss "
        f"{trained['last_loss']:.3f}; ln 80 / 9 = 0.49 is the least possible, the first two "
        f"terms being random); at least {CAPSTONE_THRESHOLD:.0%} is expected. If every other "
        f"exercise passes, check that the loss is shifted (8.4) and nothing is detached.")
    # Held-out data: the 20 progressions it never saw, each next token (the terms 3 to 8 and
    # EOS) read from the true terms before it. Most of their steps occur in trained
    # progressions from other starts, so a model that learnt the rule, not only its rows,
    # gets most of them right.
    held_out = rows[list(HELD_OUT_ROWS)]
    inputs = held_out[:, :-1]  # BOS and the 8 terms
    causal = torch.ones(inputs.size(1), inputs.size(1), dtype=torch.bool).tril()
    with torch.no_grad():
        logits = model(inputs, causal)  # [20, 9, V]
    right = (logits.argmax(-1)[:, 2:] == held_out[:, 3:]).double().mean().item()
    assert right >= CAPSTONE_HELD_OUT_THRESHOLD, (
        f"on the {len(HELD_OUT_ROWS)} progressions it never trained on, given the true terms "
        f"so far, your model writes the next term (or the end) right {right:.0%} of the time "
        f"(a guess: about 10%); "
        f"at least {CAPSTONE_HELD_OUT_THRESHOLD:.0%} is expected: it has memorised its rows "
        f"rather than learnt to continue a progression. If every other exercise passes, check "
        f"the causal mask (4.3) and that positions are added (8.5).")
