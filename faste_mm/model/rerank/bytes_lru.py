"""A least-recently-used map bounded by the bytes of its values: the one eviction rule of the caches a
reranker keeps across queries (`TowerCache`'s tower features, `ResizedImages`' resized files).
Thread-safe (the preprocessing threads share `ResizedImages`); a value larger than the bound is not
kept, and a value is made only when it will be kept (a tower output is cloned only then).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator


class BytesLRU:
    """key -> value, at most `max_bytes` of values (each kept with the size it was given).

    Example:
        >>> lru = BytesLRU(1 << 20)
        >>> lru.keep("a", 600_000, lambda: b"..." * 200_000)
        >>> lru.get("a")  # the value, now the most recently used; None when not kept
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept under `key` (marked most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def keep(self, key: Hashable, nbytes: int, make: Callable[[], Any]) -> None:
        """Keep `make()` under `key` as `nbytes` bytes, least recently used values out first; nothing
        (and no `make()`) when the key is kept already or the value alone is over the bound."""
        with self._lock:
            if nbytes > self.max_bytes or key in self._entries:
                return
            self._entries[key] = (make(), nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, old) = self._entries.popitem(last=False)
                self._bytes -= old

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def values(self) -> Iterator[Any]:
        """The kept values, least recently used first (a snapshot)."""
        with self._lock:
            return iter([value for value, _ in self._entries.values()])

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
