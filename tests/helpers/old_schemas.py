"""Collections as an older schema stored them, for the migration tests: what each later schema
added to meta.sqlite is dropped again and the version set back (a real old file, not a mock)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

# What schema N added (indexers/schema.py's migrations), undone when going back below N.
ADDED_BY = {
    3: ("DROP TABLE exclusions",),
    4: ("DROP TABLE items_fts", "DROP TRIGGER items_fts_tombstone", "DROP TRIGGER items_fts_delete"),  # lexical index
    5: ("DROP TABLE items_meta", "DROP TRIGGER items_meta_insert", "DROP TRIGGER items_meta_tombstone",
        "DROP TRIGGER items_meta_delete"),  # metadata index (its id index goes with the table)
    6: ("DROP TABLE file_identity",),  # the identities of indexed files (retrieval.stored_files)
    7: ("DROP TABLE item_facts", "DROP TRIGGER item_facts_tombstone", "DROP TRIGGER item_facts_delete"),  # facts
    8: ("ALTER TABLE item_facts DROP COLUMN neighbourhood",),  # the neighbourhood beside the city people use
}


def downgrade(root: Path, version: int, db: sqlite3.Connection | None = None) -> None:
    """Make the collection at `root` a schema-`version` one (`db`: a connection already open on
    its meta.sqlite, used and closed here)."""
    db = db or sqlite3.connect(root / "meta.sqlite")
    for added in sorted(ADDED_BY, reverse=True):
        if added > version:
            for statement in ADDED_BY[added]:
                db.execute(statement)
    db.execute("UPDATE schema_version SET version = ?", (version,))
    db.commit()
    db.close()
