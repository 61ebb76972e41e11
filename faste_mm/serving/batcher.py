"""Dynamic batching for the server: concurrent requests wait in one bounded queue per kind
("query", "document", "search") and ONE model thread merges them into token-budget batches,
TEI's convention: a batch closes when it holds `batch_tokens` prompt tokens or when its oldest
request has waited `max_wait_ms`.

Receives jobs (a payload and its prompt-token count) from the HTTP handlers; hands each job's
result (or exception) back through a `concurrent.futures.Future`.

Why one thread: a torch model is not safe to run from several threads at once, and merging
requests is what makes many clients faster than one. Why one queue per kind: queries run the
full forward and documents run FastE, whose trigger is a batch mean (Algorithm 1), so a batch
never mixes them. Merging still decides which documents share a batch, so with FastE on
(r_max > 0) a document's vector can differ slightly from the same document embedded alone or
in another batch; with r_max = 0 and for queries the vectors do not depend on the batching.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Sequence

from faste_mm.errors import ConfigError, FasteError
from faste_mm.serving.metrics import BATCH_SIZE_BUCKETS, Metrics

log = logging.getLogger(__name__)

KINDS = ("query", "document", "search", "rerank", "task")  # task: other work on the model thread (a callable: `run_tasks`)

# A runner embeds (or searches) one merged batch: payloads in, one result per payload out, in
# order. A result that is an Exception fails only its own job; when the runner raises on a merged
# batch, each job is run again alone, so the exception fails only the job(s) that raise it again.
Runner = Callable[[list[object]], Sequence[object]]


class QueueFullError(FasteError):
    """The server's queue for this kind of request is full (HTTP 503: retry later)."""


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """batch_tokens: prompt tokens merged into one model call (a larger request still runs, alone);
    max_wait_ms: how long a batch may wait for more requests, counted from the later of its
        oldest request's arrival and the model becoming free;
    max_queue: requests that may wait per kind before new ones are refused (503)."""

    batch_tokens: int = 16384
    max_wait_ms: float = 5.0
    max_queue: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.batch_tokens, int) or self.batch_tokens < 1:
            raise ConfigError(f"BatcherConfig.batch_tokens must be an int >= 1, got {self.batch_tokens!r}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ConfigError(f"BatcherConfig.max_wait_ms must be in [0, 10000] ms, got {self.max_wait_ms!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 1:
            raise ConfigError(f"BatcherConfig.max_queue must be an int >= 1, got {self.max_queue!r}")


@dataclass(eq=False, slots=True)
class _Job:
    payload: object
    tokens: int
    enqueued_s: float
    future: Future = field(default_factory=Future)


class Batcher:
    """One model thread serving per-kind queues of jobs, merged under a token budget.

    Example:
        >>> batcher = Batcher({"query": run_queries}, BatcherConfig(batch_tokens=4096))
        >>> batcher.start()
        >>> vectors = batcher.submit("query", payload, tokens=12).result()
        >>> batcher.close()
    """

    def __init__(self, runners: dict[str, Runner], config: BatcherConfig | None = None,
                 metrics: Metrics | None = None) -> None:
        unknown = set(runners) - set(KINDS)
        if unknown:
            raise ConfigError(f"Batcher: unknown kinds {sorted(unknown)}; valid kinds are {', '.join(KINDS)}")
        self.config = config or BatcherConfig()
        self.metrics = metrics or Metrics()
        self._runners = dict(runners)
        self._queues: dict[str, deque[_Job]] = {kind: deque() for kind in runners}
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._free_since = 0.0  # when the model thread last finished a batch

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Batcher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="faste-mm-model", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in progress, fail the jobs still waiting, stop the thread."""
        with self._cond:
            self._stopping = True
            waiting = [job for queue in self._queues.values() for job in queue]
            for queue in self._queues.values():
                queue.clear()
            self._cond.notify_all()
        for job in waiting:
            job.future.set_exception(QueueFullError("the server is shutting down; retry on another instance"))
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    # ---- submitting ------------------------------------------------------------------------
    def submit(self, kind: str, payload: object, tokens: int) -> Future:
        """Queue one job; returns its Future. Raises QueueFullError when `kind`'s queue is full
        or the batcher is stopping, ConfigError for a kind without a runner."""
        if kind not in self._runners:
            raise ConfigError(f"this server runs no {kind!r} jobs; it runs {', '.join(self._runners)}")
        job = _Job(payload, max(1, int(tokens)), time.perf_counter())
        with self._cond:
            queue = self._queues[kind]
            if self._stopping:
                raise QueueFullError("the server is shutting down; retry later")
            if self._thread is not None and not self._thread.is_alive():  # never queue for a dead thread
                raise QueueFullError("the server's model thread stopped (see the server log); restart the server")
            if len(queue) >= self.config.max_queue:
                self.metrics.inc("faste_mm_rejected_total", kind=kind)
                raise QueueFullError(f"the {kind} queue is full ({len(queue)} requests waiting, "
                                     f"--max-queue {self.config.max_queue}); retry later")
            queue.append(job)
            self.metrics.set("faste_mm_queue_depth", len(queue), kind=kind)
            self._cond.notify_all()
        return job.future

    # ---- the model thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._free_since = time.perf_counter()
            picked = self._next_batch()
            if picked is None:
                return
            kind, jobs = picked
            self._run(kind, jobs)

    def _next_batch(self) -> tuple[str, list[_Job]] | None:
        """Block until a batch is ready: the kind whose oldest job waited longest, then as many
        of its jobs as fit the token budget, waiting until that oldest job's deadline for more."""
        budget = self.config.batch_tokens
        with self._cond:
            while not self._stopping and not any(self._queues.values()):
                self._cond.wait()
            if self._stopping:
                return None
            kind = min((queue[0].enqueued_s, kind) for kind, queue in self._queues.items() if queue)[1]
            queue = self._queues[kind]
            # Wait from the later of the oldest job's arrival and the model becoming free: the
            # clients of the batch that just finished re-submit within milliseconds, and
            # without this grace they would form a second group that never merges with the
            # first (C clients settle into two alternating batches of C/2).
            deadline = max(queue[0].enqueued_s, self._free_since) + self.config.max_wait_ms / 1000.0
            jobs: list[_Job] = []
            tokens = 0
            while True:
                while queue and (not jobs or tokens + queue[0].tokens <= budget):
                    job = queue.popleft()
                    jobs.append(job)
                    tokens += job.tokens
                is_full = bool(queue) or tokens >= budget  # the next job would not fit
                remaining = deadline - time.perf_counter()
                if is_full or remaining <= 0 or self._stopping:
                    break
                self._cond.wait(remaining)
            self.metrics.set("faste_mm_queue_depth", len(queue), kind=kind)
        return kind, jobs

    def _run(self, kind: str, jobs: list[_Job]) -> None:
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.metrics.observe("faste_mm_batch_size", len(live), BATCH_SIZE_BUCKETS, kind=kind)
        try:
            results = self._call(kind, live)
        except Exception as error:
            if len(live) == 1:
                log.error("%s request failed: %s: %s", kind, type(error).__name__, error)
                live[0].future.set_exception(error)
                return
            # One request's input broke the merged call: run each request on its own, so the
            # exception reaches only the job that raises it again and the others get answers.
            log.warning("%s batch of %d requests failed (%s: %s); running them one by one",
                        kind, len(live), type(error).__name__, error)
            for job in live:
                self._finish(job, lambda: self._call(kind, [job])[0], kind)
            return
        except BaseException as error:  # every waiting client gets an answer, never a hang
            for job in live:
                job.future.set_exception(error)
            raise
        for job, result in zip(live, results):
            self._finish(job, lambda: result, kind)

    def _call(self, kind: str, jobs: list[_Job]) -> Sequence[object]:
        results = self._runners[kind]([job.payload for job in jobs])
        if len(results) != len(jobs):  # a runner bug, not an input problem
            raise RuntimeError(f"{kind} runner returned {len(results)} results for {len(jobs)} jobs")
        return results

    @staticmethod
    def _finish(job: _Job, result: Callable[[], object], kind: str) -> None:
        """Set the job's result, or its exception (a returned one, or one `result` raises)."""
        try:
            value = result()
        except Exception as error:
            log.error("%s request failed: %s: %s", kind, type(error).__name__, error)
            value = error
        if isinstance(value, BaseException):
            job.future.set_exception(value)
        else:
            job.future.set_result(value)


def run_tasks(tasks: list) -> list[object]:
    """The "task" runner: each queued callable's result, or its exception (that task's alone)."""
    out: list[object] = []
    for task in tasks:
        try:
            out.append(task())
        except Exception as error:  # noqa: BLE001 - handed to that task's Future
            out.append(error)
    return out
