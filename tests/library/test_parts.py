"""The parts registry: which implementation each chapter comes from, bound when built."""

from __future__ import annotations

import copy
import math
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import solutions.ch01_positional_encoding as reference_ch01
from annotated_transformer import Parts, active_parts, use_parts
from annotated_transformer.course.authoring.stubs import write_stubs
from annotated_transformer.model import DecoderOnlyTransformer, EncoderDecoder, TransformerConfig


def test_names_resolve_to_their_chapter_and_source():
    parts = Parts.reference()
    assert issubclass(parts.PositionalEncoding, reference_ch01.PositionalEncoding)
    assert parts.PositionalEncoding.__wrapped__ is reference_ch01.PositionalEncoding
    assert parts.positional_encoding.__wrapped__ is reference_ch01.positional_encoding
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


def test_only_ascii_digits_name_a_chapter(tmp_path):
    """int() reads every script's digits: a file whose name spells 01 in Arabic-Indic digits
    (sorted after the real one) must not stand in for chapter 1."""
    shutil.copy(reference_ch01.__file__, tmp_path / "ch01_positional_encoding.py")
    (tmp_path / "ch\u0660\u0661_positional_encoding.py").write_text("def positional_encoding(*a):\n"
                                                               "    return 0\n")
    module = Parts(str(tmp_path)).module(1)
    assert Path(module.__file__).name == "ch01_positional_encoding.py"
    assert torch.equal(module.positional_encoding(4, 6), reference_ch01.positional_encoding(4, 6))


def test_embeddings_follow_the_paper():
    torch.manual_seed(0)
    embed = Parts.reference().embeddings(vocab_size=13, d_model=8, max_len=20)
    tokens = torch.randint(0, 13, (2, 5))
    table = reference_ch01.positional_encoding(5, 8)
    expected = embed.tokens.embedding(tokens) * math.sqrt(8) + table
    assert torch.allclose(embed(tokens), expected)


def test_a_module_keeps_the_parts_it_was_built_with(tmp_path):
    shutil.copy(reference_ch01.__file__, tmp_path / "ch01_positional_encoding.py")
    folder = Parts("solutions", {1: str(tmp_path)})  # chapter 1 from the folder
    with use_parts(folder):
        assert active_parts() is folder
        embed = active_parts().embeddings(vocab_size=7, d_model=4)  # chapter 5's helper
    assert active_parts() == Parts.reference()
    assert type(embed.positions) is folder.PositionalEncoding
    assert type(embed.positions) is not reference_ch01.PositionalEncoding


def test_a_model_can_be_copied_and_pickled_with_its_parts():
    parts = Parts.reference().with_chapter(5, "fast")
    model = EncoderDecoder(TransformerConfig.small(11, num_layers=1), parts=parts)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin.parts == parts and twin.parts.source(5) == "fast"
        for name, tensor in model.state_dict().items():
            assert torch.equal(twin.state_dict()[name], tensor), name


def test_the_learners_unfinished_parts_say_so(tmp_path):
    write_stubs(tmp_path)
    with pytest.raises(NotImplementedError, match="Exercise 1.3"):
        Parts("solutions", {1: str(tmp_path)}).embeddings(vocab_size=7, d_model=4)


def test_multi_head_attention_binds_chapter_2_when_built(tmp_path):
    spy = (Path(Parts.reference().module(2).__file__).read_text()
           + "\nCALLS = []\n_reference = scaled_dot_product_attention\n\n\n"
           "def scaled_dot_product_attention(*args, **kwargs):\n"
           "    CALLS.append(1)\n    return _reference(*args, **kwargs)\n")
    (tmp_path / "ch02_attention.py").write_text(spy)
    parts = Parts("solutions", {2: str(tmp_path)})
    chapter_3 = Parts.reference().module(3)  # the class itself: it binds what is active
    with use_parts(parts):
        attention = chapter_3.MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    attention(x, x, x)  # run outside the block: the module kept chapter 2 from `parts`
    assert parts.module(2).CALLS == [1]
    chapter_3.MultiHeadAttention(8, 2)(x, x, x)
    assert parts.module(2).CALLS == [1], "a module built outside any block uses the reference"


# ---------------------------------------------------------------- a Parts means what it says

RECORDING = """

CALLS = []
_padding_mask, _causal_mask, _target_mask = padding_mask, causal_mask, target_mask


def padding_mask(tokens, pad_id):
    CALLS.append("padding_mask")
    return _padding_mask(tokens, pad_id)


def causal_mask(size, device=None):
    CALLS.append("causal_mask")
    return _causal_mask(size, device=device)


def target_mask(tokens, pad_id):
    CALLS.append("target_mask")
    return _target_mask(tokens, pad_id)
"""

COUNTING = """

CALLS = []
_scaled_dot_product_attention = scaled_dot_product_attention


def scaled_dot_product_attention(*args, **kwargs):
    CALLS.append("attention")
    return _scaled_dot_product_attention(*args, **kwargs)
"""


@pytest.fixture(scope="module")
def marked(tmp_path_factory) -> Parts:
    """The reference, except chapters 2 to 4 from a folder: chapter 2 counts its attention
    calls, chapter 3 is a copy (a class of its own), chapter 4 records which masks it made."""
    folder = tmp_path_factory.mktemp("marked")
    reference = Parts.reference()
    for chapter, extra in ((2, COUNTING), (3, ""), (4, RECORDING)):
        path = Path(reference.module(chapter).__file__)
        (folder / path.name).write_text(path.read_text() + extra)
    parts = Parts("solutions", {chapter: str(folder) for chapter in (2, 3, 4)})
    assert active_parts() == Parts.reference(), "the tests below run outside any block"
    return parts


def calls(parts: Parts, chapter: int) -> list[str]:
    """What the marked ``chapter`` of ``parts`` recorded since the last look."""
    recorded = list(parts.module(chapter).CALLS)
    parts.module(chapter).CALLS.clear()
    return recorded


def tokens(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows)


def test_a_function_part_uses_its_own_parts_outside_any_block(marked):
    src, tgt = tokens([[5, 6, 7, 0], [5, 6, 0, 0]]), tokens([[1, 5, 6, 2], [1, 5, 2, 0]])
    calls(marked, 4)
    batch = marked.make_batch(src, tgt, 0)  # chapter 6 from the reference, bound to `marked`
    assert {"padding_mask", "target_mask"} <= set(calls(marked, 4))
    expected = Parts.reference().make_batch(src, tgt, 0)
    assert calls(marked, 4) == [], "the reference's parts never reach the marked chapter 4"
    assert torch.equal(batch.src_mask, expected.src_mask)
    assert torch.equal(batch.tgt_mask, expected.tgt_mask)
    with use_parts(marked):
        Parts.reference().make_batch(src, tgt, 0)
    assert calls(marked, 4) == [], "Parts.reference() is the reference inside any block"


def test_a_class_part_binds_its_own_parts_when_built_outside_any_block(marked):
    layer = marked.EncoderLayer(8, 2, 16)  # chapter 5 from the reference
    own_attention = marked.module(3).MultiHeadAttention
    reference_attention = Parts.reference().module(3).MultiHeadAttention
    assert isinstance(layer, Parts.reference().module(5).EncoderLayer)
    assert isinstance(layer.self_attn, own_attention)
    assert not isinstance(layer.self_attn, reference_attention)
    x = torch.randn(2, 3, 8)
    calls(marked, 2)
    layer(x)
    assert calls(marked, 2) == ["attention"], "chapter 2 of `marked`, bound when built"
    with use_parts(marked):
        other = Parts.reference().EncoderLayer(8, 2, 16)
    assert isinstance(other.self_attn, reference_attention), "Parts.reference() is the reference"
    other(x)
    assert calls(marked, 2) == []


def test_the_batch_builder_uses_the_models_masks(marked):
    src, tgt = tokens([[5, 6, 7, 0]]), tokens([[1, 5, 6, 2]])
    config = TransformerConfig.small(11, num_layers=1)
    calls(marked, 4)
    batch = EncoderDecoder(config, parts=marked).teacher_forcing(src, tgt)
    assert {"padding_mask", "target_mask"} <= set(calls(marked, 4))
    expected = Parts.reference().make_batch(src, tgt, 0)
    assert torch.equal(batch.args[2], expected.src_mask)
    assert torch.equal(batch.args[3], expected.tgt_mask)
    DecoderOnlyTransformer(config, parts=marked).teacher_forcing(src, tgt)
    assert "target_mask" in calls(marked, 4)
    EncoderDecoder(config).teacher_forcing(src, tgt)
    assert calls(marked, 4) == [], "a model of the reference parts uses the reference masks"


def test_a_model_keeps_its_parts_when_run_inside_a_block_of_other_parts(marked):
    torch.manual_seed(0)
    model = EncoderDecoder(TransformerConfig.small(11, num_layers=1), parts=marked)
    twin = EncoderDecoder(TransformerConfig.small(11, num_layers=1), parts=Parts.reference())
    twin.load_state_dict(model.state_dict())
    src, tgt = tokens([[5, 6, 7, 0]]), tokens([[1, 5, 6, 2]])
    calls(marked, 2)
    with use_parts(Parts.reference()):
        logits = model(src, tgt)
    assert calls(marked, 2) == ["attention"] * 3, "self, self and cross: all of `marked`"
    assert torch.allclose(logits, twin(src, tgt)), "the marked chapters compute the reference"
    with use_parts(marked):
        twin(src, tgt)
    assert calls(marked, 2) == [], "and the reference model keeps the reference"


def test_a_bound_part_is_one_object_that_copies_and_pickles(marked):
    assert marked.EncoderLayer is marked.EncoderLayer
    assert marked.make_batch is marked.make_batch
    assert Parts(marked.default, dict(marked.chapters)).EncoderLayer is marked.EncoderLayer
    assert marked.EncoderLayer is not Parts.reference().EncoderLayer
    layer = marked.EncoderLayer(8, 2, 16)
    assert type(layer).__name__ == "EncoderLayer" and repr(layer).startswith("EncoderLayer(")
    reference = Parts.reference().module(5).EncoderLayer(8, 2, 16)
    assert list(layer.state_dict()) == list(reference.state_dict())
    assert repr(layer) == repr(reference)
    x = torch.randn(1, 3, 8)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(twin) is type(layer)
        assert type(twin.self_attn) is type(layer.self_attn)
        calls(marked, 2)
        assert torch.allclose(twin(x), layer(x))
        assert calls(marked, 2) == ["attention"] * 2, "the twin kept the marked chapter 2"
    assert pickle.loads(pickle.dumps(marked.make_batch)) is marked.make_batch


def _python_elsewhere(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` run by this environment's Python in isolated mode, from ``tmp_path``: the
    repository is not on its path, only what is installed."""
    return subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, text=True,
                          capture_output=True, timeout=300)


def test_the_course_installs_one_top_level_name_and_finds_its_chapters_from_anywhere(tmp_path):
    done = _python_elsewhere(tmp_path, (
        "import importlib.util\n"
        "from annotated_transformer import Parts\n"
        "print([n for n in ('solutions', 'exercises') if importlib.util.find_spec(n)])\n"
        "print(Parts.reference().module(1).__file__)\n"
        "print(Parts('exercises').module(1).__file__)\n"))
    assert done.returncode == 0, done.stderr
    installed, reference, stub = done.stdout.splitlines()
    assert installed == "[]", "solutions/ or exercises/ is installed as a top-level package"
    assert Path(reference) == Path(reference_ch01.__file__)
    assert Path(stub).parent.name == "exercises"


def test_another_package_named_solutions_is_named_not_used(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "__init__.py").write_text("")
    done = _python_elsewhere(tmp_path, (
        "import sys; sys.path.insert(0, '.')\n"
        "import solutions\n"
        "from annotated_transformer import Parts\n"
        "Parts.reference().module(1)\n"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: another package named 'solutions'"), last
    assert str(tmp_path / "solutions") in last and str(Path(reference_ch01.__file__).parent) in last
