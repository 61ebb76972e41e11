"""A stored item's file read again at request time (/explain by document_id, /search with rerank,
/thumbnails) or by `Retriever.search(rerank=...)`: only while it is still the file that was
indexed. A file replaced by a link to a secret (/proc/self/environ, a file outside the indexed
folders) or to an outside image is refused with an answer that reveals nothing of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from faste_mm import BatchingConfig, Embedder, Retriever  # noqa: E402
from faste_mm.indexers import Collection  # noqa: E402
from faste_mm.serving import ServeConfig, ServeEngine, create_app  # noqa: E402
from tests.helpers.old_schemas import downgrade
from tests.helpers.serve_fixtures import scene_image  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402

from tests.helpers.rerank_fixtures import vl_reranker, reranker_dirs  # noqa: E402, F401

SECRET = "TOP-SECRET-3141592653"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture()
def indexed(embedder, tmp_path):
    """A folder with two notes and two pictures, indexed; a secret text and an outside picture
    beside it (not indexed)."""
    folder = tmp_path / "shared"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "t1.txt").write_text("a picnic by the lake with bread and cheese")
    (folder / "notes" / "t2.txt").write_text("minutes of the garden committee meeting")
    scene_image(folder / "sunset.png", 1)
    scene_image(folder / "forest.png", 2)
    (tmp_path / "private.txt").write_text(f"api key {SECRET}")
    scene_image(tmp_path / "private.png", 9)
    Retriever(embedder, collection=tmp_path / "col").index([folder])
    return tmp_path


def _records(collection: Path) -> dict:
    with Collection.open(collection) as col:
        records = [r for chunk, _ in col.iter_live() for r in chunk]
    return {Path(r.uri).name: r for r in records}


def _ids(collection: Path) -> dict[str, int]:
    return {name: r.id for name, r in _records(collection).items()}


def _client(embedder, collection, reranker) -> TestClient:
    engine = ServeEngine(embedder, Retriever(embedder, collection=collection), ServeConfig(), reranker=reranker)
    return TestClient(create_app(engine), base_url="http://127.0.0.1:8000", raise_server_exceptions=False)


def _plant_link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


def _reveals_nothing(response, *secrets: str) -> None:
    leaked = [secret for secret in secrets if secret in response.text]
    assert not leaked, f"the answer ({response.status_code}, {len(response.text)} characters) holds {leaked}"


@pytest.mark.parametrize("target", ["private", "/proc/self/environ"])
def test_explain_refuses_a_note_replaced_by_a_link(embedder, vl_reranker, indexed, target, monkeypatch):
    monkeypatch.setenv("FASTE_MM_API_KEY_PROBE", SECRET)  # what /proc/self/environ would reveal
    ids = _ids(indexed / "col")
    with _client(embedder, indexed / "col", vl_reranker) as client:
        fine = client.post("/explain", json={"query": "garden", "document_id": ids["t2.txt"]})
        assert fine.status_code == 200, fine.text
        _plant_link(indexed / "shared" / "notes" / "t2.txt",
                    str(indexed / "private.txt") if target == "private" else target)
        refused = client.post("/explain", json={"query": "api key", "document_id": ids["t2.txt"]})
    assert refused.status_code == 409, refused.text
    assert "re-index" in refused.json()["error"]["message"]
    _reveals_nothing(refused, SECRET, "private", "/proc")


def test_thumbnail_refuses_a_picture_replaced_by_a_link_outside(embedder, vl_reranker, indexed):
    ids = _ids(indexed / "col")
    _plant_link(indexed / "shared" / "sunset.png", str(indexed / "private.png"))
    with _client(embedder, indexed / "col", vl_reranker) as client:
        refused = client.get(f"/thumbnails/{ids['sunset.png']}")
        kept = client.get(f"/thumbnails/{ids['forest.png']}")
    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"].startswith("application/json")
    _reveals_nothing(refused, "private")
    assert kept.status_code == 200 and kept.headers["content-type"] == "image/jpeg"


def test_thumbnail_refuses_a_picture_replaced_by_another_file(embedder, vl_reranker, indexed):
    """Not a link: another file moved over the name (a new inode) is not the one indexed."""
    ids = _ids(indexed / "col")
    scene_image(indexed / "other.png", 5)
    os.replace(indexed / "other.png", indexed / "shared" / "sunset.png")
    with _client(embedder, indexed / "col", vl_reranker) as client:
        assert client.get(f"/thumbnails/{ids['sunset.png']}").status_code == 409


def test_search_rerank_does_not_score_a_planted_link(embedder, vl_reranker, indexed):
    _plant_link(indexed / "shared" / "notes" / "t2.txt", str(indexed / "private.txt"))
    with _client(embedder, indexed / "col", vl_reranker) as client:
        response = client.post("/search", json={"query": "api key", "k": 4, "rerank": True})
    assert response.status_code == 200, response.text
    hits = {Path(h["uri"]).name: h for h in response.json()["hits"]}
    assert hits["t2.txt"].get("rerank_score") is None
    assert hits["t1.txt"].get("rerank_score") is not None
    _reveals_nothing(response, SECRET, "private")


def test_retriever_rerank_does_not_read_a_planted_link(embedder, vl_reranker, indexed):
    _plant_link(indexed / "shared" / "notes" / "t2.txt", "/proc/self/environ")
    hits = Retriever(embedder, collection=indexed / "col").search("garden", k=4, rerank=vl_reranker)
    scored = {Path(h.uri).name: h.rerank_score for h in hits}
    assert scored["t2.txt"] is None and scored["t1.txt"] is not None


def test_collection_without_identities_refuses_links_and_reindex_records_them(embedder, vl_reranker, indexed):
    """A schema-5 collection (indexed before identities were recorded): a link is still refused
    (its path no longer resolves to the stored one); the next `index` migrates it and records them."""
    col = indexed / "col"
    downgrade(col, 5)
    ids = _ids(col)
    assert all(r.ino is None for r in _records(col).values())
    _plant_link(indexed / "shared" / "notes" / "t2.txt", str(indexed / "private.txt"))
    with _client(embedder, col, vl_reranker) as client:
        assert client.post("/explain", json={"query": "q", "document_id": ids["t2.txt"]}).status_code == 409
        assert client.post("/explain", json={"query": "q", "document_id": ids["t1.txt"]}).status_code == 200
    (indexed / "shared" / "notes" / "t2.txt").unlink()
    Retriever(embedder, collection=col).index([indexed / "shared"])
    inos = {name: r.ino for name, r in _records(col).items()}
    assert inos["t1.txt"] == os.stat(indexed / "shared" / "notes" / "t1.txt").st_ino
