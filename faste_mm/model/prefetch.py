"""Stage 3b: preprocessing overlapped with compute. Worker threads read, decode, resize and
tokenize items chunk by chunk, form length-sorted batches and queue them (pinned on CUDA),
while the caller's thread runs the model on the batches already queued.

Receives items and a serializer; yields `Batch`es and per-item failures, in chunk order.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

from faste_mm.model.batching import Batch, BatchingConfig, collate, plan_batches
from faste_mm.model.serialization import Serialized


@dataclass(frozen=True, slots=True)
class ItemError:
    """Serialization of item `index` failed with `error` (the consumer decides raise or skip)."""

    index: int
    error: BaseException


_DONE = object()
FIRST_CHUNK_ITEMS = 16


class PrepTimer:
    """Wall seconds the workers spent serializing (summed over threads)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


def prefetch_batches(
    indices: list[int],
    serialize: Callable[[int], Serialized],
    config: BatchingConfig,
    pad_token_id: int,
    pin_memory: bool = False,
    timer: PrepTimer | None = None,
) -> Iterator[Batch | ItemError]:
    """Yield batches of the items in `indices` (and ItemErrors), serializing ahead of the consumer.

    With config.workers == 0 everything runs in the calling thread (no overlap, for debugging).
    At most config.prefetch_batches batches wait in the queue, which bounds host memory.
    """
    timer = timer or PrepTimer()
    chunks = list(_ramped_chunks(indices, config.chunk_items))
    if config.workers == 0:
        for chunk in chunks:
            yield from _chunk_batches(chunk, serialize, None, config, pad_token_id, pin_memory, timer)
        return
    out: queue.Queue = queue.Queue(maxsize=config.prefetch_batches)
    stop = threading.Event()

    def put(element) -> bool:
        """Block until queued, unless the consumer has gone away (then report False)."""
        while not stop.is_set():
            try:
                out.put(element, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            with ThreadPoolExecutor(config.worker_threads, thread_name_prefix="faste-mm-prep") as pool:
                for chunk in chunks:
                    for element in _chunk_batches(chunk, serialize, pool, config, pad_token_id, pin_memory, timer):
                        if not put(element):
                            return
        except BaseException as error:  # surfaced in the consumer thread, never swallowed
            put(error)
        finally:
            put(_DONE)

    producer = threading.Thread(target=produce, name="faste-mm-prefetch", daemon=True)
    producer.start()
    try:
        while True:
            element = out.get()
            if element is _DONE:
                break
            if isinstance(element, BaseException):
                raise element
            yield element
    finally:
        stop.set()  # a consumer that stops early (an error) releases the producer
        producer.join()


def _ramped_chunks(indices: list[int], chunk_items: int) -> Iterator[list[int]]:
    """Consecutive slices of `indices`: FIRST_CHUNK_ITEMS, then doubling up to chunk_items.

    A chunk must be fully serialized before it can be length-sorted into batches, so the model
    waits for the whole first chunk; a small first chunk starts it early and the larger later
    ones (serialized while the model runs) restore the sorting.
    """
    size = min(FIRST_CHUNK_ITEMS, chunk_items)
    start = 0
    while start < len(indices):
        yield indices[start : start + size]
        start += size
        size = min(2 * size, chunk_items)


def _chunk_batches(chunk, serialize, pool, config, pad_token_id, pin_memory, timer) -> Iterator[Batch | ItemError]:
    def run(index: int) -> Serialized | ItemError:
        started = time.perf_counter()
        try:
            return serialize(index)
        except Exception as error:  # one bad item must not cost the others their embeddings
            return ItemError(index, error)
        finally:
            timer.add(time.perf_counter() - started)

    results = list(pool.map(run, chunk)) if pool is not None else [run(index) for index in chunk]
    done: dict[int, Serialized] = {}
    for index, result in zip(chunk, results):
        if isinstance(result, ItemError):
            yield result
        else:
            done[index] = result
    rows = list(done)
    for batch_rows in plan_batches([done[r].length for r in rows], config):
        picked = [rows[i] for i in batch_rows]
        batch = collate([done[r] for r in picked], picked, pad_token_id)
        yield batch.pin_memory() if pin_memory else batch
