"""Conditions on an item's facts (`facts.ItemFacts`): the comparisons of `--where` and the API's
`where` strings ("taken>=2024-05-01", "taken<2025", "camera~pixel", "rating>=4", "place~lisbon",
"has:gps"), parsed and checked here, each turned into one SQL condition on `item_facts` that
`filters.sql_conditions` adds to a search's filter (a date range reads the index on `taken`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from faste_mm.errors import ConfigError

# field -> (type, SQL expression over item_facts). Text compares case-insensitively (ASCII letters:
# SQLite's lower()); "~" means "contains".
FIELDS: dict[str, tuple[str, str]] = {
    "taken": ("date", "taken"),
    "rating": ("number", "rating"), "width": ("number", "width"), "height": ("number", "height"),
    "orientation": ("number", "orientation"), "duration": ("number", "duration_s"), "alt": ("number", "alt"),
    "camera": ("text", "ifnull(make, '') || ' ' || ifnull(model, '')"), "make": ("text", "make"),
    "model": ("text", "model"), "lens": ("text", "lens"), "title": ("text", "title"),
    "description": ("text", "description"), "author": ("text", "author"), "city": ("text", "city"),
    "neighbourhood": ("text", "neighbourhood"),
    "region": ("text", "region"), "country": ("text", "country"),
    "place": ("text", "ifnull(city, '') || ', ' || ifnull(region, '') || ', ' || ifnull(country, '')"),
    "keyword": ("keyword", "keywords"),
}
# The SQL condition of a dated item: a date read from the file. Rows an earlier extractor wrote with
# the file's mtime as the date (source "mtime") are undated, like rows without a date.
DATED = "taken_source IS NOT NULL AND taken_source != 'mtime'"
# has:NAME -> the SQL condition of an item that has it
HAS = {"gps": "lat IS NOT NULL", "date": DATED,
       "keywords": "keywords != '[]'", "title": "title IS NOT NULL", "description": "description IS NOT NULL",
       "rating": "rating IS NOT NULL", "camera": "(make IS NOT NULL OR model IS NOT NULL)",
       "lens": "lens IS NOT NULL", "place": "country IS NOT NULL", "author": "author IS NOT NULL",
       "duration": "duration_s IS NOT NULL"}
OPS = {"date": ("=", "!=", "<", "<=", ">", ">="), "number": ("=", "!=", "<", "<=", ">", ">="),
       "text": ("=", "!=", "~"), "keyword": ("=", "~")}
DATE_FORMS = "YYYY, YYYY-MM, YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][Z|+HH:MM]"
_CONDITION = re.compile(r"\s*([A-Za-z_]+)\s*(>=|<=|!=|=|<|>|~)\s*(.*?)\s*", re.S)
_HAS = re.compile(r"\s*has:\s*([A-Za-z_]+)\s*")


@dataclass(frozen=True, slots=True)
class FactCondition:
    """One condition on a fact: `field` (a FIELDS key, or "has"), `op`, and `value` as written.
    Build one with `parse_fact_condition`; the constructor checks the same."""

    field: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.field == "has":
            if self.value not in HAS:
                raise ConfigError(f"where has:{self.value}: not a fact to test; use has: with one of "
                                  f"{', '.join(HAS)}, e.g. has:gps")
            return
        if self.field not in FIELDS:
            raise ConfigError(f"where {self.field}{self.op}{self.value}: {self.field!r} is not a fact; "
                              f"facts are {', '.join(FIELDS)}")
        kind = FIELDS[self.field][0]
        if self.op not in OPS[kind]:
            raise ConfigError(f"where {self}: {self.field} takes {' '.join(OPS[kind])}, e.g. {_EXAMPLES[kind]}")
        _values(self)  # raises for a value of the wrong form

    def __str__(self) -> str:
        return f"has:{self.value}" if self.field == "has" else f"{self.field}{self.op}{self.value}"

    def sql(self) -> tuple[str, list[Any]]:
        """(condition on `items`, parameters): the item has a facts row meeting this condition."""
        inner, params = _inner_sql(self)
        return f"items.id IN (SELECT id FROM item_facts WHERE {inner})", params


_EXAMPLES = {"date": "taken>=2024-05-01", "number": "rating>=4", "text": "camera~pixel", "keyword": "keyword=beach"}


def parse_fact_condition(text: str) -> FactCondition | None:
    """A "FIELD OP VALUE" or "has:NAME" string as a FactCondition; None when it names no fact
    (a metadata condition KEY=VALUE). ConfigError when it names a fact but is malformed."""
    has = _HAS.fullmatch(text)
    if has:
        return FactCondition("has", ":", has[1].lower())
    match = _CONDITION.fullmatch(text)
    if match is None or match[1].lower() not in FIELDS:
        return None
    return FactCondition(match[1].lower(), match[2], match[3])


def date_period(text: str) -> tuple[float, float]:
    """The UTC instants [start, end) a date names: a year, a month, a day, or a minute/second (an
    offset kept; none: UTC). ConfigError naming the value and the valid forms."""
    text = text.strip()
    try:
        if re.fullmatch(r"\d{4}(-\d\d){0,2}", text):  # a whole year, month or day
            parts = [int(p) for p in text.split("-")]
            start = datetime(*parts, *[1] * (3 - len(parts)), tzinfo=timezone.utc)
            end = (start.replace(year=start.year + 1) if len(parts) == 1 else
                   (start.replace(day=28) + timedelta(days=4)).replace(day=1) if len(parts) == 2 else
                   start + timedelta(days=1))
            return start.timestamp(), end.timestamp()
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ConfigError(f"{text!r} is not a date; use {DATE_FORMS}, e.g. 2024-05-01") from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    width = timedelta(seconds=1) if when.second or len(text) > 16 else timedelta(minutes=1)
    return when.timestamp(), (when + width).timestamp()


def _values(cond: FactCondition) -> Any:
    kind = FIELDS[cond.field][0]
    if kind == "date":
        try:
            return date_period(cond.value)
        except ConfigError as error:
            raise ConfigError(f"where {cond}: {error}") from None
    if kind == "number":
        try:
            number = float(cond.value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ConfigError(f"where {cond}: {cond.value!r} is not a number; e.g. {cond.field}>=4")
        return number
    if not cond.value:
        raise ConfigError(f"where {cond}: give the text to compare, e.g. {_EXAMPLES[kind]}")
    return cond.value


def _inner_sql(cond: FactCondition) -> tuple[str, list[Any]]:
    if cond.field == "has":
        return HAS[cond.value], []
    kind, expr = FIELDS[cond.field]
    value, op = _values(cond), cond.op
    if kind == "date":  # a period [start, end): >= start, > at end, < start, <= before end
        start, end = value  # an undated item meets no date condition (--since/--until leave it out)
        sql, params = {"=": ("taken >= ? AND taken < ?", [start, end]), "!=": ("(taken < ? OR taken >= ?)", [start, end]),
                       ">=": ("taken >= ?", [start]), ">": ("taken >= ?", [end]), "<": ("taken < ?", [start]),
                       "<=": ("taken < ?", [end])}[op]
        return f"{sql} AND {DATED}", params
    if kind == "number":
        return f"{expr} {'<>' if op == '!=' else op} ?", [value]
    if kind == "keyword":
        test = "lower(value) = lower(?)" if op == "=" else "instr(lower(value), lower(?)) > 0"
        return f"EXISTS (SELECT 1 FROM json_each(keywords) WHERE {test})", [value]
    if op == "~":
        return f"instr(lower({expr}), lower(?)) > 0", [value]
    return f"{'' if op == '=' else 'NOT '}(lower(ifnull({expr}, '')) = lower(?))", [value]
