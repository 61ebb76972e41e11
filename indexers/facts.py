"""An item's facts: the typed metadata read from its file at scan time (date taken, camera, lens,
GPS and place, pixel size, title, description, keywords, rating, author, duration). Plain data
and its SQL row; `faste_mm.retrieval.library.photo_metadata` reads them from files, `store.MetaStore`
keeps them in the `item_facts` table (schema 7), filters compare them (`filters`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

from faste_mm.errors import InputError

# Which extractor wrote a facts row: a re-scan re-reads the files of rows written by an older one
# (and of items stored before schema 7, which have no row) without re-embedding them.
# 2: the city people use, with the neighbourhood beside it (retrieval/library/places.py).
FACTS_VERSION = 2
# Where `taken` came from. A file without a date has none (`taken` None: undated); its mtime is
# never a date taken. Rows an earlier extractor wrote with source "mtime" read back undated.
TAKEN_SOURCES = ("exif", "xmp", "iptc", "pdf", "video")
LEGACY_MTIME_SOURCE = "mtime"
MAX_OFFSET_MIN = 18 * 60  # ISO 8601 / Python's timezone bound on a UTC offset
MAX_TEXT_CHARS = 2_000  # a title/description longer than this is cut (a hostile file is not a novel)
MAX_KEYWORDS = 200


@dataclass(frozen=True, slots=True)
class ItemFacts:
    """Typed metadata of one item's file; every field None (or empty) when unknown.

    taken: when it was taken/created, a UTC instant (seconds since the epoch); taken_offset_min:
        the local UTC offset recorded with it (minutes east of UTC; None: not recorded, `taken` was
        read as UTC); taken_source: one of TAKEN_SOURCES. None: undated (no date in the file; the
        file's mtime is not a date taken): left out of date filters, sorted last by date.
    make/model/lens: camera; lat/lon (degrees, WGS84) and alt (metres) from GPS; country/region/city:
        the place of (lat, lon) (offline reverse geocoding; city: the one people use, "Lisbon"),
        neighbourhood: the populated place inside that city nearest (lat, lon) ("Intendente");
        orientation: EXIF 1-8; width/height:
        pixels as stored; title/description/keywords/rating (-1..5): XMP/IPTC; author: a PDF's;
        duration_s: a video's. issues: why a field is empty although the file has one (a hostile
        or unreadable value), counted in the index report.
    """

    taken: float | None = None
    taken_offset_min: int | None = None
    taken_source: str | None = None
    make: str | None = None
    model: str | None = None
    lens: str | None = None
    lat: float | None = None
    lon: float | None = None
    alt: float | None = None
    country: str | None = None
    region: str | None = None
    city: str | None = None
    neighbourhood: str | None = None
    orientation: int | None = None
    width: int | None = None
    height: int | None = None
    title: str | None = None
    description: str | None = None
    keywords: tuple[str, ...] = ()
    rating: int | None = None
    author: str | None = None
    duration_s: float | None = None
    issues: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(self.taken is None or (isinstance(self.taken, (int, float)) and math.isfinite(self.taken)),
               "taken", self.taken, "a finite UTC timestamp in seconds")
        _check(self.taken_offset_min is None or (isinstance(self.taken_offset_min, int)
                                                 and abs(self.taken_offset_min) <= MAX_OFFSET_MIN),
               "taken_offset_min", self.taken_offset_min, f"minutes within +-{MAX_OFFSET_MIN}")
        _check(self.taken_source is None or self.taken_source in TAKEN_SOURCES, "taken_source",
               self.taken_source, f"one of {TAKEN_SOURCES}")
        _check((self.lat is None) == (self.lon is None), "lat/lon", (self.lat, self.lon), "both or neither")
        _check(self.lat is None or (math.isfinite(self.lat) and -90 <= self.lat <= 90), "lat", self.lat, "-90..90")
        _check(self.lon is None or (math.isfinite(self.lon) and -180 <= self.lon <= 180), "lon", self.lon, "-180..180")
        _check(self.alt is None or math.isfinite(self.alt), "alt", self.alt, "finite metres")
        _check(self.rating is None or (isinstance(self.rating, int) and -1 <= self.rating <= 5), "rating",
               self.rating, "an int -1..5")
        _check(self.duration_s is None or (math.isfinite(self.duration_s) and self.duration_s >= 0), "duration_s",
               self.duration_s, "finite seconds >= 0")
        object.__setattr__(self, "keywords", tuple(self.keywords))
        object.__setattr__(self, "issues", tuple(self.issues))

    @property
    def camera(self) -> str | None:
        """Make and model as one name ("Google Pixel 8"; a model that repeats its make once)."""
        make, model = self.make or "", self.model or ""
        name = model if make and model.lower().startswith(make.lower()) else f"{make} {model}".strip()
        return name or None

    @property
    def place(self) -> str | None:
        """"neighbourhood, city, region, country" (the parts known)."""
        return ", ".join(p for p in (self.neighbourhood, self.city, self.region, self.country) if p) or None

    @property
    def has_gps(self) -> bool:
        return self.lat is not None

    def taken_iso(self) -> str | None:
        """`taken` as ISO 8601 in its recorded offset ("2024-05-01T14:03:00+01:00"), else in UTC ("...Z")."""
        if self.taken is None:
            return None
        zone = timezone.utc if self.taken_offset_min is None else timezone(timedelta(minutes=self.taken_offset_min))
        text = datetime.fromtimestamp(self.taken, zone).isoformat()
        return text[:-6] + "Z" if self.taken_offset_min is None and text.endswith("+00:00") else text

    def words(self) -> str:
        """The words the lexical index holds for these facts (title, description, keywords, place,
        camera, lens, author), so "beach lisbon" matches lexically."""
        parts = [self.title, self.description, *self.keywords, self.neighbourhood, self.city, self.region, self.country,
                 self.camera, self.lens, self.author]
        return " ".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (`--format json`, /search, the page): the fields known, plus `taken` as ISO 8601
        (null: undated), `taken_unix`, `camera` and `place`."""
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in (None, ()):
                d[f.name] = list(value) if isinstance(value, tuple) else value
        if self.taken is not None:
            d["taken_unix"] = d.pop("taken")
        d["taken"] = self.taken_iso()
        for name in ("camera", "place"):
            if getattr(self, name):
                d[name] = getattr(self, name)
        return d


def facts_from_dict(d: Mapping[str, Any] | None) -> ItemFacts | None:
    """Inverse of `ItemFacts.to_dict` (a hit's JSON from a server); None for None."""
    if d is None:
        return None
    names = {f.name for f in fields(ItemFacts)}
    values = {k: v for k, v in d.items() if k in names and k != "taken"}
    if values.get("taken_source") == LEGACY_MTIME_SOURCE:  # a server older than undated files: undated
        values.update(taken_offset_min=None, taken_source=None)
        return ItemFacts(**values)
    return ItemFacts(**values, taken=d.get("taken_unix"))


def _check(ok: bool, name: str, value: object, valid: str) -> None:
    if not ok:
        raise InputError(f"ItemFacts.{name} = {value!r:.60}: must be {valid}")


# The item_facts columns in ItemFacts field order (keywords and issues as JSON arrays).
COLUMNS = tuple(f.name for f in fields(ItemFacts))
_JSON_COLUMNS = ("keywords", "issues")


def to_row(item_id: int, facts: ItemFacts) -> tuple:
    """The `item_facts` row of an item: (id, version, *COLUMNS)."""
    values = [json.dumps(list(getattr(facts, name)), ensure_ascii=False) if name in _JSON_COLUMNS
              else getattr(facts, name) for name in COLUMNS]
    return (int(item_id), FACTS_VERSION, *values)


def from_row(row: Sequence[Any]) -> ItemFacts:
    """Inverse of `to_row` without (id, version)."""
    values: dict[str, Any] = dict(zip(COLUMNS, row))
    for name in _JSON_COLUMNS:
        values[name] = tuple(json.loads(values[name] or "[]"))
    if values["taken_source"] == LEGACY_MTIME_SOURCE:  # a file's mtime, not a date taken: undated
        values.update(taken=None, taken_offset_min=None, taken_source=None)
    return ItemFacts(**values)


def issue_counts(facts: Sequence[ItemFacts | None]) -> Mapping[str, int]:
    """How many files had each metadata issue (for the index report)."""
    counts: dict[str, int] = {}
    for f in facts:
        for issue in (f.issues if f is not None else ()):
            counts[issue] = counts.get(issue, 0) + 1
    return counts
