"""Stage 3b: preprocessing overlapped with compute, bounded in bytes. Worker threads measure a
chunk of items (token counts from image headers and PDF page boxes: nothing rendered), plan its
length-sorted batches from the counts, then serialize (read, render, resize, tokenize) and
collate one batch at a time, queueing ready batches (pinned on CUDA) while the caller's thread
runs the model. What is held at once is bounded by `BatchingConfig.prefetch_bytes`, not by a
count of items, so a 2,000-page PDF needs no more memory than a 20-page one.

Receives items and a serializer; yields `Batch`es and per-item failures, in chunk order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Callable, Iterator

import torch

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


@dataclass(frozen=True, slots=True)
class _Measured:
    """An item's token count and bytes, and its serialization when measuring needed one and
    the byte budget had room to keep it (else it is serialized again in its batch)."""

    length: int
    nbytes: int
    serialized: Serialized | None = None


@dataclass(frozen=True, slots=True)
class _Steps:
    """What the workers run on one item, and the budget they share."""

    serialize: Callable[[int], Serialized]
    measure: Callable[[int], tuple[int, int] | None] | None
    config: BatchingConfig
    pad_token_id: int
    pin_memory: bool
    timer: PrepTimer
    kept: "_ByteBudget"
    planned_extra: int = 0  # tokens each item has beyond its serialized ones, for the batch plan


def prefetch_batches(
    indices: list[int],
    serialize: Callable[[int], Serialized],
    config: BatchingConfig,
    pad_token_id: int,
    pin_memory: bool = False,
    timer: PrepTimer | None = None,
    measure: Callable[[int], tuple[int, int] | None] | None = None,
    planned_extra: int = 0,
) -> Iterator[Batch | ItemError]:
    """Yield batches of the items in `indices` (and ItemErrors), serializing ahead of the consumer.

    measure(index): (token count, tensor bytes) `serialize(index)` will have, without
    serializing (None when only serializing can tell); batches are planned from them (within
    config.batch_tokens and config.batch_bytes), so they are the same whatever the byte budget.
    planned_extra: tokens added to every item's length in the batch plan (a reranker's pairs
    without their reused prefix batch as the whole pairs would).
    With config.workers == 0 everything runs in the calling thread (no overlap, for debugging). Ready batches wait in a queue of at most config.prefetch_batches batches and, past
    the first, config.prefetch_bytes bytes; a batch is serialized only when the queue has room.
    """
    steps = _Steps(serialize, measure, config, pad_token_id, pin_memory, timer or PrepTimer(),
                   _ByteBudget(config.prefetch_bytes), planned_extra)
    chunks = list(_ramped_chunks(indices, config.chunk_items))
    if config.workers == 0:
        for chunk in chunks:
            yield from _chunk_batches(chunk, steps, None, lambda: True)
        return
    ready = _ReadyQueue(config.prefetch_batches, config.prefetch_bytes)

    def produce() -> None:
        try:
            with ThreadPoolExecutor(config.worker_threads, thread_name_prefix="faste-mm-prep") as pool:
                for chunk in chunks:
                    for element in _chunk_batches(chunk, steps, pool, ready.wait_for_room):
                        ready.put(element)
                    if ready.closed:
                        return
        except BaseException as error:  # surfaced in the consumer thread, never swallowed
            ready.put(error)
        finally:
            ready.put(_DONE)

    producer = threading.Thread(target=produce, name="faste-mm-prefetch", daemon=True)
    producer.start()
    try:
        while True:
            element = ready.get()
            if element is _DONE:
                break
            if isinstance(element, BaseException):
                raise element
            yield element
            del element  # the model is done with it: its bytes are free before the next get
    finally:
        ready.close()  # a consumer that stops early (an error) releases the producer
        producer.join()


def tensor_bytes(value: Batch | Serialized) -> int:
    """Host bytes of the tensors a batch or a serialized item holds (pixels, ids, positions)."""
    tensors = (getattr(value, f.name) for f in fields(value))
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


class _ByteBudget:
    """A thread-safe count of bytes against a limit: `take` succeeds while the total stays
    within it (measured items kept for their batch)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.held -= n


class _ReadyQueue:
    """Batches serialized and waiting for the model, in order. One producer asks
    `wait_for_room` before serializing a batch: room means fewer than `max_batches` waiting
    and, unless none waits, fewer than `max_bytes` bytes; failures and the end always go in."""

    def __init__(self, max_batches: int, max_bytes: int) -> None:
        self.max_batches, self.max_bytes = max_batches, max_bytes
        self.closed = False
        self._waiting: deque = deque()
        self._bytes = 0
        self._changed = threading.Condition()

    def wait_for_room(self) -> bool:
        """Block until a batch may be serialized; False once the consumer has gone away."""
        with self._changed:
            self._changed.wait_for(lambda: self.closed or (
                len(self._waiting) < self.max_batches and (not self._waiting or self._bytes < self.max_bytes)))
            return not self.closed

    def put(self, element) -> None:
        size = tensor_bytes(element) if isinstance(element, Batch) else 0
        with self._changed:
            self._waiting.append((element, size))
            self._bytes += size
            self._changed.notify_all()

    def get(self):
        with self._changed:
            self._changed.wait_for(lambda: bool(self._waiting))
            element, size = self._waiting.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return element

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._waiting.clear()
            self._changed.notify_all()


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


def _chunk_batches(chunk: list[int], steps: _Steps, pool: ThreadPoolExecutor | None,
                   wait_for_room: Callable[[], bool]) -> Iterator[Batch | ItemError]:
    """The chunk's ItemErrors from measuring, then its batches (longest first), each serialized
    only once `wait_for_room` allows it (ItemErrors of the batch's items come before it)."""
    measured: dict[int, _Measured] = {}
    for index, result in zip(chunk, _run(pool, lambda i: _measure(i, steps), chunk, steps.timer)):
        if isinstance(result, ItemError):
            yield result
        else:
            measured[index] = result
    rows = list(measured)
    for batch_rows in plan_batches([measured[r].length + steps.planned_extra for r in rows], steps.config,
                                   [measured[r].nbytes for r in rows]):
        if not wait_for_room():
            return
        picked = [rows[i] for i in batch_rows]
        kept = [measured.pop(r).serialized for r in picked]
        steps.kept.give_back(sum(tensor_bytes(s) for s in kept if s is not None))
        serialized = iter(_run(pool, steps.serialize, [r for r, s in zip(picked, kept) if s is None], steps.timer))
        results = [s if s is not None else next(serialized) for s in kept]
        del kept, serialized  # `items` below holds the only references: collate frees them one by one
        yield from (result for result in results if isinstance(result, ItemError))
        ok_rows = [r for r, result in zip(picked, results) if not isinstance(result, ItemError)]
        items = [result for result in results if not isinstance(result, ItemError)]
        del results
        if items:
            batch = collate(items, ok_rows, steps.pad_token_id, release=True)
            del items
            yield batch.pin_memory() if steps.pin_memory else batch


def _measure(index: int, steps: _Steps) -> _Measured:
    """The item's token count: planned (no pixels) where the serializer can, else serialized,
    the result kept for its batch while the byte budget has room."""
    if steps.measure is not None:
        try:
            planned = steps.measure(index)
        except Exception:  # noqa: BLE001 - serializing reports the item's error in its own words
            planned = None
        if planned is not None:
            return _Measured(*planned)
    serialized = steps.serialize(index)
    nbytes = tensor_bytes(serialized)
    kept = steps.kept.take(nbytes)
    return _Measured(serialized.length, nbytes, serialized if kept else None)


def _run(pool: ThreadPoolExecutor | None, step: Callable[[int], object], indices: list[int],
         timer: PrepTimer) -> list:
    """`step` on each index (in the pool's threads, or here), an ItemError where it raised."""
    def run(index: int):
        started = time.perf_counter()
        try:
            return step(index)
        except Exception as error:  # one bad item must not cost the others their embeddings
            return ItemError(index, error)
        finally:
            timer.add(time.perf_counter() - started)

    return list(pool.map(run, indices)) if pool is not None else [run(index) for index in indices]
