"""Label-free calibration of FastE's threshold theta on the user's own documents.

The documents are serialized and batched once. Each batch, while it is on the device, runs the
full forward (recording the batch-mean readout/prefix alignment before every layer) and one
forward per candidate trigger layer l (compression forced before l at the requested r_max),
giving each item's distortion 1 - cos(z_full, z_l) (docs/design.md, "Distortion"). Every pass
sees the same batches, so any theta can then be evaluated without running the model again: a
batch triggers where FastE's own rule (`ThresholdTrigger`) fires on its curve, and its items take
the embeddings of that pass. The recommended theta is the smallest one whose
fidelity meets the target, i.e. the most savings at the requested fidelity.
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from faste_mm.model.ablations import AlignmentProbe
from faste_mm.model.faste import FastE, FastEConfig, ThresholdTrigger, first_checked_layer
from faste_mm.model.embedder import item_failure
from faste_mm.errors import ConfigError, InputError
from faste_mm.model.flops import batch_flops, full_batch_flops
from faste_mm.model.items import Failure, Item, expand_items
from faste_mm.model.prefetch import ItemError
from faste_mm.model.runner import run_decoder, settle_kernel
from faste_mm.retrieval.calibrations import Calibration, ThetaReport

if TYPE_CHECKING:  # annotations only: importing faste_mm.datasets loads the hub and parquet readers
    from faste_mm.datasets.encoding import ProgressSink

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """fast_e: the FastE settings to calibrate theta for: its r_max (> 0) and warm-up layer l_w
    (None: backbone default); its threshold is what is calibrated, and a fixed trigger layer leaves
    nothing to calibrate. target: mean cosine to the full forward that a theta must reach.
    p5_floor: 5th-percentile cosine it must also reach (None: 1 - 3 (1 - target)). thetas:
    candidates (None: 0.05 steps over the observed alignment range)."""

    fast_e: FastEConfig = FastEConfig(r_max=0.5)
    target: float = 0.99
    p5_floor: float | None = None
    thetas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.fast_e, FastEConfig):
            raise ConfigError(f"CalibrationConfig.fast_e must be a FastEConfig, got {type(self.fast_e).__name__}")
        if self.fast_e.r_max == 0:
            raise ConfigError("FastEConfig.r_max is 0 (the full forward): there is no theta to calibrate; "
                              "give the r_max you index with, e.g. 0.5")
        if self.fast_e.trigger_layer is not None:
            raise ConfigError(f"FastEConfig.trigger_layer {self.fast_e.trigger_layer} fixes where FastE compresses: "
                              f"there is no theta to calibrate; leave the trigger layer out")
        if not 0.0 < self.target <= 1.0:
            raise ConfigError(f"CalibrationConfig.target is a cosine in (0, 1], got {self.target}")
        if self.p5_floor is not None and not -1.0 <= self.p5_floor <= 1.0:
            raise ConfigError(f"CalibrationConfig.p5_floor is a cosine in [-1, 1], got {self.p5_floor}")

    @property
    def floor(self) -> float:
        return 1.0 - 3.0 * (1.0 - self.target) if self.p5_floor is None else self.p5_floor


@dataclass(frozen=True, slots=True)
class Labels:
    """Labelled retrieval data (MMEB) for Recall@1/10 retention; the calibration inputs are the
    candidates. query_vectors: float32 [Q, d], full forward, unit norm. lists: for each query,
    indices into the calibration inputs (input positions), the gold first."""

    query_vectors: np.ndarray
    lists: list[tuple[int, ...]]

    def __post_init__(self) -> None:
        if self.query_vectors.ndim != 2 or self.query_vectors.shape[0] != len(self.lists):
            raise InputError(
                f"Labels: {self.query_vectors.shape[0]} query vectors but {len(self.lists)} candidate lists; "
                "give one candidate list per query vector"
            )
        if not self.lists:
            raise InputError("Labels: no queries; recall retention needs at least one query with its candidate list")
        for query, ids in enumerate(self.lists):
            if not ids:
                raise InputError(f"Labels: query {query} has an empty candidate list; list its candidates, the gold first")

    def check(self, n_inputs: int) -> None:
        """Every candidate index must name one of the `n_inputs` calibration inputs."""
        for query, ids in enumerate(self.lists):
            bad = [i for i in ids if not 0 <= i < n_inputs]
            if bad:
                raise InputError(
                    f"Labels: query {query} lists candidate {bad[0]}, but there are {n_inputs} calibration inputs "
                    f"(0..{n_inputs - 1}); the lists index the inputs passed to calibrate"
                )


@dataclass(frozen=True, slots=True)
class _Runs:
    """Every pass over the same batches. Vectors are indexed by item row (the expanded inputs);
    rows of skipped items stay zero in every pass."""

    rows: list[list[int]]  # per batch: its item rows
    curves: np.ndarray  # [n_batches, L]
    full: np.ndarray  # [n_rows, d]
    by_layer: dict[int, np.ndarray]  # l -> [n_rows, d]
    flops_by_layer: dict[int, list[int]]  # l -> per batch FLOPs
    flops_full: list[int]  # per batch
    failures: list[Failure]


def trigger_layers(curves: np.ndarray, theta: float, warmup: int) -> list[int]:
    """Per batch, the layer FastE would compress before at `theta` (its own rule, replayed)."""
    trigger = ThresholdTrigger(theta, warmup, curves.shape[1])
    return [trigger.first_layer(curve) for curve in curves]


def evaluate_thetas(
    curves: np.ndarray,
    cosines: dict[int, list[np.ndarray]],
    flops: dict[int, list[int]],
    flops_full: list[int],
    thetas: list[float],
    warmup: int,
    config: CalibrationConfig,
) -> list[ThetaReport]:
    """Score each theta from recorded runs. cosines[l][b]: per-item cos(z_full, z_l) of batch b."""
    reports = []
    for theta in thetas:
        layers = trigger_layers(curves, theta, warmup)
        values = np.concatenate([cosines[layer][b] for b, layer in enumerate(layers)])
        realised = sum(flops[layer][b] for b, layer in enumerate(layers))
        mean_cos, p5_cos = float(values.mean()), float(np.percentile(values, 5))
        reports.append(
            ThetaReport(
                theta=round(float(theta), 6),
                trigger_layers={int(l): layers.count(l) for l in sorted(set(layers))},
                mean_trigger_layer=float(np.mean(layers)),
                mean_cos=mean_cos,
                p5_cos=p5_cos,
                flops_reduction=1.0 - realised / sum(flops_full),
                meets_target=mean_cos >= config.target and p5_cos >= config.floor,
            )
        )
    return reports


def recommend(reports: list[ThetaReport]) -> float | None:
    """The smallest theta from which every larger candidate also meets the target.

    Requiring the whole upper range (not just one point) guards against a lucky dip: on a
    plateau-then-climb alignment curve a theta just above the plateau can pass by chance on
    one sample while its neighbours trigger far too early.
    """
    best = None
    for report in sorted(reports, key=lambda r: r.theta, reverse=True):
        if not report.meets_target:
            break
        best = report.theta
    return best


def calibrate(embedder, inputs: list, config: CalibrationConfig, labels: Labels | None = None,
              progress: ProgressSink | None = None) -> Calibration:
    """Run the passes on `inputs` (documents: str, Path, PIL image or `Item`) and recommend a theta.
    See the module docstring.

    labels: optional `Labels` (MMEB queries whose candidate lists index `inputs`) to also report
    Recall@1/10 retention per theta; the recommendation stays label-free. Documents that cannot be
    read are skipped (Calibration.skipped) and score zero against every query in both the full
    and the compressed embeddings, as in `faste-mm eval`.

    progress: told the rows to run (one phase) and advanced after each batch, every pass included.

    Raises InputError for bad inputs or labels (before any model run) and when fewer than 2
    documents can be embedded.
    """
    inputs = list(inputs)
    items, sources, broken = expand_items(inputs)
    _check_inputs(items, sources, len(inputs), labels)
    resolved = embedder.resolve_fast_e(config.fast_e)
    failures = [Failure(index, sources[index], item.describe(), reason) for index, item, reason in broken]
    runs = _run_passes(embedder, items, sources, failures, config.fast_e.r_max, resolved.warmup_layer, progress)
    n_ok = sum(len(rows) for rows in runs.rows)
    if n_ok < 2:
        reasons = "; ".join(failure.reason for failure in runs.failures[:3])
        raise InputError(f"calibration needs at least 2 readable documents, got {n_ok} of {len(items)} ({reasons})")
    for failure in runs.failures:
        log.warning("skipped %s", failure.reason)
    cosines = {
        layer: [np.sum(runs.full[rows] * vectors[rows], axis=1) for rows in runs.rows]
        for layer, vectors in runs.by_layer.items()
    }
    thetas = list(config.thetas) if config.thetas else _default_thetas(runs.curves, resolved.warmup_layer)
    reports = evaluate_thetas(runs.curves, cosines, runs.flops_by_layer, runs.flops_full, thetas, resolved.warmup_layer, config)
    if labels is not None:
        reports = [_with_recall(report, runs, labels, resolved.warmup_layer) for report in reports]
    distortion = {layer: float(1.0 - np.concatenate(values).mean()) for layer, values in cosines.items()}
    threshold = recommend(reports)
    if threshold is None:
        log.warning("no candidate theta reaches mean cos %.3f at r_max %g; lower --r-max or --target", config.target, config.fast_e.r_max)
    return Calibration(
        model_id=embedder.model_id,
        revision=embedder.loaded.revision,
        r_max=config.fast_e.r_max,
        warmup_layer=resolved.warmup_layer,
        target=config.target,
        p5_floor=config.floor,
        sample_size=n_ok,
        created=datetime.date.today().isoformat(),
        threshold=threshold,
        alignment=runs.curves.tolist(),
        distortion=distortion,
        thetas=reports,
        skipped=[failure.reason for failure in runs.failures],
    )


def task_labels(embedder, task) -> Labels:
    """`Labels` of a loaded MMEB task (`faste_mm.datasets.TaskData`), whose candidates
    (`task.candidate_items()`) are then the calibration inputs. Queries get the full forward;
    a query that cannot be embedded is left out (logged)."""
    result = embedder.encode_queries(task.query_items(), on_error="skip")
    if len(result.items) != len(task.queries):
        raise InputError(f"{task.source}: a query image is a multi-page PDF; MMEB queries take one image each")
    for failure in result.failures:
        log.warning("query %d left out of the recall retention: %s", failure.source, failure.reason)
    kept = np.flatnonzero(result.ok)
    if kept.size == 0:
        raise InputError(f"{task.source}: none of the {len(task.queries)} queries could be embedded; check the query images")
    return Labels(result.embeddings[kept], [task.queries[i].candidates for i in kept])


def _check_inputs(items: list[Item], sources: list[int], n_inputs: int, labels: Labels | None) -> None:
    """What can be checked before the model runs: enough documents, labels that fit them."""
    if len(items) < 2:
        raise InputError("calibration needs at least 2 documents; pass more files or a larger --sample")
    if labels is None:
        return
    labels.check(n_inputs)
    if len(items) != n_inputs:  # a PDF without a page expanded into several rows
        source, pages = next((s, n) for s, n in Counter(sources).items() if n > 1)
        raise InputError(
            f"labelled candidate {source} ({items[sources.index(source)].describe()}) is a PDF of "
            f"{pages} pages; a candidate needs one embedding: give Item(image=..., page=N)"
        )


def _with_recall(report: ThetaReport, runs: _Runs, labels: Labels, warmup: int) -> ThetaReport:
    from faste_mm.datasets.metrics import gold_ranks, score_ranks

    # Rows are input positions here (_check_inputs: one row per labelled input), so the lists
    # index the vectors directly; a skipped candidate is a zero row in both runs.
    candidates = np.zeros_like(runs.full)
    for rows, layer in zip(runs.rows, trigger_layers(runs.curves, report.theta, warmup)):
        candidates[rows] = runs.by_layer[layer][rows]
    full = score_ranks(gold_ranks(labels.query_vectors, runs.full, labels.lists))
    got = score_ranks(gold_ranks(labels.query_vectors, candidates, labels.lists))
    retention = {
        "recall@1": got.recall_at_1 / full.recall_at_1 if full.recall_at_1 else None,
        "recall@10": got.recall_at_10 / full.recall_at_10 if full.recall_at_10 else None,
    }
    return replace(report, recall_retention=retention)


def _run_passes(embedder, items: list[Item], sources: list[int], broken: list[Failure], r_max: float, warmup: int,
                progress: ProgressSink | None = None) -> _Runs:
    """Serialize the items once; run every pass on each batch while it is on the device. Memory:
    the prefetch queue and one device batch, plus [n_rows, d] float32 vectors per pass."""
    backbone, shape = embedder.backbone, embedder.backbone.shape
    policies = _trigger_policies(embedder, r_max, warmup)
    full = np.zeros((len(items), embedder.dim), dtype=np.float32)
    by_layer = {layer: np.zeros_like(full) for layer in policies}
    flops_by_layer: dict[int, list[int]] = {layer: [] for layer in policies}
    rows, curves, flops_full, failures = [], [], [], list(broken)
    skipped = {failure.index for failure in failures}
    todo = [i for i in range(len(items)) if i not in skipped]
    if progress is not None:
        progress.start("calibrating", len(todo))
    for element in embedder.prepare_batches(items, todo):
        if isinstance(element, ItemError):
            failures.append(item_failure(items, sources, element))  # the reasons `encode` gives
            if progress is not None:
                progress.advance(1)
            continue
        batch = element.to(backbone.device)  # copied once, run by every pass
        vectors, trace = run_decoder(backbone, batch, AlignmentProbe())
        full[batch.rows] = vectors.cpu().numpy()
        rows.append(list(batch.rows))
        curves.append([value for _, value in trace.alignment])
        flops_full.append(full_batch_flops(shape, trace.batch_size, trace.padded_lengths[0]))
        for layer, policy in policies.items():
            kernel = settle_kernel(backbone, batch, policy, embedder.unpadded)
            vectors, trace = run_decoder(backbone, batch, policy, kernel)
            by_layer[layer][batch.rows] = vectors.cpu().numpy()
            flops_by_layer[layer].append(batch_flops(shape, trace.batch_size, trace.padded_lengths))
        if progress is not None:
            progress.advance(len(batch.rows))
    failures.sort(key=lambda failure: failure.index)
    return _Runs(rows, np.array(curves), full, by_layer, flops_by_layer, flops_full, failures)


def _trigger_policies(embedder, r_max: float, warmup: int) -> dict[int, FastE]:
    """One FastE policy per candidate trigger layer l_w..L-1, compressing before that layer."""
    num_layers = embedder.backbone.shape.num_layers
    return {
        layer: FastE(embedder.resolve_fast_e(FastEConfig(r_max=r_max, trigger_layer=layer)), num_layers)
        for layer in range(first_checked_layer(warmup, num_layers), num_layers)
    }


def _default_thetas(curves: np.ndarray, warmup: int) -> list[float]:
    """0.05 steps covering the alignments seen from the warm-up layer on, plus one above them."""
    observed = curves[:, first_checked_layer(warmup, curves.shape[1]) :]
    low = np.floor(observed.min() * 20) / 20
    high = np.ceil(observed.max() * 20) / 20 + 0.05
    return [round(t, 4) for t in np.arange(low, high + 1e-9, 0.05)]


def plot_calibration(calibration: Calibration, path: Path) -> Path:
    """Alignment per layer (batch mean, min-max band) with the chosen theta, and distortion per
    trigger layer, side by side in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = np.array(calibration.alignment)
    layers = np.arange(curves.shape[1])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(layers, curves.mean(axis=0), marker="o", label="batch-mean alignment (mean)")
    left.set_xticks(layers)
    left.fill_between(layers, curves.min(axis=0), curves.max(axis=0), alpha=0.2, label="min-max over batches")
    left.axvline(calibration.warmup_layer, color="gray", linestyle="--", label=f"warm-up l_w = {calibration.warmup_layer}")
    if calibration.threshold is not None:
        left.axhline(calibration.threshold, color="red", label=f"theta = {calibration.threshold:g}")
    left.set(xlabel="layer", ylabel="cos(readout, mean prefix)", title="Readout/prefix alignment")
    left.legend(fontsize=8)
    trigger = sorted(calibration.distortion)
    right.semilogy(trigger, [max(calibration.distortion[l], 1e-9) for l in trigger], marker="o")
    right.set_xticks(trigger)
    right.axhline(1.0 - calibration.target, color="red", linestyle="--", label=f"1 - target = {1 - calibration.target:.3g}")
    right.set(xlabel="trigger layer", ylabel="mean 1 - cos(z_full, z_FastE)", title=f"Distortion at r_max {calibration.r_max:g}")
    right.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
