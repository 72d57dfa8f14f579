"""The parts registry: which implementation each chapter comes from, bound when built."""

from __future__ import annotations

import copy
import math
import pickle
import shutil
from pathlib import Path

import pytest
import torch

import solutions.ch01_positional_encoding as reference_ch01
from annotated_transformer import Parts, active_parts, use_parts
from annotated_transformer.grading.stubs import write_stubs
from annotated_transformer.model import build_embeddings


def test_names_resolve_to_their_chapter_and_source():
    parts = Parts.reference()
    assert parts.PositionalEncoding is reference_ch01.PositionalEncoding
    assert parts.module(1) is reference_ch01
    learner = Parts.learner()
    assert learner.module(1).__name__ == "exercises.ch01_positional_encoding"
    mixed = Parts.learner().with_chapter(1, "solutions")
    assert mixed.source(1) == "solutions" and mixed.source(2) == "exercises"
    assert mixed.describe() == "chapter 1: solutions; exercises for every other chapter"


def test_unknown_names_and_sources_are_explained(tmp_path):
    with pytest.raises(AttributeError, match="NoSuchPart"):
        _ = Parts.reference().NoSuchPart
    with pytest.raises(ValueError, match="not_a_source"):
        Parts("not_a_source").module(1)
    with pytest.raises(LookupError, match="chapter 1"):
        Parts(str(tmp_path)).module(1)


def test_a_folder_is_a_source(tmp_path):
    shutil.copy(reference_ch01.__file__, tmp_path / "ch01_positional_encoding.py")
    module = Parts(str(tmp_path)).module(1)
    assert module is not reference_ch01
    assert torch.equal(module.positional_encoding(4, 6), reference_ch01.positional_encoding(4, 6))


def test_embeddings_follow_the_paper():
    torch.manual_seed(0)
    embed = build_embeddings(vocab_size=13, d_model=8, max_len=20)
    tokens = torch.randint(0, 13, (2, 5))
    table = reference_ch01.positional_encoding(5, 8)
    expected = embed.tokens.embedding(tokens) * math.sqrt(8) + table
    assert torch.allclose(embed(tokens), expected)


def test_a_module_keeps_the_parts_it_was_built_with(tmp_path):
    shutil.copy(reference_ch01.__file__, tmp_path / "ch01_positional_encoding.py")
    folder = Parts(str(tmp_path))
    with use_parts(folder):
        assert active_parts() is folder
        embed = build_embeddings(vocab_size=7, d_model=4)
    assert active_parts() == Parts.reference()
    assert type(embed.positions) is folder.PositionalEncoding
    assert type(embed.positions) is not reference_ch01.PositionalEncoding


def test_a_model_can_be_copied_and_pickled_with_its_parts():
    from annotated_transformer.model import EncoderDecoder, TransformerConfig

    parts = Parts.reference().with_chapter(5, "fast")
    model = EncoderDecoder(TransformerConfig.small(11, num_layers=1), parts=parts)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin.parts == parts and twin.parts.source(5) == "fast"
        for name, tensor in model.state_dict().items():
            assert torch.equal(twin.state_dict()[name], tensor), name


def test_the_learners_unfinished_parts_say_so(tmp_path):
    write_stubs(tmp_path)
    with pytest.raises(NotImplementedError, match="Exercise 1.3"):
        build_embeddings(vocab_size=7, d_model=4, parts=Parts(str(tmp_path)))


def test_multi_head_attention_binds_chapter_2_when_built(tmp_path):
    spy = (Path(Parts.reference().module(2).__file__).read_text()
           + "\nCALLS = []\n_reference = scaled_dot_product_attention\n\n\n"
           "def scaled_dot_product_attention(*args, **kwargs):\n"
           "    CALLS.append(1)\n    return _reference(*args, **kwargs)\n")
    (tmp_path / "ch02_attention.py").write_text(spy)
    parts = Parts("solutions", {2: str(tmp_path)})
    with use_parts(parts):
        attention = Parts.reference().MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    attention(x, x, x)  # run outside the block: the module kept chapter 2 from `parts`
    assert parts.module(2).CALLS == [1]
    Parts.reference().MultiHeadAttention(8, 2)(x, x, x)
    assert parts.module(2).CALLS == [1], "a module built outside the block uses the reference"
