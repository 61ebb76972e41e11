"""Search with a second stage: `Retriever.search(..., rerank=reranker)` equals reranking the
embedding search's top-N by hand; hits carry both scores; wrong rerankers are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from faste_mm import Embedder, Item, Retriever
from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection
from faste_mm.retrieval.rerank_hits import hit_item

from tests.helpers.eval_fixtures import eval_model_dir  # noqa: F401  (fixtures)
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def retriever(eval_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gallery")
    for i, color in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 120, 10)]):
        Image.new("RGB", (64 + 16 * i, 64), color).save(root / f"c{i}.png")
    (root / "note.txt").write_text("a note about a red bicycle leaning on a wall")
    retriever = Retriever(Embedder.from_pretrained(str(eval_model_dir), device="cpu"),
                          collection=tmp_path_factory.mktemp("col") / "c", r_max=0.0)
    retriever.index([root])
    return retriever


def _records(retriever, hits) -> dict:
    """The hits' stored records by id (what a rerank reads their files back by)."""
    from dataclasses import replace

    with Collection.open(retriever.collection) as col:
        records = col.records([hit.id for hit in hits])
    return {hit.id: replace(records[hit.id], uri=hit.uri) for hit in hits}  # a hit "moved" keeps its new uri


def test_search_with_rerank_equals_reranking_the_top_n_by_hand(retriever, vl_reranker):
    first = retriever.search("red", k=4)
    records = _records(retriever, first)
    expected = vl_reranker.rerank("red", [hit_item(hit, records) for hit in first], top_n=2).results
    got = retriever.search("red", k=2, rerank=vl_reranker, rerank_top=4)
    assert [hit.id for hit in got] == [first[r.index].id for r in expected]
    assert [hit.rerank_score for hit in got] == pytest.approx([r.score for r in expected], abs=1e-6)
    assert [hit.score for hit in got] == [first[r.index].score for r in expected]  # the cosine stays
    assert "rerank_score" in got[0].to_dict() and "rerank_score" not in first[0].to_dict()


def test_a_hit_whose_file_is_gone_is_kept_after_the_reranked_ones(retriever, vl_reranker, tmp_path):
    from dataclasses import replace

    from faste_mm.retrieval.rerank_hits import rerank_hits

    hits = retriever.search("red", k=3)
    gone = [replace(hits[0], uri=str(tmp_path / "moved.png"))] + hits[1:]
    got = rerank_hits(vl_reranker, Item(text="red"), gone, k=3, records=_records(retriever, gone))
    assert got[-1].uri.endswith("moved.png") and got[-1].rerank_score is None
    assert all(hit.rerank_score is not None for hit in got[:-1])


def test_an_embedder_given_as_reranker_is_refused_naming_both(retriever):
    with pytest.raises(ConfigError, match="got an Embedder .* an embedding model; give a Reranker"):
        retriever.search("red", rerank=retriever.embedder)
    with pytest.raises(ConfigError, match="search rerank_top must be >= 1, got 0"):
        retriever.search("red", rerank=object(), rerank_top=0)


def test_index_records_a_default_reranker_that_info_shows_and_search_uses(eval_model_dir, reranker_dirs, vl_reranker, tmp_path):
    import json

    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    runner = CliRunner()
    gallery = tmp_path / "g"
    gallery.mkdir()
    for i, color in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        Image.new("RGB", (64, 64 + 16 * i), color).save(gallery / f"c{i}.png")
    col, rr = str(tmp_path / "col"), str(reranker_dirs["qwen3_vl_reranker"])
    indexed = runner.invoke(app, ["index", str(gallery), "-c", col, "--model", str(eval_model_dir), "--reranker", rr, "--device", "cpu"])
    assert indexed.exit_code == 0, indexed.output
    info = runner.invoke(app, ["info", "-c", col, "--format", "json"])
    assert json.loads(info.stdout)["settings"]["reranker"] == rr
    searched = runner.invoke(app, ["search", "red", "-c", col, "-k", "2", "--rerank-top", "3", "--device", "cpu", "--format", "json"])
    assert searched.exit_code == 0, searched.output
    hits = json.loads(searched.stdout)["hits"]
    with Retriever.open(col, device="cpu") as retriever:
        expected = retriever.search("red", k=2, rerank=vl_reranker, rerank_top=3)
    assert [h["id"] for h in hits] == [h.id for h in expected]
    assert [h["rerank_score"] for h in hits] == pytest.approx([h.rerank_score for h in expected], abs=1e-6)
    plain = runner.invoke(app, ["search", "red", "-c", col, "-k", "2", "--no-rerank", "--device", "cpu", "--format", "json"])
    assert all("rerank_score" not in h for h in json.loads(plain.stdout)["hits"])
    # the library honours the collection's reranker exactly as the CLI does; rerank=False opts out
    with Retriever.open(col, device="cpu") as retriever:
        library = retriever.search("red", k=2, rerank_top=3)
        unranked = retriever.search("red", k=2, rerank=False)
    assert [h.id for h in library] == [h["id"] for h in hits]
    assert [h.rerank_score for h in library] == pytest.approx([h["rerank_score"] for h in hits], abs=1e-6)
    assert [h.id for h in unranked] == [h["id"] for h in json.loads(plain.stdout)["hits"]]
    assert all(h.rerank_score is None for h in unranked)
    from faste_mm.cli.collection_commands import load_reranker

    served = load_reranker(None, tmp_path / "col", "0", "none", "cpu")  # `serve -c` picks the collection's reranker
    assert served.model_id == str(Path(rr).absolute())


def test_serve_search_with_rerank_equals_retriever_search_and_explains_by_item_id(retriever, vl_reranker):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from faste_mm.serving.api import create_app
    from faste_mm.serving.engine import ServeEngine

    expected = retriever.search("red", k=2, rerank=vl_reranker, rerank_top=4)
    served = Retriever(retriever.embedder, collection=retriever.collection, r_max=0.0)  # opened on the model thread
    engine = ServeEngine(retriever.embedder, served, reranker=vl_reranker)
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        body = client.post("/search", json={"query": "red", "k": 2, "rerank": True, "rerank_top": 4}).json()
        form = client.post("/search", data={"q": "red", "k": "2", "rerank": "on", "rerank_top": "4"}).json()
        plain = client.post("/search", json={"query": "red", "k": 2}).json()
        why = client.post("/explain", json={"query": "red", "document_id": expected[0].id})
        more_like = client.post("/search", json={"id": expected[0].id, "rerank": True})
        both = client.post("/explain", json={"query": "red", "document": "x", "document_id": expected[0].id})
    assert body["rerank"] == {"model": vl_reranker.model_id, "top": 4}
    assert [h["id"] for h in body["hits"]] == [h.id for h in expected] == [h["id"] for h in form["hits"]]
    assert [h["rerank_score"] for h in body["hits"]] == pytest.approx([h.rerank_score for h in expected], abs=1e-6)
    assert [h["score"] for h in body["hits"]] == pytest.approx([h.score for h in expected], abs=1e-6)  # both scores
    assert plain["rerank"] is None and "rerank_score" not in plain["hits"][0]
    assert why.status_code == 200, why.text
    reference = vl_reranker.explain("red", hit_item(expected[0], _records(retriever, expected)))
    assert why.json()["score"] == pytest.approx(reference.score, abs=1e-6) and "not attribution" in why.json()["label"]
    assert more_like.status_code == 400 and "more like this" in more_like.json()["error"]["message"]
    assert both.status_code == 400 and "document_id" in both.json()["error"]["message"]
