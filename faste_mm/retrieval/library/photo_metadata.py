"""Facts at scan time, no model: what a file says about itself (EXIF, XMP, IPTC, a PDF's info
dictionary, a video container's tags) read into `ItemFacts`. Receives a scanned file's path and
kind; hands `ItemFacts` to ingest, which stores them beside the item and in the lexical index.

A hostile or broken value never fails the file: its field stays empty and a short reason goes to
`ItemFacts.issues` (counted in the index report). XMP is parsed with defusedxml (no DTD, no
entities: billion laughs and external entities are refused) and only up to MAX_XMP_BYTES.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from faste_mm.errors import InputError
from faste_mm.indexers.facts import MAX_KEYWORDS, MAX_OFFSET_MIN, MAX_TEXT_CHARS, ItemFacts
from faste_mm.model.file_decoding import pdf_metadata
from faste_mm.retrieval.library import places

log = logging.getLogger(__name__)

MAX_XMP_BYTES = 256 << 10  # real XMP packets are a few KiB (a JPEG APP1 holds 64 KiB); more is not read
# Dates outside these years are absurd for a photo or a document (EXIF's 0000:00:00, a clock
# reset to 1904, 9999): the field is left empty rather than sorting them first or last.
MIN_YEAR, MAX_YEAR = 1826, 2200
PHOTOS_EXTRA = "pip install 'faste-mm[photos]'"

# EXIF tags (the EXIF 2.32 numbers, as PIL.ExifTags names them)
_MAKE, _MODEL, _ORIENTATION, _DATETIME = 0x010F, 0x0110, 0x0112, 0x0132
_EXIF_IFD, _GPS_IFD = 0x8769, 0x8825
_DATETIME_ORIGINAL, _OFFSET_ORIGINAL, _LENS_MODEL = 0x9003, 0x9011, 0xA434
# IPTC-IIM records (2, n): object name (title), keywords, headline, caption
_IPTC_TITLE, _IPTC_KEYWORDS, _IPTC_HEADLINE, _IPTC_CAPTION, _IPTC_DATE = (2, 5), (2, 25), (2, 105), (2, 120), (2, 55)
_NS = {"dc": "http://purl.org/dc/elements/1.1/", "xmp": "http://ns.adobe.com/xap/1.0/",
       "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#", "photoshop": "http://ns.adobe.com/photoshop/1.0/",
       "exif": "http://ns.adobe.com/exif/1.0/"}


class _Facts:
    """The fields read so far and the issues met (mutable while one file is read)."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.issues: list[str] = []

    def guarded(self, issue: str, read: Callable[[], None]) -> None:
        """Run one section's reader; any exception leaves its fields empty and counts `issue`."""
        try:
            read()
        except Exception as error:  # hostile metadata never fails the file
            log.debug("metadata: %s (%s: %s)", issue, type(error).__name__, error)
            self.issues.append(issue)

    def text(self, name: str, value: object) -> None:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            value = value.replace("\x00", " ").strip()[:MAX_TEXT_CHARS]
            if value and name not in self.fields:
                self.fields[name] = value

    def date(self, source: str, taken: tuple[float, int | None] | None) -> None:
        if taken is not None and "taken" not in self.fields:
            self.fields.update(taken=taken[0], taken_offset_min=taken[1], taken_source=source)


def read_facts(path: Path, kind: str) -> ItemFacts:
    """The facts of one file of `kind` ("image", "pdf", "video", "text"); never raises for what the
    file holds. Without a date in the file the facts are undated (`taken` None): a file's mtime
    says when it was copied or edited, not when the photo was taken."""
    facts = _Facts()
    reader = {"image": _read_image, "pdf": _read_pdf, "video": _read_video}.get(kind)
    if reader is not None:
        facts.guarded(f"{kind} metadata unreadable", lambda: reader(path, facts))
    if "lat" in facts.fields:
        facts.guarded("place lookup failed", lambda: facts.fields.update(places.place_of(facts.fields["lat"],
                                                                                          facts.fields["lon"], facts.issues)))
    return _valid_facts(facts)


def _valid_facts(facts: _Facts) -> ItemFacts:
    """`ItemFacts` of what was read. A value its checks refuse (one no reader here should hand on:
    this is the net under them) empties its own field, with an issue, never the file's facts."""
    try:
        return ItemFacts(**facts.fields, issues=tuple(facts.issues))
    except InputError:
        pass
    groups = [("lat", "lon", "alt", "country", "region", "city") if name == "lat" else
              ("taken", "taken_offset_min", "taken_source") if name == "taken" else (name,)
              for name in facts.fields if name not in ("lon", "alt", "country", "region", "city",
                                                       "taken_offset_min", "taken_source")]
    kept: dict[str, Any] = {}
    for group in groups:
        values = {name: facts.fields[name] for name in group if name in facts.fields}
        try:
            ItemFacts(**values)
        except InputError:
            facts.issues.append(f"{group[0]} out of range")
            continue
        kept.update(values)
    return ItemFacts(**kept, issues=tuple(facts.issues))


# ---- images -------------------------------------------------------------------------------------
def _read_image(path: Path, facts: _Facts) -> None:
    from PIL import Image, IptcImagePlugin  # noqa: F401 (IptcImagePlugin: getiptcinfo)

    from faste_mm.model.file_decoding import open_lazily, register_image_plugins

    register_image_plugins()
    with open_lazily(str(path)) as image:  # headers only: no pixel is decoded (a huge JPEG's too)
        facts.fields["width"], facts.fields["height"] = image.size
        facts.guarded("exif unreadable", lambda: _read_exif(image.getexif(), facts))
        xmp = image.info.get("xmp") or image.info.get("XML:com.adobe.xmp")
        if xmp:
            facts.guarded("xmp unreadable", lambda: _read_xmp(xmp, facts))
        facts.guarded("iptc unreadable", lambda: _read_iptc(IptcImagePlugin.getiptcinfo(image), facts))


def _read_exif(exif: Any, facts: _Facts) -> None:
    facts.text("make", exif.get(_MAKE))
    facts.text("model", exif.get(_MODEL))
    orientation = exif.get(_ORIENTATION)
    if isinstance(orientation, int) and 1 <= orientation <= 8:
        facts.fields["orientation"] = orientation
    sub = exif.get_ifd(_EXIF_IFD)
    facts.text("lens", sub.get(_LENS_MODEL))
    stamp = sub.get(_DATETIME_ORIGINAL) or exif.get(_DATETIME)
    if stamp:
        facts.guarded("exif date unreadable", lambda: facts.date(
            "exif", _checked_date(_exif_date(stamp, sub.get(_OFFSET_ORIGINAL)), "exif date", facts)))
    gps = exif.get_ifd(_GPS_IFD)
    if gps:
        facts.guarded("gps unreadable", lambda: _read_gps(gps, facts))


def _exif_date(stamp: object, offset: object) -> tuple[datetime, int | None]:
    """EXIF "YYYY:MM:DD HH:MM:SS" and OffsetTime "+HH:MM" -> (local time, offset minutes as written)."""
    text = stamp.decode("ascii", "replace") if isinstance(stamp, bytes) else str(stamp)
    return datetime.strptime(text.strip("\x00 ")[:19], "%Y:%m:%d %H:%M:%S"), _offset_minutes(offset)


def _offset_minutes(offset: object) -> int | None:
    """"+HH:MM" (or "+HHMM") -> signed minutes as written, unchecked; None when not of that form."""
    if isinstance(offset, bytes):
        offset = offset.decode("ascii", "replace")
    match = re.fullmatch(r"\s*([+-])(\d\d):?(\d\d)\s*\x00*", offset) if isinstance(offset, str) else None
    if match is None:
        return None
    minutes = int(match[2]) * 60 + int(match[3])
    return minutes if match[1] == "+" else -minutes


def _checked_date(parsed: tuple[datetime, int | None], what: str, facts: _Facts) -> tuple[float, int | None] | None:
    """(local time, its UTC offset in minutes or None) -> (UTC instant, offset), the one check of
    every date read: an offset beyond +-18 h (no place on Earth has one; Python refuses it) is
    left empty, the time then read as UTC, like a date recorded without one; a year outside
    MIN_YEAR..MAX_YEAR empties the date. Each counts an issue."""
    local, minutes = parsed
    if minutes is not None and abs(minutes) > MAX_OFFSET_MIN:
        facts.issues.append(f"{what} offset out of range")
        minutes = None
    if not MIN_YEAR <= local.year <= MAX_YEAR:
        facts.issues.append(f"{what} out of range")
        return None
    zone = timezone.utc if minutes is None else timezone(timedelta(minutes=minutes))
    return local.replace(tzinfo=zone).timestamp(), minutes


def _read_gps(gps: Any, facts: _Facts) -> None:
    lat, lon = _degrees(gps.get(2), gps.get(1)), _degrees(gps.get(4), gps.get(3))
    if lat is None or lon is None:
        return
    if not (math.isfinite(lat) and math.isfinite(lon) and abs(lat) <= 90 and abs(lon) <= 180):
        facts.issues.append("gps out of range")
        return
    facts.fields.update(lat=lat, lon=lon)
    if gps.get(6) is not None:  # a broken altitude costs the altitude only, not the position
        facts.guarded("gps altitude unreadable", lambda: _read_altitude(gps, facts))


def _read_altitude(gps: Any, facts: _Facts) -> None:
    alt = float(gps.get(6))  # a zero denominator reads as nan
    if not (math.isfinite(alt) and abs(alt) < 100_000):
        facts.issues.append("gps altitude out of range")
        return
    facts.fields["alt"] = -alt if gps.get(5) in (1, b"\x01") else alt


def _degrees(dms: object, ref: object) -> float | None:
    """EXIF (degrees, minutes, seconds) rationals and "N"/"S"/"E"/"W" -> signed degrees (nan if broken:
    a zero denominator, a count other than three, a value that is not a number)."""
    if dms is None:
        return None
    try:
        d, m, s = (float(v) for v in dms)  # a zero denominator reads as nan: caught by the range check
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return math.nan
    value = d + m / 60 + s / 3600
    ref = ref.decode("ascii", "replace") if isinstance(ref, bytes) else ref
    return -value if isinstance(ref, str) and ref.strip("\x00 ").upper() in ("S", "W") else value


def _read_iptc(iptc: dict | None, facts: _Facts) -> None:
    if not iptc:
        return
    facts.text("title", iptc.get(_IPTC_TITLE) or iptc.get(_IPTC_HEADLINE))
    facts.text("description", iptc.get(_IPTC_CAPTION))
    keywords = iptc.get(_IPTC_KEYWORDS)
    keywords = keywords if isinstance(keywords, list) else [keywords] if keywords else []
    _keywords(facts, [k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k) for k in keywords])
    date = iptc.get(_IPTC_DATE)
    if date:
        text = date.decode("ascii", "replace") if isinstance(date, bytes) else str(date)
        facts.guarded("iptc date unreadable", lambda: facts.date(
            "iptc", _checked_date((datetime.strptime(text[:8], "%Y%m%d"), None), "iptc date", facts)))


def _keywords(facts: _Facts, words: list[str]) -> None:
    have = list(facts.fields.get("keywords", ()))
    for word in words:
        word = word.replace("\x00", " ").strip()[:200]
        if word and word not in have and len(have) < MAX_KEYWORDS:
            have.append(word)
    if have:
        facts.fields["keywords"] = tuple(have)


# ---- XMP ----------------------------------------------------------------------------------------
def _read_xmp(xmp: bytes | str, facts: _Facts) -> None:
    data = xmp.encode("utf-8") if isinstance(xmp, str) else bytes(xmp)
    if len(data) > MAX_XMP_BYTES:
        facts.issues.append(f"xmp over {MAX_XMP_BYTES >> 10} KiB")
        return
    try:
        from defusedxml import DefusedXmlException
        from defusedxml.ElementTree import fromstring
    except ImportError:
        facts.issues.append(f"xmp skipped (defusedxml missing: {PHOTOS_EXTRA})")
        return
    try:  # no DTD at all: a packet never needs one, and entity bombs need one
        root = fromstring(data.strip(b"\x00 \n"), forbid_dtd=True)
    except DefusedXmlException:
        facts.issues.append("xmp refused (DTD or entities)")
        return
    for desc in root.iter(f"{{{_NS['rdf']}}}Description"):
        facts.text("title", _xmp_value(desc, "dc", "title"))
        facts.text("description", _xmp_value(desc, "dc", "description"))
        subject = desc.find("dc:subject", _NS)
        if subject is not None:
            _keywords(facts, [li.text or "" for li in subject.iter(f"{{{_NS['rdf']}}}li")])
        rating = _xmp_value(desc, "xmp", "Rating")
        if rating is not None:
            _xmp_rating(rating, facts)
        for ns, name in (("exif", "DateTimeOriginal"), ("photoshop", "DateCreated")):
            stamp = _xmp_value(desc, ns, name)
            if stamp:
                facts.guarded("xmp date unreadable",
                              lambda: facts.date("xmp", _checked_date(_iso_date(stamp), "xmp date", facts)))


def _xmp_value(desc: Any, ns: str, name: str) -> str | None:
    """A property as an attribute (xmp:Rating="4") or an element, a language alternative's first item."""
    attribute = desc.get(f"{{{_NS[ns]}}}{name}")
    if attribute is not None:
        return attribute
    element = desc.find(f"{ns}:{name}", _NS)
    if element is None:
        return None
    item = element.find(".//rdf:li", _NS)
    return (item.text if item is not None else element.text) or None


def _xmp_rating(text: str, facts: _Facts) -> None:
    try:
        rating = round(float(text))
    except (ValueError, OverflowError):
        facts.issues.append("xmp rating unreadable")
        return
    if -1 <= rating <= 5:
        facts.fields["rating"] = rating
    else:
        facts.issues.append("xmp rating out of range")


def _iso_date(text: str) -> tuple[datetime, int | None]:
    """ISO 8601 (XMP, video tags) -> (local time, offset minutes as written): "Z" is offset 0, none
    is None. The offset is split off here, not by `fromisoformat`, which refuses one of 24 h or more
    and would cost the whole date instead of the offset (`_checked_date` judges it)."""
    text = text.strip()
    match = re.fullmatch(r"(.*?)(?:([Zz])|([+-])(\d\d):?(\d\d))", text)
    if match is None:
        return datetime.fromisoformat(text), None
    local = datetime.fromisoformat(match[1])
    if local.tzinfo is not None:  # "...+01:00+02:00": not a date
        raise ValueError(f"not an ISO 8601 date: {text[:40]!r}")
    if match[2]:
        return local, 0
    minutes = int(match[4]) * 60 + int(match[5])
    return local, minutes if match[3] == "+" else -minutes


# ---- PDFs and videos ----------------------------------------------------------------------------
def _read_pdf(path: Path, facts: _Facts) -> None:
    info = pdf_metadata(path)  # under the PDFium lock: indexing renders other PDFs in threads meanwhile
    facts.text("title", info.get("Title"))
    facts.text("author", info.get("Author"))
    facts.text("description", info.get("Subject"))
    _keywords(facts, [w for w in re.split(r"[,;]", info.get("Keywords", "")) if w.strip()])
    created = info.get("CreationDate")
    if created:
        facts.guarded("pdf date unreadable", lambda: facts.date("pdf", _checked_date(_pdf_date(created), "pdf date", facts)))


def _pdf_date(text: str) -> tuple[datetime, int | None]:
    """PDF 1.7 §7.9.4 "D:YYYYMMDDHHmmSSOHH'mm'" (every part after the year optional) -> (local time,
    offset minutes as written)."""
    match = re.fullmatch(r"D?:?(\d{4})(\d\d)?(\d\d)?(\d\d)?(\d\d)?(\d\d)?([Zz+-])?(\d\d)?'?(\d\d)?'?", text.strip())
    if match is None:
        raise ValueError(f"not a PDF date: {text[:40]!r}")
    year, month, day, hour, minute, second = (int(match[i] or default) for i, default in
                                              zip(range(1, 7), (0, 1, 1, 0, 0, 0)))
    sign, minutes = match[7], None
    if sign in ("+", "-"):
        minutes = (int(match[8] or 0) * 60 + int(match[9] or 0)) * (1 if sign == "+" else -1)
    elif sign in ("Z", "z"):
        minutes = 0
    return datetime(year, month, day, hour, minute, second), minutes


def _read_video(path: Path, facts: _Facts) -> None:
    import av

    with av.open(str(path)) as container:
        if container.duration is not None and container.duration > 0:
            facts.fields["duration_s"] = container.duration / av.time_base
        tags = dict(container.metadata)
        for stream in container.streams:
            tags = {**dict(stream.metadata), **tags}
    facts.text("title", tags.get("title"))
    facts.text("description", tags.get("comment") or tags.get("description"))
    created = tags.get("creation_time")
    if created:
        facts.guarded("video date unreadable",
                      lambda: facts.date("video", _checked_date(_iso_date(created), "video date", facts)))
