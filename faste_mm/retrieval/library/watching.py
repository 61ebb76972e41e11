"""A folder kept in sync with a collection (`faste-mm watch`, `serve --watch`): poll the watched
paths (a stat walk, which works on NFS/SMB and past inotify's watch limit), wait until each new or
changed file has kept its size and mtime for `settle_polls` polls (a copy in progress is left alone),
then hand the scan to the same index run as `faste-mm index` (`Retriever.index_scan`): new and
changed files embedded, vanished ones removed after, a moved file reusing its vector by content
hash, removed paths staying out, the same chunked, crash-safe commits.

Receives a `Retriever` and paths; hands back a `SyncReport` per poll and writes the last one to the
collection's `watch.json`, which `info` and serve's /info show. Polls are explicit (`sync_once`), so
tests drive them step by step; `run` loops them with a wait, woken early by native file events when
`watchdog` is installed and asked for.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.indexers.file_names import WATCH_FILE
from faste_mm.retrieval.results import IndexOptions, IndexProgress, IndexReport
from faste_mm.retrieval.scanning import Scan, ScannedFile, scan_paths
from faste_mm.retrieval.library.watch_status import describe_watch, read_watch_status  # noqa: F401 (their old home)

log = logging.getLogger(__name__)

# watch.json is rewritten when a poll changes something, else at most this often (the "last sync"
# time `info` shows is this fresh while idle; an idle poll writes nothing in between).
STATUS_REFRESH_S = 60.0
# ... and during a sync, with its progress, at most this often.
PROGRESS_REFRESH_S = 5.0
# With native events, the wait before the next poll while files settle (not the whole interval:
# an event-driven watcher may poll rarely, and a new file's last write raises no further event).
EVENT_SETTLE_S = 1.0
# How long stopping waits for watchdog's observer thread (a daemon: a stuck one never holds the exit).
OBSERVER_STOP_S = 10.0


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """How a folder is watched.

    interval_s: seconds between polls (the loop's wait; a poll with work starts the next at once).
    settle_polls: a new or changed file is embedded once its (size, mtime) was the same in this many
        consecutive polls (2: seen unchanged across one interval), so a file still being copied or
        written is not embedded half-done.
    max_files: files embedded per poll (None: every ready one); `serve --watch` embeds on the model
        thread, and a small number lets searches run between polls.
    events: wake early on native file events (needs `watchdog`; polling stays the truth); files
        waiting to settle are then polled again after EVENT_SETTLE_S, not interval_s.
    index: the index run's options (exclude, include_hidden, chunk sizes).
    """

    interval_s: float = 5.0
    settle_polls: int = 2
    max_files: int | None = None
    events: bool = False
    index: IndexOptions = field(default_factory=IndexOptions)

    def __post_init__(self) -> None:
        if isinstance(self.interval_s, bool) or not isinstance(self.interval_s, (int, float)) or not self.interval_s > 0:
            raise ConfigError(f"WatchOptions.interval_s must be a number of seconds > 0, got {self.interval_s!r}")
        if isinstance(self.settle_polls, bool) or not isinstance(self.settle_polls, int) or self.settle_polls < 1:
            raise ConfigError(f"WatchOptions.settle_polls must be an int >= 1 (1: embed at first sight), "
                              f"got {self.settle_polls!r}")
        if self.max_files is not None and (isinstance(self.max_files, bool) or not isinstance(self.max_files, int)
                                           or self.max_files < 1):
            raise ConfigError(f"WatchOptions.max_files must be None or an int >= 1, got {self.max_files!r}")
        if self.index.reindex:
            raise ConfigError("WatchOptions.index: a watcher never re-indexes (reindex=True would erase the "
                              "collection at every change); run `index --reindex` once instead")


@dataclass(frozen=True, slots=True)
class SyncReport:
    """One poll: when it ended (`at`, seconds since the epoch), files found under the watched paths,
    files waiting to settle, whether ready files were left for the next poll (`more`, max_files),
    the index run (None: nothing changed since the last poll, nothing was opened), and why the poll
    could not sync (`error`, e.g. another process writes to the collection; retried next poll)."""

    at: float
    n_files: int
    waiting: int = 0
    more: bool = False
    index: IndexReport | None = None
    error: str | None = None
    empty_roots: tuple[str, ...] = ()  # watched folders found empty: nothing under them removed
    # Watched folders no longer the folder pinned at start (replaced, or swapped for a link), each
    # with why: not read, nothing under them removed, until they are that folder again.
    stopped_roots: tuple[str, ...] = ()

    @property
    def is_idle(self) -> bool:
        return self.index is None and self.error is None and not self.waiting

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["index"] = None if self.index is None else self.index.to_dict()
        d["empty_roots"] = list(self.empty_roots)
        d["stopped_roots"] = list(self.stopped_roots)
        return d


class FolderWatcher:
    """Keeps the retriever's collection in sync with `paths` (folders or files), poll by poll.

    Example:
        >>> watcher = FolderWatcher(Retriever.for_collection("photos"), ["~/Pictures"])
        >>> watcher.sync_once()           # one poll; a new file is embedded at its second poll
        >>> watcher.run(threading.Event())  # poll every interval_s until the event is set
    """

    def __init__(self, retriever, paths: Iterable[str | os.PathLike], options: WatchOptions | None = None,
                 progress: Callable[[IndexProgress], None] | None = None) -> None:
        self.retriever = retriever
        self.paths = tuple(Path(p).expanduser() for p in paths)
        if not self.paths:
            raise ConfigError("watch: give at least one folder or file to watch")
        self.options = options or WatchOptions()
        self._progress = progress
        self._filter = self.options.index.scan_filter
        # Each watched folder pinned by its identity now: a poll reads it only while it is still that
        # folder, so one swapped for a link (to /etc, say) is never walked (`_check_roots`).
        self._pins: dict[Path, _PinnedRoot | str | None] = {path: _pin(path) for path in self.paths}
        self._absent_at_start = {path for path in self.paths if not os.path.lexists(path)}
        self._stopped: dict[Path, str] = {}  # watched path -> why its sync is stopped
        self._streaks: dict[str, tuple[tuple[int, float], int]] = {}  # uri -> ((size, mtime), polls seen so)
        self._last: dict[str, tuple[int, float]] | None = None  # the previous scan's stats
        self._fingerprint: dict[str, tuple] | None = None  # the previous poll's bare stat walk (`_fingerprint`)
        self._is_clean = False  # the last poll left nothing waiting, nothing held back, no error
        self._status_written = 0.0
        self.polls = 0
        self.last: SyncReport | None = None
        self.progress: IndexProgress | None = None  # of the sync in progress (None between syncs)

    def sync_once(self) -> SyncReport:
        """One poll: scan, and when anything changed since the last poll, run the index over the
        files that have settled. Raises CollectionError for a problem of the collection itself
        (settings, damage); another writer holding it is reported in the result and retried."""
        self.polls += 1
        paths = self._check_roots()
        stopped = tuple(self._stopped.values())
        if not paths:
            self._is_clean = False
            return self._finish(SyncReport(time.time(), 0, stopped_roots=stopped))
        fingerprint = _fingerprint(paths)  # a bare stat walk: ~20x cheaper than a scan
        if fingerprint == self._fingerprint and self._is_clean:
            return self._finish(SyncReport(time.time(), len(self._last or ()), stopped_roots=stopped))  # idle
        self._fingerprint = fingerprint
        scan = scan_paths(paths, self._filter)
        if self._check_roots() != paths:  # a folder swapped during the walk: its files are not indexed
            self._is_clean = False
            return self._finish(SyncReport(time.time(), 0, stopped_roots=tuple(self._stopped.values())))
        stats = {f.uri: (f.stat.size, f.stat.mtime) for f in scan.files()}
        self._count_streaks(stats)
        if stats == self._last and self._is_clean:
            return self._finish(SyncReport(time.time(), len(stats)))  # e.g. an excluded file changed
        self._last = stats
        scan, empty = _without_empty_roots(scan)
        waiting: list[str] = []
        taken: list[str] = []
        held: list[str] = []

        def ready(f: ScannedFile) -> bool:
            if self._streaks[f.uri][1] < self.options.settle_polls:
                waiting.append(f.uri)
                return False
            if self.options.max_files is not None and len(taken) >= self.options.max_files:
                held.append(f.uri)
                return False
            taken.append(f.uri)
            return True

        try:
            index = self.retriever.index_scan(scan, self.options.index, self._on_progress, ready=ready)
        except CollectionError as error:
            if not _is_busy(error):
                raise
            self._is_clean = False
            return self._finish(SyncReport(time.time(), len(stats), len(waiting), bool(held), error=str(error),
                                           empty_roots=empty, stopped_roots=stopped))
        finally:
            self.progress = None
        self._is_clean = not waiting and not held
        return self._finish(SyncReport(time.time(), len(stats), len(waiting), bool(held), index, empty_roots=empty,
                                       stopped_roots=stopped))

    def _check_roots(self) -> list[Path]:
        """The watched paths to poll now: each folder as its resolved path pinned at start (or when it
        first appeared), while it is still that folder (same resolved path, device and inode); the
        others are stopped, with why, logged once when it happens and again when the folder is back.
        Files are not pinned (an editor's save replaces a file's inode)."""
        active = []
        for path, pin in self._pins.items():
            if path in self._absent_at_start and os.path.lexists(path):  # pinned as it first appears
                self._absent_at_start.discard(path)
                pin = self._pins[path] = _first_sight(path)
            why = _root_change(path, pin) if isinstance(pin, _PinnedRoot) else pin
            if why is None and path in self._stopped:
                log.warning("watch: %s is the folder watched since the start again; its sync goes on", path)
                del self._stopped[path]
            elif why is not None and path not in self._stopped:
                log.warning("watch: %s", why)
                self._stopped[path] = why
            if why is None:
                active.append(path if pin is None else Path(pin.resolved))
        return active

    def run(self, stop: threading.Event, on_sync: Callable[[SyncReport], None] | None = None,
            sync: Callable[[], SyncReport] | None = None) -> None:
        """Poll until `stop` is set: a poll, then a wait of `interval_s` (none while ready files
        are held back by max_files), cut short by `stop` or, with `events`, by a file event.
        sync: what one poll runs (default `sync_once`; serve runs it on its model thread)."""
        sync = sync or self.sync_once
        wake = threading.Event() if self.options.events else None
        observer = _start_events(self.paths, wake) if wake is not None else None
        try:
            while not stop.is_set():
                if wake is not None:
                    wake.clear()  # before the poll: an event during it wakes the next poll, never lost
                report = sync()
                if on_sync is not None:
                    on_sync(report)
                if report.more:
                    continue
                events = observer is not None
                # with events, files waiting to settle are looked at again soon: a write to them wakes
                # the watcher (and restarts their count), so a quiet EVENT_SETTLE_S means they are done
                wait_s = min(self.options.interval_s, EVENT_SETTLE_S) if events and report.waiting else self.options.interval_s
                _wait_any(stop, wake if events else None, wait_s)
        finally:
            if observer is not None:
                observer.stop()
                observer.join(OBSERVER_STOP_S)

    def _count_streaks(self, stats: dict[str, tuple[int, float]]) -> None:
        """Count, per file, the consecutive polls that saw its current (size, mtime)."""
        previous = self._streaks
        self._streaks = {uri: (stat, previous[uri][1] + 1 if uri in previous and previous[uri][0] == stat else 1)
                         for uri, stat in stats.items()}

    def _on_progress(self, progress: IndexProgress) -> None:
        self.progress = progress
        if self._progress is not None:
            self._progress(progress)
        if time.time() - self._status_written >= PROGRESS_REFRESH_S:  # a long sync shows its progress in info
            self._write_status(time.time())

    def _finish(self, report: SyncReport) -> SyncReport:
        previous, self.last = self.last, report
        if report.error:
            log.warning("watch: %s", report.error)
        changed = previous is None or not report.is_idle or (previous.waiting, previous.error) != (0, None)
        if changed or report.at - self._status_written >= STATUS_REFRESH_S:
            self._write_status(report.at)
        return report

    def status(self) -> dict[str, Any]:
        """What `info` and /info show: the watched paths, the last poll, the sync in progress."""
        return watch_status(self.paths, self.options, self.last, self.progress)

    def _write_status(self, at: float) -> None:
        """watch.json in the collection folder (atomic; advisory, so a failure is only logged)."""
        self._status_written = at
        payload = json.dumps(self.status()).encode()
        try:
            atomic_write(Path(self.retriever.collection) / WATCH_FILE, lambda f: f.write(payload))
        except OSError as error:
            log.warning("watch: cannot write %s (%s)", WATCH_FILE, error)


def watch_status(paths: Iterable[Path], options: WatchOptions, last: SyncReport | None,
                 progress: IndexProgress | None) -> dict[str, Any]:
    """The watcher's state as JSON-ready data (see `FolderWatcher.status`)."""
    index = None if last is None or last.index is None else last.index
    return {"pid": os.getpid(), "paths": [str(p) for p in paths], "interval_s": options.interval_s,
            "last_poll_at": None if last is None else last.at,
            "in_sync": last is not None and last.error is None and not last.waiting and not last.more,
            "files": None if last is None else last.n_files, "waiting": None if last is None else last.waiting,
            "error": None if last is None else last.error,
            "stopped_roots": [] if last is None else list(last.stopped_roots),
            "last_change": None if index is None else {"embedded": index.embedded, "reused": index.reused,
                                                        "removed": index.removed, "failed": index.failed},
            "syncing": None if progress is None else {"files_done": progress.files_done,
                                                      "files_total": progress.files_total}}


@dataclass(frozen=True, slots=True)
class _PinnedRoot:
    """A watched folder's identity at start: where it resolved to, its device and inode."""

    resolved: str
    dev: int
    ino: int


def _pin(path: Path) -> _PinnedRoot | None:
    """`path`'s identity if it is a folder now; None for a file (rewritten by rename, a file keeps
    no inode) or a path not there (scanned as a missing path each poll)."""
    try:
        resolved = os.path.realpath(path, strict=True)
        st = os.stat(resolved, follow_symlinks=False)
    except (OSError, RuntimeError):
        return None
    return _PinnedRoot(resolved, st.st_dev, st.st_ino) if os.path.isdir(resolved) else None


def _first_sight(path: Path) -> _PinnedRoot | str | None:
    """The pin of a watched path that was not there at start, now that it is: a folder is pinned as
    found; a link is refused (why, a str: nothing the watcher was started on says where it may lead);
    a file needs none (None)."""
    if os.path.islink(path):
        return (f"{path} appeared as a link (to {os.path.realpath(path)}) after watch started; its sync is stopped "
                f"and nothing under it is read (restart watch to watch what is there now)")
    return _pin(path)


def _root_change(path: Path, pin: _PinnedRoot) -> str | None:
    """Why the watched folder `path` is no longer the one pinned at start; None while it is."""
    stop = ("; its sync is stopped and nothing under it is read or removed until it is that folder again "
            "(restart watch to watch what is there now)")
    try:
        resolved = os.path.realpath(path, strict=True)
        st = os.stat(resolved, follow_symlinks=False)
    except (OSError, RuntimeError) as error:
        return f"{path}: the watched folder cannot be reached ({error}){stop}"
    if resolved != pin.resolved:
        return f"{path} now leads to {resolved}, not the folder watched since the start ({pin.resolved}){stop}"
    if (st.st_dev, st.st_ino) != (pin.dev, pin.ino):
        return f"{path} was replaced by another folder (another device or inode than at start){stop}"
    return None


def _fingerprint(paths: Iterable[Path]) -> dict[str, tuple]:
    """Every entry under `paths` (hidden and excluded ones too) with its size and mtime in ns, by an
    os.scandir walk that follows no folder link: equal to the last poll's, nothing a scan would see
    changed. A file link's target is stat'ed (a scan indexes the target)."""
    seen: dict[str, tuple] = {}
    stack = [str(p) for p in paths]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except NotADirectoryError:
            entries = None
        except OSError as error:
            seen[top] = ("unreadable", error.errno)
            continue
        if entries is None:
            seen[top] = _stat_key(top)
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                seen[entry.path] = _stat_key(entry.path)
    return seen


def _stat_key(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError as error:
        return ("unreadable", error.errno)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _without_empty_roots(scan: Scan) -> tuple[Scan, tuple[str, ...]]:
    """`scan` without the watched folders in which no file was found: an unmounted share or a
    drive not plugged in looks like an empty folder, and removing every item under it would cost a
    full re-embed when it is back. A folder the user really emptied: `faste-mm remove` it."""
    empty = tuple(root for root, found in scan.roots if not found)
    if not empty:
        return scan, ()
    log.warning("watch: %s holds no files (unmounted?); nothing under it is removed", ", ".join(empty))
    return replace(scan, roots=tuple((root, found) for root, found in scan.roots if found)), empty


def _is_busy(error: CollectionError) -> bool:
    """Another process holds the collection's writer lock (`index` run by hand, say): try again later."""
    return "another faste-mm process" in str(error) and "is writing" in str(error)


def _wait_any(stop: threading.Event, wake: threading.Event | None, timeout_s: float) -> None:
    """Block until `stop` (or, with events, `wake`) is set, or `timeout_s` passed. Without events one
    wait on `stop`: an idle watcher's thread sleeps, costing no CPU between polls."""
    if wake is None:
        stop.wait(timeout_s)
        return
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and not wake.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        wake.wait(min(remaining, 1.0))  # `stop` is looked at once a second while events are on


def _start_events(paths: tuple[Path, ...], wake: threading.Event):
    """A watchdog observer setting `wake` on any event under `paths`; None (logged) when watchdog is
    not installed or the system refuses more watches: polling alone keeps the folder in sync."""
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
    except ImportError:
        log.warning("watch: native file events need watchdog (pip install 'faste-mm[watch]'); polling only")
        return None

    class _Wake(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            wake.set()

    observer = Observer()
    try:
        for path in paths:
            observer.schedule(_Wake(), str(path if path.is_dir() else path.parent), recursive=path.is_dir())
        observer.start()
    except OSError as error:  # e.g. inotify's watch limit reached
        log.warning("watch: native file events unavailable (%s); polling only", error)
        return None
    return observer
