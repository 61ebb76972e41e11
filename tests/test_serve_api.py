"""The HTTP API on a tiny model (FastAPI's TestClient, and one live uvicorn on loopback for the
load check): /v1/embeddings equals `Embedder.encode` (text, image, image+text, dimensions,
base64, query/document), /search equals `Retriever.search`, every error code, the API key,
thumbnails only for indexed ids, metrics, and the dynamic batcher."""

from __future__ import annotations

import base64
import io
import os
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

fastapi = pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")
from fastapi.testclient import TestClient  # noqa: E402

from faste_mm import BatchingConfig, Embedder, FastEConfig, Item, Retriever  # noqa: E402
from faste_mm.errors import ConfigError  # noqa: E402
from faste_mm.indexers import Collection  # noqa: E402
from faste_mm.serving import (Batcher, BatcherConfig, QueueFullError, ServeConfig, ServeEngine,  # noqa: E402
                              check_bind, create_app)
from faste_mm.retrieval.profile import QUERY_INSTRUCTION as VL_QUERY_INSTRUCTION  # noqa: E402
from faste_mm.serving.engine import TEXT_CHARS_PER_TOKEN  # noqa: E402
from faste_mm.serving.security import host_names  # noqa: E402
from tests.helpers.serve_fixtures import make_gallery, scene_image  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402

TEXTS = ["a red bicycle leaning on a wall", "short", "the quick brown fox jumps over the lazy dog " * 3]
INSTRUCTION = "Find a day-to-day image that looks similar to the provided image."


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture(scope="module")
def collection(embedder, tmp_path_factory) -> Path:
    """10 images, a 2-page PDF and one text item, indexed with FastE r_max=0.5."""
    base = tmp_path_factory.mktemp("serve-api")
    retriever = Retriever(embedder, collection=base / "col", r_max=0.5)
    retriever.index([make_gallery(base / "gallery")])
    retriever.add([Item(text="notes about a picnic by the lake")], uris=["notes:picnic"])
    return base / "col"


def _client(embedder, collection=None, raise_server_exceptions=True, **config) -> TestClient:
    retriever = None if collection is None else Retriever(embedder, collection=collection, r_max=0.5)
    return TestClient(create_app(ServeEngine(embedder, retriever, ServeConfig(**config))),
                      raise_server_exceptions=raise_server_exceptions, base_url="http://127.0.0.1:8000")


@pytest.fixture(scope="module")
def client(embedder, collection):
    with _client(embedder, collection) as c:
        yield c


@pytest.fixture(scope="module")
def plain(embedder):
    """An embeddings-only server with the full forward for documents (r_max=0)."""
    with _client(embedder) as c:
        yield c


def _png(seed: int, size=(96, 64)) -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", size, (30 * seed % 255, 90, 160))
    image.putpixel((seed % size[0], 3), (255, 255, 0))
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _vectors(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def _error(response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    for word in words:
        assert word in message, message
    return message


# ---- /v1/embeddings equals Embedder.encode ---------------------------------------------------
def test_text_queries_equal_encode_queries_with_the_query_instruction(plain, embedder):
    response = plain.post("/v1/embeddings", json={"input": TEXTS, "input_type": "query", "model": embedder.model_id})
    expected = embedder.encode_queries(TEXTS, instruction=VL_QUERY_INSTRUCTION)
    np.testing.assert_allclose(_vectors(response), expected.embeddings, atol=1e-6)
    body = response.json()
    assert [row["index"] for row in body["data"]] == [0, 1, 2] and body["model"] == embedder.model_id
    # usage counts the prompt tokens the model ran: prefix tokens + one readout token per item
    stats = expected.stats
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == stats.prefix_tokens + len(TEXTS)


def test_a_single_string_input_is_one_document_in_the_document_format(plain, embedder):
    response = plain.post("/v1/embeddings", json={"input": TEXTS[0]})
    np.testing.assert_allclose(_vectors(response), embedder.encode([TEXTS[0]]).embeddings, atol=1e-6)


def test_documents_get_the_collections_fast_e_in_a_single_request_batch(client, embedder, collection):
    """FastE's trigger is a batch mean: a request alone in its batch equals encode of its items."""
    response = client.post("/v1/embeddings", json={"input": TEXTS, "input_type": "document"})
    manifest_fast_e = FastEConfig(r_max=0.5)
    expected = embedder.encode(TEXTS, fast_e=manifest_fast_e).embeddings
    np.testing.assert_allclose(_vectors(response), expected, atol=1e-5)
    assert not np.allclose(expected, embedder.encode(TEXTS).embeddings, atol=1e-5)  # FastE did act


def test_image_and_image_text_messages_equal_encode(plain, embedder):
    raw = _png(3)
    image = Image.open(io.BytesIO(raw))
    only_image = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(raw)}}]}]}
    np.testing.assert_allclose(_vectors(plain.post("/v1/embeddings", json=only_image)),
                               embedder.encode([Item(image=image)]).embeddings, atol=1e-6)
    with_text = {"messages": [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": [{"type": "image_url", "image_url": _data_url(raw)},
                                     {"type": "text", "text": "a blue card"}]}], "input_type": "query"}
    expected = embedder.encode([Item(image=image, text="a blue card", instruction=INSTRUCTION)]).embeddings
    np.testing.assert_allclose(_vectors(plain.post("/v1/embeddings", json=with_text)), expected, atol=1e-6)


def test_dimensions_truncate_and_renormalise_like_encode_dim(plain, embedder):
    vectors = _vectors(plain.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 16}))
    np.testing.assert_allclose(vectors, embedder.encode(TEXTS, dim=16).embeddings, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_base64_is_little_endian_float32_of_the_same_vectors(plain):
    floats = _vectors(plain.post("/v1/embeddings", json={"input": TEXTS}))
    response = plain.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})
    decoded = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4")
                        for row in response.json()["data"]])
    np.testing.assert_array_equal(decoded, floats)


def test_the_openai_client_talks_to_the_server(plain, embedder):
    openai = pytest.importorskip("openai", reason="the OpenAI client is optional")
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:8000/v1", http_client=plain)
    result = client.embeddings.create(model=embedder.model_id, input=TEXTS[:2])
    np.testing.assert_allclose(np.array([d.embedding for d in result.data]), embedder.encode(TEXTS[:2]).embeddings,
                               atol=1e-6)
    # the OpenAI client will not send a request without `model` (docs/serve.md says so): "faste-mm"
    # names whatever model the server serves, so client code need not know the hub id
    with pytest.raises(TypeError, match="model"):
        client.embeddings.create(input=TEXTS[:2])
    alias = client.embeddings.create(model="faste-mm", input=TEXTS[:2])
    assert [d.embedding for d in alias.data] == [d.embedding for d in result.data]


# ---- /search equals Retriever.search ----------------------------------------------------------
def test_text_search_equals_retriever_search(client, embedder, collection):
    reference = Retriever(embedder, collection=collection, r_max=0.5)
    for query, k in (("a sunset over the sea", 5), ("forest", 13)):
        hits = client.post("/search", json={"query": query, "k": k}).json()["hits"]
        expected = reference.search(query, k=k)
        assert [h["id"] for h in hits] == [h.id for h in expected]
        np.testing.assert_allclose([h["score"] for h in hits], [h.score for h in expected], atol=1e-6)
        assert [h["rank"] for h in hits] == list(range(1, len(expected) + 1))


def test_filtered_search_equals_retriever_search_with_the_same_filters(client, embedder, collection):
    reference = Retriever(embedder, collection=collection, r_max=0.5)
    for filters in ({"type": "pdf"}, {"type": ["text", "pdf"]}, {"path": "*/ocean-*"}, {"where": {"tag": "none"}}):
        body = client.post("/search", json={"query": "a report", "k": 6, **filters}).json()
        expected = reference.search("a report", k=6, **filters)
        assert [h["id"] for h in body["hits"]] == [h.id for h in expected], filters
        assert body["filter"]["path"] == filters.get("path")
    pages = client.post("/search", json={"query": "a report", "k": 6, "type": "pdf"}).json()["hits"]
    assert pages and all(h["uri"].endswith(".pdf") for h in pages)
    similar = client.post("/search", json={"id": pages[0]["id"], "k": 5, "type": "image"}).json()["hits"]
    assert similar and all(h["uri"].endswith(".png") for h in similar)
    bad = client.post("/search", json={"query": "x", "type": "audio"})
    assert bad.status_code == 400 and "audio" in bad.json()["error"]["message"]


def test_lexical_and_hybrid_search_equal_retriever_search_and_the_form_takes_the_mode(client, embedder, collection):
    reference = Retriever(embedder, collection=collection, r_max=0.5)
    for mode, query in (("lexical", "picnic lake"), ("hybrid", "picnic by the lake"), ("lexical", 'ocean "*')):
        body = client.post("/search", json={"query": query, "k": 5, "mode": mode}).json()
        expected = reference.search(query, k=5, mode=mode)
        assert body["mode"] == mode
        assert [(h["id"], h["found_by"]) for h in body["hits"]] == [(h.id, h.found_by) for h in expected]
    assert [h["uri"] for h in client.post("/search", data={"q": "picnic", "mode": "lexical"}).json()["hits"]] \
        == ["notes:picnic"]
    bad = client.post("/search", json={"query": "x", "mode": "fuzzy"})
    assert bad.status_code == 400


def test_image_search_by_upload_and_by_data_url_equals_retriever_search(client, embedder, collection):
    reference = Retriever(embedder, collection=collection, r_max=0.5)
    raw = (collection.parent / "gallery" / "ocean-2.png").read_bytes()
    expected = reference.search(image=Image.open(io.BytesIO(raw)), k=4)
    uploaded = client.post("/search", data={"k": "4"}, files={"image": ("ocean.png", raw, "image/png")}).json()
    by_url = client.post("/search", json={"image": _data_url(raw), "k": 4}).json()
    for hits in (uploaded["hits"], by_url["hits"]):
        assert [h["id"] for h in hits] == [h.id for h in expected]
        np.testing.assert_allclose([h["score"] for h in hits], [h.score for h in expected], atol=1e-6)
    assert uploaded["hits"][0]["name"] == "ocean-2.png" and uploaded["hits"][0]["score"] == pytest.approx(1, abs=2e-3)


def test_more_like_this_ranks_the_stored_vectors_and_leaves_the_item_out(client, collection):
    hits = client.post("/search", data={"q": "forest", "k": "3"}).json()["hits"]
    source = hits[0]["id"]
    similar = client.post("/search", json={"id": source, "k": 5}).json()["hits"]
    with Collection.open(collection) as col:
        ids = sorted(col.live_ids(range(1000)))
        vectors = col.vectors(ids)
    scores = vectors @ vectors[ids.index(source)]
    ranked = [ids[i] for i in np.argsort(-scores, kind="stable") if ids[i] != source][:5]
    assert [h["id"] for h in similar] == ranked
    assert source not in [h["id"] for h in similar]


def test_hits_carry_uri_page_metadata_and_a_thumbnail_url_only_for_pictures(client):
    hits = client.post("/search", json={"query": "picnic", "k": 20}).json()["hits"]
    by_name = {(h["name"], h["page"]): h for h in hits}
    assert by_name[("report.pdf", 2)]["thumbnail"] == f"/thumbnails/{by_name[('report.pdf', 2)]['id']}"
    assert by_name[("notes:picnic", None)]["thumbnail"] is None and by_name[("notes:picnic", None)]["uri"] == "notes:picnic"
    assert all(h["thumbnail"] for h in hits if h["name"].endswith(".png"))


# ---- thumbnails -------------------------------------------------------------------------------
def test_thumbnails_are_jpegs_of_indexed_images_and_pdf_pages_cached_beside_the_collection(client, collection):
    hits = client.post("/search", json={"query": "x", "k": 20}).json()["hits"]
    for hit in [h for h in hits if h["thumbnail"]][:3] + [h for h in hits if h["page"] == 1]:
        response = client.get(hit["thumbnail"])
        assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
        image = Image.open(io.BytesIO(response.content))
        assert image.format == "JPEG" and max(image.size) <= 384
    cached = list((collection.parent / "col.thumbnails").glob("*.jpg"))
    assert len(cached) >= 4
    assert not any(p.suffix == ".jpg" for p in collection.iterdir())  # the collection holds only its files


@pytest.mark.parametrize("path", ["/thumbnails/999999", "/thumbnails/..%2F..%2Fetc%2Fpasswd",
                                  "/thumbnails/%2e%2e", "/thumbnails/-1", "/thumbnails/1.jpg",
                                  "/thumbnails/%C2%B2", "/thumbnails/" + "9" * 1000, "/thumbnails/9223372036854775808"])
def test_thumbnails_refuse_anything_but_the_id_of_an_indexed_item(client, path):
    response = client.get(path)
    assert response.status_code == 404 and response.headers["content-type"] == "application/json"


def test_a_link_planted_in_the_thumbnail_cache_is_replaced_never_served(embedder, collection, tmp_path):
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"SECRET private photo bytes")
    cache = tmp_path / "thumbs"
    with _client(embedder, collection, thumbnail_dir=cache) as c:
        hit = next(h for h in c.post("/search", json={"query": "x", "k": 20}).json()["hits"] if h["thumbnail"])
        first = c.get(hit["thumbnail"]).content
        assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700  # made with our own mode
        (cached,) = cache.glob(f"{hit['id']}-*.jpg")
        cached.unlink()
        cached.symlink_to(secret)  # planted: the server must not send the file it points to
        again = c.get(hit["thumbnail"])
        assert again.status_code == 200 and b"SECRET" not in again.content and again.content == first
        assert not cached.is_symlink() and secret.read_bytes().startswith(b"SECRET")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked-thumbs"
    linked.symlink_to(elsewhere)  # a cache folder that is a link: refused, nothing written through it
    with _client(embedder, collection, thumbnail_dir=linked, raise_server_exceptions=False) as c:
        _error(c.get(hit["thumbnail"]), 500, "not a folder of this user")
    assert list(elsewhere.iterdir()) == []


def test_odd_ids_nested_json_and_k_0_are_client_errors_not_crashes(client):
    from faste_mm.retrieval.search_request import MAX_K, SearchRequest

    _error(client.post("/search", json={"id": 10**30}), 400, "id")
    _error(client.post("/search", data={"id": "9" * 40}), 400, "'id'")
    # the form, and the engine behind every front end, check k with the request's own words
    _error(client.post("/search", data={"q": "x", "k": "0"}), 400, f"search k must be 1..{MAX_K}, got 0")
    _error(client.post("/search", data={"q": "x", "k": str(MAX_K + 1)}), 400, f"search k must be 1..{MAX_K}, got")
    with pytest.raises(ConfigError, match=rf"search k must be 1\.\.{MAX_K}, got {MAX_K + 1}"):
        client.app.state.engine.search(SearchRequest.of("test", query="x", k=MAX_K + 1))
    deep = "[" * 100_000 + "]" * 100_000
    for route in ("/search", "/v1/embeddings"):
        answer = client.post(route, content=deep, headers={"content-type": "application/json"})
        assert answer.status_code == 400, (route, answer.text)


def test_a_thumbnail_of_a_path_traversal_never_reaches_the_file_system(client):
    """httpx would normalise '..' away; send the raw path over a socket-free ASGI call instead."""
    import asyncio

    app = client.app
    sent: list[dict] = []

    async def call():
        scope = {"type": "http", "method": "GET", "path": "/thumbnails/../../etc/passwd", "raw_path":
                 b"/thumbnails/../../etc/passwd", "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "http_version": "1.1",
                 "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1), "root_path": ""}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)

    asyncio.run(call())
    assert sent[0]["status"] == 404
    assert b"root:" not in b"".join(m.get("body", b"") for m in sent[1:])


def test_text_items_have_no_thumbnail(client):
    hits = client.post("/search", json={"query": "picnic", "k": 20}).json()["hits"]
    text = next(h for h in hits if h["uri"] == "notes:picnic")
    _error(client.get(f"/thumbnails/{text['id']}"), 404, "no thumbnail")


# ---- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("body,words", [
    ({"input": "x", "temperature": 1}, ["temperature"]),
    ({"input": "x", "encoding_format": "int8"}, ["encoding_format"]),
    ({"input": "x", "input_type": "passage"}, ["input_type"]),
    ({"input": [1, 2, 3]}, ["input"]),
    ({}, ["input", "messages"]),
    ({"input": []}, ["empty"]),
    ({"input": "x", "dimensions": 100000}, ["dimensions", "64"]),
    ({"input": "x", "model": "text-embedding-3-small"}, ["text-embedding-3-small", "serves"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,@@@"}]}]},
     ["messages[0].content[0].image_url", "base64"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": _data_url(b"not an image")}]}]},
     ["messages[0].content[0].image_url", "not a readable image"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "http://169.254.169.254/x.png"}]}]},
     ["remote image URLs are not fetched", "--allow-remote-images"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "file:///etc/passwd"}]}]},
     ["unsupported image URL scheme"]),
    ({"messages": [{"role": "system", "content": "a"}]}, ["0 user turns"]),
])
def test_bad_embedding_requests_get_400_naming_what_was_wrong(plain, body, words):
    _error(plain.post("/v1/embeddings", json=body), 400, *words)


def test_bad_search_requests_get_400_or_404(client, plain):
    _error(client.post("/search", json={"k": 3}), 400, "query")
    _error(client.post("/search", json={"query": "x", "k": 0}), 400, "k")
    _error(client.post("/search", data={"q": "x", "k": "many"}), 400, "'k'")
    _error(client.post("/search", data={"q": "x", "color": "red"}), 400, "color")
    _error(client.post("/search", files={"image": ("a.png", b"garbage", "image/png")}), 400, "a.png",
           "not a readable image")
    _error(client.post("/search", json={"id": 123456}), 404, "123456")
    _error(plain.post("/search", json={"query": "x"}), 404, "-c")
    _error(client.get("/nope"), 404, "/nope")


def test_requests_over_the_body_or_token_limit_get_413(embedder):
    with _client(embedder, max_body_bytes=2000, max_request_tokens=60) as c:
        _error(c.post("/v1/embeddings", json={"input": ["x" * 3000]}), 413, "2000 bytes")
        _error(c.post("/v1/embeddings", json={"input": ["word " * 100]}), 413, "prompt tokens", "60")
        # a chunked body (no Content-Length) is cut off while it streams
        chunks = iter([b'{"input": "', b"y" * 2500, b'"}'])
        _error(c.post("/v1/embeddings", content=chunks, headers={"content-type": "application/json"}), 413, "2000")
        assert c.post("/v1/embeddings", json={"input": "fits"}).status_code == 200
    with _client(embedder, max_inputs=2) as c:
        _error(c.post("/v1/embeddings", json={"input": ["a", "b", "c"]}), 413, "limit is 2")


class _LongestText:
    """A serializer wrapper that records the longest text it was asked to tokenize."""

    def __init__(self, serializer) -> None:
        self.serializer, self.longest = serializer, 0

    def __call__(self, item, instruction):
        self.longest = max(self.longest, len(item.text or ""))
        return self.serializer(item, instruction)

    def __getattr__(self, name):
        return getattr(self.serializer, name)


@pytest.fixture(scope="module")
def short_model(embedder) -> Embedder:
    """The same weights cut at 64 tokens per item: long inputs stay cheap to embed in a test."""
    from faste_mm.model.serialization import SerializerConfig

    return embedder.with_serializer(SerializerConfig(max_length=64))


def test_a_long_query_is_cut_before_tokenizing_and_finds_what_the_whole_text_finds(short_model, collection):
    query = "a sunset over the sea " * 400  # 8,800 characters: far past 64 tokens
    expected = Retriever(short_model, collection=collection, r_max=0.5).search(query, k=5)
    spy = _LongestText(short_model.serializer)
    cut = Embedder(short_model.loaded, short_model.batching)
    cut.serializer = spy  # the same model, its tokenizer calls recorded
    with _client(cut, collection) as c:
        body = c.post("/search", json={"query": query, "k": 5}).json()
    assert 0 < spy.longest <= TEXT_CHARS_PER_TOKEN * 64 < len(query)
    assert [h["id"] for h in body["hits"]] == [h.id for h in expected]
    np.testing.assert_allclose([h["score"] for h in body["hits"]], [h.score for h in expected], atol=1e-5)


def test_embeddings_say_which_inputs_were_truncated_and_refuse_them_when_asked(short_model):
    long = "word " * 200  # past the model's 64 tokens
    with _client(short_model) as c:
        body = c.post("/v1/embeddings", json={"input": ["short", long]}).json()
        assert [d["truncated"] for d in body["data"]] == [False, True]
        np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]], dtype=np.float32),
                                   short_model.encode(["short", long]).embeddings, atol=1e-5)
        _error(c.post("/v1/embeddings", json={"input": ["short", long], "truncate": False}), 413,
               "input[1]", "64 tokens", "truncate")
        assert c.post("/v1/embeddings", json={"input": ["short"], "truncate": False}).status_code == 200


def test_a_full_queue_answers_503_and_the_queued_requests_still_finish(embedder, monkeypatch):
    release, running = threading.Event(), threading.Event()
    original = embedder.encode

    def slow_encode(*args, **kwargs):
        running.set()
        release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(embedder, "encode", slow_encode)
    with _client(embedder, batching=BatcherConfig(max_wait_ms=0, max_queue=1)) as c:
        engine = c.app.state.engine
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(c.post, "/v1/embeddings", json={"input": "one"})
            assert running.wait(30)  # the model thread holds "one"
            second = pool.submit(c.post, "/v1/embeddings", json={"input": "two"})
            deadline = time.monotonic() + 30
            while "faste_mm_queue_depth{kind=\"document\"} 1" not in engine.metrics.render():
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.01)
            busy = c.post("/v1/embeddings", json={"input": "three"})
            release.set()
            assert first.result(timeout=60).status_code == second.result(timeout=60).status_code == 200
        _error(busy, 503, "queue is full", "retry")
        assert busy.headers["retry-after"] == "1"
        assert 'faste_mm_rejected_total{kind="document"} 1' in engine.metrics.render()


def test_the_api_key_guards_every_data_route_but_not_the_page_or_health(embedder, collection):
    with _client(embedder, collection, api_key="s3cret") as c:
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200
        assert c.get("/static/app.js").status_code == 200
        assert c.get("/search/options").status_code == 200  # the declared options: no data
        for method, path, kwargs in (("post", "/v1/embeddings", {"json": {"input": "x"}}), ("get", "/info", {}),
                                     ("get", "/metrics", {}), ("post", "/search", {"json": {"query": "x"}}),
                                     ("get", "/thumbnails/1", {})):
            _error(getattr(c, method)(path, **kwargs), 401, "API key")
            wrong = getattr(c, method)(path, headers={"Authorization": "Bearer nope"}, **kwargs)
            _error(wrong, 401, "wrong API key")
            assert wrong.headers["www-authenticate"] == "Bearer"
            ok = getattr(c, method)(path, headers={"Authorization": "Bearer s3cret"}, **kwargs)
            assert ok.status_code == 200, (path, ok.text)
    with _client(embedder) as c:  # no key configured: no header needed
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_binding_beyond_loopback_needs_an_api_key_or_insecure():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        check_bind(host, None, False)
    for host in ("0.0.0.0", "::", "192.168.1.4", "example.com"):
        with pytest.raises(ConfigError, match="--api-key"):
            check_bind(host, None, False)
        check_bind(host, "key", False)
        check_bind(host, None, True)


def test_the_serve_command_refuses_a_public_host_without_a_key_before_loading_a_model():
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--model", "/nonexistent/model"])
    assert result.exit_code == 1
    assert "--api-key" in result.output and "nonexistent" not in result.output


# ---- info, metrics, empty collection -------------------------------------------------------
def test_only_the_servers_own_host_names_are_answered(client, embedder, collection):
    """DNS rebinding: a page at evil.example re-points its name to 127.0.0.1 and reads our answers."""
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", ""):
        _error(client.get("/health", headers={"host": host}), 403, "--allowed-host")
        _error(client.post("/search", json={"query": "x"}, headers={"host": host}), 403, "does not answer")
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST."):
        assert client.get("/health", headers={"host": host}).status_code == 200, host
    with _client(embedder, collection, allowed_hosts=host_names("0.0.0.0", ["photos.lan"])) as lan:
        assert lan.post("/search", json={"query": "x", "k": 2}, headers={"host": "photos.lan:8000"}).status_code == 200
        assert lan.get("/health", headers={"host": "0.0.0.0:8000"}).status_code == 200
        _error(lan.get("/health", headers={"host": "other.lan"}), 403, "photos.lan")
    with pytest.raises(ConfigError, match="allowed host .* 'http://x/' is not a host name"):
        ServeConfig(allowed_hosts=("http://x/",))


def test_cross_site_posts_are_refused_without_a_key(client, embedder, collection):
    form = {"q": "sunset", "k": "3"}
    _error(client.post("/search", data=form, headers={"origin": "http://evil.example"}), 403, "another site")
    _error(client.post("/search", data=form, headers={"sec-fetch-site": "cross-site"}), 403, "another site")
    _error(client.post("/search", data=form, headers={"origin": "null"}), 403, "another site")
    own = {"origin": "http://127.0.0.1:8000", "sec-fetch-site": "same-origin"}
    assert client.post("/search", data=form, headers=own).status_code == 200
    assert client.post("/search", data=form, headers={"origin": "http://localhost:8000"}).status_code == 200
    assert client.post("/search", data=form).status_code == 200  # curl and SDKs send no Origin
    assert client.get("/", headers={"sec-fetch-site": "cross-site"}).status_code == 200  # links to the page work
    with _client(embedder, collection, api_key="k3y") as keyed:  # a form cannot carry the key header
        answer = keyed.post("/search", data=form, headers={"origin": "http://evil.example", "authorization": "Bearer k3y"})
        assert answer.status_code == 200
        _error(keyed.post("/search", data=form, headers={"origin": "http://evil.example"}), 401)


def test_answers_carry_nosniff_no_framing_and_the_page_a_strict_csp(client):
    page, data = client.get("/"), client.post("/search", json={"query": "x", "k": 1})
    for response in (page, data, client.get("/nope")):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    policy = dict(p.strip().split(" ", 1) for p in page.headers["content-security-policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["default-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'" and "unsafe-inline" not in page.headers["content-security-policy"]
    assert "default-src 'none'" in data.headers["content-security-policy"]


def test_a_blank_api_key_is_refused_in_cli_words():
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--api-key", "   ", "--model", "/nonexistent-model"])
    assert result.exit_code == 1 and "--api-key is empty" in result.stderr, result.stderr
    assert "ServeConfig" not in result.stderr


def test_a_running_server_follows_a_reindex_of_its_collection(embedder, tmp_path):
    root = tmp_path / "c"
    Retriever(embedder, collection=root, r_max=0.5).add(["a cat", "a dog"], uris=["old:cat", "old:dog"])
    with _client(embedder, root) as c:
        assert {h["uri"] for h in c.post("/search", json={"query": "x", "k": 5}).json()["hits"]} == {"old:cat", "old:dog"}
        Collection.erase(root, for_create=True)  # what `index --reindex` does before indexing anew
        Retriever(embedder, collection=root, r_max=0.5).add(["a bird"], uris=["new:bird"])
        hits = c.post("/search", json={"query": "x", "k": 5}).json()["hits"]
        assert [h["uri"] for h in hits] == ["new:bird"]
        _error(c.post("/search", json={"id": hits[0]["id"] + 1, "k": 2}), 404)  # old ids are gone too


def test_a_reindex_with_other_settings_is_served_with_them_and_another_model_is_refused(embedder, tmp_path):
    """`index --reindex` with another FastE, pixel cap and dim: /info, the documents' FastE and
    the queries' width follow the collection's new profile (the generation token changed), and
    searches equal a fresh retriever's. Re-indexed with another model: searches are refused (409)
    with what to do, /info says so, and embeddings still work."""
    import shutil

    root = tmp_path / "c"
    Retriever(embedder, collection=root, r_max=0.5).add(["a cat", "a dog"], uris=["old:cat", "old:dog"])
    engine = ServeEngine(embedder, Retriever(embedder, collection=root), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as c:
        assert c.get("/info").json()["fast_e_documents"]["r_max"] == 0.5
        Collection.erase(root, for_create=True)  # what `index --reindex` does before indexing anew
        Retriever(embedder, collection=root, r_max=0.0, dim=16, max_pixels=8192).add(
            ["a bird", "a fish"], uris=["new:bird", "new:fish"])
        info = c.get("/info").json()
        assert info["fast_e_documents"] is None  # r_max 0: the full forward
        assert (info["collection"]["dim"], info["collection"]["max_pixels"], info["collection"]["r_max"]) == (16, 8192, 0.0)
        hits = c.post("/search", json={"query": "a bird", "k": 2}).json()["hits"]
        with Retriever(embedder, collection=root) as fresh:
            expected = fresh.search("a bird", k=2)
        assert [h["uri"] for h in hits] == [h.uri for h in expected]
        np.testing.assert_allclose([h["score"] for h in hits], [h.score for h in expected], atol=1e-5)
        assert engine.embedder.serializer.config.max_pixels == 8192  # documents: the new pixel cap

        other = Embedder.from_pretrained(str(shutil.copytree(Path(embedder.model_id), tmp_path / "other-model")),
                                         device="cpu")
        Collection.erase(root, for_create=True)
        Retriever(other, collection=root, r_max=0.0).add(["a horse"], uris=["other:horse"])
        _error(c.post("/search", json={"query": "a horse"}), 409, "re-indexed with another model", "restart",
               "model_id")
        info = c.get("/info").json()["collection"]
        assert info["searchable"] is False and "restart" in info["refused"] and info["items"] == 1
        assert c.post("/v1/embeddings", json={"input": ["still embeds"]}).status_code == 200


def test_info_reports_model_fast_e_and_collection_counts(client, embedder):
    info = client.get("/info").json()
    assert info["model"] == embedder.model_id and info["dim"] == embedder.dim
    assert info["fast_e_documents"]["r_max"] == 0.5
    assert info["collection"]["items"] == 13 and info["collection"]["name"] == "col"
    assert info["collection"]["plan"].startswith("not measured")  # indexed without faste-mm plan
    assert info["query_instruction"] == VL_QUERY_INSTRUCTION


def test_an_empty_collection_serves_info_and_empty_results(embedder, tmp_path):
    Retriever(embedder, collection=tmp_path / "empty", r_max=0.5).add([])
    with _client(embedder, tmp_path / "empty") as c:
        assert c.get("/info").json()["collection"]["items"] == 0
        response = c.post("/search", json={"query": "anything"})
        assert response.status_code == 200 and response.json()["hits"] == []


def test_metrics_are_prometheus_text_with_routes_batches_and_tokens(client):
    client.post("/v1/embeddings", json={"input": TEXTS})
    text = client.get("/metrics").text
    for line in ('faste_mm_requests_total{code="200",method="POST",route="/v1/embeddings"}',
                 'faste_mm_request_seconds_bucket{route="/v1/embeddings",le="+Inf"}',
                 'faste_mm_batch_size_count{kind="document"}', 'faste_mm_tokens_in_total{kind="document"}',
                 'faste_mm_prefix_tokens_kept_total{kind="document"}', "# TYPE faste_mm_request_seconds histogram"):
        assert line in text, line
    kept = float(text.split('faste_mm_prefix_tokens_kept_total{kind="document"} ')[1].split()[0])
    total = float(text.split('faste_mm_prefix_tokens_total{kind="document"} ')[1].split()[0])
    assert 0 < kept < total  # FastE removed prefix tokens of the documents


# ---- the batcher and a bounded load check on loopback -----------------------------------------
def test_the_batcher_merges_under_the_token_budget_and_never_mixes_kinds():
    seen: list[tuple[str, list]] = []
    gate, entered = threading.Event(), threading.Event()

    def runner(kind):
        def run(payloads):
            entered.set()
            gate.wait(10)
            seen.append((kind, list(payloads)))
            return [p * 10 if p != "bad" else ValueError("bad job") for p in payloads]
        return run

    batcher = Batcher({"query": runner("query"), "document": runner("document")},
                      BatcherConfig(batch_tokens=10, max_wait_ms=0, max_queue=8)).start()
    try:
        blocker = batcher.submit("query", 0, 1)  # occupies the model thread until the gate opens
        assert entered.wait(10)  # taken alone, before the others are queued
        futures = [batcher.submit("query", i, 4) for i in (1, 2, 3)] + [batcher.submit("document", 9, 4),
                                                                       batcher.submit("document", "bad", 1)]
        gate.set()
        assert [f.result(10) for f in [blocker, *futures[:4]]] == [0, 10, 20, 30, 90]
        with pytest.raises(ValueError, match="bad job"):
            futures[4].result(10)
    finally:
        batcher.close()
    batches = [(kind, payloads) for kind, payloads in seen]
    assert ("query", [1, 2]) in batches and ("query", [3]) in batches  # 4 + 4 tokens fit 10, a third does not
    assert ("document", [9, "bad"]) in batches
    full = Batcher({"query": runner("query")}, BatcherConfig(max_queue=1))  # not started: nothing drains
    full.submit("query", 1, 1)
    with pytest.raises(QueueFullError, match="max-queue 1"):
        full.submit("query", 2, 1)
    full.close()


def test_a_runner_that_raises_on_a_merged_batch_fails_only_the_job_that_broke_it():
    gate, entered, seen = threading.Event(), threading.Event(), []

    def run(payloads):
        entered.set()
        gate.wait(10)
        seen.append(list(payloads))
        if "bad" in payloads:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return [p * 10 for p in payloads]

    batcher = Batcher({"search": run}, BatcherConfig(batch_tokens=100, max_wait_ms=0)).start()
    try:
        blocker = batcher.submit("search", 0, 1)  # holds the model thread: the next jobs merge
        assert entered.wait(10)  # the model thread has taken the blocker alone
        futures = [batcher.submit("search", p, 1) for p in (1, "bad", 2, 3)]
        gate.set()
        assert blocker.result(10) == 0
        assert [futures[i].result(10) for i in (0, 2, 3)] == [10, 20, 30]
        with pytest.raises(OverflowError):
            futures[1].result(10)
    finally:
        batcher.close()
    assert [1, "bad", 2, 3] in seen  # they were merged, and the good ones still got answers


def test_a_where_integer_beyond_int64_is_a_400_and_the_searches_beside_it_succeed(client, embedder, collection):
    reference = Retriever(embedder, collection=collection, r_max=0.5)
    good = [{"query": q, "k": 4} for q in ("a sunset over the sea", "forest", "a report", "picnic")]
    bad = [{"query": "x", "k": 4, "where": {"year": 2**70}}, {"query": "y", "k": 4, "where": {"n": -2**63 - 1}}]
    with ThreadPoolExecutor(len(good) + len(bad)) as pool:
        answers = list(pool.map(lambda body: client.post("/search", json=body), good + bad))
    for body, response in zip(good, answers):
        assert response.status_code == 200, response.text
        assert [h["id"] for h in response.json()["hits"]] == [h.id for h in reference.search(body["query"], k=4)]
    _error(answers[len(good)], 400, "year", str(-2**63), str(2**63 - 1))
    _error(answers[len(good) + 1], 400, "'n'", "64 bits")
    with pytest.raises(ConfigError, match="year"):
        reference.search("x", where={"year": 2**64})


def test_after_a_batch_the_next_one_waits_for_the_clients_that_just_got_answers():
    """Without a grace period after the model frees up, C clients settle into two alternating
    batches: the request that waited through a batch would run alone, before the clients just
    answered can send their next requests."""
    gate, seen = threading.Event(), []

    def run(payloads):
        if payloads == ["a"]:
            gate.wait(10)
        seen.append(list(payloads))
        return payloads

    batcher = Batcher({"query": run}, BatcherConfig(batch_tokens=10, max_wait_ms=1000)).start()
    try:
        first = batcher.submit("query", "a", 10)  # fills the budget: runs at once, holds the model
        waiting = batcher.submit("query", "b", 5)  # waits through "a", past its own max wait
        time.sleep(1.5)
        gate.set()
        first.result(10)
        again = batcher.submit("query", "c", 5)  # a's client comes back
        assert waiting.result(10) == "b" and again.result(10) == "c"
    finally:
        batcher.close()
    assert seen == [["a"], ["b", "c"]]


def test_concurrent_clients_on_loopback_all_succeed_and_get_merged(embedder):
    """8 threads x 5 requests against a live uvicorn on 127.0.0.1: every answer equals its own
    encode_queries, and the batcher merged requests (largest batch > 1)."""
    import httpx
    import uvicorn

    engine = ServeEngine(embedder, None, ServeConfig(batching=BatcherConfig(max_wait_ms=50)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    texts = [f"request {t}-{r}: " + "word " * (t + r) for t in range(8) for r in range(5)]

    def client(t: int) -> list[tuple[str, np.ndarray]]:
        out = []
        with httpx.Client(base_url=url, timeout=60) as http:
            for r in range(5):
                text = texts[t * 5 + r]
                response = http.post("/v1/embeddings", json={"input": text, "input_type": "query"})
                assert response.status_code == 200, response.text
                out.append((text, np.array(response.json()["data"][0]["embedding"], dtype=np.float32)))
        return out

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = [pair for chunk in pool.map(client, range(8)) for pair in chunk]
    finally:
        server.should_exit = True
        thread.join(30)
    assert len(answers) == 40
    expected = embedder.encode_queries([t for t, _ in answers], instruction=VL_QUERY_INSTRUCTION).embeddings
    np.testing.assert_allclose(np.stack([v for _, v in answers]), expected, atol=1e-5)
    assert engine.metrics.largest("faste_mm_batch_size", kind="query") > 1


def test_the_page_and_its_assets_are_local_and_load_nothing_from_other_hosts(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    import re

    for asset in ["/", *re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)]:
        response = client.get(asset)
        assert response.status_code == 200, asset
        text = response.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
        assert not re.search(r"https?://", text), f"{asset} refers to another host"
    assert client.get("/docs").status_code == 404  # FastAPI's Swagger UI would load a CDN


def test_an_unexpected_failure_is_a_json_500_and_the_server_keeps_serving(embedder, monkeypatch):
    original = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    # raise_server_exceptions: the error must not escape the app (uvicorn would close the connection)
    with _client(embedder) as c:
        _error(c.post("/v1/embeddings", json={"input": "x"}), 500, "RuntimeError", "boom")
        monkeypatch.setattr(embedder, "encode", original)
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200


# ---- probes that held, kept (helper ux): traversal of the static files, forged credentials ----
@pytest.mark.parametrize("path", ["/static/../api.py", "/static/..%2Fapi.py", "/static/%2e%2e/engine.py",
                                  "/static/%2e%2e%2f%2e%2e%2fpyproject.toml", "/static//etc/passwd",
                                  "/static/..\\api.py", "/static/%00app.js", "/thumbnails/%2e%2e%2f1",
                                  "/thumbnails/1%2f..%2f..%2fmeta.sqlite", "/favicon.ico/../api.py"])
def test_traversal_probes_never_serve_a_file_outside_the_page_assets(client, path):
    response = client.get(path)
    assert response.status_code in (400, 404), (path, response.status_code)
    body = response.content
    assert b"def create_app" not in body and b"root:" not in body and b"[project]" not in body
    assert b"SQLite format" not in body


@pytest.mark.parametrize("headers", [
    {"Authorization": "Basic czNjcmV0"}, {"Authorization": "s3cret"}, {"Authorization": "Bearer"},
    {"Authorization": "Bearer s3cret2"}, {"Authorization": "Bearer s3cre"}, {"Authorization": "Bearer S3CRET"},
    {"Authorization": "Bearer s3cret, Bearer s3cret"}, {"X-API-Key": "s3cret"}, {"Cookie": "key=s3cret"},
], ids=lambda h: repr(h)[:48])
def test_forged_or_misplaced_credentials_get_401_on_every_data_route(embedder, collection, headers):
    with _client(embedder, collection, api_key="s3cret") as c:
        for method, path, kwargs in (("post", "/v1/embeddings", {"json": {"input": "x"}}), ("get", "/info", {}),
                                     ("get", "/metrics", {}), ("post", "/search", {"json": {"query": "x"}}),
                                     ("get", "/thumbnails/1", {}), ("get", "/info?api_key=s3cret", {})):
            response = getattr(c, method)(path, headers=headers, **kwargs)
            assert response.status_code == 401, (path, headers, response.status_code)


def test_a_notes_first_lines_come_with_its_hit_and_a_larger_preview_is_served(embedder, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "minutes.txt").write_text("Board minutes, 3 May\nthe invoice RE16 TGK was paid\n" + "more " * 400)
    scene_image(notes / "lake.png", 5)
    Retriever(embedder, collection=tmp_path / "col", r_max=0.5).index([notes])
    with _client(embedder, tmp_path / "col") as c:
        hits = {Path(h["uri"]).name: h for h in c.post("/search", json={"query": "minutes", "k": 5}).json()["hits"]}
        snippet = hits["minutes.txt"]["snippet"]
        assert snippet.startswith("Board minutes, 3 May the invoice RE16 TGK was paid") and len(snippet) <= 280
        assert hits["lake.png"]["snippet"] is None
        picture = c.get(f"/previews/{hits['lake.png']['id']}")
        assert picture.status_code == 200 and picture.headers["content-type"] == "image/jpeg"
        _error(c.get("/previews/etc"), 404, "item id")
        _error(c.get(f"/previews/{hits['minutes.txt']['id']}"), 404, "no picture")
        # a note swapped for a link to a file outside the indexed folder: no snippet, nothing of it sent
        (tmp_path / "secret.txt").write_text("FASTE_MM_API_KEY=hunter2")
        (notes / "minutes.txt").unlink()
        (notes / "minutes.txt").symlink_to(tmp_path / "secret.txt")
        body = c.post("/search", json={"query": "minutes", "k": 5})
        assert body.status_code == 200 and "hunter2" not in body.text
