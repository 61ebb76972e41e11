"""Filters on facts, dates, order and a minimum score (#35 item 2): the conditions against a naive
Python reference over the same facts, the SQL index on `taken` in the query plan, a date range
searched by the selective path (its matches only), and the same options through the Python API,
the CLI (with its errors) and HTTP /search."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter, collection_search
from faste_mm.indexers.facts import ItemFacts
from faste_mm.model.embedder import Embedder
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.old_schemas import downgrade
from tests.helpers.photo_fixtures import exif_block, make_photo, xmp_packet
from tests.helpers.inputs import tiny_vl_dir

D = 8
CAMERAS = [("Google", "Pixel 8"), ("Apple", "iPhone 15"), ("Canon", "Canon EOS R6"), (None, None)]
PLACES = [("Lisbon", "Portugal"), ("Tokyo", "Japan"), (None, None)]


def _ts(year, month=1, day=1):
    return datetime(year, month, day, tzinfo=timezone.utc).timestamp()


def _facts(i: int) -> ItemFacts:
    make, model = CAMERAS[i % 4]
    region, country = PLACES[i % 3]
    has_gps = region is not None
    undated = i % 7 == 0  # no date in the file
    return ItemFacts(taken=None if undated else _ts(2020 + i % 6, 1 + (i // 6) % 12, 1 + i % 28) + 3600 * (i % 24),
                     taken_source=None if undated else "exif", make=make, model=model,
                     lat=38.7 if has_gps else None, lon=-9.1 if has_gps else None, region=region, country=country,
                     rating=i % 6 - 1, keywords=("beach",) if i % 5 == 0 else ())


@pytest.fixture(scope="module")
def col(tmp_path_factory):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, D)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records = [ItemRecord(uri=f"/photos/{i:04d}.jpg", modality="image", facts=_facts(i)) for i in range(300)]
    records.append(ItemRecord(uri="/notes/n.txt", modality="text"))  # no facts at all
    vectors = np.concatenate([vectors, vectors[:1]])
    with Collection.create(tmp_path_factory.mktemp("facts") / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(vectors, records)
        yield col


REFERENCE = {  # the same conditions, in Python over ItemFacts
    "taken>=2024-05-01": lambda f: f.taken is not None and f.taken >= _ts(2024, 5, 1),
    "taken<2022": lambda f: f.taken is not None and f.taken < _ts(2022),
    "taken=2023-03": lambda f: f.taken is not None and _ts(2023, 3) <= f.taken < _ts(2023, 4),
    "taken!=2023-03": lambda f: f.taken is not None and not _ts(2023, 3) <= f.taken < _ts(2023, 4),
    "taken<=2021": lambda f: f.taken is not None and f.taken < _ts(2022),
    "taken>2024": lambda f: f.taken is not None and f.taken >= _ts(2025),
    "camera~pixel": lambda f: "pixel" in (f.camera or "").lower(),
    "camera~CANON": lambda f: "canon" in (f.camera or "").lower(),
    "rating>=4": lambda f: f.rating is not None and f.rating >= 4,
    "rating!=0": lambda f: f.rating is not None and f.rating != 0,
    "place~lisbon": lambda f: "lisbon" in (f.place or "").lower(),
    "country=japan": lambda f: (f.country or "").lower() == "japan",
    "keyword=Beach": lambda f: "beach" in f.keywords,
    "has:gps": lambda f: f.has_gps,
    "has:date": lambda f: f.taken is not None,
}


@pytest.mark.parametrize("condition", sorted(REFERENCE))
def test_each_condition_matches_exactly_the_items_a_python_reference_picks(col, condition):
    want = [i for i in range(300) if REFERENCE[condition](_facts(i))]
    got = col._store.filtered_ids(SearchFilter(facts=(condition,))).tolist()
    assert got == want and 0 < len(want) < 300


def test_conditions_combine_with_and_and_with_metadata_kind_and_path(col):
    both = SearchFilter(facts=("taken>=2023", "camera~pixel"), types=("image",), path="/photos/*")
    want = [i for i in range(300) if REFERENCE["camera~pixel"](_facts(i)) and (_facts(i).taken or 0) >= _ts(2023)]
    assert col._store.filtered_ids(both).tolist() == want


def test_a_date_range_reads_the_index_on_taken_and_searches_only_its_matches(col, monkeypatch):
    from faste_mm.indexers.fact_filters import _inner_sql, parse_fact_condition

    inner, params = _inner_sql(parse_fact_condition("taken=2023-03"))  # the condition as searches write it
    plan = col._store.db.execute(f"EXPLAIN QUERY PLAN SELECT id FROM item_facts WHERE {inner}", params).fetchall()
    assert any("item_facts_taken" in row[-1] for row in plan), plan
    matches = col._store.filtered_ids(SearchFilter(facts=("taken=2023-03",)))
    scored: list[np.ndarray] = []
    real = collection_search._selective_hits

    def spy(derived, queries, k, k_index, allowed, fetch, rescoring):
        scored.append(allowed)
        return real(derived, queries, k, k_index, allowed, fetch, rescoring)

    monkeypatch.setattr(collection_search, "_selective_hits", spy)
    query = col.vectors([5])
    scores, ids = col.search(query, 3, where=SearchFilter(facts=("taken=2023-03",)))
    assert [a.tolist() for a in scored] == [matches.tolist()]  # exactly the matches, no full scan
    brute = matches[np.argsort(-(col.vectors(matches) @ query[0]), kind="stable")][:3]
    assert sorted(ids[0][ids[0] >= 0].tolist()) == sorted(brute.tolist())


@pytest.mark.parametrize("condition, message", [
    ("taken>=notadate", "'notadate' is not a date; use YYYY, YYYY-MM, YYYY-MM-DD"),
    ("taken<2024-13", "'2024-13' is not a date"),
    ("rating>=high", "'high' is not a number"),
    ("camera>=x", "camera takes = != ~"),
    ("has:wings", "has: with one of gps"),
    ("tag>3", None),
])
def test_a_malformed_condition_is_a_config_error_naming_the_value_and_the_valid_form(condition, message):
    from faste_mm.indexers.filters import parse_where

    with pytest.raises(ConfigError, match=message and message.replace("(", r"\(")) as error:
        parse_where([condition])
    assert condition.split(">")[0].split("<")[0].split(":")[0] in str(error.value)


def test_a_reader_of_a_collection_older_than_the_facts_is_told_to_index_again(tmp_path):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(np.eye(D, dtype=np.float32)[:1], [ItemRecord(uri="/a.jpg", modality="image", facts=_facts(1))])
    downgrade(tmp_path / "c", 6)
    with Collection.open(tmp_path / "c") as reader:
        with pytest.raises(CollectionError, match="faste-mm index"):
            reader.search(np.eye(D, dtype=np.float32)[:1], 1, where=SearchFilter(facts=("has:gps",)))
        assert reader.search(np.eye(D, dtype=np.float32)[:1], 1)[1][0, 0] == 0  # unfiltered still works


# ---- the Python API, the CLI and HTTP on real photos ----------------------------------------------
DATES = ["2021:06:01 10:00:00", "2023:08:15 09:30:00", "2024:05:02 18:00:00", "2024:12:24 20:00:00"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("dated")
    for i, taken in enumerate(DATES):
        exif = exif_block(taken, "+00:00", "Google" if i % 2 else "Apple", "Pixel 8" if i % 2 else "iPhone 15")
        make_photo(root / f"p{i}.jpg", seed=10 + i, exif=exif, xmp=xmp_packet(rating=i + 2))
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    retriever = Retriever(embedder, collection=root.parent / (root.name + "-col"), r_max=0.0)
    retriever.index([root])
    return retriever


def _names(hits):
    return [Path(h.uri).name for h in hits]


def test_a_row_dated_by_its_files_mtime_by_an_older_faste_mm_is_undated_for_filters_and_hits(tmp_path):
    vectors = np.eye(2, D, dtype=np.float32)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(vectors, [ItemRecord(uri="/p/dated.jpg", modality="image", facts=ItemFacts(taken=_ts(2024), taken_source="exif")),
                          ItemRecord(uri="/p/copied.jpg", modality="image", facts=ItemFacts(taken=_ts(2024), taken_source="exif"))])
        col._store.db.execute("UPDATE item_facts SET taken_source = 'mtime' WHERE id = 1")  # as written before
        col._store.db.commit()
    with Collection.open(tmp_path / "c") as col:
        for condition in ("taken>=2023", "taken=2024", "taken!=2020", "has:date"):
            assert col._store.filtered_ids(SearchFilter(facts=(condition,))).tolist() == [0], condition
        assert col.get([1])[0].facts.taken is None and col.get([1])[0].facts.to_dict()["taken"] is None


@pytest.fixture(scope="module")
def undated(photos, tmp_path_factory):
    """The dated photos of `photos` and two without a date in the file (their mtimes today)."""
    root = tmp_path_factory.mktemp("undated")
    for i, taken in enumerate(DATES):
        make_photo(root / f"p{i}.jpg", seed=10 + i, exif=exif_block(taken, "+00:00"))
    make_photo(root / "u0.jpg", seed=20)
    make_photo(root / "u1.jpg", seed=21)
    retriever = Retriever(photos.embedder, collection=root.parent / (root.name + "-col"), r_max=0.0)
    retriever.index([root])
    return retriever


def test_undated_photos_are_left_out_of_date_filters_and_sorted_last_both_ways(undated):
    assert sorted(_names(undated.search("a photo", k=6, since="2000"))) == ["p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"]
    assert sorted(_names(undated.search("a photo", k=6, until="2100"))) == ["p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"]
    oldest, newest = undated.search("a photo", k=6, sort="date"), undated.search("a photo", k=6, sort="-date")
    assert _names(oldest)[:4] == ["p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"] and set(_names(oldest)[4:]) == {"u0.jpg", "u1.jpg"}
    assert _names(newest)[:4] == ["p3.jpg", "p2.jpg", "p1.jpg", "p0.jpg"] and set(_names(newest)[4:]) == {"u0.jpg", "u1.jpg"}
    assert all(h.to_dict()["facts"]["taken"] is None for h in newest[4:])
    table = runner.invoke(app, ["search", "a photo", "-c", str(undated.collection), "--no-server", "--sort", "-date"])
    assert table.exit_code == 0
    assert table.stdout.count("no date") == 2, table.stdout  # the two undated rows
    listed = json.loads(runner.invoke(app, ["search", "a photo", "-c", str(undated.collection), "--no-server",
                                            "--sort", "date", "--format", "json"]).stdout)
    assert [h["facts"]["taken"] is None for h in listed["hits"]] == [False] * 4 + [True] * 2


def test_mcp_search_shows_undated_photos_as_no_date(undated):
    pytest.importorskip("mcp", reason="needs the mcp extra")
    from faste_mm.serving import ServeConfig, ServeEngine
    from faste_mm.serving.mcp_paths import IndexRoots
    from faste_mm.serving.mcp_tools import EngineSlot, McpTools, SearchArgs

    engine = ServeEngine(undated.embedder, Retriever(undated.embedder, collection=undated.collection),
                         ServeConfig()).start()
    try:
        answer = McpTools(undated.collection, EngineSlot(engine=engine), IndexRoots()).search(
            SearchArgs(query="a photo", k=6, rerank=False, thumbnails=False))
    finally:
        engine.close()
    taken = {h.name: h.taken for h in answer.result.hits}
    assert taken["u0.jpg"] is None and taken["p3.jpg"] == "2024-12-24T20:00:00+00:00"
    lines = {line.split()[1].rsplit("/", 1)[-1]: line for line in answer.summary.splitlines()[1:]}
    assert lines["u0.jpg"].endswith("no date") and lines["p3.jpg"].endswith("2024-12-24")


def test_since_until_sort_and_where_strings_in_the_python_api(photos):
    assert sorted(_names(photos.search("a photo", k=4, since="2023-08-15", until="2024-05"))) == ["p1.jpg", "p2.jpg"]
    assert _names(photos.search("a photo", k=4, sort="date")) == ["p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"]
    assert _names(photos.search("a photo", k=4, sort="-date")) == ["p3.jpg", "p2.jpg", "p1.jpg", "p0.jpg"]
    assert sorted(_names(photos.search("a photo", k=4, where=["camera~pixel", "rating>=4"]))) == ["p3.jpg"]
    assert sorted(_names(photos.search("a photo", k=4, where="taken<2024"))) == ["p0.jpg", "p1.jpg"]


def test_min_score_keeps_the_hits_at_or_above_it(photos):
    every = photos.search("a photo", k=4)
    cut = (every[1].score + every[2].score) / 2  # between the 2nd and 3rd: two remain
    assert _names(photos.search("a photo", k=4, min_score=cut)) == _names(every[:2])
    with pytest.raises(ConfigError, match="min_score 2: a minimum cosine similarity between -1 and 1"):
        photos.search("a photo", min_score=2)
    with pytest.raises(ConfigError, match="search sort 'newest'"):
        photos.search("a photo", sort="newest")


def test_the_collection_default_min_score_applies_unless_given(photos, tmp_path):
    every = photos.search("a photo", k=4)
    cut = (every[0].score + every[1].score) / 2
    defaulted = Retriever(photos.embedder, collection=tmp_path / "c2", r_max=0.0, min_score=cut)
    defaulted.index([Path(every[0].uri).parent])
    assert len(defaulted.search("a photo", k=4)) == 1
    assert len(defaulted.search("a photo", k=4, min_score=-1.0)) == 4


runner = CliRunner()


def test_cli_search_filters_sorts_and_shows_the_date_taken(photos):
    result = runner.invoke(app, ["search", "a photo", "-c", str(photos.collection), "--device", "cpu", "--no-server",
                                 "--where", "taken>=2023", "--sort", "-date", "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert [Path(h["uri"]).name for h in payload["hits"]] == ["p3.jpg", "p2.jpg", "p1.jpg"]
    assert payload["hits"][0]["facts"]["taken"] == "2024-12-24T20:00:00+00:00" and payload["sort"] == "-date"
    assert payload["filter"]["facts"] == ["taken>=2023"]
    table = runner.invoke(app, ["search", "a photo", "-c", str(photos.collection), "--device", "cpu", "--no-server",
                                "--until", "2021"])
    assert table.exit_code == 0 and "p0.jpg" in table.stdout and "2021-06-01 10:00:00" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--where", "taken>=notadate"], "--where taken>=notadate: 'notadate' is not a date; use YYYY"),
    (["--min-score", "2"], "--min-score 2.0: a minimum cosine similarity between -1 and 1"),
    (["--since", "yesterday"], "--since: 'yesterday' is not a date"),
    (["--sort", "newest"], "--sort 'newest' is not one of relevance, date, -date"),
])
def test_cli_bad_filters_are_usage_errors_naming_the_value(photos, args, message):
    result = runner.invoke(app, ["search", "a photo", "-c", str(photos.collection), "--no-server", *args])
    assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.stderr


def test_http_search_takes_the_same_fields(photos):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    engine = ServeEngine(photos.embedder, Retriever(photos.embedder, collection=photos.collection), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        body = {"query": "a photo", "k": 4, "where": ["camera~pixel"], "since": "2022", "sort": "date"}
        answer = client.post("/search", json=body)
        assert answer.status_code == 200, answer.text
        assert [h["name"] for h in answer.json()["hits"]] == ["p1.jpg", "p3.jpg"]
        assert answer.json()["hits"][0]["facts"]["camera"] == "Google Pixel 8"
        form = client.post("/search", data={"q": "a photo", "until": "2021-12-31", "min_score": "-1"})
        assert [h["name"] for h in form.json()["hits"]] == ["p0.jpg"]
        bad = client.post("/search", json={"query": "a photo", "where": ["taken>=notadate"]})
        assert bad.status_code == 400 and "'notadate' is not a date" in bad.text
        bad = client.post("/search", json={"query": "a photo", "min_score": 2})
        assert bad.status_code == 400 and "min_score 2" in bad.text
