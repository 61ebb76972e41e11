"""`index --ray`: the embedding of an index run on a Ray Data pipeline, for many GPUs and cores.

The driver (this process) plans exactly as a plain `index` does (`faste_mm.ingest`: scan,
size/mtime, content hash, reuse, removal), holds the collection's single writer lock, and commits
each chunk of files once all its results are back, so a killed driver loses at most the chunks
not yet committed and a re-run embeds only what is missing. The pipeline:

    planned files (path, or text; bytes fetched from the driver's node with ship_bytes)
      -> map_batches tasks (CPU):   decode images, render PDF pages   (`_decode_files`)
      -> map_batches actor pool:    one Embedder per actor (GPU or CPU); serialization in its
                                    prefetch threads, token-budget batches, FastE (`_EmbedActor`)
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
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.retrieval.ingest import IngestTally, PreparedChunk, ScannedFile, UpdatePlan, commit_chunk, prepare_chunk
from faste_mm.scale.resources import ResourcePlan, StallWatch, describe_wait, plan_resources, watching

if TYPE_CHECKING:
    from faste_mm.scale.options import RayOptions
    from faste_mm import BatchingConfig, FastEConfig, Retriever, SerializerConfig
    from faste_mm.indexers import Collection

log = logging.getLogger(__name__)

# Test hook: the name of a Ray actor with an `add(handle)` method; each embedding actor registers
# its handle there when it starts (again after a restart), so a test can ray.kill one mid-run.
ACTOR_REGISTRY_ENV = "FASTE_MM_RAY_ACTOR_REGISTRY"
_MAX_BLOCKS = 20_000  # bounds Ray Data's per-block bookkeeping on runs of millions of files
_DECODE_MEMORY = 768 * 1024 * 1024  # logical memory per decoding task (its worker imports torch: ~0.5 GiB)


def import_ray():
    """The `ray` module with Ray Data, or a ConfigError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (ray without the [data] extra lacks pyarrow/pandas)
    except ImportError as error:
        raise ConfigError(f"--ray needs Ray Data, which is not installed ({error}); "
                          f"install it with: pip install 'faste-mm[ray]'") from None
    return ray


@dataclass(frozen=True, slots=True)
class WorkerModel:
    """What each embedding actor loads: the driver's model, with the collection's pixel bounds
    and FastE settings, so its vectors are comparable with the stored ones."""

    name: str
    revision: str | None
    dtype: str
    batching: "BatchingConfig | None"
    serializer: "SerializerConfig"
    fast_e: "FastEConfig | None"
    dim: int  # stored width (Matryoshka collections keep the first `dim` dimensions)
    model_dim: int | None = None  # the model's own width, when the collection recorded it


@dataclass(frozen=True, slots=True)
class _FileTask:
    """One file to decode: `value` is the text of a text file, else None (read `path`)."""

    path: str
    modality: str
    value: object


@dataclass(frozen=True, slots=True)
class _Decoded:
    """One row of a decoded file: a page number (PDFs), a PIL image or text `Item`, or why not."""

    page: int | None
    value: object = None
    reason: str | None = None


@dataclass
class _Pending:
    """A chunk waiting for the results of its `to_embed` files (by position)."""

    prepared: PreparedChunk
    outputs: dict[int, dict] = field(default_factory=dict)


# ---- the driver ------------------------------------------------------------------------------
def ingest_plan_with_ray(retriever: "Retriever", col: "Collection", plan: UpdatePlan, chunk_files: int,
                         tally: IngestTally, options: RayOptions,
                         report_progress: Callable[[int], None]) -> None:
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
            run = _Run(ray, retriever, col, plan.changed, chunk_files, tally, options, report_progress, resources)
            deferred = run.embed(plan.todo, in_flight=set())
            run.embed(deferred, in_flight=None)
        finally:
            if started_here:
                ray.shutdown()


@contextmanager
def _ray_output(shown: bool):
    """Ray's own output (its loggers' lines, Ray Data's execution banners, the C++ failure
    handler's stack dump when the driver is stopped) stays off the user's terminal unless
    this module logs at DEBUG (`--debug`); Ray Data still writes its session log files."""
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
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


class _Run:
    """The driver's side of one `index --ray` call: prepares chunks, streams the files to embed
    through the pipeline, commits each chunk when all its results are back."""

    def __init__(self, ray, retriever: "Retriever", col: "Collection", changed: frozenset[str], chunk_files: int,
                 tally: IngestTally, options: RayOptions, report_progress: Callable[[int], None],
                 resources: ResourcePlan) -> None:
        self.ray, self.retriever, self.col, self.changed = ray, retriever, col, changed
        self.resources = resources
        self.chunk_files, self.tally, self.options, self.report_progress = chunk_files, tally, options, report_progress
        self.done = 0  # files committed, for progress

    def embed(self, files: Sequence[ScannedFile], in_flight: set[tuple[str, str]] | None) -> list[ScannedFile]:
        """Prepare, embed and commit `files`; returns the files deferred (see `prepare_chunk`)."""
        pending: dict[int, _Pending] = {}
        rows, deferred = [], []
        units: list[tuple[int, int]] = []  # unit id -> (chunk, position in its to_embed)
        for start in range(0, len(files), self.chunk_files):
            prepared = prepare_chunk(self.col, files[start:start + self.chunk_files], in_flight)
            deferred.extend(prepared.deferred)
            if not prepared.to_embed:  # all reused or failed: nothing for the cluster
                commit_chunk(self.col, prepared, self.changed, None, self.tally)
                self._committed(prepared)
                continue
            waiting = pending[start] = _Pending(prepared)
            for position, (base, value) in enumerate(prepared.to_embed):
                task = _FileTask(base["uri"], base["modality"], value if base["modality"] == "text" else None)
                if in_flight is None and (failed := self._undecodable(task)) is not None:
                    waiting.outputs[position] = failed
                    continue
                rows.append({"unit": len(units), "task": pickle.dumps(task)})
                units.append((start, position))
            if len(waiting.outputs) == len(prepared.to_embed):
                _commit(self.col, waiting, self.changed, self.tally)
                del pending[start]
                self._committed(prepared)
        if rows:
            model = _worker_model(self.retriever, self.col)
            dataset = _pipeline(self.ray, rows, model, self.options, self.resources)
            watch = StallWatch(lambda: describe_wait(self.resources, self.ray.available_resources()))
            with watching(watch):
                self._collect(dataset, units, pending, watch)
        if pending:
            missing = sum(len(p.prepared.to_embed) - len(p.outputs) for p in pending.values())
            raise FasteError(f"Ray returned no result for {missing} files; nothing of their chunks was "
                             f"committed; run the same command again to embed them")
        return deferred

    def _collect(self, dataset, units: list[tuple[int, int]], pending: dict[int, _Pending], watch: StallWatch) -> None:
        """Stream the pipeline's results and commit each chunk whose results are all back."""
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            watch.progressed()
            for unit, payload in zip(batch["unit"], batch["embedded"]):
                chunk, position = units[int(unit)]
                waiting = pending.get(chunk)
                if waiting is None:  # a retried call delivered twice: already committed
                    continue
                waiting.outputs[position] = pickle.loads(payload)
                if len(waiting.outputs) == len(waiting.prepared.to_embed):
                    _commit(self.col, waiting, self.changed, self.tally)
                    del pending[chunk]
                    self._committed(waiting.prepared)

    def _undecodable(self, task: _FileTask) -> dict | None:
        """The output of a file that fails to decode (decoded here, on the driver), else None.
        Used for the second pass, whose files are copies of content the first pass could not
        store (mostly broken or empty files): no actor pool is started only to fail them again."""
        if task.modality == "text":
            return None
        rows = _decode_path(Path(task.path), task.modality, self.col.manifest.max_pixels)
        if any(row.reason is None for row in rows):
            return None
        return {"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                "vectors": np.zeros((len(rows), self.col.manifest.dim), dtype=np.float32),
                "prefix_tokens": 0, "kept_prefix_tokens": 0}

    def _committed(self, prepared: PreparedChunk) -> None:
        self.done += len(prepared.files)
        self.report_progress(self.done)


def _connect(ray, options: RayOptions) -> bool:
    """Join or start Ray; True when this call started it (and so shuts it down)."""
    if ray.is_initialized():
        return False
    address = None if options.address == "auto" else options.address
    try:
        # the workers' own output (actor warnings, their logs) reaches this terminal only with --debug
        debug = log.isEnabledFor(logging.DEBUG)
        ray.init(address=address, include_dashboard=False, log_to_driver=debug,
                 logging_level=logging.DEBUG if debug else logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ConfigError(f"cannot join the Ray cluster at {options.address!r} ({error}); start it with "
                          f"`ray start --head` (then `ray start --address HEAD:6379` on the other nodes) "
                          f"or use --ray auto for a local Ray") from None
    return True


def _worker_model(retriever: "Retriever", col: "Collection") -> WorkerModel:
    """The driver's model as the actors load it. The model is not loaded here: an existing
    collection was matched by model id and revision already, and each actor checks the dim."""
    from faste_mm import SerializerConfig

    manifest = col.manifest
    serializer = SerializerConfig(min_pixels=manifest.min_pixels, max_pixels=manifest.max_pixels)
    fast_e = retriever._collection_fast_e(col)
    loaded = retriever._embedder
    if loaded is not None:
        dtype = str(loaded.backbone.dtype).removeprefix("torch.")
        return WorkerModel(loaded.model_id, loaded.loaded.revision, dtype, loaded.batching, serializer, fast_e,
                           manifest.dim, manifest.model_dim)
    spec = retriever._spec
    return WorkerModel(spec.name, spec.revision, spec.dtype, spec.batching, serializer, fast_e, manifest.dim,
                       manifest.model_dim)


def _pipeline(ray, rows: list[dict], model: WorkerModel, options: RayOptions, resources: ResourcePlan):
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
        server = ray.remote(_FileServer).options(
            num_cpus=0, max_concurrency=8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(driver_node, soft=False)).remote()
    log.info("ray: %d files, %d embedding actors (%g GPU, %g CPU each), decoding %g CPU per task, ship_bytes=%s",
             len(rows), workers, gpus, cpus, resources.decode_cpus, options.ship_bytes)
    # Blocks of about files_per_task rows: a task's results come back when its block is done, so
    # small blocks let commits stream while later files are still embedding.
    blocks = min(_MAX_BLOCKS, -(-len(rows) // options.files_per_task))
    dataset = ray.data.from_items(rows, override_num_blocks=blocks)
    dataset = dataset.map_batches(
        _decode_files, batch_size=options.files_per_task, batch_format="numpy", num_cpus=resources.decode_cpus,
        fn_kwargs={"max_pixels": model.serializer.max_pixels, "server": server, "driver_node": driver_node},
        # Decoded images and rendered pages are large; asking for memory also keeps decoding in its
        # own CPU tasks: Ray Data fuses a task stage into the actors when both ask for the same
        # resources (CPU actors), and each actor would then decode and embed in turn.
        memory=_DECODE_MEMORY)
    return dataset.map_batches(
        _EmbedActor, batch_size=options.files_per_call, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus, num_cpus=cpus,
        fn_constructor_kwargs={"model": model, "gpus": gpus, "cpus": cpus,
                               "registry": os.environ.get(ACTOR_REGISTRY_ENV)})


def _commit(col: "Collection", waiting: _Pending, changed: frozenset[str], tally: IngestTally) -> None:
    """Rebuild the chunk's `EmbedResult` from its files' outputs and commit it as `index` does."""
    from faste_mm import EmbedResult, Failure, Item

    vectors, items, sources, ok, failures = [], [], [], [], []
    for position in range(len(waiting.prepared.to_embed)):
        output = waiting.outputs[position]
        tally.prefix_tokens += output["prefix_tokens"]
        tally.kept_prefix_tokens += output["kept_prefix_tokens"]
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


# ---- the workers -----------------------------------------------------------------------------
class _FileServer:
    """Reads files on the driver's node for `ship_bytes` (a Ray actor pinned there)."""

    def read(self, path: str) -> bytes | str:
        """The bytes, or why they cannot be read."""
        try:
            return Path(path).read_bytes()
        except OSError as error:
            return f"{path}: cannot read the file on the driver ({error})"


def _decode_files(batch: dict[str, np.ndarray], max_pixels: int, server, driver_node: str) -> dict[str, np.ndarray]:
    """Ray task: decode each planned file into rows (`_Decoded`): images decoded, PDF pages
    rendered at the collection's max_pixels, text passed through."""
    out = []
    for payload in batch["task"]:
        task: _FileTask = pickle.loads(payload)
        out.append(pickle.dumps((task.path, _decode_file(task, max_pixels, server, driver_node))))
    return {"unit": batch["unit"], "decoded": np.array(out, dtype=object)}


def _decode_file(task: _FileTask, max_pixels: int, server, driver_node: str) -> list[_Decoded]:
    if task.modality == "text":
        return [_Decoded(None, task.value)]
    if server is not None:
        import ray

        data = ray.get(server.read.remote(task.path))
        if isinstance(data, str):
            return [_Decoded(None, reason=data)]
        with tempfile.TemporaryDirectory(prefix="faste-mm-") as folder:
            local = Path(folder) / Path(task.path).name  # same name: same suffix-based handling
            local.write_bytes(data)
            decoded = _decode_path(local, task.modality, max_pixels)
            # Messages name the file as the driver knows it, as a plain run's would.
            return [replace(d, reason=d.reason.replace(str(local), task.path)) if d.reason else d for d in decoded]
    if not os.path.exists(task.path):
        import ray

        if ray.get_runtime_context().get_node_id() != driver_node:
            return [_Decoded(None, reason=(
                f"{task.path}: not visible on Ray node {socket.gethostname()}: the driver found it, but this worker "
                f"cannot read it; put the files on storage every node mounts at the same path, or index with "
                f"--ship-bytes (RayOptions(ship_bytes=True)); then run index again with --retry-failed"))]
    return _decode_path(Path(task.path), task.modality, max_pixels)


def _decode_path(path: Path, modality: str, max_pixels: int) -> list[_Decoded]:
    """Decode with the functions the serializer uses; a failure's reason is the one a plain run's
    embedder records (`expand_items` for a PDF's page count, `item_failure` for the rest)."""
    from faste_mm import Item
    from faste_mm.model.embedder import item_failure
    from faste_mm.model.items import count_pdf_pages, load_image
    from faste_mm.model.prefetch import ItemError

    def reason(item: Item, error: Exception) -> str:
        return item_failure([item], [0], ItemError(0, error)).reason

    if modality != "page":
        item = Item(image=path)
        try:
            return [_Decoded(None, load_image(item, max_pixels))]
        except Exception as error:  # one bad file is a failure row, never the job's end
            return [_Decoded(None, reason=reason(item, error))]
    try:
        n_pages = count_pdf_pages(path)
    except FasteError as error:
        return [_Decoded(None, reason=str(error))]
    rows = []
    for page in range(1, n_pages + 1):
        item = Item(image=path, page=page)
        try:
            rows.append(_Decoded(page, load_image(item, max_pixels)))
        except Exception as error:
            rows.append(_Decoded(page, reason=reason(item, error)))
    return rows


class _EmbedActor:
    """Ray actor: loads the Embedder once, then embeds the decoded rows of a batch of files in
    one `encode_documents` call (token-budget batches and FastE over all their items)."""

    def __init__(self, model: WorkerModel, gpus: float, cpus: float, registry: str | None = None) -> None:
        import torch

        from faste_mm import BatchingConfig, Embedder

        threads = max(1, round(cpus))
        torch.set_num_threads(threads)
        batching = model.batching or BatchingConfig()
        if batching.workers is None:  # one node hosts several actors: no thread per core each
            batching = replace(batching, workers=threads)
        self.embedder = Embedder.from_pretrained(model.name, device="cuda" if gpus > 0 else "cpu", dtype=model.dtype,
                                                 revision=model.revision, batching=batching,
                                                 serializer=model.serializer)
        # A Matryoshka collection stores the first `dim` dimensions (re-normalised), as plain index does.
        if self.embedder.dim != (model.model_dim or model.dim) or model.dim > self.embedder.dim:
            raise ConfigError(f"{model.name} makes {self.embedder.dim}-d vectors on this worker, the collection "
                              f"was made with {model.model_dim or model.dim}-d ones; index with the collection's model")
        self.dim = model.dim
        self.fast_e = model.fast_e
        if registry:
            import ray

            ray.get_actor(registry).add.remote(ray.get_runtime_context().current_actor)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from faste_mm import Item

        decoded = [pickle.loads(payload) for payload in batch["decoded"]]  # (path, rows) per file
        files = [rows for _, rows in decoded]
        items, owners = [], []  # the rows to embed, and (file, row in the file) of each
        for f, rows in enumerate(files):
            for r, row in enumerate(rows):
                if row.reason is None:
                    items.append(row.value if isinstance(row.value, Item) else Item(image=row.value, page=row.page))
                    owners.append((f, r))
        result = (self.embedder.encode_documents(items, fast_e=self.fast_e, dim=self.dim, on_error="skip")
                  if items else None)
        reasons = {} if result is None else {failure.index: failure.reason for failure in result.failures}
        outputs = [{"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                    "vectors": np.zeros((len(rows), self.dim), dtype=np.float32),
                    "prefix_tokens": 0, "kept_prefix_tokens": 0} for rows in files]
        for index, (f, r) in enumerate(owners):
            if index in reasons:  # named after the decoded image; the plain run names the file
                name = Item(image=decoded[f][0], page=files[f][r].page).describe()
                outputs[f]["reasons"][r] = reasons[index].replace(items[index].describe(), name)
            else:
                outputs[f]["vectors"][r] = result.embeddings[index]
        if result is not None and result.stats is not None and outputs:
            outputs[0]["prefix_tokens"] = result.stats.prefix_tokens
            outputs[0]["kept_prefix_tokens"] = result.stats.kept_prefix_tokens
        return {"unit": batch["unit"], "embedded": np.array([pickle.dumps(o) for o in outputs], dtype=object)}

