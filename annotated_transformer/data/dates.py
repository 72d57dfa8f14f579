"""Dates: the same day written in many human formats, translated to ISO 8601.

``"Tuesday, March 3, 1998"``, ``"3/3/98"``, ``"3rd of March 1998"``, ``"mardi 3 mars 1998"``,
``"Dienstag, 3. März 1998"``, ``"3 de marzo de 1998"``... -> ``"1998-03-03"``.

Days run from 1950-01-01 to 2049-12-31, so a two-digit year names one century
(50-99: 19xx, 00-49: 20xx). The month and day names and the locale patterns come from
the Unicode CLDR through Babel; no two formats write different days the same way
(``tests/library/test_data.py`` checks it). A tenth of the days, chosen by a hash of the ISO date,
is held out: no held-out day is ever seen in training, in any format.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from functools import cache

import torch
from babel import Locale
from babel.dates import format_date

from annotated_transformer.data.task import Pair, Task, draw_pairs, randint
from annotated_transformer.data.vocab import Vocabulary

FIRST_DAY = datetime.date(1950, 1, 1)
LAST_DAY = datetime.date(2049, 12, 31)

# (locale, CLDR pattern or a named width). Left out on purpose: day-first numeric patterns
# with two-digit years ("d/M/yy", Spanish and Italian short), which read the same as the
# American "M/d/yy" for other days.
LOCALE_FORMATS: tuple[tuple[str, str], ...] = (
    ("en_US", "full"), ("en_US", "long"), ("en_US", "medium"), ("en_US", "short"),
    ("en_GB", "full"), ("en_GB", "long"), ("en_GB", "medium"), ("en_GB", "short"),
    ("en_US", "d MMM yy"), ("en_US", "MMM d, yy"), ("en_US", "y.MM.dd"), ("en_US", "yyyyMMdd"),
    ("fr_FR", "full"), ("fr_FR", "long"), ("fr_FR", "d MMM y"),
    ("de_DE", "full"), ("de_DE", "long"), ("de_DE", "medium"), ("de_DE", "short"),
    ("es_ES", "full"), ("es_ES", "long"), ("es_ES", "medium"),
    ("it_IT", "full"), ("it_IT", "long"),
    ("en_US", "y-MM-dd"),
)
ENGLISH_ORDINALS = ("{ordinal} of {month} {year}", "{month} {ordinal}, {year}",
                    "the {ordinal} of {month}, {year}")
NUM_FORMATS = len(LOCALE_FORMATS) + len(ENGLISH_ORDINALS)


def ordinal(day: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..., ``11th``, ``12th``, ``13th``, ``21st``..."""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


@cache
def _locale(name: str) -> Locale:
    return Locale.parse(name)


def write_date(day: datetime.date, format_index: int) -> str:
    """``day`` written in format number ``format_index`` (``0 <= format_index < NUM_FORMATS``)."""
    if format_index < len(LOCALE_FORMATS):
        locale, pattern = LOCALE_FORMATS[format_index]
        text = format_date(day, pattern, locale=_locale(locale))
    else:
        month = _locale("en_US").months["format"]["wide"][day.month]
        template = ENGLISH_ORDINALS[format_index - len(LOCALE_FORMATS)]
        text = template.format(ordinal=ordinal(day.day), month=month, year=day.year)
    return text.replace("\u00a0", " ").replace("\u202f", " ")  # CLDR's no-break spaces


@cache
def _all_characters() -> tuple[str, ...]:
    """Every character any format can write: each format applied to every day of a leap
    year (all month and weekday names) plus the digits."""
    seen = set("0123456789-")
    start = datetime.date(2000, 1, 1)
    for offset in range(366):
        for index in range(NUM_FORMATS):
            seen.update(write_date(start + datetime.timedelta(days=offset), index))
    return tuple(sorted(seen))


@dataclass(frozen=True)
class DateTask(Task):
    """Human-written dates -> ``YYYY-MM-DD``."""

    name = "dates"
    vocab: Vocabulary = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab", Vocabulary(("<pad>", "<bos>", "<eos>")
                                                     + _all_characters()))

    def draw(self, generator: torch.Generator) -> Pair:
        day = FIRST_DAY + datetime.timedelta(
            days=randint(0, (LAST_DAY - FIRST_DAY).days, generator))
        return write_date(day, randint(0, NUM_FORMATS - 1, generator)), day.isoformat()

    def pairs(self, count: int, generator: torch.Generator, held_out: bool = False) -> list[Pair]:
        return draw_pairs(self.draw, count, generator, held_out, key=lambda pair: pair[1])

    def spec(self) -> dict:
        return {"task": self.name}

    @property
    def max_source_len(self) -> int:
        return 40  # the longest written date is 33 characters, plus EOS

    @property
    def max_target_len(self) -> int:
        return 12  # BOS, YYYY-MM-DD, EOS
