"""The order test files start in: `pytest -n 2 --dist loadfile` (the README's command) hands
each worker whole files in collection order. xdist's default order (most tests first) started a
file of two long Ray tests near the end of a run and left the other worker idle for a minute;
the longest files first leave only short ones for the end."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import pytest

# The files that take longest on two workers (a local Ray cluster, a browser, a docs page's
# commands, servers and their clients), longest first. An order, not a promise: a file left out
# just starts later (tests/test_test_helpers.py checks that each one still exists).
LONGEST_FILES = (
    "test_docs_blocks.py", "test_ray_index.py", "test_preprocessor_cache.py", "test_search_request_walk.py",
    "test_search_crop.py", "test_security_data.py", "test_mcp_stdio.py", "test_quiet_terminal.py",
    "test_bench.py", "test_understood_search.py", "test_albums_serve.py", "test_mcp_http.py",
)


def longest_files_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """`items` with `LONGEST_FILES` first, the other files after them, most tests first (xdist's
    own order), by name on a tie; the tests of a file keep their order."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    counts = Counter(item.path.name for item in items)
    return sorted(items, key=lambda item: (rank.get(item.path.name, len(rank)), -counts[item.path.name],
                                           item.path.name))
