"""meta.sqlite: the item table that, together with the vector parts, is a collection's truth.

Receives item records and part numbers from `Collection`; hands back rows, counts and the state
counters (next id, next part, epoch). Every statement uses bound parameters. Schema changes are
stepwise migrations (`schema`); a file newer than this code is refused with upgrade advice.
"""
# Size: ~460 lines: every SQL statement over meta.sqlite lives here, one short method each, so the
# file's whole vocabulary is read in one place.

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from faste_mm.errors import CollectionError, InputError
from faste_mm.indexers import fact_rows
from faste_mm.indexers.fact_rows import lexical_meta
from faste_mm.indexers.facts import ItemFacts
from faste_mm.indexers import file_identity
from faste_mm.indexers.filters import SearchFilter, sql_conditions
from faste_mm.indexers.records import FileStat, ItemRecord, Status
from faste_mm.indexers.remembered import Remembered
from faste_mm.indexers.schema import MIGRATIONS, READABLE_FROM_VERSION, SCHEMA_VERSION, from_db, id_list, to_db
from faste_mm.indexers.database_file import DB_NAME, damaged_database, translate_errors

log = logging.getLogger(__name__)

# Bound parameters per statement: SQLite builds before 3.32 allow at most 999.
MAX_BOUND_PARAMS = 500
_ITEM_COLUMNS = ("id, uri, page, modality, size, mtime, content_hash, status, error, added_at, "
                 "metadata, part, row")


def _row_to_record(row: Sequence[Any], facts: ItemFacts | None = None) -> ItemRecord:
    (id_, uri, page, modality, size, mtime, chash, status, error, added_at, meta, _part,
     _row, dev, ino) = row
    return ItemRecord(uri=from_db(uri), modality=modality, page=page, size=size, mtime=mtime,
                      content_hash=chash, metadata=json.loads(meta) if meta else None,
                      error=from_db(error), id=id_, status=status, added_at=added_at, dev=dev, ino=ino,
                      facts=facts)


@translate_errors
class MetaStore:
    """One connection to `meta.sqlite`. Writers migrate; readers open read-only."""

    def __init__(self, root: Path, writable: bool, create: bool = False) -> None:
        self.root = root
        self.path = root / DB_NAME
        self.writable = writable
        self._meta_index: bool | None = None  # whether items_meta exists (`has_meta_index`)
        self._facts_table = False  # whether item_facts exists (`has_facts`; once seen, for good)
        self._record_columns: str | None = None  # `record_columns`: with the identity table or without
        # The counters a search checks, read once per `version`: one PRAGMA a search on an unchanged file.
        self._remembered = Remembered(self.version)
        self._snapshot_version: int | None = None  # data_version of the open read snapshot
        if not create and not self.path.exists():
            # The truth is gone: a new empty database would make every vector an orphan to sweep.
            raise CollectionError(
                f"{root}: {DB_NAME} is missing, so the stored vectors cannot be matched to their files; "
                f"nothing was changed. Restore {DB_NAME} from a backup, or re-index with `--reindex` "
                f"(which erases the vectors)")
        try:
            if writable:
                self.db = sqlite3.connect(self.path, isolation_level=None)
            else:
                # A reader may be handed between threads (a Retriever shared by a web app's workers),
                # one at a time: its owner serializes the calls (`Retriever`'s lock).
                self.db = sqlite3.connect(self.path.absolute().as_uri() + "?mode=ro", uri=True,
                                          isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise damaged_database(self.path, e) from None
        try:
            self.db.execute("PRAGMA busy_timeout=10000")
            if not create:
                # Before anything writes to the file (even the WAL switch rewrites its header).
                self._refuse_foreign_schema()
            if writable:
                # WAL lets readers search while a writer commits; FULL sync makes a commit
                # durable before the writer moves on (commits are batched, so it is cheap).
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")
            self._check_schema()
        except BaseException as e:
            self.db.close()
            if isinstance(e, sqlite3.Error):
                raise damaged_database(self.path, e) from None
            raise

    def close(self) -> None:
        self.db.close()

    # ---- schema -----------------------------------------------------------------------------
    def _schema_version(self) -> int:
        has_table = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            ("schema_version",)).fetchone()
        if not has_table:
            return 0
        row = self.db.execute("SELECT version FROM schema_version").fetchone()
        return row[0] if row else 0

    def _refuse_foreign_schema(self) -> None:
        """CollectionError when the file of an existing collection holds none of our tables (a
        0-byte file, or a stranger's database put in its place). Migrating it would create an
        empty schema, and the next writer would then sweep every vector part as an orphan."""
        if self._schema_version() > 0:
            return
        size = self.path.stat().st_size
        why = "the file is empty (0 bytes)" if size == 0 else f"it is an SQLite file of {size} bytes without them"
        raise CollectionError(
            f"{self.path}: holds no faste-mm tables ({why}), yet {self.root} is a collection; the records "
            f"that match the stored vectors to their files are lost, and nothing was changed. Restore "
            f"{DB_NAME} from a backup (with its -wal file if there was one); to start over instead, move "
            f"the folder aside and index into a new collection")

    def _check_schema(self) -> None:
        version = self._schema_version()
        if version > SCHEMA_VERSION:
            raise CollectionError(
                f"{self.path}: schema version {version} is newer than this faste-mm supports "
                f"({SCHEMA_VERSION}); the collection was written by a newer faste-mm — upgrade "
                f"faste-mm (pip install -U faste-mm) to open it")
        if version == SCHEMA_VERSION:
            return
        if not self.writable and version >= READABLE_FROM_VERSION:
            return  # readable as it is; the next writer migrates it
        if not self.writable:
            raise CollectionError(
                f"{self.path}: schema version {version} is older than this faste-mm's "
                f"({SCHEMA_VERSION}); open the collection once for writing to upgrade it")
        for v in range(version, SCHEMA_VERSION):
            with self.transaction():
                MIGRATIONS[v](self.db)
                self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
                self.db.execute("DELETE FROM schema_version")
                self.db.execute("INSERT INTO schema_version (version) VALUES (?)", (v + 1,))
            log.info("%s: migrated schema %d -> %d", self.path, v, v + 1)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception (including KeyboardInterrupt)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            self._remembered.forget()
            raise
        self.db.execute("COMMIT")

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One read transaction (WAL: every statement inside sees the same commit), or nothing
        inside a transaction already open on this connection."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN")
        try:
            # Reading data_version starts the snapshot, and gives its version (see `version`).
            self._snapshot_version = self._data_version()
            yield
        finally:
            self._snapshot_version = None
            if self.db.in_transaction:
                self.db.execute("COMMIT")

    def _data_version(self) -> int:
        return self.db.execute("PRAGMA data_version").fetchone()[0]  # starts a read, as any query

    def version(self) -> tuple[int, int]:
        """A value that changes whenever the file may have changed: SQLite's data_version (it changes
        exactly when ANOTHER connection, in this process or another, commits) and this connection's
        own count of changed rows (which data_version does not see). Inside `read_snapshot`, the
        version of that snapshot, read when it began."""
        data_version = self._snapshot_version if self._snapshot_version is not None else self._data_version()
        return data_version, self.db.total_changes

    # ---- state counters ---------------------------------------------------------------------
    def state(self) -> dict[str, int]:
        return dict(self._remembered.get("state", lambda: self.db.execute("SELECT key, value FROM state").fetchall()))

    def set_state(self, **values: int) -> None:
        """Update counters; call inside `transaction()` together with the change they describe."""
        # Upsert: keys added after a collection was created (retired_below) start absent.
        self.db.executemany("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)",
                            [(key, int(value)) for key, value in values.items()])

    # ---- parts ------------------------------------------------------------------------------
    def parts(self) -> list[tuple[int, int]]:
        """(part, n_rows) of every committed part, ascending."""
        return list(self._remembered.get("parts", lambda: self.db.execute(
            "SELECT part, n_rows FROM parts ORDER BY part").fetchall()))

    def named_parts(self) -> set[int]:
        """Every part the parts table or an item row names (what the orphan sweep must keep)."""
        listed = self.db.execute("SELECT part FROM parts UNION SELECT DISTINCT part FROM items "
                                 "WHERE part IS NOT NULL").fetchall()
        return {r[0] for r in listed}

    def insert_part(self, part: int, n_rows: int) -> None:
        self.db.execute("INSERT INTO parts (part, n_rows, created_at) VALUES (?, ?, ?)",
                        (part, n_rows, time.time()))

    def delete_part(self, part: int) -> None:
        self.db.execute("DELETE FROM parts WHERE part = ?", (part,))

    def part_rows(self, part: int) -> list[tuple[int, int, str]]:
        """(id, row, status) of the items stored in `part`, in row order."""
        return self.db.execute("SELECT id, row, status FROM items WHERE part = ? ORDER BY row",
                               (part,)).fetchall()

    def move_rows(self, moves: Iterable[tuple[int | None, int | None, int]]) -> None:
        """Set (part, row) for item ids: [(new_part, new_row, id)]; None detaches the vector."""
        self.db.executemany("UPDATE items SET part = ?, row = ? WHERE id = ?", moves)

    # ---- items ------------------------------------------------------------------------------
    def insert_items(self, records: Sequence[ItemRecord], ids: Sequence[int], status: str,
                     part: int | None) -> None:
        """Insert records; a live row with the same (uri, page) and failed rows of the uri are
        replaced (the newest add wins, so re-running an interrupted scan never duplicates)."""
        now = time.time()
        uris = sorted({to_db(r.uri) for r in records})
        self.db.executemany("DELETE FROM items WHERE uri = ? AND status = 'failed'",
                            [(u,) for u in uris])
        self.db.executemany(
            "UPDATE items SET status = 'deleted' WHERE uri = ? AND ifnull(page, -1) = ? "
            "AND status = 'ok'", [(to_db(r.uri), -1 if r.page is None else r.page) for r in records])
        self.db.executemany(
            f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(int(i), to_db(r.uri), r.page, r.modality, r.size, r.mtime, r.content_hash, status,
              to_db(r.error), now, json.dumps(dict(r.metadata)) if r.metadata is not None else None,
              part, row if part is not None else None)
             for row, (i, r) in enumerate(zip(ids, records))])
        file_identity.set_identities(self.db, [(r.uri, r.dev, r.ino) for r in records if r.ino is not None])
        if status == Status.OK:
            self.db.executemany("INSERT INTO items_fts (rowid, body, name, meta) VALUES (?, ?, ?, ?)",
                                [(int(i), to_db(r.text), to_db(r.uri), lexical_meta(r.metadata, r.facts))
                                 for i, r in zip(ids, records)])
            fact_rows.insert_facts(self.db, [(int(i), r.facts) for i, r in zip(ids, records) if r.facts is not None])

    def facts(self, ids: Sequence[int]) -> dict[int, ItemFacts]:
        """{id: facts} of the items among `ids` that have them (none in a file older than schema 7)."""
        return fact_rows.facts_of(self.db, ids) if self.has_facts() else {}

    def records_without_facts(self, uris: Sequence[str]) -> list[ItemRecord]:
        """Live records of `uris` with no facts, or facts an older extractor wrote (FACTS_VERSION)."""
        return [_row_to_record(r) for r in fact_rows.rows_without_facts(self.db, self.record_columns(), uris)]

    def has_facts(self) -> bool:
        """Whether the file has schema 7's facts table (a reader of an older file has none)."""
        self._facts_table = self._facts_table or self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'item_facts'").fetchone() is not None
        return self._facts_table

    def purge_tombstones(self) -> None:
        """Delete the tombstoned rows (`compact`, once their vectors are gone from the new parts)."""
        self.db.execute("DELETE FROM items WHERE status = 'deleted'")
        file_identity.drop_orphans(self.db)

    def tombstone_ids(self, ids: Sequence[int]) -> int:
        cur = self.db.executemany(
            "UPDATE items SET status = 'deleted' WHERE id = ? AND status = 'ok'",
            [(int(i),) for i in ids])
        return cur.rowcount

    def tombstone_uris(self, uris: Sequence[str]) -> int:
        """Tombstone ok rows of `uris` and drop their failed rows (which have no vectors)."""
        params = [(to_db(u),) for u in uris]
        self.db.executemany("DELETE FROM items WHERE uri = ? AND status = 'failed'", params)
        cur = self.db.executemany(
            "UPDATE items SET status = 'deleted' WHERE uri = ? AND status = 'ok'", params)
        return cur.rowcount

    def set_file_stats(self, stats: Sequence[FileStat]) -> None:
        """Give the ok rows of each file its (size, mtime): the last page range of a PDF
        committed range by range marks the file complete (ingest's `_is_partial`)."""
        self.db.executemany("UPDATE items SET size = ?, mtime = ? WHERE uri = ? AND status = 'ok'",
                            [(s.size, s.mtime, to_db(s.uri)) for s in stats])
        file_identity.set_identities(self.db, [(s.uri, s.dev, s.ino) for s in stats if s.ino is not None])

    def records(self, ids: Sequence[int]) -> dict[int, ItemRecord]:
        # json_each takes the whole id list as ONE bound parameter (no variable-count limit).
        rows = self.db.execute(f"SELECT {self.record_columns()} FROM items WHERE id IN (SELECT value FROM json_each(?))",
                               (id_list(ids),)).fetchall()
        facts = self.facts([row[0] for row in rows])
        return {row[0]: _row_to_record(row, facts.get(row[0])) for row in rows}

    def vector_locations(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, parts, rows) int64 arrays, sorted by id, of `ids` with a stored vector (any status).
        Remembered per id set asked for twice while the file is unchanged: a selective filter's matches are
        all rescored at every search with it (these reads were 2.8 of 11 ms: 1,000 at 100k x 2048, binary)."""
        wanted = np.unique(np.asarray(ids, dtype=np.int64))

        def read() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            found = np.array(self.db.execute("SELECT id, part, row FROM items WHERE part IS NOT NULL AND id IN "
                                             "(SELECT value FROM json_each(?)) ORDER BY id", (id_list(wanted),)).fetchall(),
                             dtype=np.int64).reshape(-1, 3)
            found.flags.writeable = False  # shared by every search asking for this set until the file changes
            return found[:, 0], found[:, 1], found[:, 2]

        digest = hashlib.blake2b(wanted.tobytes(), digest_size=16).digest()  # kept once asked twice: not one-off sets
        return self._remembered.recent("locations", digest, read) if self._remembered.seen("asked", digest) else read()

    def live_records_after(self, after_id: int, limit: int) -> list[ItemRecord]:
        """Up to `limit` live records with id > `after_id`, in id order (a paged listing)."""
        rows = self.db.execute(f"SELECT {self.record_columns()} FROM items WHERE status = 'ok' AND id > ? ORDER BY id "
                               f"LIMIT ?", (int(after_id), int(limit))).fetchall()
        return [_row_to_record(row) for row in rows]

    def live_ids_of(self, uri: str) -> list[int]:
        """Ids of the live items of one file (its pages), in id order."""
        return [r[0] for r in self.db.execute("SELECT id FROM items WHERE status = 'ok' AND uri = ? ORDER BY id",
                                              (to_db(uri),))]

    def live_ids(self, ids: Iterable[int]) -> set[int]:
        """The subset of `ids` whose status is 'ok' (used to filter tombstones from search)."""
        rows = self.db.execute("SELECT id FROM items WHERE status = 'ok' AND id IN (SELECT value FROM json_each(?))",
                               (id_list(ids),)).fetchall()
        return {r[0] for r in rows}

    def filtered_ids(self, where: SearchFilter) -> np.ndarray:
        """Sorted ids [n] int64 of the live items that meet every condition of `where`.

        A metadata value matches only a JSON value of its own kind (json_type), so "2024" never matches
        2024 and True never 1; int and float compare by value (`items_meta` where the file has it)."""
        clauses, params = sql_conditions(where, self.has_meta_index(), self.has_facts())

        def read() -> np.ndarray:
            rows = self.db.execute(f"SELECT id FROM items WHERE {' AND '.join(clauses)} ORDER BY id", params).fetchall()
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            ids.flags.writeable = False  # shared by every search with this filter until the file changes
            return ids

        # remembered (the few most recent): a served collection is searched with the same few filters
        return self._remembered.recent("filter", (" AND ".join(clauses), json.dumps(params)), read)

    def places(self) -> list[tuple]:
        """The distinct places of the live items' facts (`fact_rows.places`), read once per version
        of the file."""
        return self._remembered.get("places", lambda: fact_rows.places(self.db))

    def newest_ids(self, where: SearchFilter, k: int) -> list[int]:
        """Ids of up to k live items meeting `where`, newest taken first, undated ones last (by id,
        newest first): a search of filters only, no query to rank by."""
        clauses, params = sql_conditions(where, self.has_meta_index(), self.has_facts())
        taken = "(SELECT taken FROM item_facts WHERE item_facts.id = items.id)" if self.has_facts() else "NULL"
        rows = self.db.execute(f"SELECT id FROM items WHERE {' AND '.join(clauses)} ORDER BY {taken} IS NULL, "
                               f"{taken} DESC, id DESC LIMIT ?", [*params, int(k)]).fetchall()
        return [r[0] for r in rows]

    def record_columns(self) -> str:
        """What a record is read from (`_row_to_record`): the item's columns, its file's identity."""
        if self._record_columns is None:
            self._record_columns = f"{', '.join('items.' + c.strip() for c in _ITEM_COLUMNS.split(','))}, " \
                                   f"{file_identity.identity_columns(self.db)}"
        return self._record_columns

    def has_meta_index(self) -> bool:
        """Whether the file has schema 5's metadata index (a reader of an older file scans instead)."""
        if self._meta_index is None:
            self._meta_index = self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'items_meta'").fetchone() is not None
        return self._meta_index

    def lexical_search(self, match: str, k: int, where: SearchFilter | None = None) -> list[tuple[int, float]]:
        """The k best live items for an FTS5 `match` expression by BM25 (body weighted 1, name and
        metadata 0.5): [(id, score)], best first, score = -bm25 (higher is better). `where` filters
        as `filtered_ids` does. InputError for a malformed expression."""
        clauses, params = sql_conditions(where or SearchFilter(), self.has_meta_index(), self.has_facts())
        try:
            rows = self.db.execute(
                "SELECT f.rowid, -bm25(items_fts, 1.0, 0.5, 0.5) AS score FROM items_fts AS f "
                f"JOIN items ON items.id = f.rowid WHERE items_fts MATCH ? AND {' AND '.join(clauses)} "
                "ORDER BY bm25(items_fts, 1.0, 0.5, 0.5) LIMIT ?", [match, *params, int(k)]).fetchall()
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "no such table" in str(e):
                raise  # busy or damaged: not the query's fault
            raise InputError(f"lexical query {match!r} is not a valid FTS5 expression ({e}); fix it, or search "
                             f"it as plain words (without the lexical syntax option)") from None
        return [(int(i), float(score)) for i, score in rows]

    def has_lexical_index(self) -> bool:
        """False for a file of schema 3 or older that a reader has open (the next writer builds it)."""
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", ("items_fts",)).fetchone() is not None

    def lexical_ids(self) -> list[int]:
        """Item ids in the lexical index, ascending (tests compare them with the live ids)."""
        return [r[0] for r in self.db.execute("SELECT rowid FROM items_fts ORDER BY rowid").fetchall()]

    def items_without_text(self) -> list[ItemRecord]:
        """Live records whose lexical row has no body (stored before the lexical index existed)."""
        rows = self.db.execute(
            f"SELECT {self.record_columns()} FROM items "
            "JOIN items_fts ON items_fts.rowid = items.id WHERE items.status = 'ok' AND items_fts.body IS NULL "
            "ORDER BY items.id").fetchall()
        return [_row_to_record(r) for r in rows]

    def texts(self, ids: Sequence[int]) -> dict[int, str]:
        """The lexical text of items that have one: {id: text}."""
        rows = self.db.execute("SELECT rowid, body FROM items_fts WHERE rowid IN (SELECT value FROM json_each(?)) "
                               "AND body IS NOT NULL", (id_list(ids),)).fetchall()
        return {int(i): from_db(body) for i, body in rows}

    def set_texts(self, texts: Sequence[tuple[int, str]]) -> None:
        """Fill the body of lexical rows: [(id, text)] (`rebuild-index` backfilling older items)."""
        self.db.executemany("UPDATE items_fts SET body = ? WHERE rowid = ?", [(to_db(t), int(i)) for i, t in texts])

    def records_where_status(self, status: str) -> list[ItemRecord]:
        rows = self.db.execute(f"SELECT {self.record_columns()} FROM items WHERE status = ? ORDER BY id",
                               (status,)).fetchall()
        return [_row_to_record(r) for r in rows]

    def records_with_hashes(self, content_hashes: Iterable[str]) -> dict[str, list[ItemRecord]]:
        """Live records per content hash, each list in id order; hashes without one are absent.
        One query per `MAX_BOUND_PARAMS` hashes, not one per file."""
        unique = sorted(set(content_hashes))
        found: dict[str, list[ItemRecord]] = {}
        for start in range(0, len(unique), MAX_BOUND_PARAMS):
            chunk = unique[start:start + MAX_BOUND_PARAMS]
            rows = self.db.execute(
                f"SELECT {self.record_columns()} FROM items WHERE status = 'ok' "
                f"AND content_hash IN ({', '.join('?' * len(chunk))}) ORDER BY id", chunk).fetchall()
            for row in rows:
                record = _row_to_record(row)
                found.setdefault(record.content_hash, []).append(record)
        return found

    def live_uris(self, under: str | None = None) -> list[str]:
        """Sorted uris with live (ok or failed) rows: all, or `under` itself and the uris below it
        (`under` + "/..."). The range ["p/", "p0") holds exactly the strings starting with "p/"
        ("0" follows "/" in byte order), so the uri index answers it without a table scan."""
        if under is None:
            rows = self.db.execute("SELECT DISTINCT uri FROM items WHERE status != 'deleted' ORDER BY uri").fetchall()
        else:
            prefix = to_db(under.rstrip("/"))
            rows = self.db.execute("SELECT DISTINCT uri FROM items WHERE status != 'deleted' AND (uri = ? OR "
                                   "(uri >= ? AND uri < ?)) ORDER BY uri", (prefix, prefix + "/", prefix + "0")).fetchall()
        return [from_db(r[0]) for r in rows]

    def live_file_stats(self) -> dict[str, tuple[int | None, float | None, str]]:
        """uri -> (size, mtime, status) over live rows; pages of one file share its stat."""
        rows = self.db.execute("SELECT uri, size, mtime, status FROM items WHERE status != 'deleted'").fetchall()
        stats: dict[str, tuple[int | None, float | None, str]] = {}
        for uri, size, mtime, status in rows:
            uri = from_db(uri)
            prev = stats.get(uri)
            # Any failed page marks the whole file failed, so `retry_failed` can re-embed it.
            if prev is None or status == Status.FAILED:
                stats[uri] = (size, mtime, status)
        return stats

    # ---- exclusions ---------------------------------------------------------------------------
    def exclusions(self) -> list[tuple[str, float]]:
        """(uri, added_at) of the removed paths later scans skip, sorted by uri; none in a
        schema-1 or -2 file a reader has open (it predates the table)."""
        has_table = self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                    ("exclusions",)).fetchone()
        if not has_table:
            return []
        rows = self.db.execute("SELECT uri, added_at FROM exclusions ORDER BY uri").fetchall()
        return [(from_db(uri), added_at) for uri, added_at in rows]

    def add_exclusions(self, uris: Iterable[str]) -> None:
        now = time.time()
        self.db.executemany("INSERT OR REPLACE INTO exclusions (uri, added_at) VALUES (?, ?)",
                            [(to_db(u), now) for u in uris])

    def remove_exclusions(self, uris: Iterable[str]) -> int:
        return self.db.executemany("DELETE FROM exclusions WHERE uri = ?", [(to_db(u),) for u in uris]).rowcount

    def counts(self) -> dict[str, int]:
        counts = {status.value: 0 for status in Status}
        counts.update(self.db.execute(
            "SELECT status, count(*) FROM items GROUP BY status").fetchall())
        return counts

    def n_tombstoned_vectors(self) -> int:
        """Deleted rows whose vectors are still in parts (and so possibly in the index)."""
        # INDEXED BY: without statistics the planner picks items_part and counts every row.
        return self._remembered.get("tombstoned", lambda: self.db.execute(
            "SELECT count(*) FROM items INDEXED BY items_tombstoned "
            "WHERE status = 'deleted' AND part IS NOT NULL").fetchone()[0])
