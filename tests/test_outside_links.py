"""Links planted in an indexed folder under a new name (issue 46): a link whose target lies outside
the folders being indexed is skipped and counted by `index` (CLI and library), `watch`, `serve
--watch` and the MCP `index` tool, and nothing of its target reaches lexical hits, get_item,
resources/read, /thumbnails or /previews; `--follow-links` opts in. A watched folder swapped for a
link to another folder stops that folder's sync at the next poll, reading nothing from it. Polls
are driven one by one (`sync_once`): no sleeps."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.indexers import Collection
from faste_mm.retrieval.results import IndexOptions
from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions
from tests.helpers.cli import invoke
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.serve_fixtures import scene_image

SECRET = "hunter2"
RED = (255, 0, 0)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


def planted(base: Path) -> tuple[Path, Path]:
    """(shared, private): a shared folder with a note, a photo and two planted links, one to a text
    file and one to a picture in `private`, a folder never indexed."""
    shared, private = base / "shared", base / "private"
    shared.mkdir(), private.mkdir()
    (shared / "picnic.txt").write_text("minutes of the picnic by the lake\n")
    scene_image(shared / "lake.png", 3)
    (private / "secret.txt").write_text(f"minutes: the API key is {SECRET}\n")
    Image.new("RGB", (64, 48), RED).save(private / "secret.png")
    (shared / "minutes.txt").symlink_to(private / "secret.txt")
    (shared / "holiday.png").symlink_to(private / "secret.png")
    return shared, private


def live_uris(collection: Path) -> list[str]:
    with Collection.open(collection) as col:
        return sorted(col.read(lambda rows: rows.live_uris()))


def assert_only_shared(collection: Path, shared: Path) -> None:
    assert live_uris(collection) == [str(shared / "lake.png"), str(shared / "picnic.txt")]


def assert_served_nothing_outside(embedder: Embedder, collection: Path) -> None:
    """Lexical hits, /thumbnails and /previews of every item carry nothing of the private files."""
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    engine = ServeEngine(embedder, Retriever(embedder, collection=collection), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        for query in (SECRET, "minutes API key"):
            body = client.post("/search", json={"query": query, "mode": "lexical", "k": 10})
            hits = body.json()["hits"]
            assert body.status_code == 200 and SECRET not in json.dumps(hits)
            assert all(Path(h["uri"]).name in ("lake.png", "picnic.txt") for h in hits)
        with Collection.open(collection) as col:
            ids = [r.id for records, _ in col.iter_live() for r in records if r.modality == "image"]
        assert ids
        for item_id in ids:
            for route in ("thumbnails", "previews"):
                picture = client.get(f"/{route}/{item_id}")
                assert picture.status_code == 200
                pixels = np.asarray(Image.open(io.BytesIO(picture.content)).convert("RGB"))
                assert not (np.abs(pixels.astype(int) - RED).max(axis=-1) < 40).all(), "the private picture was sent"


def test_index_skips_links_leading_outside_and_serves_nothing_of_them(embedder, tmp_path):
    shared, _ = planted(tmp_path)
    report = Retriever(embedder, collection=tmp_path / "col").index([shared])
    assert report.links_skipped == 2 and report.to_dict()["links_skipped"] == 2 and report.failed == 0
    assert_only_shared(tmp_path / "col", shared)
    assert_served_nothing_outside(embedder, tmp_path / "col")


def test_follow_links_opts_in_and_dropping_it_removes_what_the_links_brought(embedder, tmp_path):
    shared, _ = planted(tmp_path)
    retriever = Retriever(embedder, collection=tmp_path / "col")
    followed = retriever.index([shared], options=IndexOptions(follow_links=True))
    assert followed.links_skipped == 0 and str(shared / "minutes.txt") in live_uris(tmp_path / "col")
    again = retriever.index([shared])
    assert again.links_skipped == 2 and again.removed == 2
    assert_only_shared(tmp_path / "col", shared)


def test_cli_index_says_how_many_links_it_skipped_and_follows_them_when_asked(tmp_path):
    shared, _ = planted(tmp_path)
    model = str(tiny_vl_dir(tmp_path.parent))
    col = tmp_path / "col"
    result = invoke("index", shared, "-c", col, "--model", model, "--device", "cpu", "--format", "json")
    assert json.loads(result.stdout)["links_skipped"] == 2
    assert "skipped 2 links that lead outside the indexed folders; --follow-links to include them" in " ".join(
        result.stderr.split())
    assert_only_shared(col, shared)
    followed = json.loads(invoke("index", shared, "-c", col, "--follow-links", "--format", "json").stdout)
    assert followed["links_skipped"] == 0 and followed["embedded"] == 2


def test_watch_skips_links_leading_outside(embedder, tmp_path):
    shared, _ = planted(tmp_path)
    watcher = FolderWatcher(Retriever(embedder, collection=tmp_path / "col"), [shared], WatchOptions(settle_polls=1))
    report = watcher.sync_once()
    assert report.index.links_skipped == 2 and report.n_files == 2
    assert_only_shared(tmp_path / "col", shared)
    (shared / "later.txt").symlink_to(tmp_path / "private" / "secret.txt")  # planted while watched
    assert watcher.sync_once().n_files == 2
    assert_only_shared(tmp_path / "col", shared)


def test_serve_watch_skips_links_leading_outside(embedder, tmp_path):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from faste_mm.serving import ServeConfig, ServeEngine
    from faste_mm.serving.folder_sync import SERVE_SYNC_FILES, WatchLoop

    shared, _ = planted(tmp_path)
    Retriever(embedder, collection=tmp_path / "col").add(["a first note"])  # serve needs a collection
    engine = ServeEngine(embedder, Retriever(embedder, collection=tmp_path / "col"), ServeConfig()).start()
    watcher = FolderWatcher(Retriever(embedder, collection=tmp_path / "col"), [shared],
                            WatchOptions(interval_s=3600, settle_polls=1, max_files=SERVE_SYNC_FILES))
    try:
        report = WatchLoop(watcher, engine.batcher).sync()  # one poll, on the model thread
    finally:
        engine.close()
    assert report.index.links_skipped == 2
    assert [u for u in live_uris(tmp_path / "col") if u.startswith("/")] == [str(shared / "lake.png"),
                                                                           str(shared / "picnic.txt")]
    assert_served_nothing_outside(embedder, tmp_path / "col")


def test_a_watched_folder_swapped_for_a_link_stops_its_sync_and_nothing_there_is_read(embedder, tmp_path, caplog):
    watched, elsewhere = tmp_path / "photos", tmp_path / "etc"
    watched.mkdir(), elsewhere.mkdir()
    scene_image(watched / "own.png", 1)
    (elsewhere / "passwd.txt").write_text(f"root:{SECRET}\n")
    scene_image(elsewhere / "elsewhere.png", 2)
    retriever = Retriever(embedder, collection=tmp_path / "col")
    watcher = FolderWatcher(retriever, [watched], WatchOptions(settle_polls=1))
    assert watcher.sync_once().index.embedded == 1
    os.rename(watched, tmp_path / "photos.old")
    watched.symlink_to(elsewhere)  # the folder swapped for a link, between two polls
    with caplog.at_level("WARNING", logger="faste_mm.retrieval.library.watching"):
        report = watcher.sync_once()
        watcher.sync_once()
    assert report.index is None and report.n_files == 0
    assert len(report.stopped_roots) == 1 and f"{watched} now leads to {elsewhere}" in report.stopped_roots[0]
    assert "its sync is stopped" in report.to_dict()["stopped_roots"][0]
    assert sum("now leads to" in r.getMessage() for r in caplog.records) == 1  # said once, not every poll
    assert live_uris(tmp_path / "col") == [str(watched / "own.png")]  # nothing read there, nothing removed
    assert watcher.status()["stopped_roots"] == list(report.stopped_roots)
    watched.unlink()
    os.rename(tmp_path / "photos.old", watched)  # the same folder back: its sync goes on
    back = watcher.sync_once()
    assert back.stopped_roots == () and back.error is None
    assert live_uris(tmp_path / "col") == [str(watched / "own.png")]


def test_a_watched_folder_replaced_by_another_folder_stops_its_sync(embedder, tmp_path):
    watched = tmp_path / "photos"
    watched.mkdir()
    scene_image(watched / "own.png", 1)
    watcher = FolderWatcher(Retriever(embedder, collection=tmp_path / "col"), [watched], WatchOptions(settle_polls=1))
    watcher.sync_once()
    os.rename(watched, tmp_path / "photos.old")
    watched.mkdir()  # another folder under the same name: another inode
    scene_image(watched / "other.png", 2)
    report = watcher.sync_once()
    assert report.index is None and "was replaced by another folder" in report.stopped_roots[0]
    assert live_uris(tmp_path / "col") == [str(watched / "own.png")]


def test_mcp_index_skips_links_leading_outside_its_allowed_folder(embedder, tmp_path, tmp_path_factory):
    """The official MCP SDK's stdio client against `faste-mm mcp --allow-index shared`."""
    pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
    import base64

    from mcp.client.stdio import StdioServerParameters, stdio_client

    from tests.helpers.mcp_fixtures import error_text, images_of, open_session
    from tests.helpers.warm_process import cli_command

    shared, _ = planted(tmp_path)
    Retriever(embedder, collection=tmp_path / "col").add(["a first note"])  # the server's collection and model
    # a fork of the warm process (tests/helpers/warm_process.py; the installed script with FASTE_MM_TEST_FRESH=1)
    params = StdioServerParameters(command=cli_command(tmp_path_factory.mktemp("mcp-cli")),
                                   args=["mcp", "-c", str(tmp_path / "col"), "--allow-index", str(shared), "--device", "cpu"])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet)) as session:
        assert "outside the folders this server may index" in error_text(
            session.call("index", {"paths": [str(shared / "minutes.txt")]}))  # a link named: refused whole
        report = session.call("index", {"paths": [str(shared)]}).structured_content["report"]
        assert report["links_skipped"] == 2 and report["embedded"] == 2
        hits = session.call("search", {"query": SECRET, "mode": "lexical", "k": 10})
        assert SECRET not in json.dumps(hits.structured_content["hits"])
        # the items (the results' view, ui://, is test_mcp_app_view's)
        resources = [r for r in session.list_resources().resources if not str(r.uri).startswith("ui://")]
        assert len(resources) == 3
        for resource in resources:
            for content in session.read_resource(resource.uri).contents:
                data = getattr(content, "text", None) or base64.b64decode(content.blob).decode("latin-1")
                assert SECRET not in data and "private" not in data
            item_id = int(str(resource.uri).rsplit("/", 1)[1])
            item = session.call("get_item", {"id": item_id, "preview": True})
            assert SECRET not in json.dumps(item.structured_content)
            for picture in images_of(item):
                pixels = np.asarray(picture.convert("RGB")).astype(int)
                assert not (np.abs(pixels - RED).max(axis=-1) < 40).all(), "the private picture was sent"
    assert [u for u in live_uris(tmp_path / "col") if u.startswith("/")] == [str(shared / "lake.png"),
                                                                           str(shared / "picnic.txt")]


def test_a_watched_folder_that_first_appears_as_a_link_is_never_read(embedder, tmp_path):
    watched, elsewhere, later = tmp_path / "inbox", tmp_path / "etc", tmp_path / "later"
    elsewhere.mkdir()
    (elsewhere / "passwd.txt").write_text(f"root:{SECRET}\n")
    watcher = FolderWatcher(Retriever(embedder, collection=tmp_path / "col"), [watched, later],
                            WatchOptions(settle_polls=1))
    assert watcher.sync_once().stopped_roots == ()  # not there yet: reported missing, nothing stopped
    watched.symlink_to(elsewhere)  # the missing folder appears, as a link
    later.mkdir()  # the other appears as a folder: pinned now, then synced
    (later / "note.txt").write_text("a note\n")
    report = watcher.sync_once()
    assert len(report.stopped_roots) == 1 and "appeared as a link" in report.stopped_roots[0]
    # the note, and the failure recorded for the inbox while it was missing: nothing from the link's target
    assert live_uris(tmp_path / "col") == [str(watched), str(later / "note.txt")]
    assert "appeared as a link" in watcher.sync_once().stopped_roots[0]  # and stays stopped
