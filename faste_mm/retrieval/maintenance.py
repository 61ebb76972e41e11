"""Collection upkeep that needs no model: where collections live, removing files or ids,
compacting, rebuilding the index, `info`'s report. Loads no torch, so `faste-mm remove/compact/info`
start at once; the `Retriever` and serve's GET /info/collection delegate here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

from faste_mm.errors import InputError
from faste_mm.indexers import Collection
from faste_mm.retrieval.locations import DEFAULT_COLLECTION, collection_path, collections_dir  # noqa: F401 (re-exported)
from faste_mm.retrieval.results import RemoveReport

log = logging.getLogger(__name__)

def remove_items(root: str | os.PathLike, paths: Iterable[str | os.PathLike] = (),
                 ids: Iterable[int] = ()) -> RemoveReport:
    """Remove every item of each file, or of every file under each folder (given as a path
    or as the uri stored in the collection), and the items with the given ids.

    A removed file or folder path is also excluded from later scans: `index` of a folder above
    it skips it until the path itself is named on `index` again (`RemoveReport.excluded`).
    A target that matches nothing (a typo, a file never indexed, an id already removed) is
    not an error: it is listed in `RemoveReport.unmatched`, and nothing else changes for it.
    Raises InputError, removing nothing, for an empty or blank path: as a uri prefix it would
    match every file in the collection.
    """
    paths, ids = [os.fspath(p) for p in paths], [int(i) for i in ids]
    for position, path in enumerate(paths):
        if not str(path).strip():
            raise InputError(f"remove: target {position} is {str(path)!r}, which would match every "
                             f"file in the collection; nothing was removed. Give a file, a folder or an id")
    with Collection.open(root, writable=True) as col:
        uris: set[str] = set()
        unmatched: list[str] = []
        excluded: set[str] = set()
        for path in paths:
            matched = False
            for candidate in {str(path), str(Path(path).expanduser().resolve())}:
                found = col.read(lambda rows: rows.live_uris(candidate))
                uris.update(found)
                matched = matched or bool(found)
                if found and os.path.isabs(candidate):  # a file path (not an "item:" uri) scans could find
                    excluded.add(candidate.rstrip("/") or "/")
            if not matched:
                unmatched.append(str(path))
        live = col.live_ids(ids)
        unmatched.extend(str(i) for i in ids if i not in live)
        col.exclude(excluded)  # before the delete: a crash in between leaves the items in place
        col.delete(uris=sorted(uris))
        col.delete(sorted(live))
    if unmatched:
        log.info("%s: nothing to remove for %s", root, ", ".join(unmatched))
    return RemoveReport(tuple(sorted(uris)), tuple(sorted(live)), tuple(unmatched), tuple(sorted(excluded)))


def compact(root: str | os.PathLike) -> int:
    """Drop deleted vectors from disk and rebuild the index; returns vectors dropped."""
    with Collection.open(root, writable=True) as col:
        return col.compact()


def rebuild_index(root: str | os.PathLike, index_type: str | None = None) -> str:
    """Rebuild the FAISS index from stored vectors (optionally as another type) and the metadata
    filter index from the rows, and give items stored before the lexical index existed their text
    (`backfill_texts`); returns the factory string built."""
    with Collection.open(root, writable=True) as col:
        backfill_texts(col)
        col.rebuild_filter_index()
        return col.rebuild_index(index_type)


def backfill_texts(col: Collection) -> int:
    """Read the text of text files and PDF pages that the lexical index knows only by name (stored
    before it existed) again from their files, when a file is still there with its stored size;
    returns how many items got text. Unreadable or changed files are left to the next `index`."""
    from faste_mm.retrieval.decoders import read_text
    from faste_mm.retrieval.lexical import MAX_TEXT_CHARS, page_text
    from faste_mm.retrieval.stored_files import stored_file

    texts = []
    for record in col.read(lambda rows: rows.items_without_text()):
        if record.modality not in ("text", "page"):
            continue
        try:  # the indexed file itself (checked on its descriptor), never a link planted over it since
            source = stored_file(record)
            if source.size != record.size:
                continue
            text = (read_text(source.reader(), record.uri) if record.modality == "text"
                    else page_text(source, record.page or 1))
        except (InputError, OSError):  # no file (an item added from Python), gone, or replaced
            continue
        if text:
            texts.append((record.id, text[:MAX_TEXT_CHARS]))
    if texts:
        col.set_texts(texts)
        log.info("%s: read the text of %d items for the lexical index", col.root, len(texts))
    return len(texts)


def collection_report(root: str | os.PathLike) -> dict:
    """What `faste-mm info --format json` prints and serve's GET /info/collection answers: the
    collection's counts, failures, index and size on disk (`CollectionInfo`), its settings as the
    profile reads them (defaults filled in for older collections; `CollectionProfile.from_stored`
    reads them back), the plan receipt's summary and the watch status. One function for both, so
    a CLI answered by the server prints what a local read prints."""
    from faste_mm.retrieval.profile import CollectionProfile
    from faste_mm.retrieval.receipt import receipt_summary
    from faste_mm.retrieval.library.watch_status import read_watch_status

    with Collection.open(root) as col:
        info, profile = col.info(), CollectionProfile.from_manifest(col.manifest)
        settings = profile.to_manifest(base=col.manifest).to_dict()
        settings["vectors"]["int8_ranges"] = "calibrated" if col.manifest.int8_ranges is not None else None
    return {**info.to_dict(), "settings": settings, "plan": receipt_summary(profile.receipt),
            "watch": read_watch_status(info.path)}
