"""Label-free calibration of FastE's threshold theta for a reranker, on the user's own pairs.

The same plan as `calibration` (embedders), with scores in place of vectors: each query's
documents are serialized and batched once; each batch runs the full forward (recording the
batch-mean readout/prefix alignment before every layer) and one forward per candidate trigger
layer l (compression forced before l at the requested r_max, with the reranker's protect mode).
Any theta is then replayed without running the model again (`ThresholdTrigger`, FastE's own
rule, picks each batch's layer from its curve) and judged by fidelity to the full forward:

- score agreement: mean and largest |score - full score| over the pairs;
- top-k order agreement: per query, the share of the full forward's top-k (in order) that the
  compressed scores rank at the same places, averaged over the queries.

The recommended theta is the smallest from which every larger candidate meets both targets
(`calibration.recommend`): the most savings at the requested fidelity.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.ablations import AlignmentProbe
from faste_mm.model.faste import FastEConfig, ThresholdTrigger, first_checked_layer
from faste_mm.model.flops import batch_flops, full_batch_flops
from faste_mm.model.items import expand_items
from faste_mm.model.prefetch import ItemError, prefetch_batches
from faste_mm.model.runner import run_decoder, settle_kernel
from faste_mm.tools.calibration import recommend

if TYPE_CHECKING:
    from faste_mm.datasets.encoding import ProgressSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RerankCalibrationConfig:
    """fast_e: the r_max (> 0) and warm-up layer l_w to calibrate theta for (None: the reranker
    family's default). top_k: the ranks whose order must agree. target: mean top-k order agreement
    a theta must reach (0..1). max_score_diff: largest mean |score - full score| it may have.
    thetas: candidates (None: 0.05 steps over the observed alignment range)."""

    fast_e: FastEConfig = FastEConfig(r_max=0.5)
    top_k: int = 5
    target: float = 0.9
    max_score_diff: float = 0.05
    thetas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.fast_e.r_max == 0:
            raise ConfigError("FastEConfig.r_max is 0 (the full forward): there is no theta to calibrate; give the "
                              "r_max you rerank with, e.g. 0.5")
        if self.fast_e.trigger_layer is not None:
            raise ConfigError(f"FastEConfig.trigger_layer {self.fast_e.trigger_layer} fixes where FastE compresses: "
                              "there is no theta to calibrate; leave the trigger layer out")
        if self.top_k < 1:
            raise ConfigError(f"RerankCalibrationConfig.top_k must be >= 1, got {self.top_k}")
        if not 0.0 < self.target <= 1.0:
            raise ConfigError(f"RerankCalibrationConfig.target is a share of the top-k in (0, 1], got {self.target}")
        if not 0.0 <= self.max_score_diff <= 1.0:
            raise ConfigError(f"RerankCalibrationConfig.max_score_diff is a score difference in [0, 1], got {self.max_score_diff}")


@dataclass(frozen=True, slots=True)
class RerankThetaReport:
    """One candidate theta replayed over the recorded passes."""

    theta: float
    trigger_layers: dict[int, int]  # layer -> batches triggering there
    mean_trigger_layer: float
    mean_score_diff: float  # mean |score - full score| over the pairs
    max_score_diff: float
    top_k_agreement: float  # mean over queries of the full top-k ranks kept in place
    top1_agreement: float  # share of queries whose best candidate is unchanged
    flops_reduction: float
    meets_target: bool


@dataclass(frozen=True, slots=True)
class RerankCalibration:
    """What `calibrate_reranker` found; `threshold` None when no theta met the targets."""

    model_id: str
    r_max: float
    warmup_layer: int
    protect: str
    top_k: int
    target: float
    max_score_diff: float
    n_queries: int
    n_pairs: int
    threshold: float | None
    alignment: list[list[float]]  # per batch, the batch-mean alignment before each layer
    thetas: list[RerankThetaReport]
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Passes:
    """Every pass over the same batches: per batch its query and rows (into that query's scores)."""

    batches: list[tuple[int, list[int]]]
    curves: np.ndarray  # [n_batches, L]
    full: list[np.ndarray]  # per query, [n_documents] (NaN: skipped)
    by_layer: dict[int, list[np.ndarray]]  # l -> per query scores with compression before l
    flops_by_layer: dict[int, list[int]]  # l -> per batch
    flops_full: list[int]
    skipped: list[str]


def calibrate_reranker(reranker, pairs: Iterable[tuple[object, list]], config: RerankCalibrationConfig = RerankCalibrationConfig(),
                       progress: ProgressSink | None = None) -> RerankCalibration:
    """Recommend theta for `reranker` (its protect mode included) on `pairs`: (query, documents)
    with the queries and documents `Reranker.score` takes. Unreadable documents are skipped and
    listed; InputError when a query cannot be read or fewer than 2 pairs can be scored."""
    pairs = [(query, list(documents)) for query, documents in pairs]
    if not pairs:
        raise InputError("reranker calibration needs at least one query with its documents")
    num_layers = reranker.backbone.shape.num_layers
    warmup = config.fast_e.resolved(reranker.family, num_layers).warmup_layer
    passes = _run_passes(reranker, pairs, config.fast_e.r_max, warmup, progress)
    n_pairs = sum(len(rows) for _, rows in passes.batches)
    if n_pairs < 2:
        raise InputError(f"reranker calibration needs at least 2 readable pairs, got {n_pairs} "
                         f"({'; '.join(passes.skipped[:3]) or 'no documents given'})")
    thetas = list(config.thetas) if config.thetas else _default_thetas(passes.curves, warmup)
    reports = [_replay(passes, theta, warmup, config) for theta in thetas]
    threshold = recommend(reports)
    if threshold is None:
        log.warning("no candidate theta reaches top-%d agreement %.2f at r_max %g", config.top_k, config.target, config.fast_e.r_max)
    return RerankCalibration(
        model_id=reranker.model_id, r_max=config.fast_e.r_max, warmup_layer=warmup, protect=reranker.protect,
        top_k=config.top_k, target=config.target, max_score_diff=config.max_score_diff, n_queries=len(pairs),
        n_pairs=n_pairs, threshold=threshold, alignment=passes.curves.tolist(), thetas=reports, skipped=passes.skipped,
    )


def top_k_agreement(full: np.ndarray, other: np.ndarray, k: int) -> float:
    """Share of the full forward's top-k (best first) that `other` ranks at the same places
    (ties keep input order; NaN = skipped, left out)."""
    valid = np.flatnonzero(~np.isnan(full))
    k = min(k, valid.size)
    if k == 0:
        return 1.0
    reference = valid[np.argsort(-full[valid], kind="stable")][:k]
    ranked = valid[np.argsort(-other[valid], kind="stable")][:k]
    return float(np.mean(reference == ranked))


def _replay(passes: _Passes, theta: float, warmup: int, config: RerankCalibrationConfig) -> RerankThetaReport:
    """The scores FastE would give at `theta`: each batch takes the pass of its trigger layer."""
    trigger = ThresholdTrigger(theta, warmup, passes.curves.shape[1])
    layers = [trigger.first_layer(curve) for curve in passes.curves]
    scores = [np.full_like(full, np.nan) for full in passes.full]
    for (query, rows), layer in zip(passes.batches, layers):
        scores[query][rows] = passes.by_layer[layer][query][rows]
    diffs = np.concatenate([np.abs(s - f)[~np.isnan(f)] for s, f in zip(scores, passes.full)])
    top_k = float(np.mean([top_k_agreement(f, s, config.top_k) for s, f in zip(scores, passes.full)]))
    top1 = float(np.mean([top_k_agreement(f, s, 1) for s, f in zip(scores, passes.full)]))
    realised = sum(passes.flops_by_layer[layer][b] for b, layer in enumerate(layers))
    mean_diff = float(diffs.mean())
    return RerankThetaReport(
        theta=round(float(theta), 6),
        trigger_layers={int(l): layers.count(l) for l in sorted(set(layers))},
        mean_trigger_layer=float(np.mean(layers)),
        mean_score_diff=mean_diff,
        max_score_diff=float(diffs.max()),
        top_k_agreement=top_k,
        top1_agreement=top1,
        flops_reduction=1.0 - realised / sum(passes.flops_full),
        meets_target=top_k >= config.target and mean_diff <= config.max_score_diff,
    )


def _run_passes(reranker, pairs, r_max: float, warmup: int, progress) -> _Passes:
    """Serialize each query's pairs once; run every pass on each batch while it is on the device."""
    backbone, shape = reranker.backbone, reranker.backbone.shape
    num_layers = shape.num_layers
    configs = {layer: FastEConfig(r_max=r_max, trigger_layer=layer).resolved(reranker.family, num_layers)
               for layer in range(first_checked_layer(warmup, num_layers), num_layers)}
    full, by_layer = [], {layer: [] for layer in configs}
    flops_by_layer: dict[int, list[int]] = {layer: [] for layer in configs}
    batches, curves, flops_full, skipped = [], [], [], []
    if progress is not None:
        progress.start("calibrating", sum(len(documents) for _, documents in pairs))
    for query_index, (query, documents) in enumerate(pairs):
        prepared = reranker.prepare_query(query)
        items, sources, broken = expand_items(documents)
        skipped += [f"query {query_index}, document {sources[index]}: {reason}" for index, _, reason in broken]
        full.append(np.full(len(items), np.nan, dtype=np.float32))
        for layer in configs:
            by_layer[layer].append(np.full(len(items), np.nan, dtype=np.float32))
        todo = sorted(set(range(len(items))) - {index for index, _, _ in broken})
        for element in prefetch_batches(todo, lambda i: reranker.serialize_pair(prepared, items[i]), reranker.batching,
                                        reranker.loaded.pad_token_id):
            if isinstance(element, ItemError):
                skipped.append(f"query {query_index}, document {sources[element.index]}: {element.error}")
                continue
            batch = element.to(backbone.device)
            scores, trace = run_decoder(backbone, batch, AlignmentProbe(), readout=reranker.head)
            full[-1][element.rows] = scores.cpu().numpy()
            batches.append((query_index, list(element.rows)))
            curves.append([value for _, value in trace.alignment])
            flops_full.append(full_batch_flops(shape, trace.batch_size, trace.padded_lengths[0]))
            for layer, config in configs.items():
                policy = reranker.compressor(batch, config)
                kernel = settle_kernel(backbone, batch, policy, reranker.unpadded)
                scores, trace = run_decoder(backbone, batch, policy, kernel, readout=reranker.head)
                by_layer[layer][-1][element.rows] = scores.cpu().numpy()
                flops_by_layer[layer].append(batch_flops(shape, trace.batch_size, trace.padded_lengths))
            if progress is not None:
                progress.advance(len(element.rows))
    return _Passes(batches, np.array(curves).reshape(len(curves), num_layers), full, by_layer, flops_by_layer, flops_full, skipped)


def _default_thetas(curves: np.ndarray, warmup: int) -> list[float]:
    """0.05 steps covering the alignments seen from the warm-up layer on, plus one above them."""
    observed = curves[:, first_checked_layer(warmup, curves.shape[1]):]
    if observed.size == 0:
        return [0.7]
    low, high = np.floor(observed.min() * 20) / 20, np.ceil(observed.max() * 20) / 20 + 0.05
    return [round(t, 4) for t in np.arange(low, high + 1e-9, 0.05)]
