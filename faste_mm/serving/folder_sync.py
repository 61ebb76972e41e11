"""`serve --watch`: the thread that keeps the served collection in sync with folders. Each poll of
its `FolderWatcher` (faste_mm.retrieval.library.watching) runs on the engine's model thread, as a "task" job
of the batcher (one torch model is never run from two threads), a few files at a time, so searches
are answered between polls. Receives the watcher and the engine's way to run a poll.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from faste_mm.retrieval.library.watching import FolderWatcher, SyncReport, read_watch_status
from faste_mm.serving.batcher import Batcher

log = logging.getLogger(__name__)

# Files a poll of `serve --watch` embeds at most: the model thread answers no search meanwhile.
SERVE_SYNC_FILES = 8


class WatchLoop:
    """Polls `watcher` until stopped, each poll a "task" job of `batcher` (run on the model thread);
    without a watcher (serve without --watch) it does nothing."""

    def __init__(self, watcher: FolderWatcher | None, batcher: Batcher,
                 on_sync: Callable[[SyncReport], None] | None = None) -> None:
        self.watcher = watcher
        self._batcher = batcher
        self._on_sync = on_sync  # told each poll's report, on the watch thread (e.g. to log it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self, collection) -> dict | None:
        """The watcher's state for /info; without one, what a `faste-mm watch` process wrote (watch.json)."""
        return self.watcher.status() if self.watcher is not None else read_watch_status(collection)

    def start(self) -> None:
        if self._thread is None and self.watcher is not None:
            self._thread = threading.Thread(target=self._run, name="faste-mm-watch", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def sync(self) -> SyncReport:
        """One poll on the model thread; blocks the calling thread until it is done."""
        return self._batcher.submit("task", self.watcher.sync_once, 1).result()

    def _run(self) -> None:
        self.watcher.run(self._stop, on_sync=self._on_sync, sync=self._poll)

    def _poll(self) -> SyncReport:
        """One poll; a failure (the server shutting down, a damaged collection) is logged and reported,
        and the next poll tries again: the server keeps answering searches."""
        try:
            return self.sync()
        except Exception as error:  # noqa: BLE001 - reported in /info, retried next poll
            if not self._stop.is_set():
                log.error("watch: poll failed: %s: %s", type(error).__name__, error)
            return SyncReport(time.time(), 0, error=f"{type(error).__name__}: {error}")
