"""Each kind of model owns what differs between the kinds: its teacher forcing and loss,
its decoding, the options it refuses, its attention read-out and its checkpoint name; the
modules around it never ask which kind they hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from annotated_transformer import Parts, checkpoint, cli
from annotated_transformer.data import BOS, EOS, PAD, make_task
from annotated_transformer.decode import translate
from annotated_transformer.model import (
    MODELS,
    DecoderOnlyTransformer,
    EncoderDecoder,
    TransformerConfig,
    UnsupportedDecoding,
    model_for,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "annotated_transformer"
KIND_OWNER = PACKAGE / "model.py"  # the kinds themselves, MODELS and model_for(task)
KIND_BLIND = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                    if p != KIND_OWNER)
KIND_NAMES = {"EncoderDecoder", "DecoderOnlyTransformer"}


def questions_about_the_kind(source: str) -> list[str]:
    """Where ``source`` asks which kind of model it holds: ``isinstance`` against a model
    class, comparing its ``kind`` with a kind's name (``model.kind == "decoder-only"``,
    ``getattr(model, "kind", None) != ...``), or reading a task's ``decoder_only`` (whose
    model is ``model_for(task)``; a task reading its own, ``self.decoder_only``, asks
    nothing)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = {s.value for s in sides if isinstance(s, ast.Constant)} & set(MODELS)
            reads = any((isinstance(s, ast.Attribute) and s.attr == "kind") or (
                isinstance(s, ast.Call) and isinstance(s.func, ast.Name)
                and s.func.id == "getattr" and len(s.args) >= 2
                and isinstance(s.args[1], ast.Constant) and s.args[1].value == "kind")
                for s in sides)
            if names and reads:
                found.append(f"line {node.lineno}: compares the kind with {sorted(names)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance" and len(node.args) == 2):
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if names & KIND_NAMES:
                found.append(f"line {node.lineno}: isinstance on {sorted(names & KIND_NAMES)}")
        if (isinstance(node, ast.Attribute) and node.attr == "decoder_only"
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
            found.append(f"line {node.lineno}: reads .decoder_only")
    return found


def test_the_checker_finds_both_ways_of_asking():
    source = ("if isinstance(model, (DecoderOnlyTransformer, int)):\n    pass\n"
              "Model = DecoderOnlyTransformer if task.decoder_only else EncoderDecoder\n")
    assert [q.split(":")[0] for q in questions_about_the_kind(source)] == ["line 1", "line 3"]
    assert [q.split(":")[0] for q in questions_about_the_kind(
        "if getattr(model, 'kind', None) != 'encoder-decoder':\n    pass\n"
        "ok = state['kind'] != model.kind\n")] == ["line 1"]
    assert questions_about_the_kind("isinstance(module, layers)\nmodel.kind\n"
                                    "ids = [BOS] + ids if self.decoder_only else ids\n") == []


def test_every_module_but_the_models_own_is_checked():
    """No hand list: a new module is checked as soon as it exists."""
    assert len(KIND_BLIND) > 40 and "model.py" not in KIND_BLIND
    assert {"train.py", "cli/training.py", "data/task.py",
            "course/grading/worker/process.py"} <= set(KIND_BLIND)


# The one module that asks, and why: packing a batch's real positions is written for the
# encoder-decoder's layers only (the fast parts' training step; any other model runs as is).
ASKS_ON_PURPOSE = {"fast_parts/_packed.py"}


@pytest.mark.parametrize("name", KIND_BLIND)
def test_no_module_around_the_model_asks_for_its_kind(name):
    questions = questions_about_the_kind((PACKAGE / name).read_text(encoding="utf-8"))
    if name in ASKS_ON_PURPOSE:
        assert questions, f"{name} no longer asks for the kind: take it off ASKS_ON_PURPOSE"
        return
    assert not questions, f"{name} branches on the model's kind: {questions}"



# ---------------------------------------------------------------- one word, one meaning

# "kind" is the model's kind (``Model.kind``, its name in checkpoints) and nothing else: a
# vocabulary has a ``level`` (char, word, bpe), an exported checkpoint's weights are
# ``stored_as`` float16 or int8, attention is ``encoder``, ``decoder`` or ``cross``, and a
# failed call of the grading worker has an ``outcome``.
KIND_WORD = re.compile(r"^(kinds?|KINDS?)$|_(kinds?|KINDS?)$|^(kinds?|KINDS?)_")
CHECKPOINT_KEY = {"checkpoint.py", "average.py"}  # state["kind"]: the model's kind (and,
# in checkpoint.py, the older files' name for a vocabulary's level, read as "level")


def other_kinds(source: str, name: str) -> list[str]:
    """Where ``source`` (the module ``name``, relative to the package) uses the word kind
    for something other than a model's kind: a variable, parameter, keyword, function or
    constant named so, or the key "kind" outside the checkpoint's. ``x.kind`` and
    ``getattr(x, "kind")`` (a model's) and, in model.py, the class attribute each kind sets
    are the model's kind."""
    found = []
    tree = ast.parse(source)
    by_name = {id(node.args[1]) for node in ast.walk(tree)  # getattr(model, "kind", None)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and name == "model.py":
            for statement in node.body:  # kind = "encoder-decoder"; kind: ClassVar[str]
                targets = (statement.targets if isinstance(statement, ast.Assign)
                           else [statement.target] if isinstance(statement, ast.AnnAssign)
                           else [])
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == "kind":
                        target.id = "model_kind_of_the_class"  # the model's: allowed
        names = []
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif (isinstance(node, ast.Constant) and node.value in ("kind", "kinds")
              and name not in CHECKPOINT_KEY and id(node) not in by_name):
            found.append(f"line {node.lineno}: the key {node.value!r}")
        found += [f"line {node.lineno}: {n}" for n in names if KIND_WORD.search(n)]
    return found


def test_the_word_checker_finds_another_kind():
    source = ("def compress(weights, kind):\n    return {'kind': kind}\n"
              "KINDS = ('encoder',)\nplot(maps, kinds=KINDS)\nmodel.kind\n")
    assert sorted(q.split(":")[0] for q in other_kinds(source, "x.py")) == [
        "line 1", "line 2", "line 2", "line 3", "line 4", "line 4"]
    assert other_kinds("class M:\n    kind = 'decoder-only'\nm.kind\n", "model.py") == []
    assert other_kinds("getattr(model, 'kind', None)\n", "x.py") == []  # the model's, by name
    assert other_kinds("state['kind']\n", "checkpoint.py") == []


@pytest.mark.parametrize("name", sorted(p.relative_to(PACKAGE).as_posix()
                                        for p in PACKAGE.rglob("*.py")))
def test_kind_means_the_models_kind_alone(name):
    found = other_kinds((PACKAGE / name).read_text(encoding="utf-8"), name)
    assert not found, (f"{name} calls something other than a model's kind 'kind': {found}; "
                       f"name it for what it is (a vocabulary's level, the weights' "
                       f"stored_as, the attention, an outcome)")


# ---------------------------------------------------------------- teacher forcing and loss

def small(kind, task, seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig.small(len(task.vocab), num_layers=2, max_len=64)
    return kind(config, parts=Parts("solutions")).double().eval()


def by_hand_encoder_decoder(src, tgt):
    """Forward arguments and labels of the paper's teacher forcing, built here."""
    tgt_input, labels = tgt[:, :-1], tgt[:, 1:]
    length = tgt_input.size(1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return ((src, tgt_input, (src != PAD)[:, None, None, :],
             (tgt_input != PAD)[:, None, None, :] & causal), labels)


def by_hand_decoder_only(src, tgt):
    """Prompt and answer joined per row, one token shifted; only the answer is scored."""
    rows, labels = [], []
    for prompt, answer in zip(src.tolist(), tgt.tolist(), strict=True):
        prompt = [t for t in prompt if t != PAD]
        answer = [t for t in answer if t != PAD]
        sequence = prompt + answer
        rows.append(sequence[:-1])
        labels.append([PAD] * (len(prompt) - 1) + answer)
    width = max(map(len, rows))
    inputs = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [PAD] * (width - len(r)) for r in labels])
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    return (inputs, (inputs != PAD)[:, None, None, :] & causal), labels


class CountingNet(nn.Module):
    """Runs a model's forward pass and counts the calls (as DDP's wrapper would run it)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, *args):
        self.calls += 1
        return self.model(*args)


@pytest.mark.parametrize("kind, task_name, by_hand", [
    (EncoderDecoder, "copy", by_hand_encoder_decoder),
    (DecoderOnlyTransformer, "addition", by_hand_decoder_only),
])
def test_loss_is_the_loss_function_on_the_forward_pass(kind, task_name, by_hand):
    task = make_task(task_name)
    model = small(kind, task)
    src, tgt = task.sample(6, torch.Generator().manual_seed(1))
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD)
    batch = model.teacher_forcing(src, tgt)
    args, labels = by_hand(src, tgt)
    assert torch.equal(batch.labels, labels)
    assert batch.num_tokens() == int((labels != PAD).sum())
    # every target token is scored once: the encoder-decoder's after its BOS, the
    # decoder-only model's answer (EOS included)
    scored = (tgt[:, 1:] != PAD) if kind is EncoderDecoder else (tgt != PAD)
    assert batch.num_tokens() == int(scored.sum())
    logits = model(*args)  # [B, L, V]
    expected = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                           ignore_index=PAD)
    net = CountingNet(model)
    loss = model.loss(batch, loss_fn, net)
    assert net.calls == 1, "the loss must run the forward pass through net (DDP's wrapper)"
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.loss(batch, loss_fn), expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- decoding

@pytest.fixture(scope="module")
def dates():
    state = checkpoint.load(ROOT / "chapters" / "checkpoints" / "dates.pt")
    return checkpoint.build_task(state), checkpoint.build_model(state)


@pytest.fixture(scope="module")
def addition():
    state = checkpoint.load(ROOT / "chapters" / "checkpoints" / "addition.pt")
    return checkpoint.build_task(state), checkpoint.build_model(state)


def sources(task, count=12):
    src, tgt = task.held_out_set(count)
    return src, tgt


def test_encoder_decoder_decodes_with_chapter_6_and_7s_parts(dates):
    task, model = dates
    src, _ = sources(task)
    parts = model.parts
    src_mask = (src != PAD)[:, None, None, :]
    greedy = parts.greedy_decode(model, src, src_mask, task.max_target_len, BOS, EOS, PAD)
    beam = parts.beam_search(model, src, src_mask, task.max_target_len, BOS, EOS, PAD,
                             beam_size=3)
    assert torch.equal(model.generate(src, task.max_target_len), greedy)
    assert torch.equal(model.generate(src, task.max_target_len, beam_size=3), beam)


def greedy_completion_by_hand(model, prompt: list[int], max_new: int) -> list[int]:
    """One row at a time, the whole prefix re-run: the argmax until EOS or ``max_new``."""
    sequence, new = list(prompt), []
    while len(new) < max_new and (not new or new[-1] != EOS):
        ids = torch.tensor([sequence])
        causal = torch.ones(len(sequence), len(sequence), dtype=torch.bool).tril()
        token = int(model(ids, causal[None, None])[0, -1].argmax())
        sequence.append(token)
        new.append(token)
    return new


def test_decoder_only_completes_greedily(addition):
    task, model = addition
    src, tgt = sources(task, 10)
    out = model.generate(src, task.max_target_len)  # [B, <= max_len]
    for row, prompt in zip(out.tolist(), src.tolist(), strict=True):
        prompt = [t for t in prompt if t != PAD]
        expected = greedy_completion_by_hand(model, prompt, task.max_target_len)
        assert [t for t in row if t != PAD] == expected


def test_decoder_only_samples_among_the_top_k(addition):
    task, model = addition
    src = torch.tensor([task.source_ids("58+67=")] * 16)
    hot = dict(temperature=3.0, top_k=2)

    def sample(seed):
        generator = torch.Generator().manual_seed(seed)
        return model.generate(src, task.max_target_len, generator=generator, **hot)
    first = sample(2)
    assert torch.equal(first, sample(2)), "the same seed must give the same samples"
    assert not torch.equal(first, sample(3)), "another seed should give other samples"
    assert len({tuple(r) for r in first.tolist()}) > 1, "rows sample independently"
    one = model.generate(src, task.max_target_len, temperature=3.0, top_k=1,
                         generator=torch.Generator().manual_seed(2))
    assert torch.equal(one, model.generate(src, task.max_target_len)), "top-1 is greedy"
    # every sampled token is one of the two likeliest after its prefix
    for prompt, row in zip(src.tolist(), first.tolist(), strict=True):
        row = [t for t in row if t != PAD]
        ids = torch.tensor([prompt + row])
        causal = torch.ones(ids.size(1), ids.size(1), dtype=torch.bool).tril()
        with torch.no_grad():
            logits = model(ids, causal[None, None])[0]  # [L, V]
        for position, token in enumerate(row, start=len(prompt) - 1):
            assert token in logits[position].topk(2).indices.tolist()


def test_decoder_only_samples_with_its_parts_sample_next(addition):
    """Generation draws every token with the model's parts' ``sample_next`` (chapter 8): a
    tiny nucleus keeps the likeliest token alone, so sampling is greedy decoding."""
    task, model = addition
    src = torch.tensor([task.source_ids("58+67=")] * 4)
    nucleus = model.generate(src, task.max_target_len, temperature=3.0, top_p=1e-6,
                             generator=torch.Generator().manual_seed(0))
    assert torch.equal(nucleus, model.generate(src, task.max_target_len))
    calls = []
    parts = model.parts

    class Counting:
        def __getattr__(self, name):
            return getattr(parts, name)

        def sample_next(self, *args, **kwargs):
            calls.append(kwargs or args[1:])
            return parts.sample_next(*args, **kwargs)
    model.parts = Counting()
    try:
        model.generate(src[:1], task.max_target_len, temperature=0.5, top_k=2, top_p=0.9)
    finally:
        model.parts = parts
    assert calls and all(tuple(c)[:3] == (0.5, 2, 0.9) for c in calls), calls


def test_each_kind_refuses_the_options_it_lacks(dates, addition):
    (dates_task, encoder_decoder), (addition_task, decoder_only) = dates, addition
    src = torch.tensor([addition_task.source_ids("12+34=")])
    with pytest.raises(UnsupportedDecoding, match="beam search .* decoder-only"):
        decoder_only.generate(src, 5, beam_size=3)
    with pytest.raises(UnsupportedDecoding, match="beam search .* decoder-only"):
        translate(decoder_only, addition_task, ["12+34="], beam_size=3)
    for options in ({"temperature": 0.8}, {"top_k": 3}, {"top_p": 0.9}):
        with pytest.raises(UnsupportedDecoding, match="sampling .* for decoder-only models"):
            translate(encoder_decoder, dates_task, ["3 May 98"], **options)
    decoder_only.check_decoding(temperature=0.8, top_k=3, top_p=0.9)  # its own options pass
    encoder_decoder.check_decoding(beam_size=3)


@pytest.mark.parametrize("name, options, message", [
    ("addition.pt", ["--beam", "3"], "beam search (--beam) is for encoder-decoder models"),
    ("dates.pt", ["--temperature", "0.8"], "(--temperature, --top-k, --top-p) is for decoder-only"),
    ("dates.pt", ["--top-k", "3"], "(--temperature, --top-k, --top-p) is for decoder-only"),
    ("dates.pt", ["--top-p", "0.9"], "(--temperature, --top-k, --top-p) is for decoder-only"),
    ("addition.pt", ["--top-p", "1.5"], "--top-p must be in (0, 1]"),
])
def test_the_command_line_refuses_them_with_exit_2(capsys, name, options, message):
    path = ROOT / "chapters" / "checkpoints" / name
    status = cli.main(["translate", "--checkpoint", str(path), "--device", "cpu", *options,
                       "12"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- attention, checkpoints

def test_attention_read_out_of_each_kind(dates, addition):
    for (task, model), text in ((dates, "3 May 98"), (addition, "12+34=")):
        src = torch.tensor([task.source_ids(text)])
        output = model.generate(src, task.max_target_len)[:, :4]
        source_ids, output_ids, weights = model.read_attention(src, output)
        heads = model.config.num_heads
        if model.kind == "encoder-decoder":
            assert (source_ids, output_ids) == (src[0].tolist(), output[0].tolist())
            shapes = {"encoder": (len(source_ids),) * 2, "decoder": (len(output_ids),) * 2,
                      "cross": (len(output_ids), len(source_ids))}
        else:
            assert source_ids == output_ids == src[0].tolist() + output[0].tolist()
            shapes = {"decoder": (len(output_ids),) * 2}
        assert set(weights) == set(shapes)
        for name, layers in weights.items():
            assert len(layers) == model.config.num_layers
            for w in layers:
                assert w.shape == (heads, *shapes[name])
                torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
                if name == "decoder":  # causal: nothing above the diagonal
                    assert not w.triu(1).any()


def test_the_registry_keeps_the_checkpoint_names(tmp_path):
    assert MODELS == {"encoder-decoder": EncoderDecoder, "decoder-only": DecoderOnlyTransformer}
    assert model_for(make_task("copy")) is EncoderDecoder
    assert model_for(make_task("addition")) is DecoderOnlyTransformer
    for name, kind in (("dates.pt", EncoderDecoder), ("addition.pt", DecoderOnlyTransformer)):
        state = checkpoint.load(ROOT / "chapters" / "checkpoints" / name)
        assert state["kind"] == kind.kind
        assert type(checkpoint.build_model(state)) is kind


@pytest.mark.parametrize("kind", [EncoderDecoder, DecoderOnlyTransformer])
def test_the_recipe_gives_each_kind_positions_for_its_longest_sequence(kind):
    from annotated_transformer.recipes import RECIPES

    task = make_task("addition" if kind.decoder_only else "dates")
    config = RECIPES[task.name].model_config(task)
    src, tgt = task.sample(8, torch.Generator().manual_seed(0))
    batch = kind(config).teacher_forcing(src, tgt)
    assert batch.args[0].size(1) <= config.max_len
    assert config.max_len >= kind.longest_sequence(task.max_source_len, task.max_target_len)
