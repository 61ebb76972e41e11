"""Albums as MCP resources (`faste-mm://album/NAME`): listed beside the items, read as JSON (the album's
query, what was understood, its members best first with links to their item resources), and
subscribable: a client that sends resources/subscribe for an album gets
notifications/resources/updated whenever its members change, whoever changed them (the `index` tool,
`serve --watch`, or a `faste-mm index` / `watch` in another process). Receives the server's tools
(their collection) and the SDK's sessions; hands back resources and sends notifications.

How a change is noticed: `AlbumWatch` keeps, per subscribed album, the members last announced, and
compares them with the album now after each `index` tool call and, while anything is subscribed,
every `ALBUM_POLL_S` seconds in a thread of its own (a read-only connection: one query per album).
A notification is sent on the session's own event loop; a session that is gone is dropped.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types

from faste_mm.errors import FasteError
from faste_mm.serving.mcp_tools import ITEM_URI

log = logging.getLogger(__name__)

ALBUM_URI = "faste-mm://album/{name}"
ALBUM_POLL_S = 2.0  # how often a server with subscribers looks for album changes made by other processes


def _albums(collection: Path):
    from faste_mm.retrieval.library.albums import Albums
    from faste_mm.retrieval.profile import read_profile

    return Albums(collection, default_min_score=lambda: read_profile(collection).min_score)


def album_name(uri: str) -> str | None:
    """The album a resource uri names (None: not an album uri)."""
    prefix = ALBUM_URI.format(name="")
    return uri[len(prefix):] if uri.startswith(prefix) else None


def album_resources(collection: Path) -> list[types.Resource]:
    """Every album of the collection as a resource (resources/list's first page carries them)."""
    return [types.Resource(uri=ALBUM_URI.format(name=a.name), name=f"album {a.name}",
                           description=f"{a.query} (best {a.limit}; kept current as the collection changes)",
                           mime_type="application/json") for a in _albums(collection).list()]


def album_template() -> types.ResourceTemplate:
    return types.ResourceTemplate(uri_template=ALBUM_URI.format(name="{name}"), name="album",
                                  description="An album (a saved search kept current) by name: its members as JSON; "
                                              "subscribe to hear when they change", mime_type="application/json")


def read_album(collection: Path, uri: str) -> types.ReadResourceResult:
    """faste-mm://album/NAME: the album and its members (each with its item resource) as JSON."""
    from mcp.shared.exceptions import MCPError

    try:
        album = _albums(collection).show(album_name(uri) or "")
    except FasteError as error:
        raise MCPError(types.INVALID_PARAMS, f"{uri[:80]}: {error}") from None
    data = album.to_dict()
    for hit in data["hits"]:
        hit["resource"] = ITEM_URI.format(id=hit["id"])
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=uri, mime_type="application/json", text=json.dumps(data, ensure_ascii=False))])


class AlbumWatch:
    """Subscriptions to album resources, and the checks that notify them (see the module docstring)."""

    def __init__(self, collection: Path, poll_s: float = ALBUM_POLL_S) -> None:
        self.collection = Path(collection)
        self.poll_s = poll_s
        self._lock = threading.Lock()
        # uri -> {session: event loop token}; uri -> the member ids last announced (None: no album)
        self._subscribers: dict[str, dict[object, object]] = {}
        self._announced: dict[str, tuple | None] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    async def subscribe(self, ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        if album_name(uri) is None:
            from mcp.shared.exceptions import MCPError

            raise MCPError(types.INVALID_PARAMS, f"{uri[:80]}: only albums ({ALBUM_URI.format(name='NAME')}) change "
                                                 f"while served; an item resource never does")
        members = await anyio.to_thread.run_sync(self._members, uri)
        with self._lock:
            self._subscribers.setdefault(uri, {})[ctx.session] = anyio.lowlevel.current_token()
            self._announced.setdefault(uri, members)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="faste-mm-mcp-albums", daemon=True)
                self._thread.start()
        return types.EmptyResult()

    async def unsubscribe(self, ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        with self._lock:
            self._subscribers.get(str(params.uri), {}).pop(ctx.session, None)
        return types.EmptyResult()

    def check(self) -> None:
        """Notify the subscribers of each album whose members changed since last announced (any thread
        but a session's event loop)."""
        with self._lock:
            uris = [uri for uri, sessions in self._subscribers.items() if sessions]
        for uri in uris:
            members = self._members(uri)
            with self._lock:
                if members == self._announced.get(uri):
                    continue
                self._announced[uri] = members
                sessions = list(self._subscribers.get(uri, {}).items())
            for session, token in sessions:
                try:
                    anyio.from_thread.run(session.send_resource_updated, uri, token=token)
                except Exception as error:  # noqa: BLE001 - a closed session or loop: it hears nothing more
                    log.info("album %s: subscriber dropped (%s)", uri, type(error).__name__)
                    with self._lock:
                        self._subscribers.get(uri, {}).pop(session, None)

    def close(self) -> None:
        self._stop.set()

    def _members(self, uri: str) -> tuple | None:
        try:
            album = _albums(self.collection).show(album_name(uri) or "")
        except FasteError:
            return None  # no such album (removed, or not yet made): its appearance is a change too
        return tuple((h.id, round(h.score, 6)) for h in album.hits)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the server keeps serving; the next poll tries again
                log.exception("album subscriptions: check failed")
