"""Understood queries run through the existing search (issue 47 item 1): generated photos with EXIF
dates, cameras and GPS of real cities, indexed with the tiny model; each query's parsed filters go
to `Retriever.search` with k above the collection size (the model's meaning never cuts), and the
items that come back are exactly those the words meant."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from faste_mm.indexers import Collection
from faste_mm.model.embedder import Embedder
from faste_mm.retrieval.place_names import known_places, place_names
from faste_mm.retrieval.query_understanding import understand
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.photo_fixtures import exif_block, make_photo, xmp_packet

TODAY = date(2024, 11, 2)
INTENDENTE, MITTE, BRENA = (38.7205, -9.1355, 50.0), (52.52, 13.405, 40.0), (-12.055, -77.04, 150.0)
KYOTO, NAIROBI = (35.0116, 135.7681, 50.0), (-1.2864, 36.8172, 1700.0)
# name -> (EXIF date, make, model, GPS, rating)
PHOTOS = {
    "lisbon_2024_07.jpg": ("2024:07:14 18:00:00", "Google", "Pixel 8", INTENDENTE, None),
    "lisbon_2023_05.jpg": ("2023:05:02 10:00:00", "Apple", "iPhone 13", INTENDENTE, None),
    "berlin_2024_07.jpg": ("2024:07:20 12:00:00", "Canon", "Canon EOS R6", MITTE, 4),
    "kyoto_2019_04.jpg": ("2019:04:05 09:00:00", "Apple", "iPhone 8", KYOTO, 5),
    "lima_2021_02.jpg": ("2021:02:10 16:00:00", "Google", "Pixel 5", BRENA, None),
    "nairobi_2024_08.jpg": ("2024:08:03 08:00:00", "Samsung", "Galaxy S23", NAIROBI, 2),
    "nogps_2024_07.jpg": ("2024:07:15 12:00:00", "Google", "Pixel 8", None, None),
}
ALL = set(PHOTOS) | {"shopping.txt"}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    root = tmp_path_factory.mktemp("library")
    for i, (name, (taken, make, model, gps, rating)) in enumerate(PHOTOS.items()):
        make_photo(root / name, seed=i, exif=exif_block(taken, "+00:00", make, model, gps=gps),
                   xmp=xmp_packet("", "", (), rating=rating) if rating else None)
    (root / "shopping.txt").write_text("milk, bread, olive oil")
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    retriever = Retriever(embedder, collection=root.parent / "library-col", r_max=0.0)
    assert retriever.index([root]).failed == 0
    with Collection.open(retriever.collection) as col:
        known = known_places(r.facts for records, _ in col.iter_live() for r in records)
    return retriever, place_names(known)


def found(library, query: str) -> set[str]:
    """The names of the items the understood query finds, every match (k above the collection)."""
    retriever, places = library
    keywords = understand(query, TODAY, places).search_keywords()
    text = keywords.pop("query") or query  # wiring's job for a query of filters only; here: any text
    return {Path(h.uri).name for h in retriever.search(text, k=50, **keywords)}


MEANT = {
    "beach in Lisbon last summer": {"lisbon_2024_07.jpg"},
    "Lissabon": {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"},
    "リスボンの写真": {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"},
    "Fotos aus Kyoto 2019": {"kyoto_2019_04.jpg"},
    "京都で撮った写真": {"kyoto_2019_04.jpg"},
    "fotos de Lima en 2021": {"lima_2021_02.jpg"},
    "photos à Berlin en juillet 2024": {"berlin_2024_07.jpg"},
    "street photos shot on a Pixel": {"lisbon_2024_07.jpg", "lima_2021_02.jpg", "nogps_2024_07.jpg"},
    "sunsets with my iPhone": {"lisbon_2023_05.jpg", "kyoto_2019_04.jpg"},
    "Canon": {"berlin_2024_07.jpg"},
    "4 stars": {"berlin_2024_07.jpg", "kyoto_2019_04.jpg"},
    "2023年5月の写真": {"lisbon_2023_05.jpg"},
    "photos from July 2024": {"lisbon_2024_07.jpg", "berlin_2024_07.jpg", "nogps_2024_07.jpg"},
    "Urlaub zwischen 2019 und 2021": {"kyoto_2019_04.jpg", "lima_2021_02.jpg"},
    "viaje en Kenia el verano pasado": {"nairobi_2024_08.jpg"},
    "notes": {"shopping.txt"},
    # the traps: no filter, every item comes back
    "china plates": ALL,
    "a may flower": ALL,
    "jordan shoes": ALL,
}


@pytest.mark.parametrize("query", list(MEANT))
def test_an_understood_query_finds_exactly_the_items_its_words_mean(library, query):
    assert found(library, query) == MEANT[query]


def test_the_city_people_use_finds_a_photo_taken_in_a_neighbourhood(library):
    retriever, places = library
    hits = retriever.search("photo", k=50, where=["city=Lisbon"])
    assert {Path(h.uri).name for h in hits} == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}
    assert {h.facts.neighbourhood for h in hits} == {"Intendente"}
    for city, name in (("Berlin", "berlin_2024_07.jpg"), ("Lima", "lima_2021_02.jpg")):
        assert {Path(h.uri).name for h in retriever.search("photo", k=50, where=[f"city={city}"])} == {name}
    assert {Path(h.uri).name for h in retriever.search("photo", k=50, where=["neighbourhood=Mitte"])} == {
        "berlin_2024_07.jpg"}
