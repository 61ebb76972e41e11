"""Query understanding (retrieval/query_understanding.py, issue 47 item 1): queries in English,
German, French, Spanish and Japanese split into meaning text and filters in the search's own
words, the traps that must stay meaning, removable parts, the literal switch, and bad input."""

from __future__ import annotations

from datetime import date

import pytest

from faste_mm.retrieval.place_names import KnownPlace, fold, known_places, place_names
from faste_mm.retrieval.query_understanding import MAX_UNDERSTOOD_CHARS, UnderstoodQuery, understand
from faste_mm.indexers.facts import ItemFacts

TODAY = date(2024, 11, 2)  # a Saturday


@pytest.fixture(scope="module")
def places():
    return place_names([KnownPlace("Lisbon", "Lisbon", "Portugal", "Intendente"), KnownPlace("Kyoto", "Kyoto", "Japan"),
                        KnownPlace("Berlin", "State of Berlin", "Germany", "Mitte"), KnownPlace("Beijing", "Beijing", "China"),
                        KnownPlace("Amman", "Amman", "Jordan"), KnownPlace("Lima", "Lima region", "Peru", "Breña")])


def keywords(query: str, places, today: date = TODAY) -> dict:
    return understand(query, today, places).search_keywords()


# query -> the Retriever.search keywords it means (query None: only filters)
CASES = {
    # English
    "beach in Lisbon last summer": {"query": "beach", "since": "2024-06", "until": "2024-08", "where": ["place~Lisbon"]},
    "receipts from March": {"query": "receipts", "since": "2024-03", "until": "2024-03"},
    "receipts from December": {"query": "receipts", "since": "2023-12", "until": "2023-12"},  # the latest December gone
    "dogs between 2019 and 2021": {"query": "dogs", "since": "2019", "until": "2021"},
    "2019-2021 dogs": {"query": "dogs", "since": "2019", "until": "2021"},
    "hiking from May to July 2024": {"query": "hiking", "since": "2024-05", "until": "2024-07"},
    "cats before 2020": {"query": "cats", "until": "2019"},
    "cats after May 2023": {"query": "cats", "since": "2023-06"},
    "cats since 2022": {"query": "cats", "since": "2022"},
    "last year": {"query": None, "since": "2023", "until": "2023"},
    "this year": {"query": None, "since": "2024", "until": "2024"},
    "last month": {"query": None, "since": "2024-10", "until": "2024-10"},
    "yesterday": {"query": None, "since": "2024-11-01", "until": "2024-11-01"},
    "last week": {"query": None, "since": "2024-10-21", "until": "2024-10-27"},
    "sunset shot on a Pixel": {"query": "sunset", "where": ["camera~pixel"]},
    "dogs with my iPhone": {"query": "dogs", "where": ["camera~iphone"]},
    "Canon sunset": {"query": "sunset", "where": ["camera~canon"]},
    "4 stars": {"query": None, "where": ["rating>=4"]},
    "PDFs about taxes": {"query": "taxes", "type": ["pdf"]},
    "videos of cats": {"query": "cats", "type": ["video"]},
    "notes": {"query": None, "type": ["text"]},
    "screenshots of chats": {"query": "screenshots of chats", "type": ["image"]},  # the model tells screenshots
    "plates from China": {"query": "plates", "where": ["country=China"]},
    # German
    "Fotos aus Kyoto 2019": {"query": None, "since": "2019", "until": "2019", "where": ["place~Kyoto"], "type": ["image"]},
    "Strand in Lissabon im letzten Sommer": {"query": "Strand", "since": "2024-06", "until": "2024-08",
                                             "where": ["city=Lisbon"]},
    "Hunde zwischen 2019 und 2021": {"query": "Hunde", "since": "2019", "until": "2021"},
    "Fotos vom Mai 2024": {"query": None, "since": "2024-05", "until": "2024-05", "type": ["image"]},
    "Bilder mit 4 Sternen": {"query": None, "where": ["rating>=4"], "type": ["image"]},
    "Katze mit meinem iPhone": {"query": "Katze", "where": ["camera~iphone"]},
    "Schnee letztes Jahr": {"query": "Schnee", "since": "2023", "until": "2023"},
    # French
    "plage à Lisbonne l'été dernier": {"query": "plage", "since": "2024-06", "until": "2024-08", "where": ["city=Lisbon"]},
    "chats entre 2019 et 2021": {"query": "chats", "since": "2019", "until": "2021"},
    "photos de juillet 2023": {"query": None, "since": "2023-07", "until": "2023-07", "type": ["image"]},
    "neige de mai à juillet 2024": {"query": "neige", "since": "2024-05", "until": "2024-07"},
    "photos prises avec mon iPhone": {"query": None, "where": ["camera~iphone"], "type": ["image"]},
    "fleurs l'année dernière": {"query": "fleurs", "since": "2023", "until": "2023"},
    # Spanish
    "playa en Lisboa el verano pasado": {"query": "playa", "since": "2024-06", "until": "2024-08", "where": ["city=Lisbon"]},
    "perros entre 2019 y 2021": {"query": "perros", "since": "2019", "until": "2021"},
    "fotos de julio de 2023": {"query": None, "since": "2023-07", "until": "2023-07", "type": ["image"]},
    "nieve de mayo a julio de 2024": {"query": "nieve", "since": "2024-05", "until": "2024-07"},
    "fotos con mi Pixel": {"query": None, "where": ["camera~pixel"], "type": ["image"]},
    "fotos de Lima en 2021": {"query": None, "since": "2021", "until": "2021", "where": ["city=Lima"], "type": ["image"]},
    # Japanese
    "2023年7月の写真": {"query": None, "since": "2023-07", "until": "2023-07", "type": ["image"]},
    "リスボンの写真": {"query": None, "where": ["city=Lisbon"], "type": ["image"]},
    "京都で撮った写真 2019年": {"query": None, "since": "2019", "until": "2019", "where": ["city=Kyoto"], "type": ["image"]},
    "去年の夏の写真": {"query": None, "since": "2023-06", "until": "2023-08", "type": ["image"]},
    "2019年から2021年の動画": {"query": None, "since": "2019", "until": "2021", "type": ["video"]},
    "猫の写真 星4": {"query": "猫", "where": ["rating>=4"], "type": ["image"]},
    "Pixel 8で撮った海": {"query": "海", "where": ["camera~pixel"]},
}


@pytest.mark.parametrize("query", list(CASES))
def test_each_language_s_query_means_its_filters_and_leaves_the_meaning(places, query):
    assert keywords(query, places) == CASES[query]


TRAPS = ["china plates", "a short clip", "a may flower", "jordan shoes", "pixel art", "galaxy far away",
         "a 5-star hotel", "Lisbon or Berlin", "2049 blade runner", "Sydney harbour",
         "marzo", "le mars rover", "von hier aus"]


@pytest.mark.parametrize("query", TRAPS)
def test_an_everyday_word_that_could_be_a_filter_stays_meaning(places, query):
    understood = understand(query, TODAY, places)
    assert understood.parts == () and understood.text == query and understood.summary() == ""


def test_the_parts_carry_their_spans_labels_and_the_summary_line(places):
    query = "beach in Lisbon last summer"
    understood = understand(query, TODAY, places)
    assert [(p.kind, p.text, query[p.start:p.end]) for p in understood.parts] == [
        ("place", "in Lisbon", "in Lisbon"), ("date", "last summer", "last summer")]
    assert understood.summary() == "understood: place Lisbon · taken 2024-06..2024-08 · 'beach'"
    d = understood.to_dict()
    assert d["text"] == "beach" and d["since"] == "2024-06" and d["where"] == ["place~Lisbon"]
    assert [p["label"] for p in d["parts"]] == ["place Lisbon", "taken 2024-06..2024-08"]


def test_a_removed_part_goes_back_into_the_meaning_text(places):
    understood = understand("beach in Lisbon last summer", TODAY, places)
    without_place = understood.without(0)
    assert without_place.text == "beach in Lisbon" and without_place.where == () and without_place.since == "2024-06"
    assert without_place.without(0).text == "beach in Lisbon last summer"
    with pytest.raises(IndexError, match="2 understood parts"):
        understood.without(2)


def test_literal_turns_understanding_off(places):
    understood = understand("beach in Lisbon last summer", TODAY, places, literal=True)
    assert (understood.text, understood.parts, understood.literal) == ("beach in Lisbon last summer", (), True)
    assert understood.search_keywords() == {"query": "beach in Lisbon last summer"}


def test_a_quoted_phrase_is_exact_and_nothing_inside_it_is_a_filter(places):
    understood = understand('invoice "Lisbon 2019" from last year', TODAY, places)
    assert understood.phrases == ("Lisbon 2019",) and understood.where == ()
    assert (understood.since, understood.until) == ("2023", "2023")
    assert understood.text == 'invoice "Lisbon 2019"'  # the phrase's words stay meaning too


def test_a_query_of_filters_only_has_no_meaning_text(places):
    understood = understand("Fotos aus Kyoto 2019", TODAY, places)
    assert understood.text == "" and understood.is_filters_only
    assert understood.search_keywords()["query"] is None


def test_places_outside_the_collection_and_without_a_collection_stay_meaning(places):
    assert understand("beach in Porto", TODAY, places).text == "beach in Porto"
    assert understand("beach in Lisbon", TODAY, None).text == "beach in Lisbon"


def test_two_dates_narrow_to_their_overlap(places):
    understood = understand("since 2020 before 2022", TODAY, places)
    assert (understood.since, understood.until) == ("2020", "2021")


def test_this_winter_spans_the_turn_of_the_year():
    assert understand("snow this winter", date(2025, 1, 15)).search_keywords() == {
        "query": "snow", "since": "2024-12", "until": "2025-02"}
    assert understand("snow last winter", date(2025, 6, 1)).search_keywords()["since"] == "2024-12"


@pytest.mark.parametrize("query", ["2019-13", "2024-02-30", "beach in Smarch", "between 2021 and 2019", "in 2031",
                                   "from 2020 to 2030"])
def test_a_date_that_does_not_exist_stays_meaning(query):
    understood = understand(query, TODAY)
    assert understood.parts == () and understood.text == query


def test_bad_input_is_meaning_text_or_a_clear_note_never_a_traceback(places):
    huge = "beach in Lisbon " * 70_000  # about 1 MB
    understood = understand(huge, TODAY, places)
    assert understood.parts == () and "longer than" in understood.note and len(understood.text) > MAX_UNDERSTOOD_CHARS
    controls = understand("beach\x00 in\x1b Lisbon\u202e last\x07 summer", TODAY, places)
    assert controls.where == ("place~Lisbon",) and controls.text == "beach"
    assert understand("", TODAY, places) == UnderstoodQuery("", "")
    with pytest.raises(TypeError, match="must be a str"):
        understand(None, TODAY, places)  # type: ignore[arg-type]


def test_city_names_come_in_every_language_and_countries_from_cldr(places):
    assert places.lookup("lisbon") == (("city", "Lisbon"), ("region", "Lisbon"))  # the stored names
    for name in ("Lissabon", "Lisbonne", "Lisboa", "リスボン"):  # GeoNames' names of the city
        assert places.lookup(fold(name)) == (("city", "Lisbon"),), name
    for name in ("Deutschland", "Allemagne", "Alemania", "ドイツ", "Germany"):
        assert places.lookup(fold(name)) == (("country", "Germany"),), name
    assert places.lookup("lis") == ()  # GeoNames' airport codes are not names people type


def test_known_places_are_the_distinct_places_of_the_facts():
    facts = [ItemFacts(city="Lisbon", region="Lisbon", country="Portugal", neighbourhood="Intendente"),
             ItemFacts(city="Lisbon", region="Lisbon", country="Portugal", neighbourhood="Intendente"), ItemFacts(), None]
    assert known_places(facts) == {KnownPlace("Lisbon", "Lisbon", "Portugal", "Intendente")}


def test_the_understood_filters_go_into_a_search_request_as_they_are(places):
    from faste_mm.retrieval.search_request import SearchRequest

    understood = understand("beach in Lisbon last summer", TODAY, places)
    request = SearchRequest(query=understood.query, k=20, where=("rating>=3",)).with_filters(**understood.search_keywords())
    assert (request.query, request.since, request.until, request.k) == ("beach", "2024-06", "2024-08", 20)
    assert set(request.where) == {"rating>=3", "place~Lisbon"}
