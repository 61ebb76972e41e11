"""Albums on disk: saved searches kept in a collection's meta.sqlite (schema 9), beside the items
they rank. Receives an album's spec (query, filter, minimum score, limit) and its query vector,
then the scores of items as a refresh computes them; hands back albums, their ranked members and
what each refresh changed (`AlbumChange`). The scoring itself is the library's
(`faste_mm.retrieval.library.albums`); this module holds every album statement.

What is stored, per album: its spec (JSON), its query vector (float32, embedded once), the last
item id it has scored (`scored_through`: ids only grow, and a changed file is stored under a new
id, so the new and changed items of a run are exactly the live ids above it), the score of every
live item passing its filter (`album_scores`; a trigger drops an item's rows when it is tombstoned
or deleted, so a removed member lets the next best in without a search), and the membership last
reported (`album_members`, what a refresh's "+3, -1" counts from). An item whose words or facts
change in place (OCR text added later, facts filled or places renamed: the same id, the same vector)
is noted in `album_changed` by the writer that changes it (`mark_changed`), and every album checks
it against its filter again at the next refresh. A refresh of all albums is ONE transaction: a crash
keeps the last refresh whole, and the next one scores the same items again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import numpy as np

from faste_mm.errors import CollectionError, InputError
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.filters import SearchFilter, sql_conditions
from faste_mm.indexers.schema import id_list

if TYPE_CHECKING:
    from faste_mm.indexers.store import MetaStore

# An album name is a path segment (album://beach, GET /albums/beach, an export folder): letters,
# digits, and . _ - inside, at most 64 characters.
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Items scored per statement batch of a refresh (vectors read, filters checked, rows inserted).
REFRESH_CHUNK = 4096


def check_name(name: Any) -> str:
    """`name` if it is a valid album name; InputError naming it and the rule otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(f"album name {name!r:.80}: use {NAME_RULE} (e.g. beach, trip-2024)")
    return name


def mark_changed(db, ids) -> None:
    """Note items whose words or facts changed in place (inside the writer's transaction), so every
    album checks them again at its next refresh; nothing is noted while there are no albums."""
    if db.execute("SELECT 1 FROM albums LIMIT 1").fetchone() is None:
        return
    db.executemany("INSERT OR IGNORE INTO album_changed (id) VALUES (?)", [(int(i),) for i in ids])


class UnknownAlbumError(InputError):
    """An album name the collection has no album of (HTTP 404)."""


def taken_name(name: str) -> InputError:
    return InputError(f"album {name!r} exists already; pick another name, or `album remove {name}` first")


@dataclass(frozen=True, slots=True)
class AlbumSpec:
    """What an album searches for, fixed when it is made.

    query: the text as the user gave it; meaning: the text the model embedded (the query less what
    was understood as filters); understood: the summary of what was read from it (None: nothing);
    where: the search filter (the request's and the understood ones joined); min_score: the album's
    own minimum cosine (None: the collection's default at the time it is read); limit: the most members;
    options: the search options given besides the query (literal, where, type, ...), as given."""

    query: str
    meaning: str | None
    where: SearchFilter
    limit: int
    min_score: float | None = None
    understood: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"query": self.query, "meaning": self.meaning, "where": self.where.to_dict(),
                           "limit": self.limit, "min_score": self.min_score, "understood": self.understood,
                           "options": dict(self.options)})

    @classmethod
    def from_json(cls, text: str) -> "AlbumSpec":
        d = json.loads(text)
        w = d["where"]
        where = SearchFilter(where=w["where"], types=tuple(w["types"]), path=w["path"], facts=tuple(w["facts"]),
                             phrases=tuple(w.get("phrases", ())))
        return cls(d["query"], d["meaning"], where, int(d["limit"]), d["min_score"], d["understood"],
                   d.get("options", {}))


@dataclass(frozen=True, slots=True)
class StoredAlbum:
    """One album as stored: its name, spec, query vector [dim] float32, the last item id scored,
    its version (+1 at each refresh that changed its members) and times (seconds since the epoch)."""

    name: str
    spec: AlbumSpec
    vector: np.ndarray
    scored_through: int
    version: int
    created_at: float
    refreshed_at: float
    key: int  # the row's id in `albums`


@dataclass(frozen=True, slots=True)
class AlbumChange:
    """What one refresh changed in an album: the item ids that entered and left its members."""

    name: str
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    @property
    def summary(self) -> str:
        """The report's line: album 'beach': +3, -1."""
        return f"album {self.name!r}: +{len(self.added)}, -{len(self.removed)}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "added": list(self.added), "removed": list(self.removed)}


# Stored vectors [n, dim] float32 of item ids [n] (`Collection.vectors`).
Fetch = Callable[[np.ndarray], np.ndarray]


class AlbumStore:
    """The albums of one collection's database (`Collection.albums()` hands one out). Reading works
    on any connection; writing needs the collection's writer (`require_writable`)."""

    def __init__(self, store: "MetaStore", require_writable: Callable[[str], None]) -> None:
        self._store = store
        self._require_writable = require_writable

    @property
    def db(self):
        return self._store.db

    def exists(self) -> bool:
        """Whether the file has the album tables (a reader of a file older than schema 9 has none)."""
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'albums'").fetchone() is not None

    # ---- reading ----------------------------------------------------------------------------
    def all(self) -> list[StoredAlbum]:
        """Every album, by name."""
        if not self.exists():
            return []
        return [_album(row) for row in self.db.execute(f"SELECT {_COLUMNS} FROM albums ORDER BY name")]

    def get(self, name: str) -> StoredAlbum:
        """The album called `name`; InputError naming it (and the albums there are) when there is none."""
        row = self.db.execute(f"SELECT {_COLUMNS} FROM albums WHERE name = ?", (name,)).fetchone() \
            if self.exists() else None
        if row is None:
            names = [a.name for a in self.all()]
            raise UnknownAlbumError(f"no album {name!r}; " + (f"the albums are {', '.join(names)}" if names else
                                                        "there are none yet (make one with `album add NAME QUERY`)"))
        return _album(row)

    def ranked(self, album: StoredAlbum, min_score: float | None) -> list[tuple[int, float]]:
        """The album's members now: (id, score) of its best `limit` live items scoring >= min_score,
        best first (ties: lower id first). An item removed since the last refresh is already out."""
        rows = self.db.execute("SELECT id, score FROM album_scores WHERE album = ? AND score >= ? "
                               "ORDER BY score DESC, id LIMIT ?",
                               (album.key, -np.inf if min_score is None else float(min_score), album.spec.limit))
        return [(int(i), float(s)) for i, s in rows]

    def unscored(self, album: StoredAlbum) -> int:
        """Live items stored after the album's last refresh (it has not scored them yet)."""
        return self.db.execute("SELECT count(*) FROM items WHERE status = 'ok' AND part IS NOT NULL AND id > ?",
                               (album.scored_through,)).fetchone()[0]

    # ---- writing ----------------------------------------------------------------------------
    def create(self, name: str, spec: AlbumSpec, vector: np.ndarray, fetch: Fetch,
               min_score: float | None) -> AlbumChange:
        """Store a new album and score every live item for it, in one transaction. InputError when
        an album of that name exists (nothing changed)."""
        check_name(name)
        self._require_writable("add an album")
        vector = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1)
        with self._store.transaction():
            if self.db.execute("SELECT 1 FROM albums WHERE name = ?", (name,)).fetchone() is not None:
                raise taken_name(name)
            now = time.time()
            cursor = self.db.execute("INSERT INTO albums (name, spec, vector, scored_through, version, created_at, "
                                     "refreshed_at) VALUES (?, ?, ?, -1, 0, ?, ?)",
                                     (name, spec.to_json(), vector.tobytes(), now, now))
            album = self._by_key(cursor.lastrowid)
            changes = self._refresh([album], fetch, lambda a: min_score)
        return changes[0]

    def remove(self, name: str) -> None:
        """Delete the album called `name` and its rows (InputError when there is none)."""
        self._require_writable("remove an album")
        album = self.get(name)
        with self._store.transaction():
            for table in ("album_scores", "album_members", "albums"):
                self.db.execute(f"DELETE FROM {table} WHERE album = ?", (album.key,))

    def refresh(self, fetch: Fetch, min_score: Callable[[StoredAlbum], float | None]) -> list[AlbumChange]:
        """Score the items stored since each album's last refresh and report what changed in each
        (albums whose members stayed are left out), all in ONE transaction. min_score: each album's
        minimum cosine in effect (its own, else the collection's)."""
        self._require_writable("refresh its albums")
        if not self.exists():
            return []
        with self._store.transaction():
            albums = [_album(row) for row in self.db.execute(f"SELECT {_COLUMNS} FROM albums ORDER BY name")]
            self._recheck_changed(albums, fetch)
            changes = self._refresh(albums, fetch, min_score)
        return [c for c in changes if c.added or c.removed]

    def _recheck_changed(self, albums: list[StoredAlbum], fetch: Fetch) -> None:
        """Inside the caller's transaction: the items noted in `album_changed` that an album scored
        before, checked against its filter again (their rows dropped, then scored if they pass), so
        an album equals a fresh search after OCR or new facts as after new files."""
        while True:
            rows = self.db.execute("SELECT album_changed.id FROM album_changed JOIN items ON items.id = album_changed.id "
                                   "WHERE items.status = 'ok' AND items.part IS NOT NULL ORDER BY album_changed.id "
                                   "LIMIT ?", (REFRESH_CHUNK,)).fetchall()
            if rows:
                ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                vectors = fetch(ids)  # [n, dim]
                for album in albums:
                    scored = ids[ids <= album.scored_through]  # newer ones: the refresh scores them anyway
                    self.db.execute("DELETE FROM album_scores WHERE album = ? AND id IN (SELECT value FROM json_each(?))",
                                    (album.key, id_list(scored)))
                    mine = self.passing(album.spec.where, scored)
                    if len(mine):
                        self._insert_scores(album, mine, vectors[np.searchsorted(ids, mine)] @ album.vector)
                self.db.execute("DELETE FROM album_changed WHERE id IN (SELECT value FROM json_each(?))", (id_list(ids),))
            if len(rows) < REFRESH_CHUNK:
                self.db.execute("DELETE FROM album_changed")  # the rest: items no longer live
                return

    def _refresh(self, albums: list[StoredAlbum], fetch: Fetch,
                 min_score: Callable[[StoredAlbum], float | None]) -> list[AlbumChange]:
        """Inside the caller's transaction: each album's new rows (the new items' stored vectors read
        once per chunk, each album scoring those passing its filter), members and version."""
        if not albums:
            return []
        last = self.db.execute("SELECT max(id) FROM items").fetchone()[0]
        last = -1 if last is None else int(last)
        start = min(a.scored_through for a in albums)
        for ids in self._live_ids_after(start, last):
            vectors = fetch(ids)  # [n, dim]
            for album in albums:
                mine = self.passing(album.spec.where, ids[ids > album.scored_through])
                if len(mine):
                    scores = vectors[np.searchsorted(ids, mine)] @ album.vector  # [m]: cosines, as a flat search's
                    self._insert_scores(album, mine, scores)
        crash_point("album-refresh-before-commit")
        now, changes = time.time(), []
        for album in albums:
            members = [i for i, _ in self.ranked(album, min_score(album))]
            before = {int(r[0]) for r in self.db.execute("SELECT id FROM album_members WHERE album = ?", (album.key,))}
            change = AlbumChange(album.name, tuple(i for i in members if i not in before),
                                 tuple(sorted(before - set(members))))
            if change.added or change.removed:
                self.db.execute("DELETE FROM album_members WHERE album = ?", (album.key,))
                self.db.executemany("INSERT INTO album_members (album, id) VALUES (?, ?)",
                                    [(album.key, i) for i in members])
            if change.added or change.removed or album.scored_through != last:  # a run that changed nothing writes nothing
                self.db.execute("UPDATE albums SET scored_through = ?, refreshed_at = ?, version = version + ? "
                                "WHERE album = ?", (last, now, int(bool(change.added or change.removed)), album.key))
            changes.append(change)
        return changes

    def _live_ids_after(self, after: int, last: int) -> Iterator[np.ndarray]:
        """Ids [n] int64 of the live items with a vector in (after, last], ascending, a chunk at a time."""
        while after < last:
            rows = self.db.execute("SELECT id FROM items WHERE status = 'ok' AND part IS NOT NULL AND id > ? "
                                   "AND id <= ? ORDER BY id LIMIT ?", (after, last, REFRESH_CHUNK)).fetchall()
            if not rows:
                return
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            yield ids
            after = int(ids[-1])

    def passing(self, where: SearchFilter, ids: np.ndarray) -> np.ndarray:
        """The subset of `ids` (live items) that meet `where`, as a search's filter admits them."""
        if where.is_empty:
            return ids
        clauses, params = sql_conditions(where, self._store.has_meta_index(), self._store.has_facts())
        rows = self.db.execute(f"SELECT id FROM items WHERE {' AND '.join(clauses)} AND items.id IN "
                               f"(SELECT value FROM json_each(?)) ORDER BY id", [*params, id_list(ids)]).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def _insert_scores(self, album: StoredAlbum, ids: np.ndarray, scores: np.ndarray) -> None:
        self.db.executemany("INSERT OR REPLACE INTO album_scores (album, id, score) VALUES (?, ?, ?)",
                            zip([album.key] * len(ids), ids.tolist(), scores.astype(np.float64).tolist()))

    def _by_key(self, key: int) -> StoredAlbum:
        return _album(self.db.execute(f"SELECT {_COLUMNS} FROM albums WHERE album = ?", (key,)).fetchone())


_COLUMNS = "album, name, spec, vector, scored_through, version, created_at, refreshed_at"


def _album(row) -> StoredAlbum:
    key, name, spec, vector, scored_through, version, created_at, refreshed_at = row
    try:
        parsed = AlbumSpec.from_json(spec)
    except (ValueError, KeyError, TypeError) as error:
        raise CollectionError(f"album {name!r}: its stored spec cannot be read ({error}); remove it "
                              f"(`album remove {name}`) and add it again") from None
    return StoredAlbum(name, parsed, np.frombuffer(vector, dtype=np.float32), int(scored_through), int(version),
                       created_at, refreshed_at, int(key))
