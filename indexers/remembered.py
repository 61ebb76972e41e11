"""What a store remembers between searches of an unchanged file: the counters every search checks
(state, parts, tombstone count), the ids of recent `where` filters and the row locations of id
sets rescored more than once. Receives the store's version
(`MetaStore.version`, which moves whenever any connection may have changed the file) and the reads;
hands back the value read under the current version, reading again only after the version moved.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

# Values of one kind (a `where` filter's matching ids, a rescored id set's row locations) remembered
# while the file is unchanged: the most recently used of each kind.
RECENT_KEPT = 8
# Keys `seen` tells apart (16-byte digests: an id set is remembered once asked for twice among them).
SEEN_KEPT = 256


class Remembered:
    """Values read from one SQLite connection, kept until `version()` changes (see the module docstring)."""

    def __init__(self, version: Callable[[], tuple[int, int]]) -> None:
        self._version = version
        self._values: dict[Hashable, Any] = {}
        self._recent: dict[str, OrderedDict] = {}  # kind -> key -> value, least recently used first
        self._read_at: tuple[int, int] | None = None

    def _current(self) -> None:
        version = self._version()
        if version != self._read_at:
            self._values, self._recent, self._read_at = {}, {}, version

    def get(self, name: Hashable, read: Callable[[], Any]) -> Any:
        """`read()`, or what it returned under the current version."""
        self._current()
        if name not in self._values:
            self._values[name] = read()
        return self._values[name]

    def recent(self, kind: str, key: Hashable, read: Callable[[], Any], keep: int = RECENT_KEPT) -> Any:
        """`get` for a value of `kind`; only the `keep` most recently used of each kind are kept."""
        self._current()
        kept = self._recent.setdefault(kind, OrderedDict())
        if key in kept:
            kept.move_to_end(key)
        else:
            kept[key] = read()
            while len(kept) > keep:
                kept.popitem(last=False)
        return kept[key]

    def seen(self, kind: str, key: Hashable) -> bool:
        """Whether `key` of `kind` was asked about before under this version (among the SEEN_KEPT latest)."""
        self._current()
        before = key in self._recent.get(kind, ())
        self.recent(kind, key, lambda: True, keep=SEEN_KEPT)
        return before

    def forget(self) -> None:
        """Drop everything (a rolled-back transaction: what was read inside it never happened, yet the
        connection's row count, half of the version, does not go back)."""
        self._read_at = None
