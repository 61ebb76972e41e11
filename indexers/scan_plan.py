"""Scan planning: scanned files (uri, size, mtime) against what a collection stores, split into
new, changed, unchanged and vanished (`ScanPlan`). Pure: receives the stored file stats, hands
back the plan that `retrieval.ingest` commits."""

from __future__ import annotations

from typing import Iterable, Mapping

from faste_mm.indexers.records import FileStat, ScanPlan, Status


def plan_scan(known: Mapping[str, tuple[int | None, float | None, str]], files: Iterable[FileStat],
              under: str | None = None, retry_failed: bool = False) -> ScanPlan:
    """Split scanned `files` by (uri, size, mtime) against `known` ({uri: (size, mtime, status)}
    of the live items and failures, `MetaStore.live_file_stats`).

    under: only uris equal to this prefix or below it (a path + "/") can be reported
        vanished, so scanning one folder never tombstones items of another.
    retry_failed: report unchanged files that failed last time as changed.
    """
    new, changed, unchanged, seen = [], [], [], set()
    for f in files:
        seen.add(f.uri)
        prev = known.get(f.uri)
        if prev is None:
            new.append(f)
        elif (prev[0], prev[1]) != (f.size, f.mtime) or (retry_failed and prev[2] == Status.FAILED):
            changed.append(f)
        else:
            unchanged.append(f)
    prefix = None if under is None else under.rstrip("/")
    vanished = sorted(u for u in known if u not in seen and (
        prefix is None or u == prefix or u.startswith(prefix + "/")))
    return ScanPlan(tuple(new), tuple(changed), tuple(unchanged), tuple(vanished))
