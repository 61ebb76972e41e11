"""Places named as people name them (retrieval/library/places.py, issue 47): a GPS position in a city's
neighbourhood gets the city people use, with the neighbourhood beside it; a town of its own
stays itself; a collection of schema 7 gains the neighbourhood and its next scan renames its
places without embedding anything."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from faste_mm.indexers import Collection
from faste_mm.indexers.schema import SCHEMA_VERSION
from faste_mm.model.embedder import Embedder
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.retrieval.library.places import place_of
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.old_schemas import downgrade
from tests.helpers.photo_fixtures import exif_block, make_photo

# (lat, lon) -> (city, neighbourhood): the nearest GeoNames place is the neighbourhood (5,392 people
# in Intendente), the city is the larger place that covers it, in the same region or municipality
NEIGHBOURHOODS = {
    (38.7205, -9.1355): ("Lisbon", "Intendente"),
    (52.52, 13.405): ("Berlin", "Mitte"),
    (-12.055, -77.04): ("Lima", "Breña"),  # GeoNames files Breña's region "Lima region", Lima's "Lima Province"
    (40.4168, -3.7038): ("Madrid", "Sol"),
    (38.7597, -9.2307): ("Amadora", "Falagueira"),  # Amadora: its own municipality next to Lisbon
}
# a city itself, and towns beside a big city's reach or across a region's border, stay themselves
CITIES = {(35.0116, 135.7681): "Kyoto", (48.8566, 2.3522): "Paris", (35.4437, 139.638): "Yokohama",
          (52.40, 13.06): "Potsdam"}


@pytest.mark.parametrize("position", list(NEIGHBOURHOODS))
def test_a_neighbourhood_s_photo_gets_the_city_people_use_and_keeps_the_neighbourhood(position):
    place = place_of(*position, [])
    assert (place["city"], place["neighbourhood"]) == NEIGHBOURHOODS[position]


@pytest.mark.parametrize("position", list(CITIES))
def test_a_city_or_a_town_of_its_own_keeps_its_name_and_has_no_neighbourhood(position):
    place = place_of(*position, [])
    assert place["city"] == CITIES[position] and "neighbourhood" not in place


def test_the_facts_read_from_a_photo_name_the_city_and_the_neighbourhood(tmp_path):
    photo = make_photo(tmp_path / "p.jpg", exif=exif_block("2024:07:14 18:00:00", gps=(38.7205, -9.1355, 0.0)))
    facts = read_facts(photo, "image")
    assert (facts.city, facts.neighbourhood, facts.region, facts.country) == ("Lisbon", "Intendente", "Lisbon", "Portugal")
    assert facts.place == "Intendente, Lisbon, Lisbon, Portugal" and "Intendente" in facts.words()
    assert facts.to_dict()["neighbourhood"] == "Intendente"


def test_a_schema_7_collection_gains_the_neighbourhood_and_its_next_scan_renames_the_city(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_photo(root / "lisbon.jpg", exif=exif_block("2024:07:14 18:00:00", gps=(38.7205, -9.1355, 0.0)))
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    col_dir = root.parent / "col"
    Retriever(embedder, collection=col_dir, r_max=0.0).index([root])
    db = sqlite3.connect(col_dir / "meta.sqlite")
    db.execute("UPDATE item_facts SET version = 1, city = 'Intendente'")  # as facts version 1 named it
    downgrade(col_dir, 7, db)
    with Collection.open(col_dir) as reader:  # readable before the migration: no neighbourhood
        (records, _), = reader.iter_live()
        assert (records[0].facts.city, records[0].facts.neighbourhood) == ("Intendente", None)
    report = Retriever(embedder, collection=col_dir, r_max=0.0).index([root])
    assert (report.embedded, report.facts_filled) == (0, 1)
    version = sqlite3.connect(col_dir / "meta.sqlite").execute("SELECT version FROM schema_version").fetchone()[0]
    assert version == SCHEMA_VERSION == 9
    hits = Retriever(embedder, collection=col_dir, r_max=0.0).search("photo", k=5, where=["city=Lisbon"])
    assert [(Path(h.uri).name, h.facts.neighbourhood) for h in hits] == [("lisbon.jpg", "Intendente")]
