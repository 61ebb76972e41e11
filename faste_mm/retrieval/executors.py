"""Who embeds an index run's plan: the `IngestExecutor` protocol that `Retriever.index` hands its
plan to, and the plain in-process executor. Scale-out executors (`faste_mm.scale.RayExecutor`)
implement the same protocol, so the retrieval layer never imports them.

Receives an `IngestJob` (the open collection, the plan, the collection's profile, the model the
driver uses); embeds and commits the plan's files chunk by chunk through `faste_mm.retrieval.ingest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from faste_mm.retrieval.ingest import DocumentEncoder, IngestTally, IngestWork, ingest_chunk
from faste_mm.retrieval.profile import CollectionProfile

if TYPE_CHECKING:
    from faste_mm.indexers import Collection
    from faste_mm.model.batching import BatchingConfig


@dataclass(frozen=True, slots=True)
class ModelSource:
    """The model that embeds a run's documents, as a worker loads it: hub id or absolute folder,
    revision, dtype ("auto", "float16", ...) and batching (None = the defaults)."""

    name: str
    revision: str | None = None
    dtype: str = "auto"
    batching: "BatchingConfig | None" = None


@dataclass(frozen=True, slots=True)
class IngestJob:
    """One index run's work, as the retriever hands it to an executor.

    col: the collection, open for writing (the executor commits through `ingest.commit_chunk`).
    plan: what to embed (`plan.todo`, in scan order) and which uris have old rows (`plan.changed`).
    profile: the collection's settings (model, pixels, video, FastE, dim): every worker embeds
        with exactly these, so its vectors compare with the stored ones.
    model: the model the driver embeds with (workers load the same).
    encode: the driver's document encoder (loads the model on first use), for in-process work.
    chunk_files: files committed together. tally: the run's totals (updated in place).
    on_committed: called with the number of the plan's files committed so far.
    chunk_pages: a longer PDF is committed this many pages at a time (`ingest.ingest_long_pdf`);
        None commits every file whole.
    """

    col: "Collection"
    plan: IngestWork
    profile: CollectionProfile
    model: ModelSource
    encode: DocumentEncoder
    chunk_files: int
    tally: IngestTally
    on_committed: Callable[[int], None]
    chunk_pages: int | None = None


@runtime_checkable
class IngestExecutor(Protocol):
    """Embeds and commits an `IngestJob`'s plan (see `LocalExecutor`, `faste_mm.scale.RayExecutor`).

    Contract: every file of `job.plan.todo` is committed (rows or failure records) through
    `ingest.commit_chunk`/`ingest_chunk`, all rows of one file in one commit (a PDF of more
    than `job.chunk_pages` pages may be committed range by range); `job.on_committed`
    is called as files are committed; errors about the collection or the model are raised."""

    def run(self, job: IngestJob) -> None: ...


@dataclass(frozen=True, slots=True)
class LocalExecutor:
    """The plain executor: this process embeds one chunk at a time with the driver's encoder."""

    def run(self, job: IngestJob) -> None:
        todo = job.plan.todo
        for start in range(0, len(todo), job.chunk_files):
            chunk = todo[start:start + job.chunk_files]
            ingest_chunk(job.col, chunk, job.plan.changed, job.encode, job.tally, job.chunk_pages)
            job.on_committed(start + len(chunk))
