"""A folder kept in sync (faste_mm/retrieval/library/watching.py), driven poll by poll with `sync_once` on a
real folder and the tiny model: add, modify, delete, rename (no re-embedding: the model is not
called), a partial copy (waited for until its size and mtime settle), sticky removals, an emptied
(unmounted) folder, a busy collection, and watch.json for `info`. No sleeps: polls are counted."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection
from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions, read_watch_status
from tests.helpers.serve_fixtures import scene_image, served_photo_folder
from tests.helpers.inputs import tiny_vl_dir


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


class CountingEncoder:
    """Counts the documents the watcher's retriever sends to the model."""

    def __init__(self, embedder: Embedder, monkeypatch) -> None:
        self.calls: list[int] = []
        original = embedder.encode_documents

        def counted(documents, *args, **kwargs):
            documents = list(documents)
            self.calls.append(len(documents))
            return original(documents, *args, **kwargs)

        monkeypatch.setattr(embedder, "encode_documents", counted)


def _live(retriever) -> dict[str, int]:
    with Collection.open(retriever.collection) as col:
        records = [r for records, _ in col.iter_live() for r in records]
    uris = [r.uri for r in records]
    assert len(uris) == len(set(uris)), "an item is stored twice"
    return {os.path.basename(r.uri): r.id for r in records}


@pytest.fixture
def watched(embedder, tmp_path, monkeypatch):
    folder = tmp_path / "photos"
    folder.mkdir()
    scene_image(folder / "a.png", 1)
    scene_image(folder / "b.png", 2)
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.5)
    counter = CountingEncoder(embedder, monkeypatch)
    return folder, retriever, FolderWatcher(retriever, [folder], WatchOptions(settle_polls=2)), counter


def test_new_files_wait_one_poll_then_an_unchanged_folder_opens_nothing(watched):
    folder, retriever, watcher, counter = watched
    first = watcher.sync_once()
    assert first.waiting == 2 and first.index.embedded == 0 and counter.calls == []
    second = watcher.sync_once()
    assert (second.waiting, second.index.embedded) == (0, 2)
    assert set(_live(retriever)) == {"a.png", "b.png"}
    idle = watcher.sync_once()
    assert idle.is_idle and idle.index is None and idle.n_files == 2
    status = read_watch_status(retriever.collection)
    assert status["in_sync"] and status["paths"] == [str(folder)] and status["last_change"]["embedded"] == 2


def test_modify_delete_and_rename_without_calling_the_model(watched):
    folder, retriever, watcher, counter = watched
    watcher.sync_once(), watcher.sync_once()
    before = _live(retriever)
    scene_image(folder / "b.png", 7)  # modified in place: new content
    os.utime(folder / "b.png", (5_000_000, 5_000_000))
    assert watcher.sync_once().waiting == 1
    changed = watcher.sync_once()
    assert changed.index.embedded == 1 and _live(retriever)["b.png"] != before["b.png"]
    assert changed.index.embedded_files == (str((folder / "b.png").resolve()),)
    calls = len(counter.calls)
    os.rename(folder / "a.png", folder / "renamed.png")  # a move keeps size and mtime
    moving = watcher.sync_once()
    assert moving.waiting == 1 and moving.index.removed == 0  # the old path lends its vector once the new settles
    moved = watcher.sync_once()
    assert (moved.index.embedded, moved.index.reused, moved.index.removed) == (0, 1, 1)
    assert moved.index.moved_files == ((str((folder / "a.png").resolve()), str((folder / "renamed.png").resolve())),)
    assert len(counter.calls) == calls, "a renamed file was embedded again"
    (folder / "b.png").unlink()
    deleted = watcher.sync_once()
    assert deleted.index.removed == 1 and set(_live(retriever)) == {"renamed.png"}
    assert deleted.index.removed_files == (str((folder / "b.png").resolve()),)


def test_a_partial_copy_is_embedded_only_once_complete(watched, tmp_path):
    folder, retriever, watcher, counter = watched
    watcher.sync_once(), watcher.sync_once()
    whole = scene_image(tmp_path / "big.png", 9, size=(400, 300)).read_bytes()
    (folder / "c.png").write_bytes(whole[: len(whole) // 2])  # a copy in progress
    assert watcher.sync_once().waiting == 1
    with open(folder / "c.png", "ab") as f:
        f.write(whole[len(whole) // 2:])  # the copy goes on: size changed
    os.utime(folder / "c.png", (6_000_000, 6_000_000))
    assert watcher.sync_once().waiting == 1
    done = watcher.sync_once()
    assert (done.waiting, done.index.embedded, done.index.failed) == (0, 1, 0)
    with Collection.open(retriever.collection) as col:
        assert col.info().failures == ()


def test_a_removed_file_stays_out_and_an_emptied_folder_removes_nothing(watched, tmp_path):
    folder, retriever, watcher, counter = watched
    watcher.sync_once(), watcher.sync_once()
    retriever.remove([folder / "a.png"])  # sticky: later scans of the folder skip it
    scene_image(folder / "d.png", 4)
    watcher.sync_once(), watcher.sync_once()
    assert set(_live(retriever)) == {"b.png", "d.png"}
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in os.listdir(folder):  # emptied in place (a share unmounted under the folder would be another
        shutil.move(folder / name, aside / name)  # folder: its sync stops, tests/test_outside_links.py)
    report = watcher.sync_once()
    assert report.empty_roots == (str(folder.resolve()),) and set(_live(retriever)) == {"b.png", "d.png"}


def test_a_busy_collection_is_retried_at_the_next_poll(watched):
    folder, retriever, watcher, counter = watched
    watcher.sync_once(), watcher.sync_once()
    scene_image(folder / "e.png", 5)
    watcher.sync_once()
    with Collection.open(retriever.collection, writable=True):  # `faste-mm index` running by hand
        busy = watcher.sync_once()
    assert busy.error and "another faste-mm process" in busy.error and busy.index is None
    assert read_watch_status(retriever.collection)["error"] == busy.error
    again = watcher.sync_once()
    assert again.error is None and again.index.embedded == 1 and "e.png" in _live(retriever)


def test_max_files_leaves_the_rest_for_the_next_poll(watched):
    folder, retriever, _, counter = watched
    watcher = FolderWatcher(retriever, [folder], WatchOptions(settle_polls=1, max_files=1))
    first = watcher.sync_once()
    assert first.more and first.index.embedded == 1
    second = watcher.sync_once()
    assert not second.more and second.index.embedded == 1 and len(_live(retriever)) == 2


@pytest.mark.parametrize("options", [dict(interval_s=0), dict(settle_polls=0), dict(max_files=0),
                                     dict(interval_s=True)])
def test_bad_watch_options_are_config_errors_naming_the_field(options):
    field = next(iter(options))
    with pytest.raises(ConfigError, match=field):
        WatchOptions(**options)


def test_watch_needs_a_path(embedder, tmp_path):
    with pytest.raises(ConfigError, match="at least one"):
        FolderWatcher(Retriever(embedder, collection=tmp_path / "col"), [])


def test_watch_json_is_the_collections_own_file(watched):
    folder, retriever, watcher, _ = watched
    watcher.sync_once()
    assert json.loads((retriever.collection / "watch.json").read_text())["files"] == 2
    assert Collection.erase(retriever.collection)  # erase removes it with the rest
    assert not retriever.collection.exists()


def test_serve_watch_syncs_on_the_model_thread_and_info_shows_it(embedder, tmp_path):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app
    from faste_mm.serving.folder_sync import WatchLoop

    folder, seed = served_photo_folder(embedder, tmp_path, {"lighthouse.png": 6})
    watcher = FolderWatcher(Retriever(embedder, collection=seed.collection), [folder],
                            WatchOptions(interval_s=3600, settle_polls=1, max_files=8))
    engine = ServeEngine(embedder, Retriever(embedder, collection=seed.collection), ServeConfig())
    loop = WatchLoop(watcher, engine.batcher)
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        loop.sync()  # one poll, run as a task of the model thread
        hits = client.post("/search", json={"query": "lighthouse", "mode": "lexical", "k": 5}).json()["hits"]
        assert [os.path.basename(h["uri"]) for h in hits] == ["lighthouse.png"]
        watch = client.get("/info").json()["collection"]["watch"]
        assert watch["in_sync"] and watch["paths"] == [str(folder)]
