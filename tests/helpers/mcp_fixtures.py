"""Shared pieces of the MCP tests: a small collection made with the tiny model (images, a
two-page PDF, a note), an MCP client session from the official SDK held open across a module's
tests (one server process, one model load), and schema checks."""

from __future__ import annotations

import base64
import io
import os
from contextlib import asynccontextmanager
from pathlib import Path

import jsonschema
from anyio.from_thread import start_blocking_portal
from mcp.client.session import ClientSession
from PIL import Image

from faste_mm import BatchingConfig, Embedder, Retriever
from tests.helpers.serve_fixtures import make_gallery, scene_image
from tests.helpers.inputs import tiny_vl_dir


def tiny_collection(base: Path, reranker: str | None = None) -> tuple[Embedder, Path, Path, Path]:
    """(embedder, collection, gallery, inbox): 4 scene images, a 2-page PDF and a text note indexed
    with FastE r_max=0.5; `inbox` holds one image not yet indexed (for the index tool)."""
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(base.parent)), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    gallery = make_gallery(base / "gallery", n=4)
    (gallery / "picnic.txt").write_text("notes about a picnic by the lake\n", encoding="utf-8")
    Retriever(embedder, collection=base / "col", r_max=0.5, reranker=reranker).index([gallery])
    inbox = base / "inbox"
    inbox.mkdir()
    scene_image(inbox / "new-scene.png", 42)
    return embedder, base / "col", gallery, inbox


class Session:
    """A live `ClientSession` driven from synchronous tests through an anyio portal."""

    def __init__(self, portal, session: ClientSession) -> None:
        self.portal, self.session = portal, session

    def __getattr__(self, name: str):
        method = getattr(self.session, name)
        return lambda *args, **kwargs: self.portal.call(lambda: method(*args, **kwargs))

    def call(self, tool: str, arguments: dict | None = None, progress=None):
        return self.portal.call(lambda: self.session.call_tool(tool, arguments or {}, progress_callback=progress))


def open_session(transport, message_handler=None):
    """A context manager yielding a `Session` over `transport` (an async context manager that
    yields the SDK's (read, write) streams), initialized. message_handler: the SDK's hook for the
    server's notifications (e.g. notifications/resources/updated)."""

    @asynccontextmanager
    async def connected():
        async with transport as streams:
            async with ClientSession(*streams[:2], message_handler=message_handler) as session:
                await session.initialize()
                yield session

    class _Open:
        def __enter__(self):
            self.portal_cm = start_blocking_portal()
            portal = self.portal_cm.__enter__()
            self.session_cm = portal.wrap_async_context_manager(connected())
            return Session(portal, self.session_cm.__enter__())

        def __exit__(self, *exc):
            try:
                self.session_cm.__exit__(*exc)
            finally:
                self.portal_cm.__exit__(*exc)

    return _Open()


def check_structured(tools_by_name: dict, name: str, result) -> dict:
    """The result's structuredContent, checked against the tool's outputSchema."""
    assert not result.is_error, result.content[0].text
    jsonschema.validate(result.structured_content, tools_by_name[name].output_schema)
    return result.structured_content


def images_of(result) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(c.data))) for c in result.content if c.type == "image"]


def error_text(result) -> str:
    assert result.is_error, f"expected an error, got {result.structured_content}"
    return result.content[0].text


def http_transport(url: str, headers: dict, timeout: float = 120):
    """The SDK's streamable HTTP client transport to `url` (a server's /mcp) sending `headers`,
    its HTTP client closed with it (an async context manager for `open_session`)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=headers, timeout=timeout)

    class _Transport:
        async def __aenter__(self):
            self.inner = streamable_http_client(url, http_client=client)
            return await self.inner.__aenter__()

        async def __aexit__(self, *exc):
            try:
                return await self.inner.__aexit__(*exc)
            finally:
                await client.aclose()

    return _Transport()

