"""What the Retriever takes and hands back: index options, progress, the reports of `index`,
`add` and `remove`, and search hits. Plain typed records; the work is in `faste_mm.retrieval.retriever`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from faste_mm.errors import ConfigError
from faste_mm.indexers.albums import AlbumChange
from faste_mm.model.cost import CostTally
from faste_mm.retrieval.hits import Hit  # noqa: F401 (re-exported: the results' home)
from faste_mm.retrieval.estimate import RunEstimate
from faste_mm.retrieval.ingest import IndexFailure
from faste_mm.retrieval.scanning import ScanFilter


@dataclass(frozen=True, slots=True)
class IndexOptions:
    """Options of `Retriever.index`.

    exclude / include_hidden / follow_links: folder-walk filters (see `faste_mm.retrieval.scanning.ScanFilter`;
        follow_links: also index links whose target lies outside every walked folder).
    reindex: erase the collection first and rebuild it with the retriever's settings. The model
        loads and the index type and folder are checked before anything is erased, so a bad
        setting raises with the collection intact.
    index_type: FAISS factory string or "auto" for the derived index; None keeps the collection's.
    retry_failed: embed unchanged files that failed last time again.
    chunk_files: files embedded and committed together; a crash loses at most one chunk of work.
    chunk_pages: a PDF with more pages is embedded and committed this many pages at a time, so a
        long document makes progress and an interrupted run resumes after its last committed
        range; until its last range commits, re-indexing treats the file as not done.
    """

    exclude: tuple[str, ...] = ()
    include_hidden: bool = False
    follow_links: bool = False
    reindex: bool = False
    index_type: str | None = None
    retry_failed: bool = False
    chunk_files: int = 64
    chunk_pages: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", ScanFilter(self.exclude).exclude)  # validates
        if not isinstance(self.chunk_files, int) or self.chunk_files < 1:
            raise ConfigError(f"IndexOptions.chunk_files must be an int >= 1, got {self.chunk_files!r}")
        if not isinstance(self.chunk_pages, int) or self.chunk_pages < 1:
            raise ConfigError(f"IndexOptions.chunk_pages must be an int >= 1, got {self.chunk_pages!r}")
        if self.index_type is not None and (not isinstance(self.index_type, str) or not self.index_type.strip()):
            raise ConfigError(f"IndexOptions.index_type must be None, 'auto' or a FAISS factory string, "
                              f"got {self.index_type!r}")
        if self.index_type is not None:
            from faste_mm.indexers.faiss_index import check_factory_syntax

            check_factory_syntax(self.index_type)  # here, so no front end loads a model for a bad one

    @property
    def scan_filter(self) -> ScanFilter:
        """The folder walk these options select."""
        return ScanFilter(self.exclude, self.include_hidden, self.follow_links)


@dataclass(frozen=True, slots=True)
class IndexProgress(CostTally):
    """Handed to the `progress` callback after the scan, after each embedded batch and after
    each committed chunk. files_done / files_total count the new and changed files this run
    embeds (or reuses) and has committed; embedded and the token counts include the batches of
    the chunk in flight. share_done: the part of this run's files done, the chunk in flight
    counted by the share of its inputs embedded so far. estimate: the seconds left per input
    kind at the rates measured so far (`faste_mm.retrieval.estimate`; None before the first
    batch), which `eta_s` gives."""

    files_done: int
    files_total: int
    embedded: int
    reused: int
    failed: int
    elapsed_s: float
    share_done: float | None = None  # None: files_done / files_total
    estimate: RunEstimate | None = None

    @property
    def fraction(self) -> float:
        """Share of this run's work done, in [0, 1] (1 when there is nothing to do)."""
        if self.share_done is not None:
            return min(1.0, max(0.0, self.share_done))
        return self.files_done / self.files_total if self.files_total else 1.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left: the estimate's (each kind's work left at its measured rate), else the
        pace so far over the share of files done; None before anything is done."""
        if self.estimate is not None:
            return self.estimate.remaining_s
        done = self.fraction
        return None if done <= 0 else self.elapsed_s * (1 - done) / done


@dataclass(frozen=True, slots=True)
class IndexReport(CostTally):
    """What one `Retriever.index` call did. Items are rows (a PDF page is one item); files are
    source files. embedded: items run through the model; reused: items whose vectors were copied
    from a live item with the same content hash; unchanged: files skipped by (size, mtime);
    removed: files tombstoned because they vanished; failed: items recorded as failures;
    excluded: files skipped in walked folders because their path was removed (`remove`) earlier."""

    collection: str
    files_scanned: int
    embedded: int
    reused: int
    unchanged: int
    removed: int
    failed: int
    failures: tuple[IndexFailure, ...]
    elapsed_s: float
    index_factory: str | None = None
    excluded: int = 0
    ocr_read: int = 0  # images and scanned pages whose text was read (OCR, `index --ocr`)
    ocr_s: float = 0.0  # seconds spent reading them
    # Items of unchanged files whose facts (date, camera, place...) this run read, without embedding.
    facts_filled: int = 0
    # Why a metadata field was left empty (hostile or broken value) -> how many files.
    metadata_issues: Mapping[str, int] = field(default_factory=dict)
    # File links skipped because they lead outside every indexed folder (`IndexOptions.follow_links`).
    links_skipped: int = 0
    # The files behind the counts (`watch -v` names them): run through the model; (file, the file
    # whose vectors it reused: same content, e.g. a move or a copy); gone from the folders, removed.
    embedded_files: tuple[str, ...] = ()
    reused_files: tuple[tuple[str, str], ...] = ()
    removed_files: tuple[str, ...] = ()

    @property
    def moved_files(self) -> tuple[tuple[str, str], ...]:
        """(old path, new path) of the files moved or renamed: reused from a file this run removed."""
        removed = set(self.removed_files)
        return tuple((donor, uri) for uri, donor in self.reused_files if donor in removed)
    # The run's seconds as first estimated, once the estimate settled (`faste_mm.retrieval.estimate`:
    # the first chunk committed), and when; None when nothing was embedded in this process.
    estimated_s: float | None = None
    estimated_at_s: float | None = None
    # The albums whose members this run changed (new items scored, removed ones out; docs/albums.md).
    albums: tuple[AlbumChange, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["failures"] = [f.to_dict() for f in self.failures]
        d["albums"] = [c.to_dict() for c in self.albums]
        d["reused_files"] = [{"uri": uri, "from": donor} for uri, donor in self.reused_files]
        d["moved_files"] = [{"from": old, "to": new} for old, new in self.moved_files]
        d["metadata_issues"] = dict(self.metadata_issues)
        d["prefix_removal"] = self.prefix_removal
        d["tower_share"] = self.tower_share
        d["patches_kept"] = self.patches_kept  # None where duplicate-patch removal looked at no image
        d["seconds"] = self.elapsed_s  # the documented schema's name before `elapsed_s` (docs/collections.md)
        return d


@dataclass(frozen=True, slots=True, eq=False)
class AddReport:
    """What one `Retriever.add` call stored. ids: int64 [n_rows], one per row in input order (a
    PDF adds one row per page), -1 where the row failed; failures: the rows that failed (only
    with on_error="skip"), also recorded in the collection and listed by `info()`."""

    ids: np.ndarray
    failures: tuple[IndexFailure, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids.tolist(), "failures": [f.to_dict() for f in self.failures]}


@dataclass(frozen=True, slots=True)
class RemoveReport:
    """What one `Retriever.remove` call did: uris of the files removed (all their items), ids of
    the items removed by id, the targets, as given, that matched nothing in the collection, and
    the paths now excluded from later scans of their folders (until named on `index` again)."""

    uris: tuple[str, ...]
    ids: tuple[int, ...] = ()
    unmatched: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"uris": list(self.uris), "ids": list(self.ids), "unmatched": list(self.unmatched),
                "excluded": list(self.excluded)}
