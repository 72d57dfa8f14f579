"""The ``--parts`` language (annotated_transformer.sources): one parser, one meaning a word."""

from __future__ import annotations

import pytest

from annotated_transformer.parts import Parts
from annotated_transformer.sources import Source, parse_sources


def test_each_word_means_one_thing_and_a_folder_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fast").mkdir()  # a folder named like a word is still the word
    assert Source.parse("fast") == Source("fast")
    assert Source.parse("./fast") == Source("folder", (tmp_path / "fast").resolve())
    assert Source.parse(" exercises ") == Source("exercises")
    assert Source.parse(str(Source.parse("./fast"))) == Source.parse("./fast"), "round trip"


def test_a_comma_list_keeps_its_order_once_each(tmp_path):
    assert parse_sources(f"exercises,solutions,exercises,{tmp_path}") == (
        Source("exercises"), Source("solutions"), Source("folder", tmp_path.resolve()))


@pytest.mark.parametrize("text, named", [("nowhere", "'nowhere'"), ("solutions,", "empty")])
def test_a_wrong_word_is_a_clear_error(text, named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=named):
        parse_sources(text)


def test_the_parts_registry_reads_the_same_language(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="graded tests only"):
        Parts("variants").module(1)
    with pytest.raises(ValueError, match="none of them"):
        Parts("nowhere").module(1)
