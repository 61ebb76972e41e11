"""The rows of schema 7's `item_facts` table (one per live item that has facts) and the words an
item gives the lexical index's `meta` column (its metadata values, then its facts' words).
Receives a connection inside `store.MetaStore`'s transaction; every statement binds its values.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from faste_mm.indexers import facts as item_facts
from faste_mm.indexers.facts import ItemFacts
from faste_mm.indexers.schema import id_list, metadata_words, to_db

if TYPE_CHECKING:
    from faste_mm.indexers.records import ItemRecord


def lexical_meta(metadata: Mapping[str, Any] | None, facts: ItemFacts | None) -> str | None:
    """The `meta` column of an item's lexical row: its metadata values, then its facts' words."""
    words = " ".join(w for w in (metadata_words(metadata), to_db(facts.words()) if facts else None) if w)
    return words or None


def insert_facts(db: sqlite3.Connection, pairs: Sequence[tuple[int, ItemFacts]]) -> None:
    """Write (or replace) the facts row of each (item id, facts)."""
    if pairs:
        marks = ", ".join("?" * (2 + len(item_facts.COLUMNS)))
        db.executemany(f"INSERT OR REPLACE INTO item_facts (id, version, {', '.join(item_facts.COLUMNS)}) "
                       f"VALUES ({marks})", [item_facts.to_row(i, f) for i, f in pairs])


def set_facts(db: sqlite3.Connection, pairs: Sequence[tuple["ItemRecord", ItemFacts]]) -> None:
    """Give live items (records as read, with id and metadata) these facts, and their lexical rows
    the facts' words: a re-scan filling the facts of items stored before, no vector touched."""
    insert_facts(db, [(int(r.id), f) for r, f in pairs])
    db.executemany("UPDATE items_fts SET meta = ? WHERE rowid = ?",
                   [(lexical_meta(r.metadata, f), int(r.id)) for r, f in pairs])


def facts_of(db: sqlite3.Connection, ids: Sequence[int]) -> dict[int, ItemFacts]:
    """{id: facts} of the items among `ids` that have a facts row."""
    rows = db.execute(f"SELECT id, {_stored_columns(db)} FROM item_facts "
                      "WHERE id IN (SELECT value FROM json_each(?))", (id_list(ids),)).fetchall()
    return {row[0]: item_facts.from_row(row[1:]) for row in rows}


def _stored_columns(db: sqlite3.Connection) -> str:
    """COLUMNS as a select list, NULL for a column the file lacks (a reader of a schema 7 file has no
    `neighbourhood`: readers do not migrate)."""
    stored = {row[1] for row in db.execute("PRAGMA table_info(item_facts)")}
    return ", ".join(name if name in stored else "NULL" for name in item_facts.COLUMNS)


def places(db: sqlite3.Connection) -> list[tuple[str | None, str | None, str | None, str | None]]:
    """The distinct (neighbourhood, city, region, country) of the live items' facts (one row per
    place, not per item: what query understanding matches names against)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'item_facts'").fetchone():
        return []
    columns = _stored_columns(db).split(", ")
    chosen = [columns[item_facts.COLUMNS.index(name)] for name in ("neighbourhood", "city", "region", "country")]
    return db.execute(f"SELECT DISTINCT {', '.join(chosen)} FROM item_facts JOIN items ON items.id = item_facts.id "
                      f"WHERE items.status = 'ok' AND (city IS NOT NULL OR region IS NOT NULL OR country IS NOT "
                      f"NULL)").fetchall()


def rows_without_facts(db: sqlite3.Connection, columns: str, uris: Sequence[str]) -> list[tuple]:
    """The `columns` of the live items of `uris` with no facts row, or one an older extractor wrote."""
    return db.execute(
        f"SELECT {columns} FROM items LEFT JOIN item_facts AS f ON f.id = items.id WHERE items.status = 'ok' "
        "AND items.uri IN (SELECT value FROM json_each(?)) AND (f.id IS NULL OR f.version < ?) ORDER BY items.id",
        (json.dumps([to_db(u) for u in uris]), item_facts.FACTS_VERSION)).fetchall()


def summary(db: sqlite3.Connection) -> dict[str, Any]:
    """What `info` says of the live items' facts: how many have facts, a date from the file (not its
    mtime), a GPS position, keywords; the first and last date taken (UTC ISO 8601, or None)."""
    row = db.execute(
        "SELECT count(*), sum(taken_source IS NOT NULL AND taken_source != 'mtime'), sum(lat IS NOT NULL), "
        "sum(keywords != '[]'), min(CASE WHEN taken_source != 'mtime' THEN taken END), "
        "max(CASE WHEN taken_source != 'mtime' THEN taken END) "
        "FROM item_facts JOIN items ON items.id = item_facts.id WHERE items.status = 'ok'").fetchone()
    iso = lambda t: None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()  # noqa: E731
    return {"items": row[0], "dated": row[1] or 0, "with_gps": row[2] or 0, "with_keywords": row[3] or 0,
            "taken_first": iso(row[4]), "taken_last": iso(row[5])}
