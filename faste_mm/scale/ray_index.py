"""`index --ray`, the driver: the embedding of an index run on a Ray Data pipeline, for many GPUs
and cores.

The driver (this process) plans exactly as a plain `index` does (`faste_mm.ingest`: scan,
size/mtime, content hash, reuse, removal), holds the collection's single writer lock, and commits
each chunk of files once all its results are back, and a PDF of more than `chunk_pages` pages
range by range as its parts come back (`scale.ray_pages`), so a killed driver loses at most what
was not yet committed and a re-run embeds only what is missing. The pipeline (the workers' code
is `scale.ray_workers`):

    planned files (path, or text; bytes fetched from the driver's node with ship_bytes)
      -> map_batches tasks (CPU):   decode each file with its kind's decoder (images decoded, PDF
                                    pages rendered PAGES_PER_PART at a time; `retrieval.decoders`)
      -> map_batches actor pool:    one Embedder per actor (GPU or CPU); serialization in its
                                    prefetch threads, token-budget batches, FastE (`EmbedActor`)
      -> iter_batches on the driver: results stream back; `commit_chunk` as chunks complete

Serialization (resize, chat template, image processor) stays in the actor's prefetch threads, not
in the CPU tasks: its output (pixel patches as float32) is several times larger than a decoded
image, and the prefetch already overlaps it with the model. Failures are the plain run's: the
same functions decode the same files, and a failure row names the file (and page) as
`index` does. A worker that cannot see a path says so (use shared storage or ship_bytes).

Ray is imported only here, and only when a run asks for it.
"""

from __future__ import annotations

import logging
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.kinds import kind_name
from faste_mm.retrieval.decoders import decode_file
from faste_mm.retrieval.executors import IngestJob
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.ingest import IngestTally, PreparedChunk, _long_pdf_pages, commit_chunk, prepare_chunk
from faste_mm.retrieval.scanning import ScannedFile
from faste_mm.scale.ray_pages import LongPdf, count_output, plan_long_pdf
from faste_mm.scale.ray_stderr import hidden_cpp_log_lines
from faste_mm.scale.ray_workers import STAT_FIELDS, EmbedActor, FileServer, FileTask, WorkerModel, decode_files
from faste_mm.scale.resources import ResourcePlan, StallWatch, describe_wait, plan_resources, watching

if TYPE_CHECKING:
    from faste_mm.scale.options import RayOptions
    from faste_mm.indexers import Collection

log = logging.getLogger(__name__)

# Test hook: the name of a Ray actor with `add(handle)` and `calling(handle)` methods; each
# embedding actor registers its handle there when it starts (again after a restart) and waits
# for `calling` at the start of each call, so a test can ray.kill one in the middle of a call.
ACTOR_REGISTRY_ENV = "FASTE_MM_RAY_ACTOR_REGISTRY"
_MAX_BLOCKS = 20_000  # bounds Ray Data's per-block bookkeeping on runs of millions of files
_DECODE_MEMORY = 768 * 1024 * 1024  # logical memory per decoding task (decoded images, rendered pages)


def import_ray():
    """The `ray` module with Ray Data, or a ConfigError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (ray without the [data] extra lacks pyarrow/pandas)
    except ImportError as error:
        raise ConfigError(f"--ray needs Ray Data, which is not installed ({error}); "
                          f"install it with: pip install 'faste-mm[ray]'") from None
    return ray


@dataclass
class _Pending:
    """A chunk waiting for the results of its `to_embed` files (by position)."""

    prepared: PreparedChunk
    outputs: dict[int, dict] = field(default_factory=dict)
    parts: dict[int, dict[int, dict]] = field(default_factory=dict)  # position -> part -> output, until whole

    def add_part(self, position: int, part: int, parts: int, output: dict) -> None:
        """Keep one part of a file's output; the file's output once all its parts are here."""
        got = self.parts.setdefault(position, {})
        got[part] = output
        if len(got) == parts:
            del self.parts[position]
            self.outputs[position] = _joined([got[i] for i in range(parts)])


# ---- the driver ------------------------------------------------------------------------------
def ingest_plan_with_ray(job: IngestJob, options: RayOptions) -> None:
    """Embed and commit `plan.todo` on Ray Data; the counterpart of `Retriever.index`'s chunk loop.

    Chunks are planned up front (hash, reuse) and committed as their results arrive. A file whose
    content another chunk of this run embeds is deferred to a second pass, after its donor is
    committed, so it is reused as in a plain run (or embedded, as there, if the donor failed).
    Raises ConfigError (no ray, cannot join the cluster), FasteError when results go missing.
    """
    ray = import_ray()
    with _ray_output(shown=log.isEnabledFor(logging.DEBUG)):
        started_here = _connect(ray, options)
        try:
            resources = plan_resources(options, ray.cluster_resources())
            if resources.note:
                log.warning("ray: %s", resources.note)
            run = _Run(ray, job, options, resources)
            deferred = run.embed(job.plan.todo, in_flight=set())
            run.embed(deferred, in_flight=None)
        finally:
            if started_here:
                ray.shutdown()


@contextmanager
def _ray_output(shown: bool):
    """Ray's own output (its loggers' lines, Ray Data's execution banners, its core worker's
    C++ log lines (`scale.ray_stderr`), the C++ failure handler's stack dump when the driver is
    stopped) stays off the user's terminal unless this module logs at DEBUG (`--debug`); Ray
    Data still writes its session log files."""
    if shown:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    # read by Ray's core worker when this process joins Ray (ray.init), not later
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        with hidden_cpp_log_lines():
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


class _Run:
    """The driver's side of one `index --ray` call: prepares chunks, streams the files to embed
    through the pipeline, commits each chunk when all its results are back."""

    def __init__(self, ray, job: IngestJob, options: RayOptions, resources: ResourcePlan) -> None:
        self.ray, self.job, self.col, self.changed = ray, job, job.col, job.plan.changed
        self.resources = resources
        self.chunk_files, self.tally, self.options, self.report_progress = (job.chunk_files, job.tally, options,
                                                                            job.on_committed)
        self.done = 0  # files committed, for progress

    def embed(self, files: Sequence[ScannedFile], in_flight: set[tuple[str, str]] | None) -> list[ScannedFile]:
        """Prepare, embed and commit `files`; returns the files deferred (see `prepare_chunk`)."""
        pending: dict[int, _Pending] = {}
        rows: list[dict] = []
        deferred: list[ScannedFile] = []
        units: list[tuple[int, int] | LongPdf] = []  # unit id -> (chunk, position in its to_embed), or a long PDF
        long_pdfs: list[LongPdf] = []
        for start in range(0, len(files), self.chunk_files):
            chunk = files[start:start + self.chunk_files]
            long = {f.uri: n for f in chunk if (n := _long_pdf_pages(f, self.job.chunk_pages)) is not None}
            whole = [f for f in chunk if f.uri not in long]
            if whole:
                deferred.extend(self._plan_chunk(start, whole, in_flight, rows, units, pending))
            for f in chunk:
                if f.uri in long:
                    deferred.extend(self._plan_long_pdf(f, long[f.uri], in_flight, rows, units, long_pdfs))
        if rows:
            model = _worker_model(self.job)
            dataset = _pipeline(self.ray, rows, model, self.job.profile, self.options, self.resources)
            watch = StallWatch(lambda: describe_wait(self.resources, self.ray.available_resources()))
            with watching(watch):
                self._collect(dataset, units, pending, watch)
        if pending:
            missing = sum(len(p.prepared.to_embed) - len(p.outputs) for p in pending.values())
            raise FasteError(f"Ray returned no result for {missing} files; nothing of their chunks was "
                             f"committed; run the same command again to embed them")
        unsettled = [pdf.file.path for pdf in long_pdfs if not pdf.settled]
        if unsettled:
            raise FasteError(f"Ray returned no result for some pages of {len(unsettled)} PDFs ({unsettled[0]} ...); "
                             f"the page ranges committed are kept; run the same command again to finish them")
        return deferred

    def _plan_chunk(self, start: int, files: list[ScannedFile], in_flight: set[tuple[str, str]] | None,
                    rows: list[dict], units: list, pending: dict[int, _Pending]) -> list[ScannedFile]:
        """Prepare one chunk: commit it now when nothing is left to embed, else queue its files
        (rows for the pipeline) and wait for them in `pending`. Returns its deferred files."""
        prepared = prepare_chunk(self.col, files, in_flight)
        if not prepared.to_embed:  # all reused or failed: nothing for the cluster
            commit_chunk(self.col, prepared, self.changed, None, self.tally)
            self._committed(len(prepared.files))
            return prepared.deferred
        waiting = pending[start] = _Pending(prepared)
        for position, (base, value) in enumerate(prepared.to_embed):
            task = FileTask(base["uri"], base["modality"], value if base["modality"] == "text" else None)
            if in_flight is None and (failed := self._undecodable(task)) is not None:
                waiting.outputs[position] = failed
                continue
            rows.append({"unit": len(units), "task": pickle.dumps(task)})
            units.append((start, position))
        if len(waiting.outputs) == len(prepared.to_embed):
            _commit(self.col, waiting, self.changed, self.tally)
            del pending[start]
            self._committed(len(prepared.files))
        return prepared.deferred

    def _plan_long_pdf(self, f: ScannedFile, n_pages: int, in_flight: set[tuple[str, str]] | None,
                       rows: list[dict], units: list, long_pdfs: list[LongPdf]) -> list[ScannedFile]:
        """Prepare a PDF committed range by range (`scale.ray_pages`): only the pages an
        interrupted run did not commit go to the pipeline. Returns it when it is deferred."""
        prepared, pdf = plan_long_pdf(self.col, f, n_pages, self.changed, self.job.chunk_pages, in_flight)
        if pdf is None:  # reused, failed or deferred
            commit_chunk(self.col, prepared, self.changed, None, self.tally)
            self._committed(len(prepared.files))
            return prepared.deferred
        if not pdf.todo:  # every page committed by an interrupted run that stopped before settling
            pdf.commit(self.col, self.tally, is_last=True)
            self._committed(1)
            return []
        task = FileTask(pdf.base["uri"], pdf.base["modality"], None, tuple(pdf.todo))
        rows.append({"unit": len(units), "task": pickle.dumps(task)})
        units.append(pdf)
        long_pdfs.append(pdf)
        return []

    def _collect(self, dataset, units: list, pending: dict[int, _Pending], watch: StallWatch) -> None:
        """Stream the pipeline's results: commit each chunk whose results are all back, and each
        long PDF's pages range by range."""
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            watch.progressed()
            for unit, part, parts, payload in zip(batch["unit"], batch["part"], batch["parts"], batch["embedded"]):
                sink = units[int(unit)]
                if isinstance(sink, LongPdf):
                    if sink.add_part(self.col, int(part), int(parts), pickle.loads(payload), self.tally):
                        self._committed(1)
                    continue
                chunk, position = sink
                waiting = pending.get(chunk)
                if waiting is None:  # a retried call delivered twice: already committed
                    continue
                waiting.add_part(position, int(part), int(parts), pickle.loads(payload))
                if len(waiting.outputs) == len(waiting.prepared.to_embed):
                    _commit(self.col, waiting, self.changed, self.tally)
                    del pending[chunk]
                    self._committed(len(waiting.prepared.files))

    def _undecodable(self, task: FileTask) -> dict | None:
        """The output of a file that fails to decode (decoded here, on the driver), else None.
        Used for the second pass, whose files are copies of content the first pass could not
        store (mostly broken or empty files): no actor pool is started only to fail them again."""
        if task.modality == "text":
            return None
        rows = decode_file(Path(task.path), kind_name(task.path), self.job.profile)
        if any(row.reason is None for row in rows):
            return None
        return {"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                "vectors": np.zeros((len(rows), self.job.profile.dim), dtype=np.float32),
                **dict.fromkeys(STAT_FIELDS, 0)}

    def _committed(self, n_files: int) -> None:
        self.done += n_files
        self.report_progress(self.done)


def _connect(ray, options: RayOptions) -> bool:
    """Join or start Ray; True when this call started it (and so shuts it down)."""
    if ray.is_initialized():
        return False
    address = None if options.address == "auto" else options.address
    try:
        # the workers' own output (actor warnings, their logs) reaches this terminal only with --debug
        debug = log.isEnabledFor(logging.DEBUG)
        # ERROR: ray.init's own warnings (token authentication on by default) are not ours to print
        ray.init(address=address, include_dashboard=False, log_to_driver=debug,
                 logging_level=logging.DEBUG if debug else logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ConfigError(f"cannot join the Ray cluster at {options.address!r} ({error}); start it with "
                          f"`ray start --head` (then `ray start --address HEAD:6379` on the other nodes) "
                          f"or use --ray auto for a local Ray") from None
    return True


def _worker_model(job: IngestJob) -> WorkerModel:
    """The driver's model as the actors load it, with the collection's profile (pixels, video,
    FastE, dim). The model is not loaded here: an existing collection was matched by model id and
    revision already, and each actor checks the width."""
    model, profile = job.model, job.profile
    return WorkerModel(model.name, model.revision, model.dtype, model.batching, profile.serializer(),
                       profile.fast_e(), profile.dim, profile.model_dim, profile.patch_dedup)


def _pipeline(ray, rows: list[dict], model: WorkerModel, profile: CollectionProfile, options: RayOptions,
              resources: ResourcePlan):
    """The Ray Data dataset: planned files -> decoding tasks -> embedding actors (lazy).

    Ray Data restarts a dead actor and retries its calls (its actor pools default to
    max_restarts=-1, max_task_retries=-1); a decoding task that dies is retried too."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the library logs, the CLI renders progress
    context.print_on_execution_start = log.isEnabledFor(logging.DEBUG)
    gpus, workers, cpus = resources.gpus_per_worker, resources.workers, resources.cpus_per_worker
    driver_node = ray.get_runtime_context().get_node_id()
    server = None
    if options.ship_bytes:  # files are read on the driver's node, bytes travel in the object store
        server = ray.remote(FileServer).options(
            num_cpus=0, max_concurrency=8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(driver_node, soft=False)).remote()
    log.info("ray: %d files, %d embedding actors (%g GPU, %g CPU each), decoding %g CPU per task, ship_bytes=%s",
             len(rows), workers, gpus, cpus, resources.decode_cpus, options.ship_bytes)
    # Blocks of about files_per_task rows: a task's results come back when its block is done, so
    # small blocks let commits stream while later files are still embedding.
    blocks = min(_MAX_BLOCKS, -(-len(rows) // options.files_per_task))
    dataset = ray.data.from_items(rows, override_num_blocks=blocks)
    dataset = dataset.map_batches(
        decode_files, batch_size=options.files_per_task, batch_format="numpy", num_cpus=resources.decode_cpus,
        fn_kwargs={"profile": profile, "server": server, "driver_node": driver_node},
        # Decoded images and rendered pages are large; asking for memory also keeps decoding in its
        # own CPU tasks: Ray Data fuses a task stage into the actors when both ask for the same
        # resources (CPU actors), and each actor would then decode and embed in turn.
        memory=_DECODE_MEMORY)
    return dataset.map_batches(
        EmbedActor, batch_size=options.files_per_call, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus, num_cpus=cpus,
        fn_constructor_kwargs={"model": model, "gpus": gpus, "cpus": cpus,
                               "registry": os.environ.get(ACTOR_REGISTRY_ENV)})


def _joined(parts: list[dict]) -> dict:
    """One file's output from the outputs of its parts, in page order."""
    if len(parts) == 1:
        return parts[0]
    return {"pages": [p for part in parts for p in part["pages"]],
            "reasons": [r for part in parts for r in part["reasons"]],
            "vectors": np.concatenate([part["vectors"] for part in parts]),
            **{name: sum(part.get(name, 0) for part in parts) for name in STAT_FIELDS}}


def _commit(col: "Collection", waiting: _Pending, changed: frozenset[str], tally: IngestTally) -> None:
    """Rebuild the chunk's `EmbedResult` from its files' outputs and commit it as `index` does."""
    from faste_mm import EmbedResult, Failure, Item

    vectors, items, sources, ok, failures = [], [], [], [], []
    for position in range(len(waiting.prepared.to_embed)):
        output = waiting.outputs[position]
        count_output(tally, output)
        for page, vector, reason in zip(output["pages"], output["vectors"], output["reasons"]):
            if reason is not None:
                failures.append(Failure(len(items), position, "", reason))
            vectors.append(vector)
            items.append(Item(text="", page=page))  # only the page is read (names come from the uris)
            sources.append(position)
            ok.append(reason is None)
    result = EmbedResult(np.stack(vectors).astype(np.float32, copy=False), items, sources, np.array(ok, dtype=bool),
                         failures)
    commit_chunk(col, waiting.prepared, changed, result, tally)


