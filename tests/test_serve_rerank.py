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
from faste_mm.testing import build_tiny_model  # noqa: E402

from .rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: E402, F401


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return Embedder.from_pretrained(str(build_tiny_model(tmp_path_factory.mktemp("emb") / "m", "qwen3_vl")), device="cpu")


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
