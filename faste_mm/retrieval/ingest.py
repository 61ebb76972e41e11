"""Ingest: from a `Scan` (retrieval.scanning) to committed collection rows. Plans the incremental
update against the collection (new, changed, unchanged, vanished), and embeds + commits one chunk
of files at a time, reusing the vectors of identical content and recording bad files as failures.

Receives a scan, a Collection and a document encoder; hands back counts to the retriever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from faste_mm.errors import CollectionError, ConfigError, InputError, ModelLoadError
from faste_mm.indexers import Collection, ItemRecord, content_hash
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.facts import issue_counts
from faste_mm.kinds import KINDS, SUPPORTED_SUFFIXES
from faste_mm.model.file_decoding import count_pdf_pages
from faste_mm.model.items import Item
from faste_mm.retrieval.decoders import document_input
from faste_mm.retrieval.lexical import item_text, source_text
from faste_mm.retrieval.ingest_tally import IndexFailure, IngestTally  # (importers find them here too)
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.retrieval.scanning import Scan, ScannedFile, is_under_any

if TYPE_CHECKING:  # annotations only: scanning and planning load no model code
    from faste_mm.model.embedder import EmbedResult

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestWork:
    """The work a scan gives an index run (not a `faste-mm plan`): todo: files to embed, in scan
    order; changed: uris among them that have old rows; n_unchanged: files skipped; vanished: uris
    under a walked folder that are gone."""

    todo: tuple[ScannedFile, ...]
    changed: frozenset[str]
    n_unchanged: int
    vanished: tuple[str, ...]


def ingest_work(col: Collection, scan: Scan, retry_failed: bool = False) -> IngestWork:
    """Compare a scan with the collection by (uri, size, mtime)."""
    files = scan.files()
    todo: set[str] = set()
    changed: set[str] = set()
    vanished: set[str] = set()
    # One plan per walked folder (only it may report vanished files below it) and one for the
    # named files, whose `vanished` would list everything else and is ignored.
    for under, found in [*scan.roots, (None, scan.named)]:
        if under is None and not found:
            continue
        plan = col.plan_scan([f.stat for f in found], under=under, retry_failed=retry_failed)
        todo.update(s.uri for s in (*plan.new, *plan.changed))
        changed.update(s.uri for s in plan.changed)
        if under is not None:
            vanished.update(plan.vanished)
    vanished -= {f.uri for f in files}  # e.g. excluded from a walk but also named explicitly
    vanished -= {uri for uri, _ in scan.missing}  # FIFOs, loops: recorded again, not removed each run
    # A file named inside a removed folder stays indexed when its parent folder is scanned.
    excluded = set(scan.excluded)
    vanished = {u for u in vanished if not is_under_any(u, excluded)}
    ordered = tuple(f for f in files if f.uri in todo)
    return IngestWork(ordered, frozenset(changed), len(files) - len(ordered), tuple(sorted(vanished)))


def record_missing(col: Collection, missing: Sequence[tuple[str, str]], tally: IngestTally) -> None:
    """A named path that does not exist: remove what was indexed at that path and record the
    failure (every run, so the report does not depend on what an earlier run stored)."""
    col.delete(uris=sorted(uri for uri, _ in missing))  # a uri with no rows is a no-op
    records = [ItemRecord(uri=uri, modality="missing", error=error) for uri, error in missing]
    col.add_failures(records)
    tally.failures.extend(IndexFailure(r.uri, None, r.error) for r in records)


# Embeds documents (paths, `Item`s) with the collection's settings; bad ones are failures in
# the result (on_error="skip"). The retriever passes one that loads the model on first use.
DocumentEncoder = Callable[[Sequence[object]], "EmbedResult"]


def ingest_chunk(col: Collection, files: Sequence[ScannedFile], changed: frozenset[str],
                 encode: DocumentEncoder, tally: IngestTally, chunk_pages: int | None = None) -> None:
    """Embed one chunk of files and commit it (rows and failures in one transaction).

    `encode` is called only for content the collection does not hold yet, so a chunk of touched
    or copied files never loads the model. All rows of one file are in one chunk, except a PDF
    of more than `chunk_pages` pages (None: no limit), which is committed range by range after
    the others (`ingest_long_pdf`); neither leaves half a PDF that a re-run would consider
    unchanged. An unexpected exception (a bug, or a library failing on one odd file) costs no
    more than that file: the chunk is retried file by file, and the file that raises again is
    recorded as a failure, its traceback in the debug log (`--debug`). Errors about the
    collection or the model stop the run.
    """
    long_pdfs = {f.uri: n for f in files if (n := _long_pdf_pages(f, chunk_pages)) is not None}
    others = [f for f in files if f.uri not in long_pdfs]
    if others:
        _ingest_whole_files(col, others, changed, encode, tally)
    for f in files:
        if f.uri in long_pdfs:
            _ingest_long_pdf_or_fail(col, f, long_pdfs[f.uri], changed, encode, tally, chunk_pages)


def _ingest_whole_files(col: Collection, files: Sequence[ScannedFile], changed: frozenset[str],
                        encode: DocumentEncoder, tally: IngestTally) -> None:
    chunk_tally = IngestTally()
    try:
        prepared = prepare_chunk(col, files)
        result = encode(prepared.values()) if prepared.to_embed else None
        if result is not None:
            chunk_tally.add_stats(result.stats)
        commit_chunk(col, prepared, changed, result, chunk_tally)
    except (CollectionError, ConfigError, ModelLoadError):
        raise
    except Exception as error:  # noqa: BLE001 - anything else is about the files (see ingest_chunk)
        if len(files) > 1:
            log.warning("%d files: %s: %s; indexing them one by one", len(files), type(error).__name__, error)
            for f in files:
                _ingest_whole_files(col, [f], changed, encode, tally)
            return
        chunk_tally = _record_unexpected(col, files[0], error)
    tally.merge(chunk_tally)


def _ingest_long_pdf_or_fail(col: Collection, f: ScannedFile, n_pages: int, changed: frozenset[str],
                             encode: DocumentEncoder, tally: IngestTally, chunk_pages: int) -> None:
    """`ingest_long_pdf`, counted in `tally` range by range (so progress shows them); an
    unexpected exception takes the file's counts back out and records it as failed."""
    before = replace(tally, failures=list(tally.failures))
    try:
        ingest_long_pdf(col, f, n_pages, changed, encode, tally, chunk_pages)
    except (CollectionError, ConfigError, ModelLoadError):
        raise
    except Exception as error:  # noqa: BLE001 - about the file (see ingest_chunk)
        failed = _record_unexpected(col, f, error)
        for name in ("embedded", "reused", "failures"):
            setattr(tally, name, getattr(before, name))
        # its tokens are taken back out; the model seconds were spent all the same
        tally.cost = replace(tally.cost, prefix_tokens=before.cost.prefix_tokens,
                             kept_prefix_tokens=before.cost.kept_prefix_tokens)
        tally.merge(failed)


def _record_unexpected(col: Collection, f: ScannedFile, error: Exception) -> IngestTally:
    """Record a file whose indexing raised unexpectedly as a failure, replacing its rows (also
    the page ranges of a long PDF committed before it failed)."""
    log.debug("%s: unexpected error", f.path, exc_info=True)
    failure = ItemRecord(uri=f.uri, modality=f.modality, size=f.stat.size, mtime=f.stat.mtime,
                         error=f"{f.path}: unexpected {type(error).__name__} ({error}); skipped. Run with "
                               f"--debug for the traceback and report it")
    col.commit(np.empty((0, col.manifest.dim), dtype=np.float32), [], [failure], replace_uris=[f.uri])
    return IngestTally(failures=[IndexFailure(failure.uri, None, failure.error)])


# ---- long PDFs, page range by page range -----------------------------------------------------
# A PDF of more than `chunk_pages` pages is embedded and committed one range of pages at a time.
# Every range but the last is stored without the file's mtime: a scan sees the file as changed
# (so a re-run finishes it) and `_complete_item` never lends it as a whole document. The last
# range commits with the failures of all ranges and gives every row of the file its stat.


def _long_pdf_pages(f: ScannedFile, chunk_pages: int | None) -> int | None:
    """The page count of a PDF that is committed range by range, else None (a short or
    unreadable one: the chunk records its failure as usual)."""
    if f.kind != "pdf" or chunk_pages is None:
        return None
    try:
        n_pages = count_pdf_pages(f.path)
    except InputError:
        return None
    return n_pages if n_pages > chunk_pages else None


def _is_partial(record: ItemRecord) -> bool:
    """A page of a PDF whose last page range is not committed yet."""
    return record.modality == KINDS["pdf"].modality and record.mtime is None


def pages_left(col: Collection, f: ScannedFile, content_hash: str, n_pages: int,
               changed: frozenset[str]) -> tuple[list[int], list[str]]:
    """A long PDF's pages that no range of an interrupted run committed (rows of this uri and
    content hash), and the uris its first range replaces (a changed file's old rows, unless this
    version already has committed ranges)."""
    same_content = col.read(lambda rows: rows.records_with_hashes([content_hash])).get(content_hash, [])
    done = {r.page for r in same_content if r.uri == f.uri and _is_partial(r)}
    if done:
        log.info("%s: resuming after %d pages committed by an interrupted run", f.path, len(done))
    todo = [page for page in range(1, n_pages + 1) if page not in done]
    return todo, ([f.uri] if f.uri in changed and not done else [])


def ingest_long_pdf(col: Collection, f: ScannedFile, n_pages: int, changed: frozenset[str],
                    encode: DocumentEncoder, tally: IngestTally, chunk_pages: int) -> None:
    """Embed and commit the pages of one long PDF `chunk_pages` at a time. A run stopped in the
    middle left the ranges it committed (same content hash): only the other pages are embedded now.
    A changed file's old rows (any version) are replaced by the first range this run commits."""
    prepared = prepare_chunk(col, [f])  # hash; an identical complete document is reused whole
    if not prepared.to_embed:
        commit_chunk(col, prepared, changed, None, tally)
        return
    base = prepared.to_embed[0][0]
    todo, replace_uris = pages_left(col, f, base["content_hash"], n_pages, changed)
    failures: list[ItemRecord] = []
    for start in range(0, max(len(todo), 1), chunk_pages):  # one commit at least: the last settles
        pages = todo[start:start + chunk_pages]
        result = encode([Item(image=f.path, page=page) for page in pages]) if pages else None
        tally.add_stats(result and result.stats)
        commit_page_range(col, f, base, result, failures, replace_uris, start + chunk_pages >= len(todo), tally)
        replace_uris = []


def commit_page_range(col: Collection, f: ScannedFile, base: dict, result: EmbedResult | None, failures: list[ItemRecord],
                      replace_uris: Sequence[str], is_last: bool, tally: IngestTally) -> None:
    """Commit one page range of a long PDF (`ingest_long_pdf`, `index --ray`'s driver; see above):
    `result` holds one row per page (None: no pages left), `base` the file's record fields. Failed
    pages join `failures`, committed with the last range, which also adds them to `tally`."""
    records, vectors = [], []
    if result is not None:
        reasons = failure_reasons(result, [base["uri"]] * len(result.items))
        tally.embedded += _emit({**base, "mtime": None}, list(range(len(result.items))), result, reasons,
                                records, vectors, failures)
    if is_last:
        records = [replace(r, mtime=f.stat.mtime) for r in records]
    stacked = np.concatenate(vectors) if vectors else np.empty((0, col.manifest.dim), dtype=np.float32)
    col.commit(stacked, records, [replace(r, mtime=f.stat.mtime) for r in failures] if is_last else [],
               replace_uris=list(replace_uris), settle=[f.stat] if is_last else [])
    if not is_last:
        crash_point("index-after-page-range")
        return
    tally.failures.extend(IndexFailure(r.uri, r.page, r.error) for r in failures)


@dataclass
class PreparedChunk:
    """One chunk of files read and matched against the collection, not yet embedded.

    records/vectors: rows reused from donors (live items with the same content);
    to_embed: (record fields, embedder input) of content to embed, one per distinct content;
    copies: (record fields, position in to_embed) of files identical to one in to_embed;
    failures: unsupported and unreadable files; reused: rows in `records`;
    deferred: files identical to content an earlier chunk of this run is still embedding (only
        with `in_flight`, see `prepare_chunk`); they are not part of this chunk.
    """

    files: list[ScannedFile]
    records: list[ItemRecord] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    to_embed: list[tuple[dict, object]] = field(default_factory=list)
    copies: list[tuple[dict, int]] = field(default_factory=list)
    failures: list[ItemRecord] = field(default_factory=list)
    reused: int = 0
    reused_from: list[tuple[str, str]] = field(default_factory=list)  # (file, the stored file it took its rows from)
    deferred: list[ScannedFile] = field(default_factory=list)

    def values(self) -> list[object]:
        """The embedder inputs, in `to_embed` order."""
        return [value for _, value in self.to_embed]


def prepare_chunk(col: Collection, files: Sequence[ScannedFile],
                  in_flight: set[tuple[str, str]] | None = None) -> PreparedChunk:
    """Hash and read a chunk's files and find what the collection already holds.

    in_flight: for pipelines that embed several chunks at once (faste_mm.scale): the (content
        hash, modality) keys earlier chunks of this run are embedding. A file whose key is in it
        is moved to `deferred` (to be committed once its donor is, so it is reused, as a
        one-chunk-at-a-time run would); the keys this chunk embeds are added to it.
    """
    prepared = PreparedChunk(list(files))
    readable, prepared.failures = _read_files(files)
    donors = _donors(col, [(base["content_hash"], f.modality) for f, base, _ in readable])
    first_of_hash: dict[str, int] = {}
    for f, base, value in readable:
        digest = base["content_hash"]
        donor = donors.get((digest, f.modality))
        if donor is not None:
            for record, vector in zip(*donor):
                prepared.records.append(ItemRecord(**base, page=record.page, text=source_text(value, record.page)))
                prepared.vectors.append(vector[None])
            prepared.reused += len(donor[0])
            prepared.reused_from.append((base["uri"], donor[0][0].uri))
        elif digest in first_of_hash:  # an identical file earlier in this chunk
            prepared.copies.append((base, first_of_hash[digest]))
        elif in_flight is not None and (digest, f.modality) in in_flight:
            prepared.deferred.append(f)
        else:
            first_of_hash[digest] = len(prepared.to_embed)
            prepared.to_embed.append((base, value))
    if in_flight is not None:
        in_flight.update((base["content_hash"], base["modality"]) for base, _ in prepared.to_embed)
    if prepared.deferred:
        deferred = {f.uri for f in prepared.deferred}
        prepared.files = [f for f in prepared.files if f.uri not in deferred]
    return prepared


def commit_chunk(col: Collection, prepared: PreparedChunk, changed: frozenset[str],
                 result: EmbedResult | None, tally: IngestTally) -> None:
    """Commit a prepared chunk with the embedder's `result` for its `to_embed` inputs (None when
    there is nothing to embed): stale rows of changed files, new rows and failures in one
    transaction."""
    records, vectors, failures = prepared.records, prepared.vectors, prepared.failures
    tally.reused += prepared.reused
    tally.reused_files.extend(prepared.reused_from)
    if prepared.to_embed:
        rows_of: dict[int, list[int]] = {}
        for row, source in enumerate(result.sources):
            rows_of.setdefault(source, []).append(row)
        reasons = failure_reasons(result, [base["uri"] for base, _ in prepared.to_embed])
        for source, (base, _) in enumerate(prepared.to_embed):
            n_ok = _emit(base, rows_of[source], result, reasons, records, vectors, failures)
            tally.embedded += n_ok
            if n_ok:
                tally.embedded_files.append(base["uri"])
        for base, source in prepared.copies:
            n_ok = _emit(base, rows_of[source], result, reasons, records, vectors, failures)
            tally.reused += n_ok
            if n_ok:
                tally.reused_files.append((base["uri"], prepared.to_embed[source][0]["uri"]))
    # One transaction: old rows of changed files (drops pages a shrunken PDF no longer has),
    # the new rows and the failures; a crash keeps the chunk whole or not at all.
    stale = [f.uri for f in prepared.files if f.uri in changed]
    stacked = np.concatenate(vectors) if vectors else np.empty((0, col.manifest.dim), dtype=np.float32)
    col.commit(stacked, records, failures, replace_uris=stale)
    tally.failures.extend(IndexFailure(r.uri, r.page, r.error) for r in failures)
    tally.metadata_issues.update(issue_counts({r.uri: r.facts for r in records}.values()))


def _read_files(files: Sequence[ScannedFile]) -> tuple[list[tuple[ScannedFile, dict, object]], list[ItemRecord]]:
    """Hash and read each file: (file, record fields, embedder input) for the readable ones,
    failure records for the unsupported and unreadable ones."""
    readable: list[tuple[ScannedFile, dict, object]] = []
    failures: list[ItemRecord] = []
    for f in files:
        base = dict(uri=f.uri, modality=f.modality, size=f.stat.size, mtime=f.stat.mtime, dev=f.stat.dev, ino=f.stat.ino)
        if f.kind == "unsupported":
            failures.append(ItemRecord(**base, error=f"{f.path}: unsupported file type "
                                       f"{f.path.suffix or '(none)'!r}; supported: {SUPPORTED_SUFFIXES}"))
            continue
        try:
            base["content_hash"] = content_hash(f.path)
            value = document_input(f.path, f.kind)  # the kind's decoder (faste_mm.retrieval.decoders)
            base["facts"] = read_facts(f.path, f.kind)  # never raises for what the file holds
        except InputError as error:
            failures.append(ItemRecord(**base, error=str(error)))
            continue
        except OSError as error:
            failures.append(ItemRecord(**base, error=f"{f.path}: cannot read the file ({error.strerror or error}); "
                                                     f"check that it exists and that you may read it"))
            continue
        readable.append((f, base, value))
    return readable, failures


Donor = tuple[list[ItemRecord], np.ndarray]  # live records of one item (pages in order), vectors [n, d]


def _donors(col: Collection, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Donor]:
    """(content hash, modality) -> live records (all pages, in order) and vectors of an item
    with identical content, for each key that has one; one lookup for the whole chunk."""
    by_hash = col.read(lambda rows: rows.records_with_hashes({digest for digest, _ in wanted}))
    chosen: dict[tuple[str, str], list[ItemRecord]] = {}
    for digest, modality in wanted:
        records = _complete_item(by_hash.get(digest, []), modality)
        if records is not None:
            chosen[(digest, modality)] = records
    ids = [r.id for records in chosen.values() for r in records]
    stored = col.vectors(ids) if ids else np.empty((0, col.manifest.dim), dtype=np.float32)
    donors, start = {}, 0
    for key, records in chosen.items():
        donors[key] = (records, stored[start:start + len(records)])
        start += len(records)
    return donors


def _complete_item(candidates: Sequence[ItemRecord], modality: str) -> list[ItemRecord] | None:
    """The first uri (in id order) whose live rows of `modality` form a whole item: one row, or
    PDF pages 1..n with none missing."""
    by_uri: dict[str, list[ItemRecord]] = {}
    for record in candidates:
        if record.modality == modality:
            by_uri.setdefault(record.uri, []).append(record)
    for records in by_uri.values():
        if any(_is_partial(r) for r in records):  # half a document: not a donor
            continue
        records.sort(key=lambda r: r.page or 0)
        pages = [r.page for r in records]
        if pages == (list(range(1, len(pages) + 1)) if modality == "page" else [None]):
            return records
    return None


def failure_reasons(result: EmbedResult, names: Sequence[str] | None = None) -> dict[int, str]:
    """Why each unusable row of `result` failed: the embedder's reason, or a non-finite vector
    (a model can overflow to NaN/inf, e.g. in float16), which must never reach the collection.

    names: what to call each input (by source position) in messages; default `Item.describe()`.
    """
    reasons = {failure.index: failure.reason for failure in result.failures}
    finite = np.isfinite(result.embeddings).all(axis=1)
    for row in np.flatnonzero(result.ok & ~finite):
        reasons[int(row)] = (f"{_row_name(result, int(row), names)}: the model returned a non-finite "
                             f"vector (NaN/inf), so it was not stored; embed it again with dtype "
                             f"float32 or on another device")
    for row in np.flatnonzero(~result.ok):
        reasons.setdefault(int(row), f"{_row_name(result, int(row), names)}: could not be embedded")
    return reasons


def _row_name(result: EmbedResult, row: int, names: Sequence[str] | None) -> str:
    item = result.items[row]
    if names is None:
        return item.describe()
    return names[result.sources[row]] + (f" (page {item.page})" if item.page is not None else "")


def _emit(base: dict, rows: list[int], result: EmbedResult, reasons: dict[int, str],
          records: list[ItemRecord], vectors: list[np.ndarray], failures: list[ItemRecord]) -> int:
    """Turn the result rows of one file into records (+ vectors) or failures; returns # ok."""
    n_ok = 0
    for row in rows:
        page = result.items[row].page
        if row in reasons:
            failures.append(ItemRecord(**base, page=page, error=reasons[row]))
        else:
            records.append(ItemRecord(**base, page=page, text=item_text(result.items[row])))
            vectors.append(result.embeddings[row][None])
            n_ok += 1
    return n_ok
