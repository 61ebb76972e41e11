"""What a store remembers between searches of an unchanged file: the counters every search checks
(state, parts, tombstone count), the ids of recent `where` filters and the row locations of
recently rescored id sets. Receives the store's version
(`MetaStore.version`, which moves whenever any connection may have changed the file) and the reads;
hands back the value read under the current version, reading again only after the version moved.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

# Values of one kind (a `where` filter's matching ids, a rescored id set's row locations) remembered
# while the file is unchanged: the most recently used of each kind.
FILTERS_REMEMBERED = 8


class Remembered:
    """Values read from one SQLite connection, kept until `version()` changes (see the module docstring)."""

    def __init__(self, version: Callable[[], tuple[int, int]]) -> None:
        self._version = version
        self._values: dict[Hashable, Any] = {}
        self._read_at: tuple[int, int] | None = None

    def get(self, name: Hashable, read: Callable[[], Any]) -> Any:
        """`read()`, or what it returned under the current version."""
        version = self._version()
        if version != self._read_at:
            self._values, self._read_at = {}, version
        if name not in self._values:
            self._values[name] = read()
        return self._values[name]

    def recent(self, kind: str, key: Hashable, read: Callable[[], Any]) -> Any:
        """`get` for a value of `kind`; only the FILTERS_REMEMBERED most recently used of each kind are kept."""
        name = (kind, key)
        value = self.get(name, read)
        self._values[name] = self._values.pop(name)  # the newest use last: least recently used out first
        same = [kept for kept in self._values if isinstance(kept, tuple) and kept[0] == kind]
        for oldest in same[:-FILTERS_REMEMBERED]:
            del self._values[oldest]
        return value

    def forget(self) -> None:
        """Drop everything (a rolled-back transaction: what was read inside it never happened, yet the
        connection's row count, half of the version, does not go back)."""
        self._read_at = None
