"""Named crash points for fault-injection tests: a writer calls `crash_point("after-part-written")`
at each step whose interruption the collection must survive; when the environment variable
`FASTE_MM_CRASH_AT` names that step, the process SIGKILLs itself there (no cleanup, no finally
blocks, like a power cut), so a test can reproduce a crash at an exact point instead of after a
random delay. Unset (always, outside tests) it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "FASTE_MM_CRASH_AT"

# Every point a writer names, in the order they happen; tests iterate over these.
CRASH_POINTS = (
    "create-before-manifest",   # create: database made, manifest.json.tmp written, not renamed
    "add-after-part-written",   # add: part files renamed into place, SQLite not committed
    "add-after-commit",         # add: rows committed, index.faiss not updated
    "index-after-page-range",   # index: a long PDF's first page range committed, the rest not embedded
    "delete-after-commit",      # delete/remove: tombstones committed, index not saved
    "compact-after-new-parts",  # compact: new parts written, SQLite still points at the old ones
    "compact-after-commit",     # compact: SQLite points at the new parts, old files not unlinked
    "index-after-replace",      # save_index: index.faiss replaced, manifest not yet updated
    "erase-after-marker",       # erase (--reindex): manifest renamed to the erasing marker
)


def crash_point(name: str) -> None:
    """SIGKILL this process if `FASTE_MM_CRASH_AT` is `name` (see the module docstring)."""
    assert name in CRASH_POINTS, name
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
