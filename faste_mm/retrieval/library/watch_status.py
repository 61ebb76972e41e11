"""A collection's `watch.json` (written by `faste-mm watch` and `serve --watch`, see `watching`)
read back, and `info`'s one line on it. Standard library only: `faste-mm info` answered by a
running server reads it without importing the index machinery (no FAISS, no numpy)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from faste_mm.indexers.file_names import WATCH_FILE


def read_watch_status(root: str | os.PathLike) -> dict[str, Any] | None:
    """The watch.json a watcher of the collection at `root` wrote (None when none did); its
    `last_poll_at` says how fresh it is (a watcher rewrites it at least every STATUS_REFRESH_S)."""
    path = Path(root) / WATCH_FILE
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def describe_watch(status: dict[str, Any] | None, now: float | None = None) -> str:
    """One line for `info`: the watched paths, the last poll and what it left ("-" when never watched)."""
    if not status:
        return "-"
    ago = (time.time() if now is None else now) - (status.get("last_poll_at") or 0)
    state = ("in sync" if status.get("in_sync") else f"not synced: {status['error']}" if status.get("error")
             else f"{status.get('waiting') or 0} files being written")
    syncing = status.get("syncing")
    if syncing:
        state = f"syncing {syncing['files_done']}/{syncing['files_total']} files"
    return f"{', '.join(status.get('paths', []))}: {state}, last poll {ago:.0f} s ago (pid {status.get('pid')})"
