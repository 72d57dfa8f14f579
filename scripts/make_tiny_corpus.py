"""Write a small German-English parallel corpus for Chapter 7's offline translation run.

    python scripts/make_tiny_corpus.py chapters/data/tiny-de-en

Sentences are drawn from a small grammar of both languages (articles that agree with
gender, number and case, adjective endings, verb-second order after an adverb, verb-final
order after "weil"), so a subword vocabulary has stems and endings to find and the model
has words to reorder. The three splits share no sentence. Deterministic (seed 0).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# noun: (German singular, German plural, gender, English singular, English plural)
NOUNS = [
    ("Hund", "Hunde", "m", "dog", "dogs"), ("Mann", "Männer", "m", "man", "men"),
    ("Ball", "Bälle", "m", "ball", "balls"), ("Vogel", "Vögel", "m", "bird", "birds"),
    ("Lehrer", "Lehrer", "m", "teacher", "teachers"), ("Apfel", "Äpfel", "m", "apple", "apples"),
    ("Katze", "Katzen", "f", "cat", "cats"), ("Frau", "Frauen", "f", "woman", "women"),
    ("Blume", "Blumen", "f", "flower", "flowers"), ("Tür", "Türen", "f", "door", "doors"),
    ("Kind", "Kinder", "n", "child", "children"), ("Buch", "Bücher", "n", "book", "books"),
    ("Haus", "Häuser", "n", "house", "houses"), ("Pferd", "Pferde", "n", "horse", "horses"),
]
ANIMATE = {"Hund", "Mann", "Vogel", "Lehrer", "Katze", "Frau", "Kind", "Pferd"}
ADJECTIVES = [("klein", "little"), ("groß", "big"), ("rot", "red"), ("alt", "old"),
              ("jung", "young"), ("schön", "beautiful"), ("schnell", "fast")]
# verb: (German 3rd singular, 3rd plural, English 3rd singular, plural)
VERBS = [("sieht", "sehen", "sees", "see"), ("sucht", "suchen", "looks for", "look for"),
         ("findet", "finden", "finds", "find"), ("mag", "mögen", "likes", "like"),
         ("hört", "hören", "hears", "hear"), ("kennt", "kennen", "knows", "know")]
ADVERBS = [("heute", "today"), ("morgen", "tomorrow"), ("oft", "often"), ("jetzt", "now")]
PLACES = [("im Park", "in the park"), ("im Garten", "in the garden"),
          ("in der Stadt", "in the city"), ("am Fluss", "by the river")]
ARTICLE = {("m", "nom"): "der", ("f", "nom"): "die", ("n", "nom"): "das",
           ("m", "acc"): "den", ("f", "acc"): "die", ("n", "acc"): "das"}


def upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def noun_phrase(rng: random.Random, case: str, animate: bool) -> tuple[str, str, bool]:
    """(German, English, plural) for an article, maybe an adjective, and a noun."""
    de_sg, de_pl, gender, en_sg, en_pl = rng.choice(
        [n for n in NOUNS if (n[0] in ANIMATE) == animate or not animate])
    plural = rng.random() < 0.3
    adjective = rng.choice(ADJECTIVES) if rng.random() < 0.5 else None
    article = "die" if plural else ARTICLE[gender, case]
    de, en = [article], ["the"]
    if adjective:
        weak_e = not plural and (case == "nom" or gender != "m")
        de.append(adjective[0] + ("e" if weak_e else "en"))
        en.append(adjective[1])
    de.append(de_pl if plural else de_sg)
    en.append(en_pl if plural else en_sg)
    return " ".join(de), " ".join(en), plural


def sentence(rng: random.Random) -> tuple[str, str]:
    """One German sentence and its English translation."""
    subject_de, subject_en, plural = noun_phrase(rng, "nom", animate=True)
    object_de, object_en, _ = noun_phrase(rng, "acc", animate=False)
    verb = rng.choice(VERBS)
    verb_de, verb_en = (verb[1], verb[3]) if plural else (verb[0], verb[2])
    place = rng.choice(PLACES) if rng.random() < 0.4 else None
    where_de = f" {place[0]}" if place else ""
    where_en = f" {place[1]}" if place else ""
    form = rng.random()
    if form < 0.3:  # verb second after an adverb: "heute sieht der Hund ..."
        adverb = rng.choice(ADVERBS)
        de = f"{upper_first(adverb[0])} {verb_de} {subject_de}{where_de} {object_de}"
        en = f"{upper_first(adverb[1])} {subject_en} {verb_en} {object_en}{where_en}"
    elif form < 0.5:  # verb last after "weil": "..., weil der Hund den Ball sieht"
        reason_de, reason_en, reason_plural = noun_phrase(rng, "nom", animate=True)
        tired_de = "müde sind" if reason_plural else "müde ist"
        tired_en = "are tired" if reason_plural else "is tired"
        de = (f"{upper_first(subject_de)} {verb_de} {object_de}{where_de}, weil {reason_de} "
              f"{tired_de}")
        en = (f"{upper_first(subject_en)} {verb_en} {object_en}{where_en} because {reason_en} "
              f"{tired_en}")
    else:
        de = f"{upper_first(subject_de)} {verb_de} {object_de}{where_de}"
        en = f"{upper_first(subject_en)} {verb_en} {object_en}{where_en}"
    return de + ".", en + "."


def corpus(sizes: dict[str, int], seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Distinct pairs for each split, none shared between splits."""
    rng, seen, splits = random.Random(seed), set(), {}
    for split, size in sizes.items():
        pairs = []
        while len(pairs) < size:
            pair = sentence(rng)
            if pair[0] not in seen:
                seen.add(pair[0])
                pairs.append(pair)
        splits[split] = pairs
    return splits


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "chapters/data/tiny-de-en")
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in corpus({"train": 4000, "validation": 200, "test": 200}).items():
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as file:
            for de, en in pairs:
                file.write(json.dumps({"de": de, "en": en}, ensure_ascii=False) + "\n")
    print(f"wrote {out}/train.jsonl, validation.jsonl, test.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
