"""`index --ray`, the workers' side: the decoding tasks (each planned file through its kind's
decoder, a PDF's pages a part at a time) and the embedding actors (one `Embedder` each) that
`faste_mm.scale.ray_index` chains into a Ray Data pipeline. Everything here runs in Ray workers
and travels between them pickled, so it is kept apart from the driver's bookkeeping.

Receives `FileTask`s (a path or a text, and the pages to embed); hands on, per part of a file,
its pages' vectors and failure reasons.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.kinds import KINDS, dedups_patches, kind_name
from faste_mm.model.cost import CostTally
from faste_mm.model.file_decoding import count_pdf_pages
from faste_mm.model.patch_dedup import dedup_config
from faste_mm.retrieval.decoders import Decoded, decode_file, decode_pdf_pages
from faste_mm.retrieval.profile import CollectionProfile

if TYPE_CHECKING:
    from faste_mm import BatchingConfig, FastEConfig, SerializerConfig

PAGES_PER_PART = 16  # a PDF's pages travel from decoding to embedding this many at a time


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
    patch_dedup: str = "off"  # the collection's duplicate-patch removal (off, exact, near)


# What an embedding call counts (`CostTally`'s fields, read off its `EmbedStats`), summed over a run
# by the driver (`ray_pages.count_output`).
STAT_FIELDS = tuple(f.name for f in fields(CostTally))


@dataclass(frozen=True, slots=True)
class FileTask:
    """One file to decode: `value` is the text of a text file, else None (read `path`); `pages`:
    the pages of a PDF to decode (None: all; a resumed long PDF skips its committed ones)."""

    path: str
    modality: str
    value: object
    pages: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ShippedFile:
    """A file's bytes shipped from the driver's node (ship_bytes) for an actor to read itself:
    videos, whose decoded frames are far larger than the file. `name` keeps the suffix."""

    name: str
    data: bytes


class FileServer:
    """Reads files on the driver's node for `ship_bytes` (a Ray actor pinned there)."""

    def read(self, path: str) -> bytes | str:
        """The bytes, or why they cannot be read."""
        try:
            return Path(path).read_bytes()
        except OSError as error:
            return f"{path}: cannot read the file on the driver ({error})"


def decode_files(batch: dict[str, np.ndarray], profile: CollectionProfile, server,
                 driver_node: str) -> Iterator[dict[str, np.ndarray]]:
    """Ray task: decode each planned file into rows (`Decoded`) with its kind's decoder, the one
    the plain path uses (`faste_mm.retrieval.decoders`), under the collection's profile. A
    generator: each part of a file (a PDF's pages PAGES_PER_PART at a time, any other file
    whole) is one output row, rendered only when the previous one has gone on, so a task
    never holds a long PDF's pages at once. Rows carry `part` of `parts` for the driver."""
    for unit, payload in zip(batch["unit"], batch["task"]):
        task: FileTask = pickle.loads(payload)
        for part, (rows, parts) in enumerate(decode_file_parts(task, profile, server, driver_node)):
            yield {"unit": np.array([unit]), "part": np.array([part]), "parts": np.array([parts]),
                   "decoded": np.array([pickle.dumps((task.path, rows))], dtype=object)}


def decode_file_parts(task: FileTask, profile: CollectionProfile, server,
                      driver_node: str) -> Iterator[tuple[list[Decoded], int]]:
    """The file's rows in parts (a PDF's: only `task.pages`, when given), each with the number
    of parts."""
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
            yield [Decoded(None, ShippedFile(Path(task.path).name, data))], 1
            return
        with tempfile.TemporaryDirectory(prefix="faste-mm-") as folder:
            local = Path(folder) / Path(task.path).name  # same name: same suffix-based handling
            local.write_bytes(data)
            for decoded, parts in decode_parts(local, kind, profile, task.pages):
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
    yield from decode_parts(Path(task.path), kind, profile, task.pages)


def decode_parts(path: Path, kind: str, profile: CollectionProfile,
                 pages: Sequence[int] | None = None) -> Iterator[tuple[list[Decoded], int]]:
    """A PDF's pages (all, or `pages`) PAGES_PER_PART at a time (rendered as each part is asked
    for), any other file (or a PDF that cannot be opened) in one part."""
    if KINDS[kind].decoder != "pdf-pages":
        yield decode_file(path, kind, profile), 1
        return
    if pages is None:
        try:
            pages = range(1, count_pdf_pages(path) + 1)
        except FasteError:
            yield decode_file(path, kind, profile), 1  # the failure row, worded as the plain run's
            return
    parts = -(-len(pages) // PAGES_PER_PART)
    for first in range(0, len(pages), PAGES_PER_PART):
        yield decode_pdf_pages(path, profile, pages[first:first + PAGES_PER_PART]), parts


class EmbedActor:
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
        self.patch_dedup = dedup_config(model.patch_dedup)
        self.registry = None  # test hook (ray_index.ACTOR_REGISTRY_ENV)
        if registry:
            import ray

            self.registry = ray.get_actor(registry)
            self.registry.add.remote(ray.get_runtime_context().current_actor)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from faste_mm import Item

        if self.registry is not None:  # a test may kill this actor here, in the middle of a call
            import ray

            ray.get(self.registry.calling.remote(ray.get_runtime_context().current_actor))
        decoded = [pickle.loads(payload) for payload in batch["decoded"]]  # (path, rows) per file
        files = [rows for _, rows in decoded]
        with tempfile.TemporaryDirectory(prefix="faste-mm-") as folder:
            items, owners = [], []  # the rows to embed, and (file, row in the file) of each
            for f, rows in enumerate(files):
                for r, row in enumerate(rows):
                    if row.reason is None:
                        items.append(embedder_input(row, Path(folder) / str(len(items))))
                        owners.append((f, r))
            vectors, reasons, stats = self._embed(items, [dedups_patches(decoded[f][0]) for f, _ in owners])
        outputs = [{"pages": [row.page for row in rows], "reasons": [row.reason for row in rows],
                    "vectors": np.zeros((len(rows), self.dim), dtype=np.float32),
                    **dict.fromkeys(STAT_FIELDS, 0)} for rows in files]
        for index, (f, r) in enumerate(owners):
            if index in reasons:  # named after the decoded image or copy; the plain run names the file
                name = Item(image=decoded[f][0], page=files[f][r].page).describe()
                outputs[f]["reasons"][r] = reasons[index].replace(items[index].describe(), name)
            else:
                outputs[f]["vectors"][r] = vectors[index]
        if outputs:
            outputs[0].update(stats)
        return {"unit": batch["unit"], "part": batch["part"], "parts": batch["parts"],
                "embedded": np.array([pickle.dumps(o) for o in outputs], dtype=object)}

    def _embed(self, items: list, dedups: list[bool]) -> tuple[np.ndarray, dict[int, str], dict[str, float]]:
        """(vectors [n, dim], {item: failure reason}, `STAT_FIELDS` totals) of `items`, embedded as
        the plain run embeds them: duplicate-patch removal on the items whose file it applies to
        (`dedups`: PDF pages and lossless images, by the file's suffix; decoded here, every picture
        is in memory), the rest in a call of their own without it."""
        vectors = np.zeros((len(items), self.dim), dtype=np.float32)
        reasons: dict[int, str] = {}
        stats = dict.fromkeys(STAT_FIELDS, 0)
        deduped = [i for i, d in enumerate(dedups) if d and self.patch_dedup is not None]
        plain = [i for i, d in enumerate(dedups) if not (d and self.patch_dedup is not None)]
        for rows, dedup in ((deduped, self.patch_dedup), (plain, None)):
            if not rows:
                continue
            result = self.embedder.encode_documents([items[i] for i in rows], fast_e=self.fast_e, dim=self.dim,
                                                    on_error="skip", patch_dedup=dedup)
            vectors[rows] = result.embeddings
            reasons.update({rows[failure.index]: failure.reason for failure in result.failures})
            if result.stats is not None:
                for name in STAT_FIELDS:
                    stats[name] += getattr(result.stats, name)
        return vectors, reasons, stats


def embedder_input(row: Decoded, folder: Path) -> object:
    """The `Item` an actor embeds for a decoded row; a shipped file is written under `folder`
    (kept until the call's batch is embedded)."""
    from faste_mm import Item

    if isinstance(row.value, ShippedFile):
        folder.mkdir()
        local = folder / row.value.name
        local.write_bytes(row.value.data)
        return Item(video=local)
    return row.value if isinstance(row.value, Item) else Item(image=row.value, page=row.page)
