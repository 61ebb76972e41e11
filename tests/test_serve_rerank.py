"""POST /v1/rerank and /explain on tiny models: equal to `Reranker.score` / `Reranker.explain`,
with the server's auth, limits and JSON errors."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from faste_mm import Embedder, Item  # noqa: E402
from faste_mm.serving.api import create_app  # noqa: E402
from faste_mm.serving.engine import ServeConfig, ServeEngine  # noqa: E402

from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: E402, F401


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")


def _client(embedder, reranker, **config) -> TestClient:
    return TestClient(create_app(ServeEngine(embedder, None, ServeConfig(**config), reranker=reranker)),
                      base_url="http://127.0.0.1:8000")


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


RED = Image.new("RGB", (90, 60), (210, 30, 30))


def test_v1_rerank_equals_reranker_score(embedder, vl_reranker):
    documents = ["a red bicycle leaning on a wall", {"text": "a red square", "image": _data_url(RED)},
                 [{"type": "image_url", "image_url": {"url": _data_url(RED)}}], {"content": [{"type": "text", "text": "short"}]}]
    expected = vl_reranker.score("red things", ["a red bicycle leaning on a wall", Item(text="a red square", image=RED),
                                                Item(image=RED), "short"]).scores
    with _client(embedder, vl_reranker) as client:
        response = client.post("/v1/rerank", json={"query": "red things", "documents": documents, "top_n": 3,
                                                    "return_documents": True})
    assert response.status_code == 200, response.text
    body = response.json()
    order = np.argsort(-expected, kind="stable")[:3]
    assert [r["index"] for r in body["results"]] == order.tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], expected[order], atol=1e-6)
    assert body["results"][0]["document"] in ({"text": documents[order[0]]}, documents[order[0]])
    assert body["usage"]["total_tokens"] > 0 and body["failures"] == []


def test_v1_rerank_errors_are_json_and_name_the_field(embedder, vl_reranker):
    with _client(embedder, vl_reranker, api_key="secret", max_request_tokens=60) as client:
        assert client.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 401
        headers = {"Authorization": "Bearer secret"}
        bad = client.post("/v1/rerank", headers=headers, json={"query": "q", "documents": ["a", {"image": "data:image/png;base64,AAAA"}]})
        assert bad.status_code == 400 and "documents[1].image" in bad.json()["error"]["message"]
        big = client.post("/v1/rerank", headers=headers, json={"query": "q", "documents": ["word " * 200]})
        assert big.status_code == 413
        empty = client.post("/v1/rerank", headers=headers, json={"query": "q", "documents": []})
        assert empty.status_code == 200 and empty.json()["results"] == []
    with _client(embedder, None) as client:
        none = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert none.status_code == 400 and "--rerank" in none.json()["error"]["message"]


def test_explain_endpoint_equals_reranker_explain(embedder, vl_reranker):
    expected = vl_reranker.explain("red", Item(text="a red square", image=RED), layer=2).to_dict()
    with _client(embedder, vl_reranker) as client:
        body = client.post("/explain", json={"query": "red", "document": {"text": "a red square", "image": _data_url(RED)},
                                             "layer": 2}).json()
    assert body["layer"] == 2 and "not attribution" in body["label"]
    np.testing.assert_allclose(body["images"][0]["grid"], expected["images"][0]["grid"], atol=1e-6)
    assert body["score"] == pytest.approx(expected["score"], abs=1e-6)


@pytest.fixture(scope="module")
def collection_engine_parts(embedder, tmp_path_factory):
    """A small served collection (four photos and a note) for /search with rerank."""
    from faste_mm import Retriever

    root = tmp_path_factory.mktemp("served-gallery")
    for i, color in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 120, 10)]):
        Image.new("RGB", (64 + 16 * i, 64), color).save(root / f"c{i}.png")
    (root / "note.txt").write_text("a note about a red bicycle leaning on a wall")
    collection = tmp_path_factory.mktemp("served-col") / "c"
    with Retriever(embedder, collection=collection, r_max=0.0) as retriever:
        retriever.index([root])
    return collection


def _search_client(embedder, collection, reranker, **config) -> TestClient:
    from faste_mm import Retriever

    served = Retriever(embedder, collection=collection, r_max=0.0)
    return TestClient(create_app(ServeEngine(embedder, served, ServeConfig(**config), reranker=reranker)),
                      base_url="http://127.0.0.1:8000")


def test_search_with_rerank_is_bounded_by_max_request_tokens_like_v1_rerank(embedder, vl_reranker, collection_engine_parts):
    from faste_mm import Retriever
    from faste_mm.retrieval.rerank_hits import hit_item

    from faste_mm.indexers import Collection

    with Retriever(embedder, collection=collection_engine_parts, r_max=0.0) as retriever:
        hits = retriever.search("red", k=4)
    with Collection.open(collection_engine_parts) as col:
        records = col.records([hit.id for hit in hits])
    prepared = vl_reranker.prepare_query(Item(text="red"))
    total = sum(vl_reranker.serializer(prepared, hit_item(hit, records)).length for hit in hits)  # the pairs the model sees
    request = {"query": "red", "k": 2, "rerank": True, "rerank_top": 4}
    with _search_client(embedder, collection_engine_parts, vl_reranker, max_request_tokens=total - 1) as client:
        over = client.post("/search", json=request)
        form = client.post("/search", data={"q": "red", "k": "2", "rerank": "on", "rerank_top": "4"})
        fewer = client.post("/search", json={**request, "rerank_top": 1})
        plain = client.post("/search", json={"query": "red", "k": 4})  # the limit is the reranker's pairs
    assert over.status_code == form.status_code == 413, over.text
    message = over.json()["error"]["message"]
    assert str(total) in message and "--max-request-tokens" in message and "rerank_top" in message
    assert fewer.status_code == 200 and plain.status_code == 200
    with _search_client(embedder, collection_engine_parts, vl_reranker, max_request_tokens=total) as client:
        assert client.post("/search", json=request).status_code == 200


def test_info_states_the_search_rerank_depth_the_page_shows(embedder, vl_reranker, collection_engine_parts):
    from pathlib import Path

    from faste_mm.retrieval.search_request import DEFAULTS

    SEARCH_RERANK_TOP = DEFAULTS["rerank_top"]

    with _search_client(embedder, collection_engine_parts, vl_reranker) as client:
        depth = client.get("/info").json()["reranker"]["search_top"]
        searched = client.post("/search", json={"query": "red", "k": 1, "rerank": True}).json()
    assert depth == SEARCH_RERANK_TOP and searched["rerank"]["top"] == depth
    static = Path(create_app.__code__.co_filename).parent / "static"
    page = (static / "app.js").read_text() + (static / "index.html").read_text()
    assert f"top {SEARCH_RERANK_TOP}" not in page and "reranker.search_top" in page  # the page asks the server
    with _client(embedder, None) as client:
        assert client.get("/info").json()["reranker"] is None
