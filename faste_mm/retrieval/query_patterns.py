"""The words of query understanding, one table per language: month and season names, relative
dates, date rules (regular-expression templates), kinds, camera phrases, ratings, place
prepositions and the small words that go with a filter. Plain data; `query_understanding`
compiles the templates and applies them. Add a language by adding one `Language` to LANGUAGES.

Templates are regular expressions (matched case-insensitively on the query with accents kept)
with these placeholders, filled from the same table: {month} a month name, {season} a season
name, {year} a four-digit year, {date} a month (with or without its year), a year or an ISO date
("2024-06", "2024-06-15"). Named groups carry the values: `d1`/`d2` for dates, `n` for a number.
A rule's action says what the match means (`query_understanding.DATE_ACTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True, slots=True, eq=False)  # compared (and cached) by identity: its tables are dicts
class Language:
    """The patterns of one language (see the module docstring for the template placeholders).

    months: name -> 1..12 (full names and unambiguous abbreviations, lower case);
    seasons: name -> first month (northern hemisphere: spring 3, summer 6, autumn 9, winter 12);
    relative: phrase (a regular expression) -> one of RELATIVE ("last_year", "yesterday", ...);
    date_rules: (template, action) in order of preference, longer forms first;
    kinds: word (a regular expression for its forms) -> the item types it names;
    kept_kinds: words of `kinds` that also stay in the meaning text (facts cannot tell a
        screenshot from a photo, the model can);
    camera_phrases: templates around {camera} that make a camera name a filter ("shot on {camera}");
    ratings: templates with a group `n` (1..5) or `stars` (a run of stars);
    place_prepositions: words before a place ("in", "aus"); a place name that is also a common
        word (COMMON_PLACE_WORDS) is a filter only after one of these;
    fillers: small words dropped where they touch an understood part ("photos of dogs": "of");
        in a language written without spaces (Japanese) they are particles dropped as suffixes.
    """

    code: str
    months: Mapping[str, int]
    seasons: Mapping[str, int]
    relative: Mapping[str, str]
    date_rules: tuple[tuple[str, str], ...]
    kinds: Mapping[str, tuple[str, ...]]
    kept_kinds: frozenset[str] = frozenset()
    camera_phrases: tuple[str, ...] = ()
    ratings: tuple[str, ...] = ()
    place_prepositions: frozenset[str] = frozenset()
    fillers: frozenset[str] = frozenset()
    spaced: bool = True  # words are separated by spaces (False: Japanese, matched without word bounds)
    relative_seasons: tuple[tuple[str, str], ...] = ()  # (template with {season}, "last"|"this"|"last_year")
    # What {date} stands for: a month with or without its year, a year, an ISO date.
    date_form: str = r"(?:{iso}|{month}(?:\s+(?:de\s+|del\s+)?{year})?|{year})"


# What a relative phrase means, from the current date (`query_understanding._relative`).
RELATIVE = ("today", "yesterday", "this_week", "last_week", "this_month", "last_month", "this_year", "last_year")

# Cameras: a name as typed (a regular expression) -> (the `camera~` value, is_bare_ok). Bare-ok names
# are filters anywhere ("Canon"); the others only inside a camera phrase ("shot on a Pixel"), since
# "pixel art", "galaxy", "apple" and "mobile" mean things on their own.
CAMERAS: Mapping[str, tuple[str, bool]] = {
    r"i-?phone(?:\s?\d+)?(?:\s?(?:pro|max|mini|plus))*": ("iphone", True),
    r"(?:google\s)?pixel(?:\s?\d+a?)?(?:\s?pro)?": ("pixel", False),
    r"(?:samsung\s)?galaxy(?:\s?[sa]\d+)?": ("galaxy", False),
    r"samsung": ("samsung", False),
    r"canon(?:\seos)?": ("canon", True),
    r"nikon": ("nikon", True),
    r"sony": ("sony", False),
    r"fuji(?:film)?": ("fuji", True),
    r"olympus": ("olympus", True),
    r"(?:panasonic\s)?lumix": ("panasonic", True),
    r"leica": ("leica", True),
    r"gopro": ("gopro", True),
    r"dji": ("dji", False),
    r"huawei": ("huawei", False),
    r"xiaomi": ("xiaomi", False),
    r"ricoh": ("ricoh", True),
}

# Place names that are also everyday words (any of the five languages): a filter only after a
# place preposition ("plates from China" yes, "china plates" no; "in Jordan" yes, "jordan shoes" no).
COMMON_PLACE_WORDS = frozenset({
    "china", "jordan", "turkey", "chile", "georgia", "nice", "split", "reading", "bath", "mobile", "orange",
    "victoria", "florence", "sydney", "phoenix", "buffalo", "cork", "sale", "hope", "wells",
    "essen", "halle", "mark", "bergen", "lima", "santiago", "san", "santa", "la", "le", "los", "mali", "chad",
    "niger", "guinea", "jersey", "man", "date", "pau", "tours", "sens", "vence", "granada", "leon", "león",
    "como", "mayo", "marche", "corte", "salt", "delta", "aurora", "york", "home", "mercedes", "dover",
})

_EN_MONTHS = {"january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "april": 4, "apr": 4, "may": 5,
              "june": 6, "july": 7, "august": 8, "aug": 8, "september": 9, "sept": 9, "sep": 9, "october": 10,
              "oct": 10, "november": 11, "nov": 11, "december": 12, "dec": 12}
_DE_MONTHS = {"januar": 1, "jänner": 1, "februar": 2, "märz": 3, "maerz": 3, "april": 4, "mai": 5, "juni": 6,
              "juli": 7, "august": 8, "september": 9, "oktober": 10, "november": 11, "dezember": 12}
_FR_MONTHS = {"janvier": 1, "février": 2, "fevrier": 2, "mars": 3, "avril": 4, "mai": 5, "juin": 6,
              "juillet": 7, "août": 8, "aout": 8, "septembre": 9, "octobre": 10, "novembre": 11,
              "décembre": 12, "decembre": 12}
_ES_MONTHS = {"enero": 1, "febrero": 2, "marzo": 3, "abril": 4, "mayo": 5, "junio": 6, "julio": 7,
              "agosto": 8, "septiembre": 9, "setiembre": 9, "octubre": 10, "noviembre": 11, "diciembre": 12}

ENGLISH = Language(
    code="en", months=_EN_MONTHS,
    seasons={"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12},
    relative={r"today": "today", r"yesterday": "yesterday", r"this week": "this_week", r"last week": "last_week",
              r"this month": "this_month", r"last month": "last_month", r"this year": "this_year",
              r"last year": "last_year"},
    date_rules=(
        (r"between (?P<d1>{date}) and (?P<d2>{date})", "between"),
        (r"(?:from )?(?P<d1>{date}) (?:to|until|till|through) (?P<d2>{date})", "between"),
        (r"(?:before|until|till|up to|earlier than) (?P<d1>{date})", "before"),
        (r"(?:after|later than) (?P<d1>{date})", "after"),
        (r"since (?P<d1>{date})", "since"),
        (r"(?:in|from|during) (?P<d1>{date})", "in"),
        (r"(?P<d1>{month} {year})", "in"),
        (r"(?P<d1>{season} (?:of )?{year})", "in"),
    ),
    relative_seasons=((r"last {season}", "last"), (r"this {season}", "this")),
    kinds={r"photos?|pictures?|pics?|images?": ("image",), r"pdfs?": ("pdf",), r"videos?": ("video",),
           r"notes": ("text",), r"screenshots?": ("image",), r"documents|docs": ("pdf", "text")},
    kept_kinds=frozenset({"screenshot", "screenshots"}),
    camera_phrases=(r"(?:shot|taken|captured|photographed) (?:on|with) (?:an? |my |the )?{camera}",
                    r"(?:with|on|from) (?:an? |my |the )?{camera}", r"{camera} (?:photos|pictures|shots)"),
    # "4 stars" and "rated 4 stars", not "a 5-star hotel" (meaning)
    ratings=(r"(?:rated|at least) (?P<n>[1-5])(?:\s*\+)?[\s-]?stars?", r"(?P<n>[1-5])(?:\s*\+)? stars(?: or more)?",
             r"(?P<stars>★{1,5})"),
    place_prepositions=frozenset({"in", "at", "from", "near", "around", "to"}),
    fillers=frozenset({"of", "from", "in", "at", "the", "my", "all", "with", "taken", "and", "show", "me", "find", "about"}),
)

GERMAN = Language(
    code="de", months=_DE_MONTHS,
    seasons={"frühling": 3, "frühjahr": 3, "sommer": 6, "herbst": 9, "winter": 12},
    relative={r"heute": "today", r"gestern": "yesterday", r"diese woche": "this_week",
              r"letzte woche|vorige woche|letzter woche": "last_week", r"diesen monat|dieser monat": "this_month",
              r"letzten monat|letzter monat|vorigen monat": "last_month", r"dieses jahr|diesem jahr": "this_year",
              r"letztes jahr|letzten jahr|voriges jahr|vorigen jahr|letztem jahr|letzes jahr": "last_year"},
    date_rules=(
        (r"zwischen (?P<d1>{date}) und (?P<d2>{date})", "between"),
        (r"(?:von |vom )?(?P<d1>{date}) bis (?:zum |ende |anfang )?(?P<d2>{date})", "between"),
        (r"(?:vor|bis) (?P<d1>{date})", "before"),
        (r"nach (?P<d1>{date})", "after"),
        (r"seit (?P<d1>{date})", "since"),
        (r"(?:im|in|aus|von|vom) (?P<d1>{date})", "in"),
        (r"(?P<d1>{month} {year})", "in"),
        (r"(?P<d1>{season} {year})", "in"),
    ),
    relative_seasons=((r"(?:im |vom )?(?:letzten|vergangenen|vorigen) {season}", "last"),
                      (r"(?:diesen|in diesem|diesem) {season}", "this")),
    kinds={r"fotos?|bilder|bild|aufnahmen": ("image",), r"pdfs?": ("pdf",), r"videos?": ("video",),
           r"notizen": ("text",), r"screenshots?|bildschirmfotos?": ("image",), r"dokumente": ("pdf", "text")},
    kept_kinds=frozenset({"screenshot", "screenshots", "bildschirmfoto", "bildschirmfotos"}),
    camera_phrases=(r"(?:aufgenommen|fotografiert|geknipst) mit (?:einem |einer |meinem |meiner |dem |der )?{camera}",
                    r"mit (?:einem |einer |meinem |meiner |dem |der )?{camera}"),
    ratings=(r"(?:mit |mindestens )?(?P<n>[1-5])[\s-]?sternen?", r"(?P<stars>★{1,5})"),
    place_prepositions=frozenset({"in", "aus", "bei", "nahe", "von", "nach", "im"}),
    fillers=frozenset({"von", "aus", "in", "im", "mit", "meine", "meinen", "alle", "die", "der", "den", "und", "zeig", "mir"}),
)

FRENCH = Language(
    code="fr", months=_FR_MONTHS,
    seasons={"printemps": 3, "été": 6, "ete": 6, "automne": 9, "hiver": 12},
    relative={r"aujourd['’]hui": "today", r"d['’]hier|(?:prises?|faites?) hier": "yesterday", r"cette semaine": "this_week",
              r"la semaine derni[eè]re": "last_week", r"ce mois[- ]ci": "this_month",
              r"le mois dernier": "last_month", r"cette ann[ée]e": "this_year",
              r"l['’]ann[ée]e derni[eè]re|l['’]an dernier": "last_year"},
    date_rules=(
        (r"entre (?P<d1>{date}) et (?P<d2>{date})", "between"),
        (r"(?:de |d['’]|du )(?P<d1>{date}) (?:à|a|au|jusqu['’]à|jusqu['’]en) (?P<d2>{date})", "between"),
        (r"(?:avant|jusqu['’]à|jusqu['’]en) (?P<d1>{date})", "before"),
        (r"apr[èe]s (?P<d1>{date})", "after"),
        (r"depuis (?P<d1>{date})", "since"),
        (r"(?:en|de|d['’]|du|pendant) (?P<d1>{date})", "in"),
        (r"(?P<d1>{month} {year})", "in"),
        (r"(?:l['’]|le |en )?(?P<d1>{season} {year})", "in"),
    ),
    relative_seasons=((r"(?:l['’]|le |cet |de l['’]|du )?{season} derni(?:er|ère)", "last"),
                      (r"(?:cet|ce) {season}", "this")),
    kinds={r"photos?|images?": ("image",), r"pdfs?": ("pdf",), r"vidéos?|videos?": ("video",),
           r"notes": ("text",), r"captures? d['’][ée]cran": ("image",), r"documents": ("pdf", "text")},
    kept_kinds=frozenset({"capture d'écran", "captures d'écran", "capture d’écran", "captures d’écran"}),
    camera_phrases=(r"(?:prises?|faites?) (?:avec|au|à l['’]) (?:un |une |mon |ma |le |la )?{camera}",
                    r"(?:avec|au) (?:un |une |mon |ma |le |la )?{camera}"),
    ratings=(r"(?:au moins )?(?P<n>[1-5])[\s-]?[ée]toiles?", r"(?P<stars>★{1,5})"),
    place_prepositions=frozenset({"à", "a", "au", "aux", "en", "de", "d'", "d’", "près"}),
    fillers=frozenset({"de", "des", "du", "d'", "d’", "à", "en", "mes", "les", "la", "le", "avec", "et", "toutes"}),
)

SPANISH = Language(
    code="es", months=_ES_MONTHS,
    seasons={"primavera": 3, "verano": 6, "otoño": 9, "otono": 9, "invierno": 12},
    relative={r"hoy": "today", r"ayer": "yesterday", r"esta semana": "this_week", r"la semana pasada": "last_week",
              r"este mes": "this_month", r"el mes pasado": "last_month", r"este año|este ano": "this_year",
              r"el año pasado|el ano pasado": "last_year"},
    date_rules=(
        (r"entre (?P<d1>{date}) y (?P<d2>{date})", "between"),
        (r"(?:de |desde )(?P<d1>{date}) (?:a|al|hasta) (?P<d2>{date})", "between"),
        (r"(?:antes de|hasta) (?P<d1>{date})", "before"),
        (r"despu[ée]s de (?P<d1>{date})", "after"),
        (r"desde (?P<d1>{date})", "since"),
        (r"(?:en|de|del|durante) (?P<d1>{date})", "in"),
        (r"(?P<d1>{month} (?:de )?{year})", "in"),
        (r"(?:el |en )?(?P<d1>{season} (?:de |del )?{year})", "in"),
    ),
    relative_seasons=((r"(?:el |en el |del )?{season} pasado", "last"), (r"(?:este|en este) {season}", "this")),
    kinds={r"fotos?|fotografías|imágenes|imagenes": ("image",), r"pdfs?": ("pdf",), r"v[íi]deos?": ("video",),
           r"notas": ("text",), r"capturas? de pantalla": ("image",), r"documentos": ("pdf", "text")},
    kept_kinds=frozenset({"captura de pantalla", "capturas de pantalla"}),
    camera_phrases=(r"(?:tomadas?|hechas?|sacadas?) con (?:un |una |mi |el |la )?{camera}",
                    r"con (?:un |una |mi |el |la )?{camera}"),
    ratings=(r"(?:con |al menos )?(?P<n>[1-5])[\s-]?estrellas?", r"(?P<stars>★{1,5})"),
    place_prepositions=frozenset({"en", "de", "desde", "cerca"}),
    fillers=frozenset({"de", "del", "en", "mis", "las", "los", "la", "el", "con", "y", "todas"}),
)

JAPANESE = Language(
    code="ja", months={f"{n}月": n for n in range(1, 13)} | {f"{n:02d}月": n for n in range(1, 10)},
    seasons={"春": 3, "夏": 6, "秋": 9, "冬": 12},
    relative={r"今日|きょう": "today", r"昨日|きのう": "yesterday", r"今週": "this_week", r"先週": "last_week",
              r"今月": "this_month", r"先月": "last_month", r"今年": "this_year", r"去年|昨年": "last_year"},
    date_rules=(
        (r"(?P<d1>{date})\s*(?:から|〜|～|~)\s*(?P<d2>{date})(?:まで)?", "between"),
        (r"(?P<d1>{date})\s*より前", "before"),
        (r"(?P<d1>{date})\s*まで", "before_inclusive"),
        (r"(?P<d1>{date})\s*(?:以降|から)", "since"),
        (r"(?P<d1>{year}\s*年\s*の?\s*{season})", "in"),
        (r"(?P<d1>{date})", "in"),
    ),
    date_form=r"(?:{iso}|{year}\s*年\s*(?:{month})?|{month})",
    relative_seasons=((r"(?:去年|昨年)の{season}", "last_year"), (r"今年の{season}", "this")),
    kinds={r"写真|画像|フォト": ("image",), r"PDF|ＰＤＦ": ("pdf",), r"動画|ビデオ": ("video",), r"メモ|ノート": ("text",),
           r"スクリーンショット|スクショ": ("image",), r"書類|文書": ("pdf", "text")},
    kept_kinds=frozenset({"スクリーンショット", "スクショ"}),
    camera_phrases=(r"{camera}\s*で(?:撮った|撮影した|撮影|撮られた)",),
    ratings=(r"星\s*(?P<n>[1-5])(?:つ)?(?:以上)?", r"(?P<n>[1-5])\s*つ星", r"(?P<stars>★{1,5})"),
    place_prepositions=frozenset({"で", "の"}),
    fillers=frozenset({"の", "で", "に", "を", "は", "から", "まで", "と", "撮った", "撮影した"}),
    spaced=False,
)

LANGUAGES: tuple[Language, ...] = (ENGLISH, GERMAN, FRENCH, SPANISH, JAPANESE)
