"""Dates of query understanding: what a date rule's match names, read against today's date, as
(first day, last day) and as the search's since/until texts. Receives a match of a
`query_patterns` date rule; hands `query_understanding` the period.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, timedelta
from typing import Callable

from faste_mm.retrieval.place_names import fold
from faste_mm.retrieval.query_patterns import Language

YEAR = r"(?:1[89]|20)\d\d"  # a four-digit year a photo or a document can have been made in


def date_action(action: str, match: re.Match, lang: Language, today: date):
    """(first day, last day) the match names (either end None: open); None when it names no date
    (a month 13, a year still to come, a range that ends before it starts)."""
    kind, _, key = action.partition(":")
    if kind == "relative":
        return _relative(key, today)
    if kind == "season":
        return _relative_season(match[0], key, lang, today)
    groups = match.groupdict()
    second = _read_date(groups["d2"], lang, today) if groups.get("d2") else None
    first = _read_date(groups["d1"], lang, today, second[0].year if second else None)
    if first is None or (groups.get("d2") and second is None):
        return None
    if kind == "between":
        return (first[0], second[1]) if first[0] <= second[1] else None
    return {"in": first, "since": (first[0], None), "after": (first[1] + timedelta(days=1), None),
            "before": (None, first[0] - timedelta(days=1)), "before_inclusive": (None, first[1])}[kind]


def _read_date(text: str, lang: Language, today: date, year_hint: int | None = None) -> tuple[date, date] | None:
    iso = re.search(r"((?:1[89]|20)\d\d)-(\d\d)(?:-(\d\d))?", text)
    try:
        if iso:
            y, m = int(iso[1]), int(iso[2])
            if iso[3]:
                day = date(y, m, int(iso[3]))
                return (day, day) if day <= today else None
            return _month(y, m) if date(y, m, 1) <= today else None
        year = re.search(rf"(?<!\d){YEAR}(?!\d)", text)
        y = int(year[0]) if year else None
        if y is not None and y > today.year:
            return None
        season = _find_word(text, lang.seasons, lang.spaced)
        if season is not None and y is not None:
            return _season(y, season)
        month = _find_word(text, lang.months, lang.spaced)
        if month is not None:
            if y is None:  # a month alone: in the range's year, else the latest one not to come
                y = year_hint if year_hint is not None else (today.year if month <= today.month else today.year - 1)
            return _month(y, month)
        return (date(y, 1, 1), date(y, 12, 31)) if y is not None else None
    except ValueError:  # a month 13, a day 32
        return None


def _find_word(text: str, words: dict[str, int], spaced: bool) -> int | None:
    for word in sorted(words, key=len, reverse=True):
        at = text.find(fold(word))
        if at >= 0 and (not spaced or _word_at(text, at, len(word))):
            return words[word]
    return None


def _word_at(text: str, at: int, n: int) -> bool:
    return (at == 0 or not text[at - 1].isalpha()) and (at + n == len(text) or not text[at + n].isalpha())


def _month(y: int, m: int) -> tuple[date, date]:
    return date(y, m, 1), date(y, m, calendar.monthrange(y, m)[1])


def _season(y: int, first_month: int) -> tuple[date, date]:
    """Three months from `first_month` of year y (winter y: December y to February y+1)."""
    end_y, end_m = (y + 1, first_month + 2 - 12) if first_month + 2 > 12 else (y, first_month + 2)
    return date(y, first_month, 1), _month(end_y, end_m)[1]


_RELATIVE: dict[str, Callable[[date], tuple[date, date]]] = {
    "today": lambda t: (t, t),
    "yesterday": lambda t: (t - timedelta(days=1),) * 2,
    "this_week": lambda t: (t - timedelta(days=t.weekday()), t - timedelta(days=t.weekday()) + timedelta(days=6)),
    "last_week": lambda t: (t - timedelta(days=t.weekday() + 7), t - timedelta(days=t.weekday() + 1)),
    "this_month": lambda t: _month(t.year, t.month),
    "last_month": lambda t: _month(t.year - (t.month == 1), 12 if t.month == 1 else t.month - 1),
    "this_year": lambda t: (date(t.year, 1, 1), date(t.year, 12, 31)),
    "last_year": lambda t: (date(t.year - 1, 1, 1), date(t.year - 1, 12, 31)),
}


def _relative(key: str, today: date) -> tuple[date, date]:
    return _RELATIVE[key](today)


def _relative_season(text: str, key: str, lang: Language, today: date) -> tuple[date, date] | None:
    """"last summer": the latest summer over before today; "this summer": this year's (this winter:
    the one around the turn of the year we are in); "last_year": last year's (去年の夏)."""
    first = _find_word(text, lang.seasons, lang.spaced)
    if first is None:
        return None
    if key == "last":
        return next(_season(y, first) for y in range(today.year, today.year - 3, -1) if _season(y, first)[1] < today)
    if key == "last_year":
        return _season(today.year - 1, first)
    return _season(today.year - (first == 12 and today.month <= 2), first)


def period_texts(start: date | None, end: date | None) -> tuple[str | None, str | None]:
    """since/until texts of [start, end] in the coarsest unit both ends fit: years ("2019".."2021"),
    months ("2024-06".."2024-08") or days; an open end is None."""
    whole_years = (start is None or (start.month, start.day) == (1, 1)) and (end is None or (end.month, end.day) == (12, 31))
    whole_months = ((start is None or start.day == 1)
                    and (end is None or end.day == calendar.monthrange(end.year, end.month)[1]))
    width = 4 if whole_years else 7 if whole_months else 10
    return (start.isoformat()[:width] if start else None), (end.isoformat()[:width] if end else None)


def period_bounds(text: str) -> tuple[date, date]:
    """The first and last day a since/until text names (YYYY, YYYY-MM, YYYY-MM-DD)."""
    parts = [int(p) for p in text.split("-")]
    if len(parts) == 1:
        return date(parts[0], 1, 1), date(parts[0], 12, 31)
    if len(parts) == 2:
        return _month(*parts)
    return date(*parts), date(*parts)
