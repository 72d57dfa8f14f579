"""The tasks' data: deterministic, round-trips through the vocabulary, a clean held-out split."""

from __future__ import annotations

import datetime

import pytest
import torch

from annotated_transformer.data import (
    BOS,
    EOS,
    PAD,
    DataError,
    Vocabulary,
    VocabularyError,
    make_task,
)
from annotated_transformer.data.addition import count_carries
from annotated_transformer.data.dates import NUM_FORMATS, write_date

GENERATED = ["copy", "reverse", "dates", "addition"]


@pytest.fixture
def tsv_file(tmp_path):
    path = tmp_path / "pairs.tsv"
    lines = [f"{w}\t{w.upper()}" for w in ("cat", "dog", "emu", "gnu", "yak", "owl", "ant",
                                              "bee", "cow", "elk", "fox", "hen", "pig")]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", GENERATED)
def test_generated_tasks_are_deterministic(name):
    task = make_task(name)
    first = task.pairs(50, torch.Generator().manual_seed(3))
    assert first == task.pairs(50, torch.Generator().manual_seed(3))
    assert first != task.pairs(50, torch.Generator().manual_seed(4))
    assert task.held_out_pairs(20) == make_task(name).held_out_pairs(20)


@pytest.mark.parametrize("name", [*GENERATED, "tsv"])
def test_texts_round_trip_through_the_vocabulary(name, tsv_file):
    task = make_task(name, **({"path": str(tsv_file)} if name == "tsv" else {}))
    pairs = task.pairs(64, torch.Generator().manual_seed(0))
    src, tgt = task.encode_pairs(pairs)
    assert src.dtype == tgt.dtype == torch.long
    assert src.size(1) <= task.max_source_len and tgt.size(1) <= task.max_target_len
    for (source, target), s, t in zip(pairs, src.tolist(), tgt.tolist(), strict=True):
        assert task.vocab.decode(task.vocab.encode(source)) == source
        assert task.vocab.decode(s) == source and task.vocab.decode(t) == target
        if task.decoder_only:
            assert s[0] == BOS and t[len(task.vocab.encode(target))] == EOS
        else:
            assert t[0] == BOS and EOS in s


@pytest.mark.parametrize("name", GENERATED)
def test_no_held_out_example_is_trained_on(name):
    task = make_task(name)
    key = 1 if name == "dates" else 0  # dates hold out days, whatever their format
    held = {pair[key] for pair in task.held_out_pairs(300)}
    train = {pair[key] for pair in task.pairs(3000, torch.Generator().manual_seed(0))}
    assert held and train and not held & train


def test_dates_targets_are_the_iso_dates_of_their_sources():
    task = make_task("dates")
    for source, target in task.pairs(300, torch.Generator().manual_seed(1)):
        day = datetime.date.fromisoformat(target)
        assert datetime.date(1950, 1, 1) <= day <= datetime.date(2049, 12, 31)
        assert source in {write_date(day, i) for i in range(NUM_FORMATS)}
        assert len(source) + 1 <= task.max_source_len


def test_no_two_date_formats_write_different_days_alike():
    seen: dict[str, datetime.date] = {}
    days = [datetime.date(y, 1, 1) + datetime.timedelta(days=d)
            for y in (1950, 1999, 2000, 2012, 2049) for d in range(0, 366, 3)]
    days += [datetime.date(2001, m, d) for m in range(1, 13) for d in range(1, 13)]
    for day in days:
        for index in range(NUM_FORMATS):
            text = write_date(day, index)
            assert seen.setdefault(text, day) == day, f"{text!r} reads as {day} and {seen[text]}"


def test_dates_speak_several_languages():
    day = datetime.date(1998, 3, 3)
    texts = {write_date(day, i) for i in range(NUM_FORMATS)}
    for expected in ("Tuesday, March 3, 1998", "3rd of March 1998", "3/3/98", "3 Mar 98",
                     "mardi 3 mars 1998", "Dienstag, 3. März 1998", "3 de marzo de 1998"):
        assert expected in texts


def test_addition_answers_are_sums():
    task = make_task("addition", max_digits=4)
    for prompt, answer in task.pairs(200, torch.Generator().manual_seed(0)):
        a, b = prompt.rstrip("=").split("+")
        assert int(answer) == int(a) + int(b) and len(a) <= 4 and len(b) <= 4
    assert [count_carries(a, b) for a, b in [(95, 7), (123, 4567), (999, 1), (0, 0)]] == \
        [2, 1, 3, 0]


def test_vocabulary_errors_name_the_unknown_characters():
    vocab = Vocabulary.build(["abc"])
    assert vocab.tokens[:3] == ("<pad>", "<bos>", "<eos>") and len(vocab) == 6
    with pytest.raises(VocabularyError, match="'x', 'z'"):
        vocab.encode("abxz")
    assert vocab.decode([BOS, 3, 4, EOS, 5, PAD]) == "ab"
    words = Vocabulary.build(["the cat", "a cat"], level="word")
    assert words.decode(words.encode("a cat")) == "a cat"
    assert Vocabulary.from_dict(words.to_dict()) == words


def test_tsv_split_and_vocabulary(tsv_file):
    task = make_task("tsv", path=str(tsv_file))
    assert task.test_pairs and not set(task.test_pairs) & set(task.train_pairs)
    assert len(task.test_pairs) + len(task.train_pairs) == 13
    assert set("catCAT") <= set(task.vocab.tokens)


@pytest.mark.parametrize("content, message", [
    ("", "no 'source<TAB>target' lines"),
    ("\n\n", "no 'source<TAB>target' lines"),
    ("a\tb\nno tab here\n", "line 2: expected 'source<TAB>target'"),
    ("a\tb\nc\td\te\n", "line 2: .*found 2 tabs"),
    ("a\tb\n\t\nx\ty\n", "line 2: the source is empty"),
    ("a\tb\nc\t \n", "line 2: the target is empty"),
])
def test_malformed_tsv_files_are_refused_with_the_line(tmp_path, content, message):
    path = tmp_path / "bad.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        make_task("tsv", path=str(path))


def test_missing_tsv_and_unknown_task_are_refused(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        make_task("tsv", path=str(tmp_path / "nope.tsv"))
    with pytest.raises(DataError, match="--data"):
        make_task("tsv")
    with pytest.raises(DataError, match="unknown task 'french'"):
        make_task("french")
