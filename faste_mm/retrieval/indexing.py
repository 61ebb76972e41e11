"""One `Retriever.index` run over an open collection: vanished files removed, missing ones
recorded, the update plan handed to an executor chunk by chunk with progress, the index type
switched if asked. Receives the collection opened for writing, its profile and a `Scan`; hands
back the `IndexReport`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from faste_mm.errors import FasteError
from faste_mm.indexers import Collection
from faste_mm.indexers.facts import issue_counts
from faste_mm.model.runner import BatchTrace
from faste_mm.retrieval.documents import CollectionDocuments
from faste_mm.retrieval.estimate import RunMeter, TokenBounds, plan_rows, sample_first
from faste_mm.retrieval.executors import IngestExecutor, IngestJob, ModelSource
from faste_mm.retrieval.ingest import IngestTally, IngestWork, ingest_work, record_missing
from faste_mm.retrieval.library.albums import refresh_albums
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.retrieval.library.ocr import OcrEngine, OcrTally, read_text_in_images
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.results import IndexOptions, IndexProgress, IndexReport
from faste_mm.retrieval.scanning import Scan, ScannedFile, honour_exclusions

log = logging.getLogger(__name__)


def index_collection(col: Collection, profile: CollectionProfile, scan: Scan, options: IndexOptions,
                     encode: CollectionDocuments, model: ModelSource, executor: IngestExecutor,
                     progress: Callable[[IndexProgress], None] | None, started: float,
                     ready: Callable[[ScannedFile], bool] | None = None, ocr: OcrEngine | None = None) -> IndexReport:
    """Bring `col` (opened for writing; closed here, which saves index.faiss) up to date with `scan`.
    `started`: perf_counter() when the call began (the report's seconds count from it).
    ready: which of the new and changed files to embed now (None: all); the others keep their
    old rows, if any, for a later run (`faste_mm.retrieval.library.watching` waits for files still being
    written). Vanished files are removed after the new ones are committed, so a file moved or
    renamed lends its vectors to its new path (same content) instead of being embedded again.
    ocr: the engine reading the text inside images and scanned pages (`retrieval.library.ocr`; None: none
    read), after the files are committed."""
    tally = IngestTally()
    root = Path(col.root)
    with col:
        scan = honour_exclusions(col, scan)  # paths removed earlier stay out of folder scans
        plan = ingest_work(col, scan, options.retry_failed)
        # Files indexed before identities were recorded get theirs now (retrieval.stored_files).
        todo = {f.uri for f in plan.todo}
        col.fill_identities([f.stat for f in scan.files() if f.uri not in todo])
        if ready is not None:
            plan = hold_back(plan, ready)
        plan = replace(plan, todo=sample_first(plan.todo))  # the first batches measure every kind
        if scan.missing:
            record_missing(col, scan.missing, tally)
        done = 0
        meter = RunMeter(plan.todo, token_bounds(profile))
        report_progress = _progress_reporter(progress, encode, plan, options.chunk_files, tally, started,
                                             lambda: done, meter)

        def files_committed(n: int) -> None:
            nonlocal done
            done = n
            meter.commit(n)
            report_progress()

        encode.on_batch = report_progress
        meter.begin(time.perf_counter())
        report_progress()
        executor.run(IngestJob(col, plan, profile, model, encode, options.chunk_files, tally,
                               files_committed, chunk_pages=options.chunk_pages))
        col.delete(uris=plan.vanished)  # after: their content was a donor for moved files above
        read = OcrTally() if ocr is None else read_text_in_images(col, ocr)
        fill_facts(col, scan, plan, tally)
        albums = _refreshed_albums(col, profile)
        if options.index_type is not None and options.index_type != col.manifest.index_type:
            col.rebuild_index(options.index_type)
    factory = col.manifest.index_factory  # as saved by close(), which brought index.faiss up to date
    seconds = time.perf_counter() - started
    log.info("%s: embedded %d items, reused %d, %d files unchanged, %d removed, %d failed in %.1f s",
             root, tally.embedded, tally.reused, plan.n_unchanged, len(plan.vanished), len(tally.failures), seconds)
    return IndexReport(str(root), len(scan.files()), tally.embedded, tally.reused, plan.n_unchanged,
                       len(plan.vanished), len(tally.failures), tuple(tally.failures), seconds, factory,
                       scan.n_excluded, ocr_read=read.read, ocr_s=read.elapsed_s, facts_filled=tally.facts_filled,
                       metadata_issues=dict(sorted(tally.metadata_issues.items())),
                       links_skipped=len(scan.outside_links), embedded_files=tuple(tally.embedded_files),
                       reused_files=tuple(tally.reused_files), removed_files=tuple(plan.vanished),
                       estimated_s=None if meter.first is None else meter.first.total_s,
                       estimated_at_s=None if meter.first is None else meter.first.elapsed_s,
                       albums=albums, **tally.cost.cost_fields())


def _refreshed_albums(col: Collection, profile: CollectionProfile) -> tuple:
    """The albums brought up to date with the items this run stored (`library.albums`); an album that
    cannot be refreshed never fails the run, whose items are committed: its items stay unscored for
    the next run or `faste-mm album refresh`, which says why again."""
    try:
        return refresh_albums(col, profile.min_score)
    except FasteError as error:
        log.warning("albums not refreshed: %s; the next index run or `faste-mm album refresh` tries again", error)
        return ()


def hold_back(plan: IngestWork, ready: Callable[[ScannedFile], bool]) -> IngestWork:
    """`plan` with only the files `ready` admits to embed; the others count as unchanged this run.
    While any file is held back, vanished files are kept too: a file moved across folders or
    filesystems (copied, then deleted) still lends its vectors when its copy is ready."""
    todo = tuple(f for f in plan.todo if ready(f))
    kept = {f.uri for f in todo}
    is_held = len(todo) < len(plan.todo)
    return replace(plan, todo=todo, changed=frozenset(u for u in plan.changed if u in kept),
                   n_unchanged=plan.n_unchanged + len(plan.todo) - len(todo),
                   vanished=() if is_held else plan.vanished)


# Unchanged files given their facts per transaction (a collection of 100k photos indexed before the
# facts existed is filled in commits of this many files, each a few hundred ms of reading headers).
FACTS_CHUNK_FILES = 256


def fill_facts(col: Collection, scan: Scan, plan: IngestWork, tally: IngestTally) -> None:
    """Read the facts of the scan's unchanged files whose items have none (stored before schema 7,
    or by an older extractor) and store them with the items: no model, no vector touched."""
    todo = {f.uri for f in plan.todo}
    unchanged = [f for f in scan.files() if f.uri not in todo and f.kind != "unsupported"]
    for start in range(0, len(unchanged), FACTS_CHUNK_FILES):
        chunk = {f.uri: f for f in unchanged[start:start + FACTS_CHUNK_FILES]}
        records = col.read(lambda rows: rows.records_without_facts(list(chunk)))
        read = {uri: read_facts(chunk[uri].path, chunk[uri].kind)
                for uri in dict.fromkeys(r.uri for r in records)}
        if read:
            col.set_facts([(r, read[r.uri]) for r in records])
            tally.facts_filled += len(records)
            tally.metadata_issues.update(issue_counts(list(read.values())))


def token_bounds(profile: CollectionProfile) -> TokenBounds:
    """What a collection's items' planned tokens depend on (its pixel bounds, the token cap)."""
    return TokenBounds(profile.min_pixels, profile.max_pixels, profile.serializer().max_length)


def _progress_reporter(progress: Callable[[IndexProgress], None] | None, encode: CollectionDocuments,
                       plan: IngestWork, chunk_files: int, tally: IngestTally, started: float,
                       done: Callable[[], int], meter: RunMeter,
                       clock: Callable[[], float] = time.perf_counter) -> Callable[[BatchTrace | None], None]:
    """A callback (after each batch and each committed chunk) sending `progress` the totals so far:
    the committed chunks' tally plus the batches of the chunk being embedded (`encode.in_flight`),
    and the estimate of the time left. Each batch is measured into `meter` (also without
    `progress`: the report gives the estimate), its rows planned once per encode call.
    clock: the seconds `started` and the meter count in."""
    planned: dict[str, object] = {}  # the encode call in flight and its rows' plan
    load_s = encode.load_s

    def report_progress(trace: BatchTrace | None = None) -> None:
        nonlocal load_s
        flight = encode.in_flight  # batches of the chunk being embedded, not yet in the tally
        now = clock()
        if trace is not None:
            if planned.get("flight") is not flight:
                planned.update(flight=flight, rows=plan_rows(flight.values, meter.bounds, meter.pages))
            meter.observe(planned["rows"], trace.rows, trace.tower_s, trace.decoder_s, now, encode.load_s - load_s)
            load_s = encode.load_s
        estimate = meter.estimate(now - started, encode.dtype)
        if estimate is not None and estimate is meter.first:
            log.info("about %.0f s left (%s)", estimate.remaining_s,
                     ", ".join(f"{n} {k}" for k, n in zip(estimate.kinds, estimate.items_left)))
        if progress is None:
            return
        n_done = done()
        chunk_size = min(chunk_files, len(plan.todo) - n_done)
        share = (n_done + chunk_size * min(1.0, flight.rows / flight.inputs) if flight.inputs else n_done)
        progress(IndexProgress(n_done, len(plan.todo), tally.embedded + flight.rows, tally.reused,
                               len(tally.failures), now - started,
                               share / len(plan.todo) if plan.todo else 1.0, estimate,
                               **(tally.cost + flight.cost).cost_fields()))

    return report_progress
