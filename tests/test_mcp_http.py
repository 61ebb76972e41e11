"""The MCP tools over the streamable HTTP transport at /mcp of a live `faste-mm serve` with an
API key: the SDK's HTTP client with the key gets the same tools and hits as over stdio; without
the key, or naming another Host, /mcp is refused like every data route."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

import httpx2  # noqa: E402

from faste_mm import Retriever  # noqa: E402
from tests.helpers.warm_process import start_cli  # noqa: E402
from tests.helpers.mcp_fixtures import check_structured, error_text, http_transport, open_session, tiny_collection  # noqa: E402
from tests.helpers.bounds import first_line  # noqa: E402

KEY = "test-key-123"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    embedder, col, gallery, inbox = tiny_collection(tmp_path_factory.mktemp("mcp-http"))
    # forked from the warm process of tests/helpers/warm_process.py: no fresh torch import
    server = start_cli(["serve", "-c", str(col), "--port", "0", "--api-key", KEY, "--device", "cpu"])
    try:
        line = first_line(server, "faste-mm serve")  # "serving on http://127.0.0.1:PORT/" once the socket is bound
        assert line.startswith("serving on "), line
        yield {"embedder": embedder, "col": col, "url": line.split()[-1] + "mcp"}
    finally:
        server.terminate()
        server.wait(timeout=60)
        server.close()


def _transport(url: str, headers: dict):
    return http_transport(url, headers)


def test_the_tools_answer_over_http_with_the_key(world):
    with open_session(_transport(world["url"], {"Authorization": f"Bearer {KEY}"})) as session:
        tools = {tool.name: tool for tool in session.list_tools().tools}
        assert set(tools) == {"search", "more_like_this", "get_item", "explain", "info", "index"}
        found = check_structured(tools, "search", session.call("search", {"query": "a forest at dusk", "k": 3}))
        reference = Retriever(world["embedder"], collection=world["col"]).search("a forest at dusk", k=3)
        assert [h["id"] for h in found["hits"]] == [h.id for h in reference]
        assert "may not index anything" in error_text(session.call("index", {"paths": [str(world["col"])]}))
        assert "argument `where`: search where must be" in error_text(session.call("search", {"query": "x", "where": 5}))
        assert "has no reranker" in error_text(session.call("explain", {"query": "a forest", "id": 0}))
        assert "has no reranker" in error_text(session.call("search", {"query": "a forest", "rerank": True}))
        assert not session.call("info").is_error  # still serving after the refusals


def test_mcp_without_the_key_or_from_another_host_is_refused(world):
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx2.Client(timeout=60) as http:
        missing = http.post(world["url"], json=hello)
        wrong = http.post(world["url"], json=hello, headers={"Authorization": "Bearer nope"})
        rebinding = http.post(world["url"], json=hello, headers={"Authorization": f"Bearer {KEY}", "Host": "evil.example"})
    assert missing.status_code == 401 and "needs an API key" in missing.json()["error"]["message"]
    assert wrong.status_code == 401
    assert rebinding.status_code == 403 and "does not answer to the host" in rebinding.json()["error"]["message"]
