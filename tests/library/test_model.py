"""The encoder-decoder assembled by the package: shapes, tying, initialisation, parts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from annotated_transformer import Parts
from annotated_transformer.course.authoring.stubs import write_stubs
from annotated_transformer.model import EncoderDecoder, TransformerConfig, count_parameters


def small_model(**changes):
    torch.manual_seed(0)
    return EncoderDecoder(TransformerConfig.small(17, **changes))


def test_base_config_is_the_papers():
    config = TransformerConfig.base()
    assert (config.num_layers, config.d_model, config.d_ff, config.num_heads, config.dropout,
            config.norm_first) == (6, 512, 2048, 8, 0.1, False)
    model = EncoderDecoder(config)
    # Table 3 of the paper: about 65 M parameters for the base model.
    assert 60e6 < count_parameters(model) < 66e6


def test_shapes_through_encode_decode_generator():
    model = small_model().eval()
    src, tgt = torch.randint(3, 17, (2, 7)), torch.randint(3, 17, (2, 5))
    src_mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    tgt_mask = torch.ones(5, 5, dtype=torch.bool).tril()
    memory = model.encode(src, src_mask)
    assert memory.shape == (2, 7, 64)
    hidden = model.decode(memory, src_mask, tgt, tgt_mask)
    assert hidden.shape == (2, 5, 64)
    assert model.generator(hidden).shape == (2, 5, 17)
    assert torch.allclose(model(src, tgt, src_mask, tgt_mask), model.generator(hidden))


def test_weights_are_tied_and_can_be_untied():
    model = small_model()
    shared = model.src_embed.tokens.embedding.weight
    assert model.tgt_embed.tokens.embedding.weight is shared and model.generator.weight is shared
    untied = EncoderDecoder(TransformerConfig(17, 19, num_layers=1, d_model=16, d_ff=32,
                                              num_heads=2, tie_embeddings=False))
    assert untied.generator.weight.shape == (19, 16)
    assert untied.generator.weight is not untied.tgt_embed.tokens.embedding.weight
    with pytest.raises(ValueError, match="tie_embeddings"):
        TransformerConfig(17, 19)


def test_matrices_are_xavier_uniform():
    model = EncoderDecoder(TransformerConfig(50, 50, num_layers=1, d_model=32, d_ff=64,
                                             num_heads=4))
    weight = model.encoder.layers[0].feed_forward.linear1.weight  # [64, 32]
    bound = (6 / (32 + 64)) ** 0.5
    assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound


def test_pre_ln_gets_a_final_norm_post_ln_does_not():
    assert isinstance(small_model(norm_first=False).encoder.norm, nn.Identity)
    assert not isinstance(small_model(norm_first=True).decoder.norm, nn.Identity)


def test_built_from_the_learners_parts(tmp_path):
    write_stubs(tmp_path)
    with pytest.raises(NotImplementedError, match="Exercise 5.8"):
        EncoderDecoder(TransformerConfig.small(11), parts=Parts(str(tmp_path)))
    with pytest.raises(NotImplementedError, match="Exercise 1.3"):
        EncoderDecoder(TransformerConfig.small(11), parts=Parts("solutions", {1: str(tmp_path)}))
    mixed = Parts("solutions", {3: str(tmp_path)})
    with pytest.raises(NotImplementedError, match="Exercise 3.3"):
        EncoderDecoder(TransformerConfig.small(11), parts=mixed)


def test_a_checkpoint_written_before_the_stacks_were_an_exercise_loads():
    """The committed checkpoints name the layers ``encoder_layers.0...`` (and a decoder-only
    model's ``layers.0...``); read, they are the stacks' ``encoder.layers.0...``."""
    from annotated_transformer import checkpoint
    from annotated_transformer.layout import ROOT

    for name, former, now in (("dates", "encoder_layers.1.feed_forward.linear1.weight",
                               "encoder.layers.1.feed_forward.linear1.weight"),
                              ("addition", "layers.0.self_attn.q_proj.weight",
                               "decoder.layers.0.self_attn.q_proj.weight")):
        path = ROOT / "chapters" / "checkpoints" / f"{name}.pt"
        raw = torch.load(path, weights_only=True)["model"]
        assert former in raw and now not in raw, "the committed file has the former names"
        model = checkpoint.build_model(checkpoint.load(path))
        assert torch.equal(model.state_dict()[now].float(), raw[former].float())
    # An int8 file's matrices come back with their row scales, renamed too.
    path = ROOT / "chapters" / "checkpoints" / "multi30k-cpu.pt"
    raw = torch.load(path, weights_only=True)
    former = "encoder_layers.1.self_attn.q_proj.weight"
    now = "encoder.layers.1.self_attn.q_proj.weight"
    assert raw["model"][former].dtype == torch.int8, "the committed translator is int8"
    expected = raw["model"][former].float() * raw["scales"][former][:, None]
    model = checkpoint.build_model(checkpoint.load(path))
    assert torch.allclose(model.state_dict()[now], expected)


def test_the_model_is_its_network_with_the_package_around_it():
    """``model.EncoderDecoder(config, parts)`` holds ``parts.EncoderDecoder`` (the network of
    exercise 5.8) built from the config's sizes, and likewise for the decoder-only kind: the
    same parameters under the same names, and the network's forward pass."""
    from annotated_transformer.model import DecoderOnlyTransformer

    parts = Parts.reference()
    config = TransformerConfig.small(17, num_layers=1)
    src, tgt = torch.randint(3, 17, (2, 7)), torch.randint(3, 17, (2, 5))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    for kind, network_class, args in [
            (EncoderDecoder, parts.EncoderDecoder, (src, tgt, None, causal)),
            (DecoderOnlyTransformer, parts.DecoderOnlyTransformer, (tgt, causal))]:
        torch.manual_seed(0)
        model = kind(config, parts=parts).eval()
        assert isinstance(model.network, network_class)
        ours, its = model.state_dict(), model.network.state_dict()
        assert list(ours) == list(its)
        assert all(ours[name].data_ptr() == its[name].data_ptr() for name in ours)
        assert torch.equal(model(*args), model.network(*args))
