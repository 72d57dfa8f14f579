"""Multi30k without a dead link, offline: its repository's raw files (``train.de.gz``,
``val.en.gz``, ``test_2016_flickr.de.gz``, ...) written here in the same formats, a few
lines each, read as they are; ``--dataset multi30k`` falls back to a message that says how
to use them."""

from __future__ import annotations

import gzip

import pytest

from annotated_transformer import cli
from annotated_transformer.data import corpus as corpus_module
from annotated_transformer.data.corpus import load_corpus
from annotated_transformer.data.tsv import DataError

pytest.importorskip("tokenizers")

LINES = {  # Multi30k's style: one caption per line, the languages line for line
    "train": [("Zwei junge Männer sind im Freien.", "Two young men are outside."),
              ("Ein Hund läuft über das Gras.", "A dog runs across the grass."),
              ("Eine Frau liest ein Buch.", "A woman reads a book."),
              ("Ein Kind spielt mit einem Ball.", "A child plays with a ball.")],
    "val": [("Ein Mann fährt Fahrrad.", "A man rides a bike.")],
    "test_2016_flickr": [("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
                         ("Ein Mädchen lacht.", "A girl laughs.")],
}


def write_raw(folder, gz=True, lines=LINES, langs=("de", "en")):
    """``STEM.LANG.gz`` (or ``STEM.LANG``) for every split and language, a French file too
    (the repository has four languages)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stem, pairs in lines.items():
        for i, lang in enumerate(langs):
            text = "".join(pair[i] + "\n" for pair in pairs)
            if gz:
                with gzip.open(folder / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
            else:
                (folder / f"{stem}.{lang}").write_text(text, "utf-8")
        with gzip.open(folder / f"{stem}.fr.gz", "wt", encoding="utf-8") as f:
            f.write("".join("Une phrase.\n" for _ in pairs))
    return folder


@pytest.mark.parametrize("gz", [True, False])
def test_raw_files_are_read_as_they_are(tmp_path, gz):
    corpus = load_corpus(str(write_raw(tmp_path / "raw", gz=gz)), "de", "en")
    assert corpus == {"train": LINES["train"], "validation": LINES["val"],
                      "test": LINES["test_2016_flickr"]}
    reverse = load_corpus(str(tmp_path / "raw"), "en", "de")
    assert reverse["test"][0] == LINES["test_2016_flickr"][0][::-1]


def test_raw_files_that_do_not_match_are_named(tmp_path):
    folder = write_raw(tmp_path / "raw")
    with gzip.open(folder / "val.en.gz", "wt", encoding="utf-8") as f:
        f.write("one\ntwo\n")
    with pytest.raises(DataError, match=r"val.de.gz has 1 lines but .*val.en.gz has 2"):
        load_corpus(str(folder), "de", "en")
    (folder / "val.en.gz").unlink()
    with pytest.raises(DataError, match=r"val.de.gz has no val.en\(.gz\) beside it"):
        load_corpus(str(folder), "de", "en")
    with pytest.raises(DataError, match=r"train.de.gz has no train.cs\(.gz\) beside it"):
        load_corpus(str(folder), "de", "cs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"nor train.de\(.gz\) with train.en\(.gz\)"):
        load_corpus(str(tmp_path / "empty"), "de", "en")
    (folder / "train.de.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="train.de.gz: not readable"):
        load_corpus(str(folder), "de", "fr")


def test_multi30k_reads_the_hub_copy_when_it_can(monkeypatch):
    asked = []

    def hub(name, config, source_lang, target_lang):
        asked.append((name, config, source_lang, target_lang))
        return {"train": LINES["train"], "test": LINES["val"]}

    monkeypatch.setattr(corpus_module, "load_hub", hub)
    assert load_corpus("multi30k", "de", "en")["train"] == LINES["train"]
    assert asked == [("bentrevett/multi30k", None, "de", "en")]


def test_multi30k_offline_says_how_to_use_the_raw_files(monkeypatch, capsys, tmp_path):
    def unreachable(name, *args):
        raise DataError(f"could not reach dataset {name!r} on the Hugging Face hub")

    monkeypatch.setattr(corpus_module, "load_hub", unreachable)
    with pytest.raises(DataError) as error:
        load_corpus("multi30k", "de", "en")
    message = str(error.value)
    assert "bentrevett/multi30k" in message and "--dataset dataset/data/task1/raw" in message
    assert "git clone https://github.com/multi30k/dataset" in message
    status = cli.main(["train", "--task", "translation", "--dataset", "multi30k", "--out",
                       str(tmp_path / "run"), "--steps", "1"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: --dataset multi30k: ")
    assert "data/task1/raw" in err and len(err.strip().splitlines()) == 1


def test_train_and_evaluate_on_the_raw_folder(capsys, tmp_path):
    folder = write_raw(tmp_path / "raw")
    out = tmp_path / "run"
    status = cli.main(["train", "--task", "translation", "--dataset", str(folder), "--out",
                       str(out), "--vocab-size", "300", "--model", "small", "--steps", "2",
                       "--warmup", "1", "--eval-size", "1", "--device", "cpu", "--threads",
                       "1", "--no-progress"])
    assert status == 0, capsys.readouterr().err
    capsys.readouterr()
    status = cli.main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--device",
                       "cpu", "--greedy", "--json"])
    out_text = capsys.readouterr().out
    assert status == 0 and '"num_examples": 2' in out_text  # test_2016_flickr's two lines
