"""Named crash points for fault-injection tests: a writer calls `crash_point("after-part-written")`
at each step whose interruption the collection must survive; when the environment variable
`FASTE_MM_CRASH_AT` names that step, the process SIGKILLs itself there (no cleanup, no finally
blocks, like a power cut), so a test can reproduce a crash at an exact point instead of after a
random delay. `NAME#N` crashes the Nth time the point is reached (`add-after-commit#3`: after
the third commit), so a test can stop a run mid-way; `FASTE_MM_CRASH_SIGNAL=SIGINT` sends a
Ctrl-C there instead of the SIGKILL. Unset (always, outside tests) it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

CRASH_ENV = "FASTE_MM_CRASH_AT"
SIGNAL_ENV = "FASTE_MM_CRASH_SIGNAL"
_reached: Counter = Counter()  # times each point was reached in this process (for NAME#N)

# Every point a writer names, in the order they happen; tests iterate over these.
CRASH_POINTS = (
    "create-before-manifest",   # create: database made, manifest.json.tmp written, not renamed
    "add-after-part-written",   # add: part files renamed into place, SQLite not committed
    "add-after-commit",         # add: rows committed, index.faiss not updated
    "index-after-page-range",   # index (plain or --ray): a page range of a long PDF committed, not its last
    "delete-after-commit",      # delete/remove: tombstones committed, index not saved
    "compact-after-new-parts",  # compact: new parts written, SQLite still points at the old ones
    "compact-after-commit",     # compact: SQLite points at the new parts, old files not unlinked
    "index-after-replace",      # save_index: index.faiss replaced, manifest not yet updated
    "erase-after-marker",       # erase (--reindex): manifest renamed to the erasing marker
    "export-after-batch",       # export: a batch of rows handed to the writer, the export not complete
    "album-refresh-before-commit",  # albums: new items scored and their rows written, not committed
)


def crash_point(name: str) -> None:
    """SIGKILL this process if `FASTE_MM_CRASH_AT` is `name` or `name#N` and this is the Nth
    time the point is reached (see the module docstring)."""
    assert name in CRASH_POINTS, name
    wanted = os.environ.get(CRASH_ENV)
    if wanted is None or not wanted.startswith(name):
        return
    point, _, nth = wanted.partition("#")
    if point != name:
        return
    _reached[name] += 1
    if _reached[name] == int(nth or 1):
        os.kill(os.getpid(), getattr(signal, os.environ.get(SIGNAL_ENV, "SIGKILL")))
