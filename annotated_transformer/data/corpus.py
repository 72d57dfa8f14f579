"""Parallel corpora: sentence pairs by split, from the Hugging Face hub or from local files.

    load_corpus("bentrevett/multi30k", "de", "en")       # the hub: columns "de" and "en"
    load_corpus("wmt/wmt14", "en", "de", config="de-en") # a "translation" column of dicts
    load_corpus("data/", "de", "en")                     # train.jsonl, validation.jsonl, ...
    load_corpus("pairs.tsv", "de", "en")                 # source<TAB>target lines
    load_corpus("multi30k", "de", "en")                  # the hub's copy of Multi30k
    load_corpus("dataset/data/task1/raw", "de", "en")    # train.de.gz, train.en.gz, ...

Hub datasets and local JSON lines are read by ``datasets.load_dataset`` (the hub's
downloads are cached, by default under ``~/.cache/huggingface``); a row gives its pair
either as one column per language (``{"de": ..., "en": ...}``) or as a ``translation``
column holding such a dict. A local folder holds one file per split, named
``train``, ``validation`` (or ``valid``, ``dev``) and ``test``, each ``.jsonl`` or
``.tsv``, or, as Multi30k's repository ships them, one file per split and language whose
lines match up: ``train.de.gz`` and ``train.en.gz``, ``val.*`` and ``test_2016_flickr.*``
(gzipped or not; :data:`LINE_ALIGNED`). A single local file is the training split; a tenth
of its pairs, chosen by a hash of the source, is held out as both validation and test split.

``multi30k`` names Multi30k (Elliott et al., 2016): the hub's copy when it can be reached,
otherwise an error saying how to use a local copy of its repository's raw files.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from annotated_transformer.data.optional import require
from annotated_transformer.data.task import Pair, held_out_by_hash
from annotated_transformer.data.tsv import DataError, read_pairs

SPLITS = ("train", "validation", "test")
SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "dev"),
               "test": ("test",)}
SUFFIXES = (".jsonl", ".tsv")
OFFLINE_HELP = ("without a network, use a local file (--dataset FILE.jsonl, FILE.tsv or a "
                "folder of train/validation/test files), or a dataset already in the cache "
                "(set HF_HUB_OFFLINE=1; HF_DATASETS_CACHE names the cache folder)")

# Line-aligned files, one per language: the names each split's files may have (Multi30k's
# repository: train, val and test_2016_flickr), with ``.LANG`` or ``.LANG.gz`` after them.
LINE_ALIGNED = {"train": ("train",), "validation": ("val", "valid", "validation", "dev"),
                "test": ("test_2016_flickr", "test")}
MULTI30K_HUB = "bentrevett/multi30k"
MULTI30K_HELP = ("Multi30k's own files work offline: clone its repository (git clone "
                 "https://github.com/multi30k/dataset) and pass its raw folder, "
                 "--dataset dataset/data/task1/raw (train.de.gz, train.en.gz, val.*, "
                 "test_2016_flickr.*, read as they are)")

Corpus = dict[str, list[Pair]]


def is_local(dataset: str) -> bool:
    """A path rather than a hub id: it exists, ends in a data file's suffix, or starts with
    ``.``, ``/`` or ``~``."""
    return (Path(dataset).expanduser().exists() or dataset.endswith(SUFFIXES + (".json",))
            or dataset.startswith((".", "/", "~")))


def load_corpus(dataset: str, source_lang: str, target_lang: str,
                config: str | None = None) -> Corpus:
    """The ``(source, target)`` pairs of each split of ``dataset`` (see the module's
    docstring); :class:`DataError` for a corpus that cannot be read, a language that is
    not in it, or an empty split."""
    if source_lang == target_lang:
        raise DataError(f"the source and target languages are both {source_lang!r}")
    if dataset == "multi30k":
        try:
            corpus = load_hub(MULTI30K_HUB, None, source_lang, target_lang)
        except DataError as error:
            raise DataError(f"--dataset multi30k: {error}. {MULTI30K_HELP}") from None
    elif is_local(dataset):
        corpus = load_local(Path(dataset).expanduser(), source_lang, target_lang)
    else:
        corpus = load_hub(dataset, config, source_lang, target_lang)
    if not corpus.get("train"):
        raise DataError(f"{dataset}: the train split has no sentence pairs")
    for split, pairs in corpus.items():
        if not pairs:
            raise DataError(f"{dataset}: the {split} split has no sentence pairs")
    return corpus


def load_hub(name: str, config: str | None, source_lang: str, target_lang: str) -> Corpus:
    """A dataset of the Hugging Face hub (or of its cache), through ``datasets``."""
    datasets = require("datasets")
    described = f"{name!r}" + (f" (config {config!r})" if config else "")
    try:
        splits = datasets.load_dataset(name, config)
    except ConnectionError as error:  # no network, or offline mode without a cached copy
        raise DataError(f"could not reach dataset {described} on the Hugging Face hub "
                        f"({error}); {OFFLINE_HELP}") from None
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(f"no dataset {described} on the Hugging Face hub; {OFFLINE_HELP}"
                        ) from None
    except FileNotFoundError:  # a relative path that is not there from this folder
        raise DataError(f"no folder {name} in {Path.cwd()}, and no dataset {described} on "
                        f"the Hugging Face hub: give the corpus's path (evaluate: --data PATH)"
                        ) from None
    except ValueError as error:  # a missing or unknown config
        first = str(error).strip().splitlines()[0]
        raise DataError(f"dataset {described}: {first}") from None
    return {split: pairs_of(splits[names], f"{name} [{names}]", source_lang, target_lang)
            for split in SPLITS if (names := find_split(splits, split)) is not None}


def load_local(path: Path, source_lang: str, target_lang: str) -> Corpus:
    """A local file (the training split, with a tenth held out) or folder of split files."""
    if path.is_dir():
        files = {split: file for split in SPLITS if (file := split_file(path, split))}
        if "train" not in files:
            aligned = line_aligned_files(path, source_lang, target_lang)
            if aligned:
                return {split: read_line_aligned(*files) for split, files in aligned.items()}
            raise DataError(f"{path}: no train.jsonl or train.tsv in this folder, nor "
                            f"train.{source_lang}(.gz) with train.{target_lang}(.gz)")
        return {split: read_file(file, source_lang, target_lang)
                for split, file in files.items()}
    if not path.is_file():
        raise DataError(f"{path}: no such file or folder")
    pairs = read_file(path, source_lang, target_lang)
    held = [held_out_by_hash(source) for source, _ in pairs]  # one pass: files can be big
    held_out = [p for p, h in zip(pairs, held, strict=True) if h]
    train = [p for p, h in zip(pairs, held, strict=True) if not h]
    if not held_out:  # a small file: hold out its last pair
        held_out, train = pairs[-1:], pairs[:-1]
    train = train or pairs
    return {"train": train, "validation": held_out, "test": held_out}


def split_file(folder: Path, split: str) -> Path | None:
    for name in SPLIT_NAMES[split]:
        for suffix in SUFFIXES:
            if (folder / f"{name}{suffix}").is_file():
                return folder / f"{name}{suffix}"
    return None


def line_aligned_files(folder: Path, source_lang: str, target_lang: str
                       ) -> dict[str, tuple[Path, Path]]:
    """Each split's ``(source file, target file)`` in ``folder`` (names of
    :data:`LINE_ALIGNED`, the language after them, gzipped or not); ``{}`` when there is no
    training pair of files. A split with only one language's file is an error."""
    found = {}
    for split, stems in LINE_ALIGNED.items():
        for stem in stems:
            pair = [next((folder / f"{stem}.{lang}{gz}" for gz in (".gz", "")
                          if (folder / f"{stem}.{lang}{gz}").is_file()), None)
                    for lang in (source_lang, target_lang)]
            if pair[0] and pair[1]:
                found[split] = tuple(pair)
                break
            if pair[0] or pair[1]:
                missing = target_lang if pair[0] else source_lang
                raise DataError(f"{folder}: {(pair[0] or pair[1]).name} has no "
                                f"{stem}.{missing}(.gz) beside it")
    return found if "train" in found else {}


def read_line_aligned(source_file: Path, target_file: Path) -> list[Pair]:
    """The pairs of two files whose line ``i`` are translations of each other (UTF-8,
    gzipped when the name ends in ``.gz``); pairs with an empty side are dropped."""
    def lines(path: Path) -> list[str]:
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as file:
                return file.read().splitlines()
        except (OSError, UnicodeDecodeError, EOFError) as error:
            raise DataError(f"{path}: not readable as UTF-8 text ({error})") from None
    sources, targets = lines(source_file), lines(target_file)
    if len(sources) != len(targets):
        raise DataError(f"{source_file} has {len(sources)} lines but {target_file} has "
                        f"{len(targets)}: line-aligned files must have one line per pair")
    return [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)
            if s.strip() and t.strip()]


def read_file(path: Path, source_lang: str, target_lang: str) -> list[Pair]:
    """A TSV file (``source<TAB>target``) or JSON lines read by ``datasets``."""
    if path.suffix == ".tsv":
        return read_pairs(path)
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"{path}: a corpus file is .jsonl (JSON lines) or .tsv")
    with open(path, "rb") as file:
        if not any(line.strip() for line in file):
            raise DataError(f"{path}: the file is empty (no sentence pairs)")
    datasets = require("datasets")
    datasets.disable_progress_bars()  # a local file is read in a moment
    try:
        rows = datasets.load_dataset("json", data_files={"train": str(path)})["train"]
    except Exception as error:  # datasets wraps the JSON parser's errors in several types
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
        raise DataError(f"{path}: not JSON lines ({first})") from None
    finally:
        datasets.enable_progress_bars()
    return pairs_of(rows, str(path), source_lang, target_lang)


def find_split(splits, split: str) -> str | None:
    """The name that ``splits`` (a ``DatasetDict``) gives ``split``, if it has it."""
    return next((name for name in SPLIT_NAMES[split] if name in splits), None)


def pairs_of(rows, where: str, source_lang: str, target_lang: str) -> list[Pair]:
    """The pairs of a ``datasets.Dataset`` whose rows hold both languages: as columns
    ``source_lang`` and ``target_lang``, or as keys of a ``translation`` column (flattened
    by ``datasets`` to ``translation.de``, ...). Pairs with an empty side are dropped."""
    flat = rows.flatten()
    columns = flat.column_names
    found = []
    for lang in (source_lang, target_lang):
        column = next((c for c in (lang, f"translation.{lang}") if c in columns), None)
        if column is None:
            raise DataError(f"{where}: no column for language {lang!r}; the columns are "
                            f"{', '.join(columns)} (choose --source-lang and --target-lang "
                            f"among them)")
        found.append(column)
    sources, targets = flat[found[0]], flat[found[1]]
    return [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)
            if isinstance(s, str) and isinstance(t, str) and s.strip() and t.strip()]
