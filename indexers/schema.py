"""meta.sqlite's schema: its version, the stepwise migrations that bring an older file up to it,
and the escaping of text SQLite cannot hold (file names with undecodable bytes). Receives a
connection inside the caller's transaction; `store.MetaStore` runs the steps when a writer opens.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any, Iterable, Mapping

import numpy as np

from faste_mm.indexers.facts import COLUMNS as FACT_COLUMNS

SCHEMA_VERSION = 9
# Readers accept files this old: the migrations after it only add tables a reader can do without
# (exclusions, the lexical index, the metadata index, the facts, the albums) or escape a character no real name holds (see ESC).
READABLE_FROM_VERSION = 1


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    _execute_script(db, """
        CREATE TABLE parts (
            part INTEGER PRIMARY KEY,
            n_rows INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE items (
            id INTEGER PRIMARY KEY,
            uri TEXT NOT NULL,
            page INTEGER,
            modality TEXT NOT NULL,
            size INTEGER,
            mtime REAL,
            content_hash TEXT,
            status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'deleted')),
            error TEXT,
            added_at REAL NOT NULL,
            metadata TEXT,
            part INTEGER REFERENCES parts(part),
            row INTEGER
        );
        -- (uri, page) is unique among live rows; NULL pages compare equal through ifnull.
        CREATE UNIQUE INDEX items_live_uri_page ON items (uri, ifnull(page, -1))
            WHERE status != 'deleted';
        -- Plain (non-partial) uri index: the partial one above cannot serve `status = ?`
        -- lookups, and without this every replace/scan query would scan the whole table.
        CREATE INDEX items_uri ON items (uri);
        -- Every search counts tombstoned vectors: that must not scan all rows. Partial, so the
        -- planner never prefers it over items_uri for per-uri lookups (a plain status index
        -- would be, and each replace would then scan the whole table).
        CREATE INDEX items_tombstoned ON items (part) WHERE status = 'deleted';
        CREATE INDEX items_content_hash ON items (content_hash) WHERE content_hash IS NOT NULL;
        CREATE INDEX items_part ON items (part) WHERE part IS NOT NULL;
        CREATE TABLE state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        -- next_id/next_part only grow, so ids and part numbers are never reused;
        -- epoch changes when parts are rewritten (compact), which invalidates index.faiss.
        INSERT INTO state (key, value) VALUES ('next_id', 0), ('next_part', 0), ('epoch', 0);
    """)


# File names need not be valid UTF-8; Python decodes such bytes to lone surrogates
# (os.fsdecode), which SQLite text cannot hold. Stored text escapes each one as ESC + two hex
# digits, and ESC itself as ESC ESC (a private-use character no real name is expected to hold;
# doubling keeps even that one lossless). The escape maps character by character, so a prefix
# stays a prefix and `live_uris`' range query still finds the uris below a folder.
ESC = "\U000F0000"
_SURROGATE = re.compile("[\udc80-\udcff]")
ESCAPED = re.compile(ESC + "(" + ESC + "|[0-9a-f]{2})")


def id_list(ids: Iterable[int]) -> str:
    """Item ids as one JSON array: the single bound parameter `json_each` reads (no variable-count
    limit). An id array is converted in one numpy call, not an int() per element."""
    array = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, dtype=np.int64)
    return json.dumps(array.astype(np.int64, copy=False).reshape(-1).tolist())


def to_db(text: str | None) -> str | None:
    """Text as stored (see ESC): lossless for names with undecodable bytes."""
    if text is None or (ESC not in text and not _SURROGATE.search(text)):
        return text
    return _SURROGATE.sub(lambda m: f"{ESC}{ord(m.group()) - 0xDC00:02x}", text.replace(ESC, ESC * 2))


def from_db(text: str | None) -> str | None:
    """Inverse of `to_db`."""
    if text is None or ESC not in text:
        return text
    return ESCAPED.sub(lambda m: ESC if m.group(1) == ESC else chr(0xDC00 + int(m.group(1), 16)), text)


def metadata_words(metadata: Mapping[str, Any] | None) -> str | None:
    """The values of a metadata dict (nested ones too) as one space-separated text for the lexical
    index; None when there are none."""
    if not metadata:
        return None
    words: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif value is not None:
            words.append(value if isinstance(value, str) else json.dumps(value))

    walk(metadata)
    return to_db(" ".join(words)) or None


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    # Uris and errors are stored escaped from now on (see ESC); existing text holds no
    # surrogates (SQLite refused them), so only a literal ESC needs doubling.
    db.execute("UPDATE items SET uri = replace(uri, ?, ?), error = replace(error, ?, ?) "
               "WHERE instr(uri, ?) OR instr(error, ?)", (ESC, ESC * 2, ESC, ESC * 2, ESC, ESC))


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    _execute_script(db, """
        -- Paths (files or folders) the user removed: scans of a folder above them skip them
        -- until the user names them on `index` again (see retrieval.scanning.honour_exclusions).
        CREATE TABLE exclusions (uri TEXT PRIMARY KEY, added_at REAL NOT NULL);
    """)


def _execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run `;`-separated DDL inside the caller's transaction (executescript would COMMIT first,
    breaking the all-or-nothing migration step)."""
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    for statement in "\n".join(lines).split(";"):
        if statement.strip():
            db.execute(statement)


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    # The lexical index (FTS5, BM25) of the live items, rowid = item id: `body` the item's own
    # text, `name` its uri (the tokenizer splits path words), `meta` its metadata values.
    db.execute("CREATE VIRTUAL TABLE items_fts USING fts5(body, name, meta, "
               "tokenize = 'unicode61 remove_diacritics 2')")
    # An item leaves the lexical index in the statement that tombstones or deletes it, whichever
    # path does so (replace, delete, remove, compact). (One statement each: the bodies hold `;`.)
    db.execute("CREATE TRIGGER items_fts_tombstone AFTER UPDATE OF status ON items "
               "WHEN old.status = 'ok' AND new.status != 'ok' "
               "BEGIN DELETE FROM items_fts WHERE rowid = old.id; END")
    db.execute("CREATE TRIGGER items_fts_delete AFTER DELETE ON items "
               "BEGIN DELETE FROM items_fts WHERE rowid = old.id; END")
    # Items stored before: their names and metadata now; their text on `rebuild-index`.
    db.execute("INSERT INTO items_fts (rowid, body, name, meta) SELECT id, NULL, uri, "
               "(SELECT group_concat(CASE WHEN type IN ('true', 'false') THEN type ELSE atom END, ' ') "
               "FROM json_tree(metadata) WHERE atom IS NOT NULL) "
               "FROM items WHERE status = 'ok'")


# The metadata values `items_meta` indexes: JSON scalars (objects, arrays and nulls are not
# filterable). `kind` is json_each's type, so "2024" (text) and 2024 (integer) stay apart and
# true/false (stored as 1/0) never equal the numbers 1/0.
META_KINDS = "('text', 'integer', 'real', 'true', 'false')"
META_FILL = ("INSERT OR IGNORE INTO items_meta (key, value, kind, id) SELECT key, value, type, {id} "
             f"FROM json_each({{metadata}}) WHERE type IN {META_KINDS}")
META_DROP = ("DELETE FROM items_meta WHERE (key, value, id) IN "
             f"(SELECT key, value, {{id}} FROM json_each({{metadata}}) WHERE type IN {META_KINDS})")


def _migrate_4_to_5(db: sqlite3.Connection) -> None:
    # The metadata index of the live items: a filter `where={key: value}` reads the ids of one
    # (key, value) range instead of evaluating json_extract on every row (1% of 1M rows: a
    # full scan of `items` per search). No column type on `value`, so SQLite compares integers
    # and reals by value and never equates them with text.
    db.execute("CREATE TABLE IF NOT EXISTS items_meta (key TEXT NOT NULL, value, kind TEXT NOT NULL, "
               "id INTEGER NOT NULL, PRIMARY KEY (key, value, id)) WITHOUT ROWID")
    # (IF NOT EXISTS, and `fill_meta_index` starts from empty: a file whose version number was
    # set back still migrates.) Kept in step in the statement that writes the row, whichever
    # path does so (add, replace, delete, remove, compact), as the lexical index is. (One
    # statement each: the bodies hold `;`.)
    db.execute("CREATE TRIGGER IF NOT EXISTS items_meta_insert AFTER INSERT ON items "
               "WHEN new.status = 'ok' AND json_valid(new.metadata) "
               f"BEGIN {META_FILL.format(id='new.id', metadata='new.metadata')}; END")
    # A row's metadata never changes once written, so its entries are found again by the primary
    # key from the same json_each (no second index on id: half the B-tree writes of an add).
    db.execute("CREATE TRIGGER IF NOT EXISTS items_meta_tombstone AFTER UPDATE OF status ON items "
               "WHEN old.status = 'ok' AND new.status != 'ok' AND json_valid(old.metadata) "
               f"BEGIN {META_DROP.format(id='old.id', metadata='old.metadata')}; END")
    db.execute("CREATE TRIGGER IF NOT EXISTS items_meta_delete AFTER DELETE ON items "
               "WHEN old.status = 'ok' AND json_valid(old.metadata) "
               f"BEGIN {META_DROP.format(id='old.id', metadata='old.metadata')}; END")
    fill_meta_index(db)


def fill_meta_index(db: sqlite3.Connection) -> None:
    """(Re)build `items_meta` from the live rows (the migration from schema 4)."""
    db.execute("DELETE FROM items_meta")
    db.execute("INSERT OR IGNORE INTO items_meta (key, value, kind, id) SELECT e.key, e.value, e.type, items.id "
               "FROM items, json_each(items.metadata) AS e WHERE items.status = 'ok' AND json_valid(items.metadata) "
               f"AND e.type IN {META_KINDS}")


def _migrate_5_to_6(db: sqlite3.Connection) -> None:
    # The identity (device, inode) of each indexed file, by uri: a file read again at request
    # time (thumbnails, explain, rerank) must still be the one indexed, not something planted
    # under its name (retrieval.stored_files). Files indexed before have none until the next
    # `index` records it; readers of an older file see none.
    db.execute("CREATE TABLE IF NOT EXISTS file_identity (uri TEXT PRIMARY KEY, dev INTEGER NOT NULL, "
               "ino INTEGER NOT NULL)")


def _migrate_6_to_7(db: sqlite3.Connection) -> None:
    # Each live item's facts (indexers/facts.py: date taken, camera, GPS and place, XMP/IPTC...),
    # typed columns; `taken` a UTC instant with the recorded offset beside it. Items stored before
    # have no row: the next scan of their files reads the facts without re-embedding them.
    columns = ", ".join(f"{name} {_FACT_TYPES.get(name, 'TEXT')}" for name in FACT_COLUMNS)
    db.execute(f"CREATE TABLE IF NOT EXISTS item_facts (id INTEGER PRIMARY KEY, version INTEGER NOT NULL, {columns})")
    # A date range (`taken>=2024-05-01`, --since/--until, sort by date) reads a range of this index.
    db.execute("CREATE INDEX IF NOT EXISTS item_facts_taken ON item_facts (taken) WHERE taken IS NOT NULL")
    db.execute("CREATE INDEX IF NOT EXISTS item_facts_rating ON item_facts (rating) WHERE rating IS NOT NULL")
    # An item's facts leave with it, whichever path tombstones or deletes it (as the lexical index does).
    db.execute("CREATE TRIGGER IF NOT EXISTS item_facts_tombstone AFTER UPDATE OF status ON items "
               "WHEN old.status = 'ok' AND new.status != 'ok' "
               "BEGIN DELETE FROM item_facts WHERE id = old.id; END")
    db.execute("CREATE TRIGGER IF NOT EXISTS item_facts_delete AFTER DELETE ON items "
               "BEGIN DELETE FROM item_facts WHERE id = old.id; END")


def _migrate_7_to_8(db: sqlite3.Connection) -> None:
    # The neighbourhood beside the city people use (retrieval/library/places.py). A file created at 7 by
    # this code already has it (step 6 -> 7 creates the table from today's columns). Rows stay
    # until the next scan re-reads their files (facts.FACTS_VERSION 2).
    if "neighbourhood" not in {row[1] for row in db.execute("PRAGMA table_info(item_facts)")}:
        db.execute("ALTER TABLE item_facts ADD COLUMN neighbourhood TEXT")


def _migrate_8_to_9(db: sqlite3.Connection) -> None:
    # Albums: saved searches that stay current (indexers/albums.py). An album keeps its query vector
    # (embedded once), its understood filter, and the score of every live item passing that filter
    # (`album_scores`), so a member removed lets the next best in without searching again;
    # `album_members` is the membership last reported (what a refresh's "+3, -1" counts from);
    # `album_changed`: items whose words or facts changed in place since (OCR, facts filled or renamed),
    # which each album checks again at its next refresh.
    _execute_script(db, """
        CREATE TABLE IF NOT EXISTS albums (
            album INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            spec TEXT NOT NULL,
            vector BLOB NOT NULL,
            scored_through INTEGER NOT NULL,
            version INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            refreshed_at REAL NOT NULL
        );
        CREATE TABLE IF NOT EXISTS album_scores (
            album INTEGER NOT NULL,
            id INTEGER NOT NULL,
            score REAL NOT NULL,
            PRIMARY KEY (album, id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS album_scores_rank ON album_scores (album, score DESC, id);
        CREATE INDEX IF NOT EXISTS album_scores_item ON album_scores (id);
        CREATE TABLE IF NOT EXISTS album_members (
            album INTEGER NOT NULL,
            id INTEGER NOT NULL,
            PRIMARY KEY (album, id)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS album_changed (
            id INTEGER PRIMARY KEY
        )
    """)
    # An item's scores leave with it, whichever path tombstones or deletes it (as its lexical row does).
    db.execute("CREATE TRIGGER IF NOT EXISTS album_scores_tombstone AFTER UPDATE OF status ON items "
               "WHEN old.status = 'ok' AND new.status != 'ok' "
               "BEGIN DELETE FROM album_scores WHERE id = old.id; END")
    db.execute("CREATE TRIGGER IF NOT EXISTS album_scores_delete AFTER DELETE ON items "
               "BEGIN DELETE FROM album_scores WHERE id = old.id; END")


_FACT_TYPES = {"taken": "REAL", "taken_offset_min": "INTEGER", "lat": "REAL", "lon": "REAL", "alt": "REAL",
               "orientation": "INTEGER", "width": "INTEGER", "height": "INTEGER", "rating": "INTEGER",
               "duration_s": "REAL"}

# MIGRATIONS[v] upgrades schema version v to v + 1.
MIGRATIONS = {0: _migrate_0_to_1, 1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4, 4: _migrate_4_to_5,
              5: _migrate_5_to_6, 6: _migrate_6_to_7, 7: _migrate_7_to_8,
              8: _migrate_8_to_9}
assert len(MIGRATIONS) == SCHEMA_VERSION
