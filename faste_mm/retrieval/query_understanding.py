"""Query understanding, offline and deterministic: a query as people type it ("beach in Lisbon
last summer", "Fotos aus Kyoto 2019", "2023年7月の写真") becomes the meaning text left for the
model plus filters in the search's own words (since/until, `where` conditions on facts, item
types, exact phrases). Receives the query, today's date and the collection's place names
(`place_names`); hands an `UnderstoodQuery` to the search request. Patterns: `query_patterns`.

Conservative by rule: every match is a candidate with its span, the longest non-overlapping ones
win, and a word that is also an everyday word ("may", "china", "pixel") is a filter only with the
words around it that make it one ("in May", "from China", "shot on a Pixel").
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, replace
from datetime import date
from typing import Any, Iterable, Sequence

from faste_mm.retrieval.place_names import PlaceNames, fold
from faste_mm.retrieval.query_dates import YEAR, date_action, period_bounds, period_texts
from faste_mm.retrieval.query_patterns import CAMERAS, COMMON_PLACE_WORDS, LANGUAGES, Language

# Longer queries are searched as typed: no one types a filter sentence this long, and the
# patterns' cost grows with the length (a 1 MB paste must not cost seconds before the search).
MAX_UNDERSTOOD_CHARS = 1_000
PART_KINDS = ("date", "place", "camera", "rating", "kind", "phrase")
_QUOTES = re.compile(r"\"([^\"]{1,200})\"|“([^”]{1,200})”|「([^」]{1,200})」|«\s?([^»]{1,200}?)\s?»")


@dataclass(frozen=True, slots=True)
class UnderstoodPart:
    """One understood part of a query: `kind` (one of PART_KINDS), the words as typed (`text`,
    characters [start, end) of the query), a `label` to show ("taken 2024-06..2024-08", "place
    Lisbon") and what it asks of the search: `where` conditions, a `since`/`until` date, item
    `types`, an exact `phrase`. `in_meaning`: its words also stay in the meaning text (a quoted
    phrase, "screenshots": the model sees what facts cannot tell)."""

    kind: str
    text: str
    start: int
    end: int
    label: str
    where: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    types: tuple[str, ...] = ()
    phrase: str | None = None
    in_meaning: bool = False
    language: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "text": self.text, "start": self.start, "end": self.end, "label": self.label}
        for name in ("where", "types"):
            if getattr(self, name):
                d[name] = list(getattr(self, name))
        for name in ("since", "until", "phrase", "language"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        if self.in_meaning:
            d["in_meaning"] = True
        return d


@dataclass(frozen=True, slots=True)
class UnderstoodQuery:
    """A query split into meaning and filters. `query`: as typed; `text`: the meaning text for the
    model ("" when the query is only filters: list the matching items, newest first); `parts`: what
    was understood, in query order, each removable (`without`); `literal`: understanding was off;
    `note`: why nothing was understood although asked (a query too long). The filters, combined:
    `since`/`until` (the latest start, the earliest end), `where` (all must hold), `types`,
    `phrases`; `search_keywords()` gives them as `Retriever.search` keywords."""

    query: str
    text: str
    parts: tuple[UnderstoodPart, ...] = ()
    literal: bool = False
    note: str | None = None

    @property
    def since(self) -> str | None:
        starts = [p.since for p in self.parts if p.since is not None]
        return max(starts, key=lambda s: period_bounds(s)[0]) if starts else None

    @property
    def until(self) -> str | None:
        ends = [p.until for p in self.parts if p.until is not None]
        return min(ends, key=lambda s: period_bounds(s)[1]) if ends else None

    @property
    def where(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for p in self.parts for c in p.where))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for p in self.parts for t in p.types))

    @property
    def phrases(self) -> tuple[str, ...]:
        return tuple(p.phrase for p in self.parts if p.phrase is not None)

    @property
    def is_filters_only(self) -> bool:
        """Nothing is left for the model: the search lists the matching items, newest first."""
        return not self.text and bool(self.parts)

    def without(self, index: int) -> UnderstoodQuery:
        """The same query with part `index` taken back into the meaning text (a removed chip)."""
        if not 0 <= index < len(self.parts):
            raise IndexError(f"part {index}: the query has {len(self.parts)} understood parts")
        parts = self.parts[:index] + self.parts[index + 1:]
        return replace(self, parts=parts, text=_meaning(_clean(self.query), parts))

    def search_keywords(self) -> dict[str, Any]:
        """`Retriever.search` keywords: query (None when only filters), since, until, where, type
        (only those set)."""
        keywords: dict[str, Any] = {"query": self.text or None}
        for name, value in (("since", self.since), ("until", self.until), ("where", list(self.where)),
                            ("type", list(self.types))):
            if value:
                keywords[name] = value
        return keywords

    def summary(self) -> str:
        """One line to show: "understood: place Lisbon · taken 2024-06..2024-08 · 'beach'"; "" when
        nothing was understood."""
        if not self.parts:
            return ""
        shown = [p.label for p in self.parts] + ([f"'{self.text}'"] if self.text else [])
        return "understood: " + " · ".join(shown)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnderstoodQuery:
        """The query `to_dict` wrote (a server's answer, read back by the thin client)."""
        parts = tuple(UnderstoodPart(**{k: tuple(v) if k in ("where", "types") else v for k, v in p.items()})
                      for p in d["parts"])
        return cls(d["query"], d["text"], parts, d.get("literal", False), d.get("note"))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the `query.understood` object of --format json, HTTP and MCP answers)."""
        d: dict[str, Any] = {"query": self.query, "text": self.text, "literal": self.literal,
                             "parts": [p.to_dict() for p in self.parts]}
        for name in ("since", "until"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        for name in ("where", "types", "phrases"):
            if getattr(self, name):
                d[name] = list(getattr(self, name))
        if self.note:
            d["note"] = self.note
        return d


def understand(query: str, today: date, places: PlaceNames | None = None, *, literal: bool = False,
               languages: Sequence[Language] = LANGUAGES) -> UnderstoodQuery:
    """Split `query` into meaning text and filters (dates read against `today`; places: only those
    in `places`, the collection's). `literal=True`: nothing is understood, the text is the query.
    Never raises for what the query holds: what is not understood stays meaning text.

    >>> understand("beach in Lisbon last summer", date(2024, 11, 2), lisbon).summary()
    "understood: place Lisbon · taken 2024-06..2024-08 · 'beach'"
    """
    if not isinstance(query, str):
        raise TypeError(f"understand: the query must be a str, got {type(query).__name__}")
    clean = _clean(query)
    if literal:
        return UnderstoodQuery(query, " ".join(clean.split()), literal=True)
    if len(clean) > MAX_UNDERSTOOD_CHARS:
        return UnderstoodQuery(query, " ".join(clean.split()),
                               note=f"not understood: longer than {MAX_UNDERSTOOD_CHARS} characters; searched as typed")
    folded = fold(clean)
    candidates: list[UnderstoodPart] = []
    for find in (_phrases, _dates, _places, _cameras, _ratings, _kinds):
        candidates.extend(find(clean, folded, today, places, languages))
    parts = _choose(candidates)
    return UnderstoodQuery(query, _meaning(clean, parts, languages), parts)


# ---- choosing among candidates ------------------------------------------------------------------
def _choose(candidates: list[UnderstoodPart]) -> tuple[UnderstoodPart, ...]:
    """Phrases first (nothing inside quotes is a filter), then the longest candidates that overlap
    nothing chosen; in query order."""
    chosen: list[UnderstoodPart] = []
    order = sorted(enumerate(candidates), key=lambda ic: (ic[1].kind != "phrase", -(ic[1].end - ic[1].start), ic[0]))
    for _, part in order:
        if all(part.end <= c.start or part.start >= c.end for c in chosen):
            chosen.append(part)
    places = [p for p in chosen if p.kind == "place"]
    if len({p.where for p in places}) > 1:  # "Lisbon or Porto": conditions all hold, so neither is a filter
        chosen = [p for p in chosen if p.kind != "place"]
    return tuple(sorted((p for p in chosen if p.kind != "blocked"), key=lambda p: p.start))


def _meaning(clean: str, parts: Sequence[UnderstoodPart], languages: Sequence[Language] = LANGUAGES) -> str:
    """The query without the parts' words (those not `in_meaning`), dropping the small words
    (`Language.fillers` of the parts' languages) that touch a removed part, spaces collapsed."""
    fillers = [lang for lang in languages if any(p.language == lang.code for p in parts)]
    removed = sorted((p.start, p.end) for p in parts if not p.in_meaning)
    pieces, at = [], 0
    for start, end in removed:
        pieces.append((clean[at:start], at > 0, True))
        at = max(at, end)
    pieces.append((clean[at:], at > 0, False))
    kept = [_strip_fillers(text, after, before, fillers) for text, after, before in pieces]
    return " ".join(" ".join(kept).split())


def _strip_fillers(text: str, after_part: bool, before_part: bool, languages: Sequence[Language]) -> str:
    changed = True
    while changed and text.strip():
        changed = False
        stripped = text.strip(" ,.;:!?、。")
        for lang in languages:
            for word in lang.fillers:
                word = fold(word)
                if before_part and _ends_with_word(fold(stripped), word, lang.spaced):
                    stripped, changed = stripped[: len(stripped) - len(word)], True
                elif after_part and _starts_with_word(fold(stripped), word, lang.spaced):
                    stripped, changed = stripped[len(word):], True
        text = stripped
    return text.strip(" ,.;:!?、。")


def _ends_with_word(text: str, word: str, spaced: bool) -> bool:
    return text.endswith(word) and (not spaced or len(text) == len(word) or not text[-len(word) - 1].isalnum())


def _starts_with_word(text: str, word: str, spaced: bool) -> bool:
    return text.startswith(word) and (not spaced or len(text) == len(word) or not text[len(word)].isalnum())


def _clean(query: str) -> str:
    """Control and format characters as spaces (one for one, so spans stay the query's)."""
    return "".join(" " if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in query)


# ---- finders: each yields candidates ------------------------------------------------------------
def _phrases(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    for match in _QUOTES.finditer(clean):
        phrase = next(g for g in match.groups() if g is not None).strip()
        if phrase:
            yield UnderstoodPart("phrase", match[0], match.start(), match.end(), f'exact "{phrase}"',
                                 phrase=phrase, in_meaning=True)


def _dates(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    for lang in languages:
        for regex, action in _date_rules(lang):
            for match in regex.finditer(folded):
                period = date_action(action, match, lang, today)
                if period is not None:
                    yield _date_part(clean, match, period, lang)
                else:  # "between 2021 and 2019", "in 2031": no date, and no year inside it is one either
                    yield UnderstoodPart("blocked", match[0], match.start(), match.end(), "")


def _places(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    if places is None or not places.names:
        return
    words = [(m.start(), m.end()) for m in re.finditer(r"\w+(?:['’]\w+)*", folded)]
    prepositions = {w for lang in languages for w in lang.place_prepositions}
    for i in range(len(words)):
        for n in range(min(places.max_words, len(words) - i), 0, -1):
            start, end = words[i][0], words[i + n - 1][1]
            name = " ".join(folded[s:e] for s, e in words[i:i + n])
            found = places.lookup(name)
            if not found or not _spaced_name(name):
                continue
            before = folded[words[i - 1][0]:words[i - 1][1]] if i else None
            if name in COMMON_PLACE_WORDS and before not in prepositions:
                continue  # "china plates", "jordan shoes": meaning
            if before in prepositions:
                start = words[i - 1][0]
            yield _place_part(clean, start, end, found, name)
            break
    for name in places.unspaced:  # Japanese and Chinese names: no spaces to find words by
        at = folded.find(name)
        while at >= 0:
            yield _place_part(clean, at, at + len(name), places.lookup(name), name, "ja")
            at = folded.find(name, at + len(name))


def _spaced_name(name: str) -> bool:
    return not any("\u3040" <= ch <= "\u9fff" for ch in name)


def _place_part(clean: str, start: int, end: int, found: tuple[tuple[str, str], ...], name: str,
                language: str | None = None) -> UnderstoodPart:
    values = {value for _, value in found}
    if len(found) == 1:
        field, value = found[0]
        where = f"{field}={value}"
    else:  # one name for several stored places (a city and its country): any of them
        value = sorted(values)[0]
        where = f"place~{value}"
    return UnderstoodPart("place", clean[start:end], start, end, f"place {' / '.join(sorted(values))}",
                          where=(where,), language=language)


def _cameras(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    names = list(CAMERAS)
    for lang in languages:
        for regex in _camera_rules(lang):
            for match in regex.finditer(folded):
                yield _camera_part(clean, match, names, lang.code)
    for regex in _bare_cameras():
        for match in regex.finditer(folded):
            yield _camera_part(clean, match, names, None)


def _camera_part(clean: str, match: re.Match, names: list[str], language: str | None) -> UnderstoodPart:
    index = next(int(k[1:]) for k, v in match.groupdict().items() if k.startswith("c") and v is not None)
    value = CAMERAS[names[index]][0]
    typed = clean[match.start(f"c{index}"):match.end(f"c{index}")]
    return UnderstoodPart("camera", clean[match.start():match.end()], match.start(), match.end(),
                          f"camera {typed}", where=(f"camera~{value}",), language=language)


def _ratings(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    for lang in languages:
        for regex in _rating_rules(lang):
            for match in regex.finditer(folded):
                groups = match.groupdict()
                stars = int(groups["n"]) if groups.get("n") else len(groups.get("stars") or "")
                if 1 <= stars <= 5:
                    yield UnderstoodPart("rating", clean[match.start():match.end()], match.start(), match.end(),
                                         f"rating {stars}+" if stars < 5 else "rating 5", where=(f"rating>={stars}",),
                                         language=lang.code)


def _kinds(clean, folded, today, places, languages) -> Iterable[UnderstoodPart]:
    for lang in languages:
        for regex, types in _kind_rules(lang):
            for match in regex.finditer(folded):
                typed = clean[match.start():match.end()]
                yield UnderstoodPart("kind", typed, match.start(), match.end(), f"kind {'/'.join(types)}",
                                     types=types, in_meaning=fold(typed) in {fold(k) for k in lang.kept_kinds},
                                     language=lang.code)


# ---- compiled rules (once per language) ---------------------------------------------------------
def _fold_template(template: str) -> str:
    """A pattern template matched against folded text: its words folded, its syntax kept (the
    templates use no upper-case escapes such as \\S or \\D, which folding would change), a space
    standing for any run of white space."""
    return fold(template).replace("(?p<", "(?P<").replace(" ", r"\s+")


def _bounded(template: str, lang: Language) -> str:
    return rf"(?<!\w){template}(?!\w)" if lang.spaced else template


def _alternation(words: Iterable[str]) -> str:
    return "(?:" + "|".join(re.escape(fold(w)) for w in sorted(words, key=len, reverse=True)) + ")"


def _fill(template: str, lang: Language) -> str:
    year = rf"(?<!\d){YEAR}(?!\d)"
    iso = rf"(?<!\d){YEAR}-\d\d(?:-\d\d)?(?![\d-])"
    date_form = lang.date_form.format(iso=iso, month=_alternation(lang.months), year=year)
    return _fold_template(template).format(date=date_form, month=_alternation(lang.months), year=year,
                                 season=_alternation(lang.seasons), iso=iso)


@functools.lru_cache(maxsize=None)
def _date_rules(lang: Language) -> tuple[tuple[re.Pattern, str], ...]:
    rules = [(t, "relative:" + key) for t, key in lang.relative.items()]
    rules += [(t, "season:" + key) for t, key in lang.relative_seasons]
    rules += list(lang.date_rules)
    rules += [(r"(?P<d1>{year})\s*[-–~〜]\s*(?P<d2>{year})", "between"), (r"(?P<d1>{iso})", "in"),
              (r"(?<!\d[-/.])(?P<d1>{year})(?![-/.]\d)", "in")]  # a year, not a part of "2019-13"
    return tuple((re.compile(_bounded(_fill(t, lang), lang)), action) for t, action in rules)


@functools.lru_cache(maxsize=None)
def _camera_rules(lang: Language) -> tuple[re.Pattern, ...]:
    camera = _camera_alternation()
    return tuple(re.compile(_bounded(_fold_template(t).replace("{camera}", camera), lang)) for t in lang.camera_phrases)


@functools.lru_cache(maxsize=1)
def _camera_alternation() -> str:
    return "(?:" + "|".join(f"(?P<c{i}>{pattern})" for i, pattern in enumerate(CAMERAS)) + ")"


@functools.lru_cache(maxsize=1)
def _bare_cameras() -> tuple[re.Pattern, ...]:
    bare = "|".join(f"(?P<c{i}>{p})" if ok else f"(?P<c{i}>(?!x)x)" for i, (p, (_, ok)) in enumerate(CAMERAS.items()))
    return (re.compile(rf"(?<!\w)(?:{bare})(?!\w)"),)


@functools.lru_cache(maxsize=None)
def _rating_rules(lang: Language) -> tuple[re.Pattern, ...]:
    return tuple(re.compile(_bounded(_fold_template(t), lang) if "stars>" not in t else _fold_template(t)) for t in lang.ratings)


@functools.lru_cache(maxsize=None)
def _kind_rules(lang: Language) -> tuple[tuple[re.Pattern, tuple[str, ...]], ...]:
    return tuple((re.compile(_bounded(f"(?:{_fold_template(t)})", lang)), types) for t, types in lang.kinds.items())


# ---- dates --------------------------------------------------------------------------------------
def _date_part(clean: str, match: re.Match, period: tuple[date, date | None] | tuple[date | None, date],
               lang: Language) -> UnderstoodPart:
    start, end = period
    since, until = period_texts(start, end)
    shown = (f"taken {since}" if since == until else f"taken {since}..{until}" if since and until
             else f"taken since {since}" if since else f"taken until {until}")
    return UnderstoodPart("date", clean[match.start():match.end()], match.start(), match.end(), shown,
                          since=since, until=until, language=lang.code)
