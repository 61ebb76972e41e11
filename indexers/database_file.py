"""meta.sqlite as a file: its name, its row count read without opening a store, and SQLite errors
in a collection's words (a busy database says wait; a read-only file, a full disk or a file SQLite
may not open say so, the data being intact; anything else is damage, with the advice to restore or
re-index). `translate_errors` applies this to every public method of `store.MetaStore`.
"""

from __future__ import annotations

import errno
import functools
import sqlite3
from pathlib import Path

from faste_mm.errors import CollectionError
from faste_mm.indexers.atomic_files import storage_error

DB_NAME = "meta.sqlite"


# SQLite's messages for conditions that are not damage -> the errno whose words `storage_error` uses.
_SQLITE_NOT_DAMAGE = (("readonly", errno.EROFS), ("disk is full", errno.ENOSPC),
                      ("unable to open database file", errno.EACCES))


def damaged_database(path: Path, error: sqlite3.Error) -> CollectionError:
    """The CollectionError for an SQLite error: a busy database says wait; a read-only file, a
    full disk or a file it may not open say so (the data is intact); anything else is damage."""
    if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
        return CollectionError(f"{path}: the database is busy ({error}); wait for the other faste-mm "
                               f"process to finish and try again")
    for words, code in _SQLITE_NOT_DAMAGE:
        if isinstance(error, sqlite3.OperationalError) and words in str(error):
            return storage_error(path, OSError(code, str(error)))
    return CollectionError(f"{path}: the database cannot be read ({error}); the collection is damaged. "
                           f"Restore {DB_NAME} from a backup, or re-index with `--reindex`")


def translate_errors(cls):
    """Wrap every public method of `cls` so that an sqlite3.Error (a truncated or garbage file
    surfaces at the first query that touches a bad page, not at connect) becomes a
    CollectionError naming the file."""
    def wrap(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except sqlite3.Error as error:
                raise damaged_database(self.path, error) from None
        return wrapper

    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_") and name != "transaction":
            setattr(cls, name, wrap(value))
    return cls


def count_items(path: Path) -> int:
    """Rows in the items table of the database at `path` without migrating or writing it: 0 when
    the file or the table does not exist (a create killed before its schema committed).
    Raises CollectionError for a file SQLite cannot read."""
    if not path.exists():
        return 0
    try:
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True)
        try:
            has_table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                   ("items",)).fetchone()
            return db.execute("SELECT count(*) FROM items").fetchone()[0] if has_table else 0
        finally:
            db.close()
    except sqlite3.Error as e:
        raise CollectionError(f"{path}: not a readable faste-mm database ({e}); restore it from a backup, "
                              f"or delete the folder yourself to index into it from scratch") from None
