"""The public reranking API. `Reranker` composes the stages for (query, document) pairs:
expand documents -> pair serialization (pair_format) -> length-sorted batches -> the runner
with a policy (full, FastE, or FastE protecting the query) -> the score of each pair's last
token, sigmoid((W[yes] - W[no]) . Norm(h_last)), in input order, with failures and stats.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal

import numpy as np
import torch

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.ablations import Full, policy_for
from faste_mm.model.rerank.loading import LoadedReranker, load_reranker
from faste_mm.model.batching import BatchingConfig, collate
from faste_mm.model.cost import CostTally
from faste_mm.model.embedder import item_failure
from faste_mm.model.faste import FastEConfig, ThresholdTrigger
from faste_mm.model.flops import batch_flops, full_batch_flops
from faste_mm.model.items import Failure, Item, expand_items
from faste_mm.model.cpu.machine_plan import use_torch_threads
from faste_mm.model.prefetch import ItemError, PrepTimer, prefetch_batches
from faste_mm.model.rerank.prefix_reuse import (PrefixCache, PrefixMismatch, cut_pair, encode_prefix, first_asked_layer, prefix_of,
                                         reusable, run_with_prefix, with_protected)
from faste_mm.model.rerank.pair_format import PreparedQuery, TextPairSerializer, VLPairSerializer, rerank_serializer_config
from faste_mm.model.rerank.explain import Explanation, explain_pair
from faste_mm.model.rerank.policy import AttentionProbe, ProtectedFastE
from faste_mm.model.rerank.results import Ranking, RerankResult, RerankStats
from faste_mm.model.runner import BatchTrace, run_decoder, settle_kernel
from faste_mm.model.rerank.document_tails import DocumentTails
from faste_mm.model.rerank.resized_images import ResizedImages
from faste_mm.model.serialization import SerializerConfig
from faste_mm.model.rerank.tower_cache import DEFAULT_TOWER_CACHE_BYTES, RowKeys, TowerCache
from faste_mm.model.unpadded import Unpadded

log = logging.getLogger(__name__)

Protect = Literal["none", "query"]
PROTECT_MODES = ("none", "query")


class YesNoHead:
    """The reranker readout: Norm(h_last) . (W[yes] - W[no]) through a sigmoid, in float32.
    The final RMSNorm is per token, so norming only the readout rows equals the official
    `last_hidden_state[:, -1]`."""

    def __init__(self, yes_minus_no: torch.Tensor) -> None:
        self.direction = yes_minus_no  # [H] float32

    def __call__(self, backbone, hidden_readout: torch.Tensor) -> torch.Tensor:
        normed = backbone.final_norm(hidden_readout).float()  # [B, H]
        return torch.sigmoid(normed @ self.direction)  # [B]


class Reranker:
    """Qwen3-VL-Reranker (text, images, pages, video on either side) or the text Qwen3-Reranker,
    with optional FastE on each pair's prefix.

    Example:
        >>> rr = Reranker.from_pretrained("Qwen/Qwen3-VL-Reranker-2B", r_max=0.5, protect="query")
        >>> rr.rerank("a red bicycle", ["photo.jpg", "a blue car"], top_n=1).results[0].index
    """

    def __init__(
        self,
        loaded: LoadedReranker,
        *,
        fast_e: FastEConfig | None = None,
        protect: Protect = "none",
        batching: BatchingConfig | None = None,
        serializer: SerializerConfig | None = None,
        prefix_reuse: bool | None = None,
        tower_cache_bytes: int = DEFAULT_TOWER_CACHE_BYTES,
    ) -> None:
        if protect not in PROTECT_MODES:
            raise ConfigError(f"protect must be one of {', '.join(PROTECT_MODES)}, got {protect!r}")
        self.loaded = loaded
        self.backbone = loaded.backbone
        self.family = loaded.family
        batching = batching or BatchingConfig()
        self.machine = batching.machine_plan(self.backbone.device)  # threads for this machine's usable cores
        self.batching = batching.for_device(self.backbone.device, self.machine)
        use_torch_threads(self.machine)
        self.protect = protect
        num_layers = self.backbone.shape.num_layers
        # r_max = 0 keeps every prefix state: the full forward, without the alignment checks
        self.fast_e = None if fast_e is None or fast_e.r_max == 0 else fast_e.resolved(self.family, num_layers)
        if protect == "query" and self.fast_e is not None and self.fast_e.ranking != "readout":
            raise ConfigError(f"protect='query' keeps the query by FastE's readout ranking; ranking "
                              f"{self.fast_e.ranking!r} cannot be combined with it (use protect='none')")
        # candidates' tower features across queries (docs/rerank.md); 0 bytes turns it off
        cache = TowerCache(tower_cache_bytes, f"{loaded.model_id}|{self.backbone.dtype}")
        self.tower_cache = cache if tower_cache_bytes and loaded.is_multimodal else None
        # with it, candidates' resized images too: a quarter of its bytes holds the images of more
        # pages than it holds features (~4 MB against ~21 MB a page at the 2B shape)
        self.resized_images = None if self.tower_cache is None else ResizedImages(tower_cache_bytes // 4)
        # and their encoded tails (patches, tokens, the patches' hash): a warm query's pairs are the query's
        # head and these, without the processor or a hash per candidate (~7 MB a 640x480 photo in float32)
        self.document_tails = None if self.tower_cache is None else DocumentTails(tower_cache_bytes // 2)
        config = serializer or rerank_serializer_config(self.family.max_length)
        self.serializer = (VLPairSerializer(loaded.preprocessor, config, self.resized_images, self.document_tails)
                           if loaded.is_multimodal else TextPairSerializer(loaded.preprocessor, config))
        self.head = YesNoHead(loaded.yes_minus_no.to(self.backbone.device))
        self.unpadded = Unpadded(self.batching.unpadded, self.backbone.device, self.backbone.dtype)
        # None: where it is exact at every layer (full forward, protect="query"); plain FastE
        # reuses only up to its trigger, which measured no faster (docs/benchmarks-log.md, round 3)
        self.prefix_reuse = (self.fast_e is None or protect == "query") if prefix_reuse is None else bool(prefix_reuse)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        r_max: float = 0.0,
        warmup_layer: int | None = None,
        threshold: float | None = None,
        protect: Protect = "none",
        fast_e: FastEConfig | None = None,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        revision: str | None = None,
        batching: BatchingConfig | None = None,
        serializer: SerializerConfig | None = None,
        attn_implementation: str = "sdpa",
        prefix_reuse: bool | None = None,
        tower_cache_bytes: int = DEFAULT_TOWER_CACHE_BYTES,
    ) -> "Reranker":
        """Load a hub id ("Qwen/Qwen3-VL-Reranker-2B", "Qwen/Qwen3-Reranker-0.6B") or a local folder.

        r_max / warmup_layer / threshold: FastE on every pair [r_max, l_w, theta]; r_max 0 is the
        exact full forward; None takes the family default (registry `RERANK_FAMILIES`). `fast_e`
        gives a whole `FastEConfig` instead. protect "query": never evict the instruction + query
        (the budget then applies to the document part; docs/rerank.md). prefix_reuse: compute the
        system + instruction + query states once per query and run only each pair's document part
        (same scores; docs/rerank.md "Prefix reuse"); None: on for the full forward and protect
        "query", off for plain FastE (reused only up to its trigger there). tower_cache_bytes: keep candidates' vision
        tower features across queries up to this many bytes (default 1 GiB; 0 turns it off), and their
        files' resized images up to a quarter of that (`resized_images`: no page rendered twice).
        Raises ModelLoadError (an embedding model is refused, naming both) and ConfigError.
        """
        if fast_e is None:
            fast_e = FastEConfig(r_max=r_max, warmup_layer=warmup_layer, threshold=threshold)
        loaded = load_reranker(name_or_path, device=device, dtype=dtype, revision=revision, attn_implementation=attn_implementation)
        return cls(loaded, fast_e=fast_e, protect=protect, batching=batching, serializer=serializer,
                   prefix_reuse=prefix_reuse, tower_cache_bytes=tower_cache_bytes)

    def variant(self, *, fast_e: FastEConfig | None = None, protect: Protect = "none",
                prefix_reuse: bool | None = None) -> "Reranker":
        """Another setting (FastE, protect, prefix reuse) of this reranker: the same loaded model,
        batching and serializer, and the same caches (tower features, resized images), so settings
        compared over the same candidates (the evaluators, the benchmarks) pay for each candidate's
        tower and resize once."""
        other = Reranker(self.loaded, fast_e=fast_e, protect=protect, batching=self.batching,
                         serializer=self.serializer.config, prefix_reuse=prefix_reuse, tower_cache_bytes=0)
        other.serializer, other.tower_cache, other.resized_images = self.serializer, self.tower_cache, self.resized_images
        other.document_tails = self.document_tails
        return other

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    def settings(self) -> dict:
        """What decides the scores: model, FastE (resolved), protect, max_length."""
        return {
            "model": self.model_id,
            "family": self.family.name,
            "fast_e": None if self.fast_e is None else self.fast_e.to_dict(),
            "protect": self.protect,
            "max_length": self.serializer.config.max_length,
        }

    def prepare_query(self, query: object, instruction: str | None = None) -> PreparedQuery:
        """One query (str, path, PIL image or `Item`; its own instruction wins) decoded once;
        InputError naming it when it cannot be read or is a multi-page PDF without a page."""
        items, _, broken = expand_items([query])
        if broken:
            raise InputError(f"query: {broken[0][2]}")
        if len(items) != 1:
            raise InputError(f"query {items[0].describe()}: a PDF of {len(items)} pages; give one page (Item(image=path, page=k))")
        item = items[0]
        try:
            return self.serializer.prepare_query(item, item.instruction or instruction)
        except InputError as error:
            raise InputError(f"query: {error}") from None
        except Exception as error:  # noqa: BLE001 - a decoder's own error, named and explained
            raise InputError(f"query {item.describe()}: cannot be read ({type(error).__name__}: {error})") from None

    def score(
        self,
        query: object,
        documents: Iterable[object],
        *,
        instruction: str | None = None,
        on_error: Literal["raise", "skip"] = "skip",
        progress: Callable[[int], None] | None = None,
    ) -> RerankResult:
        """Score each document against the query.

        Args:
            query: str, path, PIL image or `Item` (text, image, page, video, or mixed).
            documents: the same kinds; a PDF path without a page scores each page.
            instruction: the task (default: the family's official instruction).
            on_error: "skip" (default) scores the others and reports each unreadable candidate
                in `failures` (its score NaN); "raise" stops with an InputError naming it.
        Returns `RerankResult` (scores in (0, 1), in input order).
        """
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        started = time.perf_counter()
        items, sources, broken = expand_items(documents)
        failures = [Failure(index, sources[index], item.describe(), reason) for index, item, reason in broken]
        if failures and on_error == "raise":
            raise InputError(f"document {failures[0].source}: {failures[0].reason}")
        scores = np.full(len(items), np.nan, dtype=np.float32)
        ok = np.zeros(len(items), dtype=bool)
        if not items:
            return RerankResult(scores, items, sources, ok, failures, self._stats([], 0, 0, 0, 0.0, started))
        prepared = self.prepare_query(query, instruction)
        broken_rows = {failure.index for failure in failures}
        tally = _Tally(scores, ok, failures)
        todo = [i for i in range(len(items)) if i not in broken_rows]
        tick = time.perf_counter()
        prefix = self.prefix_cache(prepared) if self.prefix_reuse and todo else None
        tally.prefix_s = time.perf_counter() - tick
        if prefix is not None:  # pairs that do not start with the prefix (truncated queries) go on whole
            todo = self._score_pairs(todo, lambda i: self._keyed_pair(prepared, items[i], prefix),
                                     lambda i: self._planned(prepared, items[i], prefix.length),
                                     items, sources, tally, on_error, progress, prefix)
        self._score_pairs(todo, lambda i: self._keyed_pair(prepared, items[i]), lambda i: self._planned(prepared, items[i]),
                          items, sources, tally, on_error, progress)
        failures.sort(key=lambda f: f.index)
        if failures:
            log.info("scored %d candidates, skipped %d", int(ok.sum()), len(failures))
        stats = self._stats(tally.traces, len(items), len(failures), tally.protected_tokens, tally.timer.seconds, started,
                            tally.forward_s, 0 if prefix is None else prefix.length, tally.prefix_s)
        return RerankResult(scores, items, sources, ok, failures, stats)

    def prefix_cache(self, prepared: PreparedQuery) -> PrefixCache | None:
        """The query's shared prefix computed once (`prefix_reuse`), or None where reuse would not
        be exact for this reranker's FastE (a query image with eviction before DeepStack ends)."""
        pair = self.serialize_pair(prepared, Item(text=""))  # any document: the first P tokens are every pair's
        if not 0 < pair.protected < pair.length - 1:
            return None
        prefix = prefix_of(pair, pair.protected, prepared.image is not None, prepared.video is not None)
        num_layers = self.backbone.shape.num_layers
        cache = encode_prefix(self.backbone, prefix, self.loaded.pad_token_id, first_asked_layer(self.fast_e, num_layers),
                              self._vision(None))
        return cache if reusable(cache, self.fast_e, self.protect == "query", num_layers) else None

    def _planned(self, prepared: PreparedQuery, item: Item, shared: int = 0) -> tuple[int, int] | None:
        """(tokens, pixel bytes) of the pair, less the `shared` prefix tokens run once per query,
        without rendering its image or page; None where only serializing can tell."""
        planned = self.serializer.planned_size(prepared, item)
        return None if planned is None else (planned[0] - shared, planned[1])

    def pair_tokens(self, prepared: PreparedQuery, item: Item) -> int:
        """The prompt tokens of one pair as the model sees them: counted from the image header or
        the page box where it can (nothing rendered), else serialized (the server's request limits)."""
        planned = self.serializer.planned_size(prepared, item)
        return planned[0] if planned is not None else self.serializer(prepared, item).length

    def _score_pairs(self, todo, serialize, measure, items, sources, tally: "_Tally", on_error, progress,
                     prefix=None) -> list[int]:
        """Score the pairs `todo` (whole, or document parts after `prefix`) into `tally`, batches
        planned from `measure` (so the first batch waits only for its own pages); returns the rows
        that did not start with the prefix (to be scored whole)."""
        whole: list[int] = []
        pin = self.backbone.device.type == "cuda"
        shared = 0 if prefix is None else prefix.length  # batches planned on whole pairs: the same as without reuse
        row_keys = None if self.tower_cache is None else RowKeys(self.tower_cache)
        keyed = serialize
        # keys hashed in the prep workers (where the serializer does not know them already)
        serialize = (lambda i: keyed(i)[0]) if row_keys is None else row_keys.hashing(keyed)
        for element in prefetch_batches(todo, serialize, self.batching, self.loaded.pad_token_id, pin, tally.timer,
                                        measure, planned_extra=shared):
            if isinstance(element, ItemError):
                if isinstance(element.error, PrefixMismatch):
                    whole.append(element.index)
                    continue
                failure = item_failure(items, sources, element)
                if on_error == "raise":
                    raise InputError(f"document {failure.source}: {failure.reason}") from element.error
                tally.failures.append(failure)
                if progress is not None:
                    progress(1)
                continue
            batch = element.to(self.backbone.device)
            vision = self._vision(element, row_keys)
            tick = time.perf_counter()
            if prefix is None:
                policy = self.compressor(batch)
                kernel = settle_kernel(self.backbone, batch, policy, self.unpadded)
                batch_scores, trace = run_decoder(self.backbone, batch, policy, kernel, readout=self.head, encode_vision=vision)
                tally.protected_tokens += 0 if batch.protected is None else int(batch.protected.sum())
            else:
                policy = self.compressor(with_protected(batch, prefix.length))
                kernel = self.unpadded.kernel(self.unpadded.choice) if policy.compresses and self.unpadded.choice else None
                batch_scores, trace = run_with_prefix(self.backbone, prefix, batch, policy, kernel, self.head, vision)
                tally.protected_tokens += prefix.length * batch.size
            tally.scores[element.rows] = batch_scores.cpu().numpy()  # .cpu() waits for the GPU: honest timing
            tally.forward_s += time.perf_counter() - tick
            tally.ok[element.rows] = True
            tally.traces.append(trace)
            if progress is not None:
                progress(len(element.rows))
        return whole

    def _vision(self, host_batch, row_keys: "RowKeys | None" = None):
        """The tower for a batch: through the tower cache when on, keyed by `row_keys` (hashed by
        the prep workers) or from the host batch (None: the batch itself); else the backbone's own."""
        cache = self.tower_cache
        if cache is None:
            return self.backbone.encode_vision
        keys = None if host_batch is None else (row_keys or RowKeys(cache)).of_batch(host_batch)
        return lambda batch: cache.encode(self.backbone, batch, keys if host_batch is not None else cache.keys(batch))

    def rerank(
        self,
        query: object,
        documents: Iterable[object],
        top_n: int | None = None,
        *,
        instruction: str | None = None,
        on_error: Literal["raise", "skip"] = "skip",
    ) -> Ranking:
        """`score`, then the best `top_n` candidates first (all when None), each with its input
        `index` and `score`; failed candidates are listed in `failures`, never ranked."""
        result = self.score(query, documents, instruction=instruction, on_error=on_error)
        return Ranking(result.ranked(top_n), result.failures, result.stats)

    def explain(self, query: object, document: object, *, instruction: str | None = None, layer: int | None = None) -> Explanation:
        """Where the reranker's readout looked in one document: its attention over the pair's
        prefix (FastE's ranking quantity) before `layer`, by default the layer FastE's alignment
        trigger picks for this pair (this reranker's l_w and theta, or the family's). Mapped to
        image / video patches and text spans (`explain`: the sum rule). The full forward
        runs; the score is the exact one. Attention, not attribution. InputError naming the
        document when it cannot be read."""
        num_layers = self.backbone.shape.num_layers
        if layer is not None and not 0 <= layer < num_layers:
            raise ConfigError(f"layer must be in 0..{num_layers - 1} for {self.model_id}, got {layer}")
        prepared = self.prepare_query(query, instruction)
        items, _, broken = expand_items(document)
        if broken or len(items) != 1:
            reason = broken[0][2] if broken else f"{len(items)} pages; give one page (Item(image=path, page=k))"
            raise InputError(f"document {items[0].describe() if items else ''}: {reason}")
        try:
            serialized = self.serialize_pair(prepared, items[0])
        except Exception as error:  # noqa: BLE001 - named and explained like a failed candidate
            raise InputError(f"document {items[0].describe()}: {error}") from None
        config = self.fast_e or FastEConfig().resolved(self.family, num_layers)
        probe = AttentionProbe(ThresholdTrigger(config.threshold, config.warmup_layer, num_layers), layer)
        batch = collate([serialized], [0], self.loaded.pad_token_id).to(self.backbone.device)
        scores, _ = run_decoder(self.backbone, batch, probe, None, readout=self.head)
        weights = probe.weights[0, : serialized.length - 1].cpu().numpy()  # [n_prefix]
        tokenizer = getattr(self.loaded.preprocessor, "tokenizer", self.loaded.preprocessor)
        model_config = self.backbone.model.config
        return explain_pair(serialized, weights, items[0], tokenizer, float(scores[0]), probe.recorded_layer,
                            getattr(model_config, "image_token_id", None), getattr(model_config, "video_token_id", None))

    def serialize_pair(self, query: PreparedQuery, item: Item):
        """One (query, document) pair as the runner takes it (calibration serializes with it too)."""
        return self.backbone.with_positions(self.serializer(query, item))

    def _keyed_pair(self, query: PreparedQuery, item: Item, prefix: PrefixCache | None = None):
        """(the pair as the runner takes it, cut after `prefix` when given, and its images'
        tower-cache digests where the serializer knows them: None, hashed by `RowKeys`)."""
        pair, digests = self.serializer.keyed(query, item)
        pair = self.backbone.with_positions(pair)
        if prefix is None:
            return pair, digests
        if digests is not None and prefix.image_patches:  # the query's image stays in the prefix
            digests = digests[1:]
        return cut_pair(pair, prefix), digests

    def compressor(self, batch, fast_e: FastEConfig | None = None):
        """The policy the runner asks for `batch`: this reranker's FastE, or `fast_e` (a resolved
        config: calibration's forced trigger layers), keeping the query when protect is "query"."""
        fast_e = fast_e or self.fast_e
        if fast_e is None:
            return Full()
        num_layers = self.backbone.shape.num_layers
        if self.protect == "query" and batch.protected is not None:
            return ProtectedFastE(fast_e, num_layers, batch.protected)
        return policy_for(fast_e, num_layers)  # FastE, or an ablation's ranking (FastEConfig.ranking)

    def _stats(self, traces, n_pairs, n_failed, protected_tokens, serialize_s, started, forward_s=0.0,
               prefix_reused=0, prefix_s=0.0) -> RerankStats:
        shape = self.backbone.shape
        return RerankStats(
            n_pairs=n_pairs,
            n_failed=n_failed,
            fast_e=None if self.fast_e is None else self.fast_e.to_dict(),
            protect=self.protect,
            protected_tokens=protected_tokens,
            flops_full=sum(full_batch_flops(shape, t.batch_size, t.padded_lengths[0]) for t in traces),
            flops_realised=sum(batch_flops(shape, t.batch_size, t.padded_lengths) for t in traces),
            serialize_s=serialize_s,
            forward_s=forward_s,
            elapsed_s=time.perf_counter() - started,
            batches=traces,
            prefix_reused=prefix_reused,
            prefix_s=prefix_s,
            **CostTally.total(traces).cost_fields(),
        )


@dataclass(slots=True)
class _Tally:
    """What `Reranker.score` accumulates over its batches (mutable, private to one call)."""

    scores: np.ndarray
    ok: np.ndarray
    failures: list[Failure]
    traces: list[BatchTrace] = field(default_factory=list)
    protected_tokens: int = 0
    forward_s: float = 0.0
    prefix_s: float = 0.0
    timer: PrepTimer = field(default_factory=PrepTimer)
