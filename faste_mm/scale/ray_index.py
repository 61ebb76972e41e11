# Size: ~500 lines: one Ray Data pipeline (driver loop, decode tasks, embedding actor) read top to bottom.
"""`index --ray`: the embedding of an index run on a Ray Data pipeline, for many GPUs and cores.

The driver (this process) plans exactly as a plain `index` does (`faste_mm.ingest`: scan,
size/mtime, content hash, reuse, removal), holds the collection's single writer lock, and commits
each chunk of files once all its results are back, so a killed driver loses at most the chunks
not yet committed and a re-run embeds only what is missing. The pipeline:

    planned files (path, or text; bytes fetched from the driver's node with ship_bytes)
      -> map_batches tasks (CPU):   decode each file with its kind's decoder (images decoded, PDF
                                    pages rendered, videos checked through; `retrieval.decoders`)
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
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.kinds import KINDS, kind_name
from faste_mm.model.items import count_pdf_pages
from faste_mm.retrieval.decoders import Decoded, decode_file, decode_pdf_pages
from faste_mm.retrieval.executors import IngestJob
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.ingest import IngestTally, PreparedChunk, ScannedFile, commit_chunk, prepare_chunk
from faste_mm.scale.resources import ResourcePlan, StallWatch, describe_wait, plan_resources, watching

if TYPE_CHECKING:
    from faste_mm.scale.options import RayOptions
    from faste_mm import BatchingConfig, FastEConfig, SerializerConfig
    from faste_mm.indexers import Collection

log = logging.getLogger(__name__)

# Test hook: the name of a Ray actor with an `add(handle)` method; each embedding actor registers
# its handle there when it starts (again after a restart), so a test can ray.kill one mid-run.
ACTOR_REGISTRY_ENV = "FASTE_MM_RAY_ACTOR_REGISTRY"
_MAX_BLOCKS = 20_000  # bounds Ray Data's per-block bookkeeping on runs of millions of files
PAGES_PER_PART = 16  # a PDF's pages travel from decoding to embedding this many at a time
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
class _ShippedFile:
    """A file's bytes shipped from the driver's node (ship_bytes) for an actor to read itself:
    videos, whose decoded frames are far larger than the file. `name` keeps the suffix."""

    name: str
    data: bytes


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

    def __init__(self, ray, job: IngestJob, options: RayOptions, resources: ResourcePlan) -> None:
        self.ray, self.job, self.col, self.changed = ray, job, job.col, job.plan.changed
        self.resources = resources
        self.chunk_files, self.tally, self.options, self.report_progress = (job.chunk_files, job.tally, options,
                                                                            job.on_committed)
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
            model = _worker_model(self.job)
            dataset = _pipeline(self.ray, rows, model, self.job.profile, self.options, self.resources)
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
            for unit, part, parts, payload in zip(batch["unit"], batch["part"], batch["parts"], batch["embedded"]):
                chunk, position = units[int(unit)]
                waiting = pending.get(chunk)
                if waiting is None:  # a retried call delivered twice: already committed
                    continue
                waiting.add_part(position, int(part), int(parts), pickle.loads(payload))
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
        rows = decode_file(Path(task.path), kind_name(task.path), self.job.profile)
        if any(row.reason is None for row in rows):
            return None
        return {"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                "vectors": np.zeros((len(rows), self.job.profile.dim), dtype=np.float32),
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


def _worker_model(job: IngestJob) -> WorkerModel:
    """The driver's model as the actors load it, with the collection's profile (pixels, video,
    FastE, dim). The model is not loaded here: an existing collection was matched by model id and
    revision already, and each actor checks the width."""
    model, profile = job.model, job.profile
    return WorkerModel(model.name, model.revision, model.dtype, model.batching, profile.serializer(),
                       profile.fast_e(), profile.dim, profile.model_dim)


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
        fn_kwargs={"profile": profile, "server": server, "driver_node": driver_node},
        # Decoded images and rendered pages are large; asking for memory also keeps decoding in its
        # own CPU tasks: Ray Data fuses a task stage into the actors when both ask for the same
        # resources (CPU actors), and each actor would then decode and embed in turn.
        memory=_DECODE_MEMORY)
    return dataset.map_batches(
        _EmbedActor, batch_size=options.files_per_call, batch_format="numpy",
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
            "prefix_tokens": sum(part["prefix_tokens"] for part in parts),
            "kept_prefix_tokens": sum(part["kept_prefix_tokens"] for part in parts)}


def _commit(col: "Collection", waiting: _Pending, changed: frozenset[str], tally: IngestTally) -> None:
    """Rebuild the chunk's `EmbedResult` from its files' outputs and commit it as `index` does."""
    from faste_mm import EmbedResult, Failure, Item

    vectors, items, sources, ok, failures = [], [], [], [], []
    for position in range(len(waiting.prepared.to_embed)):
        output = waiting.outputs[position]
        tally.prefix_tokens += output["prefix_tokens"]
        tally.kept_prefix_tokens += output["kept_prefix_tokens"]
        tally.tower_s += output.get("tower_s", 0.0)
        tally.decoder_s += output.get("decoder_s", 0.0)
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


def _decode_files(batch: dict[str, np.ndarray], profile: CollectionProfile, server,
                  driver_node: str) -> Iterator[dict[str, np.ndarray]]:
    """Ray task: decode each planned file into rows (`Decoded`) with its kind's decoder, the one
    the plain path uses (`faste_mm.retrieval.decoders`), under the collection's profile. A
    generator: each part of a file (a PDF's pages PAGES_PER_PART at a time, any other file
    whole) is one output row, rendered only when the previous one has gone on, so a task
    never holds a long PDF's pages at once. Rows carry `part` of `parts` for the driver."""
    for unit, payload in zip(batch["unit"], batch["task"]):
        task: _FileTask = pickle.loads(payload)
        for part, (rows, parts) in enumerate(_decode_file(task, profile, server, driver_node)):
            yield {"unit": np.array([unit]), "part": np.array([part]), "parts": np.array([parts]),
                   "decoded": np.array([pickle.dumps((task.path, rows))], dtype=object)}


def _decode_file(task: _FileTask, profile: CollectionProfile, server,
                 driver_node: str) -> Iterator[tuple[list[Decoded], int]]:
    """The file's rows in parts, each with the number of parts."""
    if task.modality == "text":  # read on the driver while planning
        yield [Decoded(None, task.value)], 1
        return
    kind = kind_name(task.path)
    if server is not None:
        import ray

        data = ray.get(server.read.remote(task.path))
        if isinstance(data, str):
            yield [Decoded(None, reason=data)], 1
            return
        if KINDS[kind].decoder == "video":  # decoded by the actor's serializer, from its own copy
            yield [Decoded(None, _ShippedFile(Path(task.path).name, data))], 1
            return
        with tempfile.TemporaryDirectory(prefix="faste-mm-") as folder:
            local = Path(folder) / Path(task.path).name  # same name: same suffix-based handling
            local.write_bytes(data)
            for decoded, parts in _decode_parts(local, kind, profile):
                # Messages name the file as the driver knows it, as a plain run's would.
                yield [replace(d, reason=d.reason.replace(str(local), task.path)) if d.reason else d
                       for d in decoded], parts
        return
    if not os.path.exists(task.path):
        import ray

        if ray.get_runtime_context().get_node_id() != driver_node:
            yield [Decoded(None, reason=(
                f"{task.path}: not visible on Ray node {socket.gethostname()}: the driver found it, but this worker "
                f"cannot read it; put the files on storage every node mounts at the same path, or index with "
                f"--ship-bytes (RayOptions(ship_bytes=True)); then run index again with --retry-failed"))], 1
            return
    yield from _decode_parts(Path(task.path), kind, profile)


def _decode_parts(path: Path, kind: str, profile: CollectionProfile) -> Iterator[tuple[list[Decoded], int]]:
    """A PDF's pages PAGES_PER_PART at a time (rendered as each part is asked for), any other
    file (or a PDF that cannot be opened) in one part."""
    if KINDS[kind].decoder != "pdf-pages":
        yield decode_file(path, kind, profile), 1
        return
    try:
        n_pages = count_pdf_pages(path)
    except FasteError:
        yield decode_file(path, kind, profile), 1  # the failure row, worded as the plain run's
        return
    parts = -(-n_pages // PAGES_PER_PART)
    for first in range(1, n_pages + 1, PAGES_PER_PART):
        yield decode_pdf_pages(path, profile, range(first, min(first + PAGES_PER_PART, n_pages + 1))), parts


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
        with tempfile.TemporaryDirectory(prefix="faste-mm-") as folder:
            items, owners = [], []  # the rows to embed, and (file, row in the file) of each
            for f, rows in enumerate(files):
                for r, row in enumerate(rows):
                    if row.reason is None:
                        items.append(_embedder_input(row, Path(folder) / str(len(items))))
                        owners.append((f, r))
            result = (self.embedder.encode_documents(items, fast_e=self.fast_e, dim=self.dim, on_error="skip")
                      if items else None)
        reasons = {} if result is None else {failure.index: failure.reason for failure in result.failures}
        outputs = [{"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                    "vectors": np.zeros((len(rows), self.dim), dtype=np.float32),
                    "prefix_tokens": 0, "kept_prefix_tokens": 0} for rows in files]
        for index, (f, r) in enumerate(owners):
            if index in reasons:  # named after the decoded image or copy; the plain run names the file
                name = Item(image=decoded[f][0], page=files[f][r].page).describe()
                outputs[f]["reasons"][r] = reasons[index].replace(items[index].describe(), name)
            else:
                outputs[f]["vectors"][r] = result.embeddings[index]
        if result is not None and result.stats is not None and outputs:
            outputs[0]["prefix_tokens"] = result.stats.prefix_tokens
            outputs[0]["kept_prefix_tokens"] = result.stats.kept_prefix_tokens
            outputs[0]["tower_s"] = result.stats.tower_s
            outputs[0]["decoder_s"] = result.stats.decoder_s
        return {"unit": batch["unit"], "part": batch["part"], "parts": batch["parts"],
                "embedded": np.array([pickle.dumps(o) for o in outputs], dtype=object)}


def _embedder_input(row: Decoded, folder: Path) -> object:
    """The `Item` an actor embeds for a decoded row; a shipped file is written under `folder`
    (kept until the call's batch is embedded)."""
    from faste_mm import Item

    if isinstance(row.value, _ShippedFile):
        folder.mkdir()
        local = folder / row.value.name
        local.write_bytes(row.value.data)
        return Item(video=local)
    return row.value if isinstance(row.value, Item) else Item(image=row.value, page=row.page)
