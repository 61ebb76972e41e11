"""meta.sqlite's `file_identity` table (schema 6): the device and inode of each indexed file, by
uri. A file read again at request time must still be the one indexed, not something planted under
its name since (`faste_mm.retrieval.stored_files`). Receives a connection inside the caller's
transaction and (uri, dev, ino) rows; hands back the SQL a record is read with.
"""

from __future__ import annotations

import sqlite3
from typing import Sequence

from faste_mm.indexers.schema import to_db

# A record's identity columns (after the item's own): NULL for a file older than schema 6, which a
# reader opens as it is (no table), and for files indexed before it (no row until the next index).
_IDENTITY_COLUMNS = ("(SELECT dev FROM file_identity AS f WHERE f.uri = items.uri), "
                     "(SELECT ino FROM file_identity AS f WHERE f.uri = items.uri)")


def identity_columns(db: sqlite3.Connection) -> str:
    """The SQL of a record's (dev, ino) in a SELECT over `items`."""
    has = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'file_identity'").fetchone() is not None
    return _IDENTITY_COLUMNS if has else "NULL, NULL"


def set_identities(db: sqlite3.Connection, identities: Sequence[tuple[str, int, int]], keep: bool = False) -> None:
    """Record (uri, dev, ino) of indexed files, replacing what a uri had (keep: only for uris that
    have none: `Collection.fill_identities`)."""
    db.executemany(f"INSERT OR {'IGNORE' if keep else 'REPLACE'} INTO file_identity (uri, dev, ino) VALUES (?, ?, ?)",
                   [(to_db(uri), int(dev), int(ino)) for uri, dev, ino in identities])


def drop_orphans(db: sqlite3.Connection) -> None:
    """Forget the identities of uris no row names any more (after `compact` purges tombstones)."""
    db.execute("DELETE FROM file_identity WHERE uri NOT IN (SELECT uri FROM items)")
