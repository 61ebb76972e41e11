"""Albums served: GET /albums and /albums/{name} of a live `faste-mm serve` (the page's albums.js
reads them), and albums as MCP resources over the official SDK's stdio client: listed, read, and
subscribed to, with notifications/resources/updated after the `index` tool and after a `faste-mm
index` in another process changes an album (waited for as events, bounded, never timed)."""

from __future__ import annotations

import json
import os
import threading

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

import httpx2  # noqa: E402
import mcp.types as types  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from faste_mm import Retriever  # noqa: E402
from tests.helpers.bounds import HANG_S, first_line  # noqa: E402
from tests.helpers.mcp_fixtures import open_session, tiny_collection  # noqa: E402
from tests.helpers.serve_fixtures import scene_image  # noqa: E402
from tests.helpers.warm_process import cli_command, run_cli, start_cli  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("albums-serve")
    embedder, col, gallery, inbox = tiny_collection(base)
    albums = Retriever(embedder, collection=col).albums()
    albums.add("everything", "a sunset over the sea", limit=50)  # more than the items: each new one enters
    albums.add("pictures", "a forest at dusk", limit=2, type="image")
    return {"embedder": embedder, "col": col, "gallery": gallery, "inbox": inbox, "albums": albums}


def test_the_album_routes_answer_as_album_show(world):
    server = start_cli(["serve", "-c", str(world["col"]), "--port", "0", "--device", "cpu"])
    try:
        url = first_line(server, "faste-mm serve").split()[-1]
        with httpx2.Client(timeout=60) as http:
            listed = http.get(url + "albums").json()["albums"]
            assert [a["name"] for a in listed] == ["everything", "pictures"] and "hits" not in listed[0]
            shown = http.get(url + "albums/pictures").json()
            want = world["albums"].show("pictures")
            assert [(h["rank"], h["id"]) for h in shown["hits"]] == [(r, h.id) for r, h in enumerate(want.hits, 1)]
            assert all(h["thumbnail"] == f"/thumbnails/{h['id']}" for h in shown["hits"])
            missing = http.get(url + "albums/nope")
            assert missing.status_code == 404 and "no album 'nope'" in missing.json()["error"]["message"]
            page = http.get(url).text
            assert '<script src="/static/albums.js"></script>' in page and 'id="albums"' in page
            assert "showAlbum" in http.get(url + "static/albums.js").text
    finally:
        server.terminate()
        server.wait(timeout=60)
        server.close()


# The SDK marks resources/subscribe deprecated for its next protocol version (subscriptions/listen); the
# protocol version this client and server negotiate has it, and it is what this test checks.
@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
def test_album_resources_are_listed_read_and_notify_their_subscribers(world, tmp_path_factory):
    updated: list[str] = []
    heard = threading.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(str(message.params.uri))
            heard.set()

    params = StdioServerParameters(command=cli_command(tmp_path_factory.mktemp("mcp-albums")),
                                   args=["mcp", "-c", str(world["col"]), "--allow-index", str(world["inbox"]),
                                         "--device", "cpu"])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet), on_message) as client:
        # the results' view (ui://) first, then the albums, then the items
        listed = [str(r.uri) for r in client.list_resources().resources if not str(r.uri).startswith("ui://")]
        assert listed[:2] == ["faste-mm://album/everything", "faste-mm://album/pictures"]
        templates = [t.uri_template for t in client.list_resource_templates().resource_templates]
        assert "faste-mm://album/{name}" in templates
        read = json.loads(client.read_resource("faste-mm://album/pictures").contents[0].text)
        assert [h["id"] for h in read["hits"]] == [h.id for h in world["albums"].show("pictures").hits]
        assert read["hits"][0]["resource"] == f"faste-mm://item/{read['hits'][0]['id']}"
        with pytest.raises(Exception, match="only albums"):
            client.subscribe_resource("faste-mm://item/0")

        client.subscribe_resource("faste-mm://album/everything")
        before = {h.id for h in world["albums"].show("everything").hits}
        assert not client.call("index", {"paths": [str(world["inbox"])]}).is_error
        assert heard.wait(HANG_S), "no notification after the index tool changed the album"
        assert updated == ["faste-mm://album/everything"]
        after = json.loads(client.read_resource("faste-mm://album/everything").contents[0].text)
        assert len({h["id"] for h in after["hits"]} - before) == 1

        # another process indexes a new file: the server notices the album changed and says so
        heard.clear()
        scene_image(world["inbox"] / "later.png", 77)
        done = run_cli(["index", str(world["inbox"]), "-c", str(world["col"]), "--device", "cpu"])
        assert done.returncode == 0 and "album 'everything': +1, -0" in done.stderr, done.stderr[-2000:]
        assert heard.wait(HANG_S), "no notification after another process changed the album"
        assert updated == ["faste-mm://album/everything"] * 2

        client.unsubscribe_resource("faste-mm://album/everything")
        assert "no album 'nope'" in str(pytest.raises(Exception, client.read_resource, "faste-mm://album/nope").value)
