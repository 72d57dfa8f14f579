"""The fast parts compute what the reference computes (float64, equal weights, dropout off)."""

from __future__ import annotations

import pytest
import torch

from annotated_transformer import Parts, use_parts
from annotated_transformer.cli import parse_parts
from annotated_transformer.data.copy import CopyTask
from annotated_transformer.fast_parts import _ops
from annotated_transformer.inspect_attention import attention_maps
from annotated_transformer.model import DecoderOnlyTransformer, EncoderDecoder, TransformerConfig
from annotated_transformer.parts import _exported_names, chapter_files, load_chapter

REF, FAST = Parts.reference(), Parts("fast")
B, LQ, LK, D, H = 3, 5, 7, 16, 4
TOL = dict(rtol=1e-10, atol=1e-12)


def close(actual, expected, what=""):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert torch.allclose(actual, expected, **TOL), (
        f"{what}: largest difference {(actual - expected).abs().max().item():.3g}")


def grads(module_or_tensors):
    if isinstance(module_or_tensors, torch.nn.Module):
        return {n: p.grad for n, p in module_or_tensors.named_parameters()}
    return [t.grad for t in module_or_tensors]


def twins(name, *args, **kwargs):
    """The reference part and the fast one, float64, the fast one with the reference's weights."""
    torch.manual_seed(0)
    ref = getattr(REF, name)(*args, **kwargs).double()
    with use_parts(FAST):
        fast = getattr(FAST, name)(*args, **kwargs).double()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def masks(lq=LQ, lk=LK):
    """Every kind of mask the course makes, and one with a query that sees no key."""
    padding = torch.ones(B, 1, 1, lk, dtype=torch.bool)
    padding[0, ..., lk - 2:] = False
    causal = torch.ones(lq, lk, dtype=torch.bool).tril()
    empty_row = torch.ones(B, 1, lq, lk, dtype=torch.bool)
    empty_row[1, 0, 2] = False
    per_head = torch.rand(B, H, lq, lk) > 0.3
    per_head[..., 0] = True
    return {"none": None, "padding": padding, "causal": causal, "target": padding & causal,
            "empty_row": empty_row, "per_head": per_head}


# ---------------------------------------------------------------- the registry


def test_fast_is_a_source_with_the_reference_names():
    assert set(chapter_files("fast")) == set(chapter_files("solutions"))
    for chapter, path in chapter_files("solutions").items():
        names = _exported_names(path)
        assert _exported_names(chapter_files("fast")[chapter]) == names
        module = FAST.module(chapter)
        assert module.__name__.startswith("annotated_transformer.fast_parts.")
        for name in names:
            assert getattr(FAST, name).__wrapped__ is getattr(module, name)
    mixed = Parts.reference().with_chapter(3, "fast")
    assert mixed.MultiHeadAttention.__wrapped__ is FAST.module(3).MultiHeadAttention
    assert mixed.LayerNorm.__wrapped__ is REF.module(5).LayerNorm
    assert Parts("fast").describe() == "fast"
    assert parse_parts("fast") == FAST, "--parts fast on the command line"


# ---------------------------------------------------------------- chapter 2


def test_softmax_equals_the_reference_with_all_masked_rows():
    x = torch.randn(4, 6, dtype=torch.float64) * 10
    x[1] = float("-inf")
    x[2, :3] = float("-inf")
    close(FAST.softmax(x), REF.softmax(x), "softmax")
    assert FAST.softmax(x)[1].eq(0).all()
    close(FAST.softmax(x, dim=0), REF.softmax(x, dim=0), "softmax over dim 0")


@pytest.mark.parametrize("kind", list(masks()))
def test_attention_function_equals_the_reference(kind):
    mask = masks()[kind]
    outputs = {}
    for parts in (REF, FAST):
        torch.manual_seed(1)
        q, k, v = (torch.randn(B, H, n, 8, dtype=torch.float64, requires_grad=True)
                   for n in (LQ, LK, LK))
        out, weights = parts.scaled_dot_product_attention(q, k, v, mask=mask)
        (out.square().sum() + weights.square().sum()).backward()
        outputs[parts.default] = (out, weights, *grads([q, k, v]))
    for a, b, what in zip(outputs["fast"], outputs["solutions"], ("out", "weights", "dq", "dk",
                                                                 "dv"), strict=True):
        close(a, b, what)
        assert not a.isnan().any()


# ---------------------------------------------------------------- chapter 3


@pytest.mark.parametrize("path", ["explicit", "sdpa"])
@pytest.mark.parametrize("inputs", ["self", "cross", "distinct"])
@pytest.mark.parametrize("kind", list(masks()))
def test_multi_head_attention_equals_the_reference(path, inputs, kind):
    lk = LQ if inputs == "self" else LK
    mask = masks(LQ, lk)[kind]
    ref, fast = twins("MultiHeadAttention", D, H)
    fast.sdpa_min_length = 10**9 if path == "explicit" else 0
    torch.manual_seed(2)
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    memory, other = torch.randn(2, B, lk, D, dtype=torch.float64)
    results = []
    for module in (ref, fast):
        q = x.clone().requires_grad_()
        k = q if inputs == "self" else memory.clone().requires_grad_()
        v = k if inputs in ("self", "cross") else other.clone().requires_grad_()
        out = module(q, k, v, mask)
        out.square().sum().backward()
        leaves = [t for t in (q, k, v) if t.is_leaf]
        results.append((out, grads(leaves), grads(module)))
    (out_r, inputs_r, params_r), (out_f, inputs_f, params_f) = results
    close(out_f, out_r, "output")
    assert not out_f.isnan().any()
    for a, b in zip(inputs_f, inputs_r, strict=True):
        close(a, b, "input gradient")
    for name in params_r:
        close(params_f[name], params_r[name], f"gradient of {name}")
    assert fast.attention_weights is None, "no weights kept in training unless asked"


@pytest.mark.parametrize("kind", ["padding", "causal", "empty_row"])
def test_attention_weights_are_kept_in_eval_mode_or_when_asked(kind):
    mask = masks(LQ, LQ)[kind]
    ref, fast = twins("MultiHeadAttention", D, H)
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    ref.eval(), fast.eval()
    with torch.no_grad():
        close(fast(x, x, x, mask), ref(x, x, x, mask), "output in eval mode")
    close(fast.attention_weights, ref.attention_weights, "attention_weights")
    fast.train()
    fast.keep_weights = True
    fast(x, x, x, mask)
    close(fast.attention_weights, ref.attention_weights, "attention_weights, keep_weights")
    fast.eval()
    fast.keep_weights = False
    fast(x, x, x, mask)
    assert fast.attention_weights is None


def test_the_fused_kernel_runs_where_it_wins():
    module = FAST.MultiHeadAttention(D, H, dropout=0.1)
    short, long = torch.zeros(1, 1, 16, 8), torch.zeros(1, 1, 256, 8)
    assert not module._fused_wins(short, 0.0) and module._fused_wins(long, 0.0)
    assert not module._fused_wins(long, 0.1), "no dropout in PyTorch's CPU kernel"
    module.sdpa_min_length = 8
    assert module._fused_wins(short, 0.0)


def test_a_mask_changed_in_place_is_read_again():
    ref, fast = twins("MultiHeadAttention", D, H)
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    mask = torch.ones(B, 1, 1, LQ, dtype=torch.bool)
    close(fast(x, x, x, mask), ref(x, x, x, mask), "before")
    mask[0, ..., 3:] = False
    close(fast(x, x, x, mask), ref(x, x, x, mask), "after a padding change")
    mask[1] = False  # every key of row 1 masked: zeros, not NaN
    out = fast(x, x, x, mask)
    close(out, ref(x, x, x, mask), "after masking a whole row")
    assert not out.isnan().any()


def test_mask_errors_are_the_references():
    _, fast = twins("MultiHeadAttention", D, H)
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="mask"):
        fast(x, x, x, torch.ones(B, LQ, LQ, dtype=torch.bool))
    with pytest.raises(ValueError, match="divisible"):
        FAST.MultiHeadAttention(10, 3)


# ---------------------------------------------------------------- chapter 5


def test_layer_norm_and_feed_forward_equal_the_reference():
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    for name, args in (("LayerNorm", (D,)), ("PositionwiseFeedForward", (D, 32))):
        ref, fast = twins(name, *args)
        if name == "LayerNorm":  # not the initial ones and zeros
            with torch.no_grad():
                for module in (ref, fast):
                    module.weight.copy_(torch.linspace(0.5, 1.5, D))
                    module.bias.copy_(torch.linspace(-1, 1, D))
        outs = []
        for module in (ref, fast):
            xi = x.clone().requires_grad_()
            out = module(xi)
            out.pow(3).sum().backward()
            outs.append((out, xi.grad, grads(module)))
        close(outs[1][0], outs[0][0], name)
        close(outs[1][1], outs[0][1], f"{name} input gradient")
        for key in outs[0][2]:
            close(outs[1][2][key], outs[0][2][key], f"{name} gradient of {key}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_equals_the_reference(norm_first):
    ref, fast = twins("ResidualConnection", D, norm_first=norm_first)
    x = torch.randn(B, LQ, D, dtype=torch.float64)
    weight = torch.randn(D, D, dtype=torch.float64)
    close(fast(x, lambda y: y @ weight), ref(x, lambda y: y @ weight), "residual")


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", ["none", "padding", "target", "empty_row"])
def test_layers_equal_the_reference(norm_first, kind):
    lt, ls = LQ, LK
    tgt_mask, src_mask = masks(lt, lt)[kind], masks(lt, ls)["padding"]
    for name in ("EncoderLayer", "DecoderLayer"):
        ref, fast = twins(name, D, H, 32, 0.0, norm_first)
        torch.manual_seed(3)
        x = torch.randn(B, lt, D, dtype=torch.float64)
        memory = torch.randn(B, ls, D, dtype=torch.float64)
        outs = []
        for module in (ref, fast):
            xi, mi = x.clone().requires_grad_(), memory.clone().requires_grad_()
            out = module(xi, tgt_mask) if name == "EncoderLayer" else module(
                xi, mi, src_mask, tgt_mask)
            out.square().sum().backward()
            outs.append((out, xi.grad, mi.grad, grads(module)))
        close(outs[1][0], outs[0][0], name)
        close(outs[1][1], outs[0][1], f"{name} input gradient")
        if name == "DecoderLayer":
            close(outs[1][2], outs[0][2], f"{name} memory gradient")
        for key in outs[0][3]:
            close(outs[1][3][key], outs[0][3][key], f"{name} gradient of {key}")


# ---------------------------------------------------------------- chapter 6


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [None, 0])
def test_loss_equals_the_reference(smoothing, ignore_index):
    logits = torch.randn(12, 9, dtype=torch.float64)
    target = torch.randint(0, 9, (12,))
    target[:3] = 0
    results = []
    for parts in (REF, FAST):
        x = logits.clone().requires_grad_()
        loss = parts.LabelSmoothingLoss(smoothing, ignore_index=ignore_index)(x, target)
        loss.backward()
        results.append((loss, x.grad))
    close(results[1][0], results[0][0], "loss")
    close(results[1][1], results[0][1], "loss gradient")


def test_loss_of_only_ignored_targets_is_zero():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    loss = FAST.LabelSmoothingLoss(0.1, ignore_index=0)(x, torch.zeros(4, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and x.grad.eq(0).all()
    with pytest.raises(ValueError, match="smoothing"):
        FAST.LabelSmoothingLoss(1.0)


# ---------------------------------------------------------------- dropout


def test_dropout_keeps_one_minus_p_and_scales_like_pytorch():
    x = torch.ones(400_000)
    torch.manual_seed(0)
    out = _ops.dropout(x, 0.1)
    kept = out != 0
    assert abs(kept.double().mean().item() - 0.9) < 3e-3
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.9))
    torch.manual_seed(0)
    assert torch.equal(_ops.dropout(x, 0.1), out), "torch.manual_seed fixes the mask"
    assert _ops.dropout(x, 0.1, training=False) is x and _ops.dropout(x, 0.0) is x
    halves = _ops.dropout(torch.ones(2, 100_000), 0.5) != 0
    assert abs(halves[0].double().mean().item() - 0.5) < 0.01
    assert abs((halves[0] == halves[1]).double().mean().item() - 0.5) < 0.01, "independent"
    assert _ops.dropout(torch.ones(3), 1.0).eq(0).all()
    for odd in (1, 3, 5, 7):  # a count that is not a multiple of the elements a draw serves
        assert _ops.dropout(torch.ones(odd), 0.1).shape == (odd,)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32])
def test_the_threshold_is_tested_without_a_comparison_at_every_integer_near_it(dtype):
    """``at_least`` (clamp, subtract) is ``integers >= threshold`` as 1 and 0, at the
    threshold, one either side, and the type's extremes."""
    info = torch.iinfo(dtype)
    for threshold in (info.min + 1, -6554, 0, 1, 6553, info.max):
        near = [info.min, info.min + 1, threshold - 1, threshold, info.max - 1, info.max]
        near += [threshold + 1] if threshold < info.max else []
        integers = torch.tensor(near, dtype=dtype)
        expected = (integers >= threshold).to(dtype)
        assert torch.equal(_ops.at_least(integers.clone(), threshold), expected), threshold


@pytest.mark.parametrize("p", [0.1, 0.5, 1e-6, 1 - 1e-6])
def test_the_mask_of_a_seed_is_the_comparison_of_its_random_integers(p):
    """``scaled_mask``: 0 or ``1 / (1 - p)`` where the seed's 16 (or, near 0 and 1, 32)
    random bits reach the threshold."""
    x = torch.ones(4_001, dtype=torch.float64)  # not a multiple of the elements a draw serves
    bits = 16 if 0 < round(p * 2**16) < 2**16 else 32
    torch.manual_seed(3)
    mask = _ops.scaled_mask(x, p)
    torch.manual_seed(3)
    per_draw, span = 64 // bits, 2**bits
    draws = torch.empty(-(-x.numel() // per_draw), dtype=torch.int64).random_(-(2**63), None)
    integers = draws.view(torch.int16 if bits == 16 else torch.int32)[: x.numel()]
    expected = (integers.long() >= round(p * span) - span // 2).double() / (1 - p)
    assert mask.dtype == torch.float64 and torch.equal(mask, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relu_then_dropout_in_one_mask_is_the_same_values_and_gradients(dtype):
    """``relu_dropout`` draws the mask ``dropout`` would draw for ``relu(x)`` (the same seed,
    the same mask) and gives its values and gradients, 0 included among the inputs."""
    x = torch.randn(37, 64, dtype=dtype)
    x[0, :8] = 0.0
    module = torch.nn.Dropout(0.3)
    results = []
    for fused in (True, False):
        leaf = x.clone().requires_grad_()
        torch.manual_seed(5)
        out = (_ops.relu_dropout(leaf, module) if fused
               else _ops.module_dropout(torch.relu(leaf), module))
        (out * torch.arange(out.numel(), dtype=dtype).view_as(out)).sum().backward()
        results.append((out.detach(), leaf.grad))
    (fused_out, fused_grad), (plain_out, plain_grad) = results
    assert fused_out.dtype == dtype and torch.equal(fused_out, plain_out)
    assert torch.equal(fused_grad, plain_grad)
    assert 0 < (fused_out == 0).double().mean() < 1
    module.eval()
    assert torch.equal(_ops.relu_dropout(x, module), torch.relu(x))


def test_a_residual_sum_with_dropout_in_one_kernel_is_the_same_values_and_gradients():
    """``add_dropout(x, y)`` is ``x + dropout(y)`` with the mask the same seed draws."""
    x, y = torch.randn(2, 37, 64, dtype=torch.float64).unbind(0)
    module = torch.nn.Dropout(0.2)
    results = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (x, y)]
        torch.manual_seed(7)
        out = (_ops.add_dropout(*leaves, module) if fused
               else leaves[0] + _ops.module_dropout(leaves[1], module))
        (out * out).sum().backward()
        results.append((out.detach(), *(t.grad for t in leaves)))
    for fused, plain in zip(*results, strict=True):
        assert torch.allclose(fused, plain, **TOL)
    assert 0 < (results[0][2] == 0).double().mean() < 1  # dropped: no gradient to y
    module.eval()
    assert torch.equal(_ops.add_dropout(x, y, module), x + y)


@pytest.mark.parametrize("p", [1e-6, 1 - 1e-6])
def test_dropout_near_zero_or_one_takes_32_bits_an_element(p):
    """16 bits would round ``p`` to 0 or 1: 32 bits keep it (the kept share is ``1 - p``)."""
    torch.manual_seed(0)
    kept = (_ops.dropout(torch.ones(2_000_000), p) != 0).double().mean().item()
    assert abs(kept - (1 - p)) < 5e-5 and 0 < kept < 1


def test_a_model_with_dropout_is_random_in_training_and_deterministic_in_eval():
    config = TransformerConfig(13, 13, num_layers=1, d_model=16, d_ff=32, num_heads=2,
                               dropout=0.3, max_len=16)
    torch.manual_seed(0)
    model = EncoderDecoder(config, parts=FAST)
    src = torch.randint(3, 13, (8, 6))
    first, second = model.encode(src, None), model.encode(src, None)
    assert first.isfinite().all() and not torch.equal(first, second)
    model.eval()
    assert torch.equal(model.encode(src, None), model.encode(src, None))


# ---------------------------------------------------------------- whole models


def model_twins(kind, norm_first):
    config = TransformerConfig(13, 13, num_layers=2, d_model=D, d_ff=32, num_heads=H,
                               dropout=0.0, max_len=32, norm_first=norm_first)
    torch.manual_seed(0)
    ref = kind(config, parts=REF).double()
    fast = kind(config, parts=FAST).double()
    assert list(fast.state_dict()) == list(ref.state_dict())
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def pad_rows_of(tokens, lengths):
    for row, length in enumerate(lengths):
        tokens[row, length:] = 0
    return tokens


def assert_twins_agree(reference, fast):
    """The fast model's (logits, loss, gradients by name) equal the reference model's."""
    (ref_logits, ref_loss, ref_grads), (fast_logits, fast_loss, fast_grads) = reference, fast
    close(fast_logits, ref_logits, "logits")
    close(fast_loss, ref_loss, "loss")
    for name in ref_grads:
        close(fast_grads[name], ref_grads[name], f"gradient of {name}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_equals_the_reference(norm_first):
    ref, fast = model_twins(EncoderDecoder, norm_first)
    torch.manual_seed(4)
    src = pad_rows_of(torch.randint(3, 13, (B, 9)), [9, 5, 7])
    tgt = pad_rows_of(torch.randint(3, 13, (B, 8)), [8, 8, 4])
    tgt[:, 0] = 1
    results = []
    for model in (ref, fast):
        with use_parts(model.parts):
            batch = model.parts.make_batch(src, tgt, 0)
            logits = model(batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask)
            loss = model.parts.LabelSmoothingLoss(0.1, ignore_index=0)(
                logits.reshape(-1, 13), batch.tgt_labels.reshape(-1))
        loss.backward()
        results.append((logits, loss, grads(model)))
    assert_twins_agree(*results)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_only_equals_the_reference(norm_first):
    ref, fast = model_twins(DecoderOnlyTransformer, norm_first)
    tokens = pad_rows_of(torch.randint(3, 13, (B, 10)), [10, 6, 8])
    results = []
    for model in (ref, fast):
        mask = model.parts.target_mask(tokens, 0)
        logits = model(tokens, mask)
        loss = model.parts.LabelSmoothingLoss(0.0, ignore_index=0)(
            logits[:, :-1].reshape(-1, 13), tokens[:, 1:].reshape(-1))
        loss.backward()
        results.append((logits, loss, grads(model)))
    assert_twins_agree(*results)


@pytest.mark.parametrize("kind", [EncoderDecoder, DecoderOnlyTransformer])
def test_a_checkpoint_round_trips_between_the_parts(kind, tmp_path):
    config = TransformerConfig(13, 13, num_layers=2, d_model=D, d_ff=32, num_heads=H,
                               dropout=0.1, max_len=32)
    torch.manual_seed(0)
    trained_fast = kind(config, parts=FAST)
    torch.save(trained_fast.state_dict(), tmp_path / "fast.pt")
    ref = kind(config, parts=REF)
    ref.load_state_dict(torch.load(tmp_path / "fast.pt"), strict=True)
    back = kind(config, parts=FAST)
    back.load_state_dict(ref.state_dict(), strict=True)
    for name, tensor in trained_fast.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    tokens = torch.randint(3, 13, (2, 6))
    ref.eval(), back.eval()
    if kind is EncoderDecoder:
        out_r, out_f = ref(tokens, tokens), back(tokens, tokens)
    else:
        mask = REF.causal_mask(6)
        out_r, out_f = ref(tokens, mask), back(tokens, mask)
    assert torch.allclose(out_r, out_f, atol=1e-5)


def test_the_attention_map_tool_reads_fast_parts():
    task = CopyTask()
    config = TransformerConfig.small(task.vocab_size, num_layers=1)
    torch.manual_seed(0)
    ref = EncoderDecoder(config, parts=REF)
    fast = EncoderDecoder(config, parts=FAST)
    fast.load_state_dict(ref.state_dict())
    maps_r, maps_f = attention_maps(ref, task, "0123"), attention_maps(fast, task, "0123")
    assert maps_f.output == maps_r.output
    for kind in ("encoder", "decoder", "cross"):
        for a, b in zip(getattr(maps_f, kind), getattr(maps_r, kind), strict=True):
            assert torch.allclose(a, b, atol=1e-6), kind


def test_chapter_modules_reexport_the_reference_where_nothing_is_faster():
    for name in ("TokenEmbedding", "causal_mask", "greedy_decode", "beam_search"):
        assert getattr(FAST, name).__wrapped__ is getattr(REF, name).__wrapped__, name
    assert FAST.beam_search.__wrapped__ is load_chapter("solutions", 7).beam_search


CONSTRUCTOR_ARGS = {  # every class of the fast parts, and arguments to build it
    "PositionalEncoding": (D, 32), "TokenEmbedding": (13, D), "MultiHeadAttention": (D, H),
    "LayerNorm": (D,), "PositionwiseFeedForward": (D, 32), "ResidualConnection": (D,),
    "EncoderLayer": (D, H, 32), "DecoderLayer": (D, H, 32), "Encoder": (D, H, 32, 2),
    "Decoder": (D, H, 32, 2), "EncoderDecoder": (13, 13, D, H, 32, 2),
    "DecoderOnlyTransformer": (13, D, H, 32, 2),
    "LabelSmoothingLoss": (0.1,),
}


def test_every_fast_class_is_checked_below():
    classes = {name for chapter, path in chapter_files("fast").items()
               for name in _exported_names(path)
               if isinstance(getattr(FAST.module(chapter), name), type)}
    assert classes == set(CONSTRUCTOR_ARGS)


@pytest.mark.parametrize("name", sorted(CONSTRUCTOR_ARGS))
def test_fast_classes_subclass_the_reference_with_the_same_state_dict(name):
    """Built on the reference by subclassing: its constructor, checks and state-dict names."""
    fast_class, reference_class = FAST.get(name).__wrapped__, REF.get(name).__wrapped__
    assert issubclass(fast_class, reference_class)
    assert fast_class.__init__ is reference_class.__init__, "the reference's constructor"
    torch.manual_seed(0)
    reference = REF.get(name)(*CONSTRUCTOR_ARGS[name])
    fast = FAST.get(name)(*CONSTRUCTOR_ARGS[name])
    assert isinstance(fast, reference_class) and isinstance(fast, fast_class)
    assert list(fast.state_dict()) == list(reference.state_dict())
    for key, tensor in reference.state_dict().items():
        assert fast.state_dict()[key].shape == tensor.shape, key


@pytest.mark.parametrize("kind", ["padding", "target", "empty_row"])
def test_the_traced_formula_used_under_torch_compile_equals_the_reference(kind, monkeypatch):
    """Inside ``torch.compile`` the mask cache is skipped and a row with no key is zeroed
    without a branch; the same numbers, checked here without paying for a compilation."""
    monkeypatch.setattr(FAST.module(3), "is_compiling", lambda: True)
    mask = masks(LQ, LQ)[kind]
    ref, fast = twins("MultiHeadAttention", D, H)
    fast.sdpa_min_length = 10**9
    outs = []
    for module in (ref, fast):
        x = torch.randn(B, LQ, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
        x.requires_grad_()
        out = module(x, x, x, mask)
        out.square().sum().backward()
        outs.append((out, x.grad))
    close(outs[1][0], outs[0][0], "output")
    close(outs[1][1], outs[0][1], "input gradient")
    assert not outs[1][1].isnan().any()
