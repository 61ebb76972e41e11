"""The search tools' result view for MCP Apps hosts (the MCP Apps extension of MCP,
`io.modelcontextprotocol/ui`, stable 2026-01-26): a `ui://` HTML resource the host renders in a
sandboxed iframe beside a search's answer, declared on the tools through their `_meta`.

The server only serves the document: the view gets the tool result the host hands it over postMessage
(the bridge: `ui/initialize`, `ui/notifications/tool-result`, ...) and draws it from the
structured result and the answer's own thumbnails (the image blocks, each tagged with its item
under `PICTURE_ITEM_KEY`). Hands `serving.mcp_server` the resource's listing entry, its contents
(the HTML under its own Content-Security-Policy) and the tools' `_meta`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

import mcp_types as types
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID

VIEW_URI = "ui://faste-mm/search-results.html"
VIEW_FILE = Path(__file__).parent / "mcp_static" / "search_results.html"
# An image block's `_meta` key naming the item it shows: the view pairs pictures with hits by it,
# not by the order of the blocks or the words of their labels.
PICTURE_ITEM_KEY = "faste-mm/item"
# The view runs only its own inline script and style (by hash), shows only data: pictures (the
# answer's own thumbnails), and may open no connection, form, frame or plugin. Hosts add their
# sandbox's policy on top; both hold.
VIEW_CSP = ("default-src 'none'; script-src {script}; style-src {style}; img-src data:; connect-src 'none'; "
            "font-src 'none'; media-src 'none'; frame-src 'none'; object-src 'none'; base-uri 'none'; "
            "form-action 'none'")
EXTENSIONS = {EXTENSION_ID: {}}  # the server's capabilities: it speaks the extension (no settings)


def tool_meta() -> dict:
    """A tool's `_meta` naming the view: `ui.resourceUri` (the stable spec's key) and the flat
    `ui/resourceUri` the drafts used, which the spec keeps as deprecated for hosts built before
    it (a host that reads both prefers the nested one; both name the same resource)."""
    return {"ui": {"resourceUri": VIEW_URI}, "ui/resourceUri": VIEW_URI}


def _ui_meta() -> dict:
    # No `csp` domains: the view needs none, and without them a host applies the spec's restrictive
    # default (no connections, pictures only from data:). A border: the cards sit on the host's panel.
    return {"ui": {"prefersBorder": True}}


def view_resource() -> types.Resource:
    """The view's entry in resources/list."""
    return types.Resource(uri=VIEW_URI, name="search-results", title="faste-mm search results",
                          description="Shows a search's hits as a grid of thumbnails with their facts (for MCP Apps "
                                      "hosts; the search tools' results also stand alone as text and images)",
                          mime_type=APP_MIME_TYPE, meta=_ui_meta())


def read_view() -> types.ReadResourceResult:
    """resources/read of `VIEW_URI`: the HTML document, its MIME type and `_meta.ui`."""
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=VIEW_URI, mime_type=APP_MIME_TYPE,
                                                                         text=view_html(), meta=_ui_meta())])


@functools.cache
def view_html() -> str:
    """The shipped view with its Content-Security-Policy filled in: the hashes of its one inline
    script and one inline style (so the policy allows exactly those), and faste-mm's version."""
    from faste_mm import __version__

    html = VIEW_FILE.read_text(encoding="utf-8").replace("__VERSION__", __version__)
    policy = VIEW_CSP.format(script=_hash_of(html, "script"), style=_hash_of(html, "style"))
    return html.replace("__CSP__", policy)


def _hash_of(html: str, tag: str) -> str:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    assert len(bodies) == 1, f"{VIEW_FILE.name} holds one inline <{tag}>, found {len(bodies)}"
    digest = hashlib.sha256(bodies[0].encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"
