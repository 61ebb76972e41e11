"""Albums: saved searches that stay current (`faste-mm album`, `Retriever.albums()`, serve's
/albums, MCP `faste-mm://album/NAME`). An album is a dense search of a query text, made once (its
text understood as meaning and filters, its meaning embedded) and kept with its minimum score and
limit; every index, watch and serve --watch run then scores only the new and changed items against
the kept query vector (`refresh_albums`), so the album equals a fresh search of its query on an
exact (flat) index at every step without searching again. Receives the collection and, to make an
album, a planner that embeds its query (the Retriever's); hands back `Album` views with their hits,
the `AlbumChange`s of a refresh and `AlbumExport`s. Storage is `faste_mm.indexers.albums`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection
from faste_mm.indexers.albums import AlbumChange, AlbumSpec, StoredAlbum, check_name, taken_name
from faste_mm.indexers.atomic_files import atomic_write, atomic_write_bytes
from faste_mm.retrieval.results import Hit
from faste_mm.retrieval.stored_files import open_stored

DEFAULT_LIMIT = 100  # members an album keeps unless told
MAX_LIMIT = 10_000
# The search options an album takes besides its query: filters and how the text is read. An album
# ranks by meaning only: lexical and hybrid modes, reranking, `like`, pictures and another order
# are a search's, not an album's (they would need the words, a model or a re-search at each refresh).
ALBUM_OPTIONS = ("literal", "where", "type", "path", "since", "until", "instruction")
EXPORT_MARKER = ".faste-mm-album.json"  # in a folder an album was exported to: the files it wrote

# (query, options) -> the planned query (`search_executor.PlannedQuery`: where, meaning, vector, understood).
Planner = Callable[[str, dict], Any]


@dataclass(frozen=True, slots=True)
class Album:
    """An album as read now: its name and spec, its members as search hits (best first), how many
    items stored since its last refresh it has not scored yet (`unscored`: an index, watch or
    `album refresh` scores them), its version (+1 at each refresh that changed it) and times."""

    name: str
    query: str
    understood: str | None
    where: dict[str, Any]
    min_score: float | None
    limit: int
    hits: tuple[Hit, ...] = ()
    unscored: int = 0
    version: int = 0
    created_at: float = 0.0
    refreshed_at: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, hits: bool = True) -> dict[str, Any]:
        d = {"name": self.name, "query": self.query, "understood": self.understood, "where": self.where,
             "min_score": self.min_score, "limit": self.limit, "count": len(self.hits), "unscored": self.unscored,
             "version": self.version, "created_at": self.created_at, "refreshed_at": self.refreshed_at,
             "options": self.options}
        if hits:
            d["hits"] = [h.to_dict() for h in self.hits]
        return d


@dataclass(frozen=True, slots=True)
class AlbumExport:
    """What `Albums.export` wrote: the folder or playlist, the files written (or listed), the
    earlier export's files it removed (members no longer), and the members whose file could not be
    read (why), which were left out."""

    album: str
    to: str
    files: tuple[str, ...]
    removed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"album": self.album, "to": self.to, "files": list(self.files), "removed": list(self.removed),
                "skipped": list(self.skipped)}


class Albums:
    """A collection's albums. `Retriever.albums()` hands one out with its model as the planner;
    without a planner (`Albums(path)`) everything but `add` works, loading no model.

    Example:
        >>> albums = Retriever.for_collection("photos").albums()
        >>> albums.add("beach", "the beach at sunset", limit=50, min_score=0.3)
        >>> [hit.uri for hit in albums.show("beach").hits]
    """

    def __init__(self, collection: str | os.PathLike, planner: Planner | None = None,
                 default_min_score: Callable[[], float | None] = lambda: None) -> None:
        self.collection = Path(collection)
        self._planner = planner
        self._default_min_score = default_min_score

    def add(self, name: str, query: str, *, limit: int = DEFAULT_LIMIT, min_score: float | None = None,
            **options: Any) -> Album:
        """Make the album `name`: `query` understood and embedded once (as `Retriever.search` does),
        every item scored, the best `limit` scoring >= `min_score` (None: the collection's default
        minimum score, else none) its members. options: those of `ALBUM_OPTIONS`, as `search` takes them.
        Relative dates in the query ("last summer") count from today, once: the album keeps them.
        Raises InputError for a bad or taken name, an empty query, a query of filters only;
        ConfigError for a bad limit, min_score or option (naming it)."""
        check_name(name)
        if not isinstance(query, str) or not query.strip():
            raise InputError(f"album {name!r}: the query is empty; give the words to look for (e.g. \"the beach "
                             f"at sunset\")")
        _check_limit(limit)
        if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, (int, float))
                                      or not -1.0 <= min_score <= 1.0):
            raise ConfigError(f"album {name!r}: min_score {min_score!r} must be a cosine between -1 and 1 (e.g. 0.3)")
        _check_options(name, options)
        if self._planner is None:
            raise ConfigError("albums: making an album embeds its query; use Retriever.albums() (which has a model)")
        with Collection.open(self.collection) as col:  # a taken name is refused before the model loads
            if any(a.name == name for a in col.albums().all()):
                raise taken_name(name)
        planned = self._planner(query, options)
        understood = planned.understood.summary() if planned.understood is not None else ""
        spec = AlbumSpec(query, planned.meaning, planned.where, limit, None if min_score is None else float(min_score),
                         understood or None, _json_options(options))
        with Collection.open(self.collection, writable=True) as col:
            col.albums().create(name, spec, planned.vector, col.vectors, self._min_score(spec.min_score))
        return self.show(name)

    def list(self) -> list[Album]:
        """Every album (without hits: `show` reads them), by name."""
        with Collection.open(self.collection) as col:
            store = col.albums()
            return [_view(a, (), store.unscored(a)) for a in store.all()]

    def show(self, name: str) -> Album:
        """The album `name` with its members as hits, best first. InputError when there is none."""
        with Collection.open(self.collection) as col:
            return album_view(col, name, self._min_score)

    def remove(self, name: str) -> None:
        """Delete the album `name` (its items stay in the collection). InputError when there is none."""
        with Collection.open(self.collection, writable=True) as col:
            col.albums().remove(check_name(name))

    def refresh(self) -> list[AlbumChange]:
        """Score the items stored since the last refresh for every album (an index, watch or
        serve --watch run does it itself); returns the albums whose members changed."""
        with Collection.open(self.collection, writable=True) as col:
            return refresh_albums(col, self._default_min_score())

    def export(self, name: str, to: str | os.PathLike) -> AlbumExport:
        """Write the album's files to a folder (copies, as photo managers export: the folder stays
        whole when the collection's files move; a page of a PDF exports its file, once) or to an .m3u
        / .m3u8 playlist (absolute paths, best first). A folder must be empty, new, or an earlier
        export of this album, whose files that are no longer members are removed (nothing else in
        it is touched). Members whose file is gone or replaced are left out and listed."""
        album = self.show(name)
        target = Path(to).expanduser()
        if target.suffix.lower() in (".m3u", ".m3u8"):
            return _export_playlist(album, target)
        return _export_folder(album, target, self.collection)

    def _min_score(self, own: float | None) -> float | None:
        return own if own is not None else self._default_min_score()


def refresh_albums(col: Collection, default_min_score: float | None) -> tuple[AlbumChange, ...]:
    """Every album of `col` (open for writing) brought up to date with the items stored since its
    last refresh, in one transaction; the albums whose members changed. Loads no model."""
    if not col.albums().exists():
        return ()
    changes = col.albums().refresh(col.vectors, lambda a: a.spec.min_score if a.spec.min_score is not None
                                   else default_min_score)
    return tuple(changes)


def album_view(col: Collection, name: str, min_score: Callable[[float | None], float | None]) -> Album:
    """The album `name` of an open collection with its hits (serve's routes and MCP read it so)."""
    store = col.albums()
    stored = store.get(check_name(name))
    ranked = store.ranked(stored, min_score(stored.spec.min_score))
    records = col.records([i for i, _ in ranked])
    hits = tuple(Hit(i, score, records[i].uri, records[i].page, records[i].metadata, facts=records[i].facts)
                 for i, score in ranked if i in records)
    return _view(stored, hits, store.unscored(stored))


def _view(stored: StoredAlbum, hits: tuple[Hit, ...], unscored: int) -> Album:
    spec = stored.spec
    return Album(stored.name, spec.query, spec.understood, spec.where.to_dict(), spec.min_score, spec.limit, hits,
                 unscored, stored.version, stored.created_at, stored.refreshed_at, dict(spec.options))


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"album limit must be an integer 1..{MAX_LIMIT:,} (the most members), got {limit!r}")


def _check_options(name: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(ALBUM_OPTIONS))
    if unknown:
        raise ConfigError(f"album {name!r}: {', '.join(unknown)} cannot be kept in an album, which ranks items by "
                          f"the meaning of its query (dense mode, no reranker, by relevance); it takes "
                          f"{', '.join(ALBUM_OPTIONS)} besides limit and min_score")


def _json_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options as JSON keeps them (dates as ISO text, tuples as lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return value
    return {key: plain(value) for key, value in options.items() if value is not None}


def _member_files(album: Album) -> list[str]:
    """The members' files, best first, each once (a PDF's pages share one)."""
    return list(dict.fromkeys(hit.uri for hit in album.hits if not hit.uri.startswith("item:")))


def _export_playlist(album: Album, target: Path) -> AlbumExport:
    files = _member_files(album)
    text = "#EXTM3U\n" + "".join(f"#EXTINF:-1,{Path(uri).name}\n{uri}\n" for uri in files)
    atomic_write_bytes(target, text.encode("utf-8", "surrogateescape"))
    return AlbumExport(album.name, str(target), tuple(files))


def _export_folder(album: Album, target: Path, collection: Path) -> AlbumExport:
    marker = target / EXPORT_MARKER
    before: list[str] = []
    if target.exists():
        if not target.is_dir():
            raise InputError(f"{target}: not a folder; export an album to a folder (new or empty) or to a .m3u file")
        if marker.exists():
            earlier = json.loads(marker.read_text(encoding="utf-8"))
            if earlier.get("album") != album.name or earlier.get("collection") != str(collection.resolve()):
                raise InputError(f"{target}: holds an export of album {earlier.get('album')!r}; export {album.name!r} "
                                 f"to another folder")
            before = list(earlier.get("files", ()))
        elif any(target.iterdir()):
            raise InputError(f"{target}: the folder holds other files; export album {album.name!r} to a new or empty "
                             f"folder (or to the folder of its earlier export)")
    target.mkdir(parents=True, exist_ok=True)
    records = {hit.uri: hit for hit in album.hits}
    written, skipped, taken = [], [], set()
    with Collection.open(collection) as col:
        for uri in _member_files(album):
            name = _free_name(Path(uri).name, taken)
            try:  # the file indexed, still there and still that file (stored_files), else left out
                source = open_stored(col.get([records[uri].id])[0])
            except InputError as error:
                skipped.append(str(error))
                continue
            with source:
                atomic_write(target / name, lambda out: _copy(source, out))
            taken.add(name)
            written.append(name)
    removed = [name for name in before if name not in taken and (target / name).is_file()]
    for name in removed:
        (target / name).unlink()
    atomic_write_bytes(marker, json.dumps({"album": album.name, "collection": str(collection.resolve()),
                                           "files": written}).encode("utf-8"))
    return AlbumExport(album.name, str(target), tuple(written), tuple(removed), tuple(skipped))


def _free_name(name: str, taken: set[str]) -> str:
    """`name`, or "stem (2).ext", "stem (3).ext", ... when another member's file has it already."""
    if name not in taken and name != EXPORT_MARKER:
        return name
    stem, suffix = os.path.splitext(name)
    n = 2
    while f"{stem} ({n}){suffix}" in taken:
        n += 1
    return f"{stem} ({n}){suffix}"


def _copy(source, out) -> None:
    while chunk := source.read(1 << 20):
        out.write(chunk)
