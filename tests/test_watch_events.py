"""A watched folder kept in sync by the running loops, not by polls the test calls: `watch --events`
(watchdog's native events wake `FolderWatcher.run`, whose interval is an hour, so only events drive
these syncs) and `serve --watch` (its `WatchLoop` thread, polls on the model thread, several of
them: max_files leaves work for the next). Each step waits on the report of the sync that did it
(a condition the loop signals), never on a sleep; the long timeouts only stop a hung test."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from faste_mm import Retriever
from faste_mm.indexers import Collection
from faste_mm.retrieval.library.watching import FolderWatcher, SyncReport, WatchOptions
from tests.helpers.serve_fixtures import scene_image, served_photo_folder

pytest.importorskip("watchdog", reason="needs the watch extra")

HANG_S = 120.0  # a guard against a hung loop, not a timing: each step ends when its sync reports


class Reports:
    """The reports of a running loop's syncs, waited on by condition."""

    def __init__(self) -> None:
        self.seen: list[SyncReport] = []
        self._changed = threading.Condition()

    def __call__(self, report: SyncReport) -> None:
        with self._changed:
            self.seen.append(report)
            self._changed.notify_all()

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(done, HANG_S), f"no sync {what}; reports: {self.seen}"


def _live(collection) -> set[str]:
    with Collection.open(collection) as col:
        return {os.path.basename(r.uri) for records, _ in col.iter_live() for r in records}


def _embedded(reports: Reports) -> int:
    return sum(r.index.embedded for r in reports.seen if r.index is not None)


def _removed(reports: Reports) -> int:
    return sum(r.index.removed for r in reports.seen if r.index is not None)


def test_native_events_drive_syncs_of_new_and_deleted_files(vl_embedder, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    scene_image(folder / "a.png", 1)
    retriever = Retriever(vl_embedder, collection=tmp_path / "col", r_max=0.5)
    watcher = FolderWatcher(retriever, [folder], WatchOptions(interval_s=3600, settle_polls=2, events=True))
    reports, stop = Reports(), threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), kwargs={"on_sync": reports}, daemon=True)
    thread.start()
    try:
        # a.png waits one poll to settle; the next poll comes after EVENT_SETTLE_S, not the hour
        reports.wait_for(lambda: _embedded(reports) == 1, "embedded a.png")
        polls = watcher.polls
        scene_image(folder / "b.png", 2)  # only its events can wake the loop before an hour passes
        reports.wait_for(lambda: _embedded(reports) == 2, "embedded b.png after its events")
        assert watcher.polls > polls and _live(retriever.collection) == {"a.png", "b.png"}
        (folder / "a.png").unlink()
        reports.wait_for(lambda: _removed(reports) == 1, "removed a.png after its event")
        assert _live(retriever.collection) == {"b.png"}
    finally:
        stop.set()
        thread.join(HANG_S)
    assert not thread.is_alive()  # the observer stopped with the loop


def test_a_change_made_during_a_poll_wakes_the_next_poll(vl_embedder, tmp_path):
    """An event that arrives while a poll runs is not lost: the loop polls again at once rather than
    after its hour (the wake is cleared before each poll, never after: a change the poll's scan may
    have missed still wakes the next one). The file is removed inside the poll's own `sync`, and the
    poll returns only once an observer of the test's own saw that removal."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    folder = tmp_path / "photos"
    folder.mkdir()
    scene_image(folder / "a.png", 1)
    scene_image(folder / "b.png", 2)
    retriever = Retriever(vl_embedder, collection=tmp_path / "col", r_max=0.5)
    watcher = FolderWatcher(retriever, [folder], WatchOptions(interval_s=3600, settle_polls=1, events=True))
    removal_seen = threading.Event()

    class _Seen(FileSystemEventHandler):
        def on_deleted(self, event) -> None:
            removal_seen.set()

    def sync() -> SyncReport:
        report = watcher.sync_once()
        if watcher.polls == 1:
            (folder / "a.png").unlink()  # after this poll's scan, before its wait
            assert removal_seen.wait(HANG_S), "the test's observer saw no removal"
        return report

    own = Observer()
    own.schedule(_Seen(), str(folder))
    own.start()
    reports, stop = Reports(), threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), kwargs={"on_sync": reports, "sync": sync}, daemon=True)
    thread.start()
    try:
        reports.wait_for(lambda: _removed(reports) == 1, "removed a.png after the event during the first poll")
        assert _embedded(reports) == 2 and _live(retriever.collection) == {"b.png"}
    finally:
        stop.set()
        thread.join(HANG_S)
        own.stop()
        own.join(HANG_S)
    assert not thread.is_alive()


def test_serve_watch_thread_syncs_several_polls_and_stops(vl_embedder, tmp_path):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app
    from faste_mm.serving.folder_sync import WatchLoop

    folder, seed = served_photo_folder(vl_embedder, tmp_path, {"lighthouse.png": 4, "tram.png": 5, "bridge.png": 6})
    watcher = FolderWatcher(Retriever(vl_embedder, collection=seed.collection), [folder],
                            WatchOptions(interval_s=3600, settle_polls=1, max_files=2, events=True))
    engine = ServeEngine(vl_embedder, Retriever(vl_embedder, collection=seed.collection), ServeConfig())
    reports = Reports()
    loop = WatchLoop(watcher, engine.batcher, on_sync=reports)
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        loop.start()
        try:
            # three new files, two a poll: the loop polls again at once for the third (no hour's wait)
            reports.wait_for(lambda: _embedded(reports) == 3, "embedded the three new files")
            assert [r.more for r in reports.seen if r.index is not None and r.index.embedded][:2] == [True, False]
            hits = client.post("/search", json={"query": "bridge", "mode": "lexical", "k": 5}).json()["hits"]
            assert [os.path.basename(h["uri"]) for h in hits] == ["bridge.png"]
            (folder / "tram.png").unlink()  # an event wakes the served watcher too
            reports.wait_for(lambda: _removed(reports) == 1, "removed tram.png")
            hits = client.post("/search", json={"query": "tram", "mode": "lexical", "k": 5}).json()["hits"]
            assert hits == []
            watch = client.get("/info").json()["collection"]["watch"]
            assert watch["in_sync"] and watch["paths"] == [str(folder)]
        finally:
            loop.stop(HANG_S)
    assert loop._thread is None and watcher.polls == len(reports.seen)
    assert _live(seed.collection) == {"harbour.png", "lighthouse.png", "bridge.png"}
